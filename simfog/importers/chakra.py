"""Chakra execution traces (MLCommons; PyTorch's execution trace and Kineto trace linked and converted, or
`simfog export chakra`) -> ModelTrace.

    simfog import chakra workload.0.et -o trace.json.gz              # one rank (or one file for all)
    simfog import chakra workload.*.et -o trace.json.gz              # one file per rank: each rank's compute

The files are read and checked by simfog.importers.chakra_graph (schema version, dependencies, what simfog
simulates). Then one of two readings:

- A file `simfog export chakra` wrote (GlobalMetadata attribute schema = SIMFOG_SCHEMA) carries, beside the
  Chakra fields ASTRA-sim reads (microsecond durations, comm_size), the exact trace in `simfog.*` attributes:
  every layer's recorded times in seconds (all samples), its parameter tensors, each bucket's tensors. The trace
  comes back exactly, so export then import gives the same simulation bit for bit.
- Any other trace (the Chakra converter's) is read per operator: its device compute nodes (is_cpu_op false; every
  compute node where the trace marks none) in issue order, each one a layer; backward starts at the first node
  whose name, or whose launching host operator's, says "backward"; the gradients are the ALL_REDUCE (DDP buckets)
  and REDUCE_SCATTER (FSDP/ZeRO) collectives launched after a backward node, each one tensor of comm_size bytes,
  ready when the last backward node launched before it ends (node ids follow the host's launch order); the nodes
  after the last gradient's ready node that are not backward make the optimizer step (with DDP: the copies of
  the reduced buckets back into the gradients, and the optimizer's kernels). Durations are the trace's, in
  microseconds. ALL_GATHER (FSDP's parameter gathers) and BROADCAST (DDP's buffers at start) are counted in the
  notes and not kept: the experiment's algorithm plans its own. PyTorch's traces carry no module names, so
  layers are operators, named by their node id and name.

Several files are several ranks: the same structure in each, rank r's times as sample r (sample_ranks), so the
engine gives simulated rank r recorded rank r mod R's compute.
"""

from __future__ import annotations

import bisect
import json
import re
from pathlib import Path

from simfog.errors import ConfigError
from simfog.importers import chakra_graph
from simfog.importers.chakra_graph import Graph
from simfog.importers.chakra_schema import COLLECTIVE_TYPES, NODE_TYPES
from simfog.importers.logs import warn
from simfog.trace import DTYPE_BYTES, ModelTrace, model_trace_from_dict

SIMFOG_SCHEMA = "simfog.chakra/1"  # the GlobalMetadata "schema" attribute of the files simfog writes
# The attributes simfog writes beside Chakra's own (ASTRA-sim keeps unknown attributes and ignores them).
TRACE = "simfog.trace"          # GlobalMetadata: JSON of the trace's fields but its layers and step times
LAYER = "simfog.layer"          # compute node: the layer's name
PHASE = "simfog.phase"          # compute node: forward, backward or optimizer
SAMPLES = "simfog.samples_s"    # compute node: every recorded sample of its time, seconds
HOST = "simfog.host_s"          # optimizer node: the trace's host time per sample, seconds
OPS = "simfog.ops"              # forward node: the layer's operators with their shapes, JSON (simfog.gpu.ops)
PARAMS = "simfog.params"        # backward node: its layer's parameter tensors (names, elements, dtypes)
ELEMENTS = "simfog.param_elements"
DTYPES = "simfog.param_dtypes"
TENSORS = "simfog.tensors"      # collective node: the gradient tensors of its bucket
LAYER_NUMBERS = ("flops", "bytes_accessed", "activation_bytes", "output_bytes")  # forward node: simfog.<name>

_COMP, _COLL = NODE_TYPES["COMP_NODE"], NODE_TYPES["COMM_COLL_NODE"]
_GRADIENT_OPS = {COLLECTIVE_TYPES["ALL_REDUCE"]: "ALL_REDUCE", COLLECTIVE_TYPES["REDUCE_SCATTER"]: "REDUCE_SCATTER"}


def import_chakra(path: str | Path, *, model: str | None = None, batch_size: int | None = None) -> ModelTrace:
    """Chakra execution trace(s) (protobuf, one per rank) -> ModelTrace: per operator, or exactly as simfog wrote it.

    See the module docstring. `model`, `batch_size`: what a trace not written by simfog does not record (defaults:
    the file's name, 1)."""
    return import_chakra_files([path], model=model, batch_size=batch_size)


def import_chakra_files(paths, *, model: str | None = None, batch_size: int | None = None) -> ModelTrace:
    """Chakra execution traces of the ranks of one run (file order = rank order, or the rank number in names like
    workload.3.et) -> one ModelTrace. Raises ConfigError naming the file (and node) for a bad file, or files that
    do not describe the same workload."""
    paths = sorted((str(p) for p in paths), key=_rank_key)
    graphs = [chakra_graph.load(p) for p in paths]
    if graphs[0].meta.get("schema") == SIMFOG_SCHEMA:
        return _simfog_trace(graphs)
    return _operator_trace(graphs, model, batch_size)


def _rank_key(path: str) -> tuple:
    m = re.search(r"\.(\d+)\.et(?:\.gz)?$", path)
    return (0, int(m.group(1)), path) if m else (1, 0, path)


def _names(paths: list[str]) -> str:
    return " ".join(paths) if len(paths) <= 3 else f"{paths[0]} ... {paths[-1]} ({len(paths)} files)"


# --- files simfog wrote -------------------------------------------------------------------------------------------

def _simfog_trace(graphs: list[Graph]) -> ModelTrace:
    dicts = [_simfog_dict(g) for g in graphs]
    for g, d in zip(graphs[1:], dicts[1:]):
        if d != dicts[0]:
            raise ConfigError("simfog.trace", "(differs)", f"the trace of {graphs[0].path}: the ranks of one "
                              "export carry one trace", source=g.path)
    d, g = dicts[0], graphs[0]
    p = d["provenance"]
    p["notes"] = (f"Read by `simfog import chakra` from the Chakra execution trace {_names([x.path for x in graphs])} "
                  f"(schema version {g.version}, written by simfog), exactly as exported; the trace's own "
                  f"provenance: {p.get('command', '')}; {p.get('notes', '')}").rstrip("; ")
    p["command"] = f"simfog import chakra {_names([x.path for x in graphs])}"
    try:
        return model_trace_from_dict(d)
    except ConfigError as e:
        raise e.in_file(g.path) from None


def _simfog_dict(g: Graph) -> dict:
    """The trace dict (simfog.trace format) a simfog-written file holds."""
    try:
        d = json.loads(g.meta.get(TRACE, ""))
    except (TypeError, ValueError):
        raise ConfigError(f"GlobalMetadata {TRACE}", g.meta.get(TRACE), "the JSON of the exported trace",
                          source=g.path) from None
    if not isinstance(d, dict):
        raise ConfigError(f"GlobalMetadata {TRACE}", type(d).__name__, "a JSON object", source=g.path)
    layers: dict = {}
    for node in g.nodes:
        a = g.attrs(node)
        phase = a.get(PHASE)
        if node.type == _COMP and phase in ("forward", "backward"):
            name = a.get(LAYER)
            layer = layers.setdefault(name, {"name": name})
            layer[f"{phase}_s"] = _samples(a, node, g)
            if phase == "forward":
                layer.update({k: a[f"simfog.{k}"] for k in LAYER_NUMBERS if f"simfog.{k}" in a})
                if OPS in a:
                    try:
                        layer["ops"] = json.loads(a[OPS])
                    except (TypeError, ValueError):
                        raise ConfigError(f"node {node.id} {OPS}", a[OPS], "the JSON list of the layer's operators",
                                          source=g.path) from None
            else:
                names, elements, dtypes = (a.get(k, []) for k in (PARAMS, ELEMENTS, DTYPES))
                if not len(names) == len(elements) == len(dtypes):
                    raise ConfigError(f"node {node.id} {PARAMS}", names, f"as many {ELEMENTS} and {DTYPES}",
                                      source=g.path)
                layer["params"] = [{"name": n, "elements": e, "dtype": t} for n, e, t in zip(names, elements, dtypes)]
        elif node.type == _COMP and phase == "optimizer":
            d["optimizer_s"] = list(a.get(SAMPLES) or [])
            if a.get(HOST):
                d["host_s"] = list(a[HOST])
    for name, layer in layers.items():
        for key in ("forward_s", "backward_s", "params"):
            if key not in layer:
                raise ConfigError(f"layer {name!r}", f"(no {key})", "a forward and a backward node per layer",
                                  source=g.path)
    return {**d, "layers": list(layers.values())}


def _samples(a: dict, node, g: Graph) -> list[float]:
    values = a.get(SAMPLES)
    if not isinstance(values, list) or not values:
        raise ConfigError(f"node {node.id} {SAMPLES}", values, "the layer's recorded times in seconds (a "
                          "double_list)", source=g.path)
    return values


# --- any other Chakra trace: per operator -------------------------------------------------------------------------

def _operator_trace(graphs: list[Graph], model: str | None, batch_size: int | None) -> ModelTrace:
    runs = [_phases(g) for g in graphs]
    first = runs[0]
    for g, run in zip(graphs[1:], runs[1:]):
        for key in ("forward", "backward", "gradients"):
            if len(run[key]) != len(first[key]) or (key == "gradients" and run[key] != first[key]):
                raise ConfigError(key, f"{len(run[key])} {'collectives' if key == 'gradients' else 'nodes'}",
                                  f"the {len(first[key])} of {graphs[0].path} with the same sizes (the ranks of "
                                  "one data-parallel run)", source=g.path)
    ranks = len(runs)
    fwd_names = [f"f{n.id}:{n.name[:60]}" for n in first["forward_nodes"]]
    bwd_names = [f"b{n.id}:{n.name[:60]}" for n in first["backward_nodes"]]
    tensors: dict[int, list] = {}
    for k, (op, size, ready) in enumerate(first["gradients"]):
        dtype = "float32" if size % 4 == 0 else "uint8"
        tensors.setdefault(max(ready, 0), []).append({"name": f"grad{k}:{op.lower()}",
                                                      "elements": size // DTYPE_BYTES[dtype], "dtype": dtype})
    zeros = [0.0] * ranks
    layers = [{"name": name, "forward_s": [r["forward"][i] for r in runs], "backward_s": zeros, "params": []}
              for i, name in enumerate(fwd_names)]
    layers += [{"name": bwd_names[j], "forward_s": zeros, "backward_s": [r["backward"][j] for r in runs],
                "params": tensors.get(j, [])} for j in reversed(range(len(bwd_names)))]
    order = [t["name"] for j in sorted(tensors) for t in tensors[j]]
    g = graphs[0]
    names = _names([x.path for x in graphs])
    notes = (f"Chakra execution trace{'s' if ranks > 1 else ''} {names} (schema version {g.version}; PyTorch trace "
             f"schema {g.meta.get('schema', 'unknown')}), read per operator: {len(fwd_names)} forward and "
             f"{len(bwd_names)} backward device compute nodes as layers (durations in whole microseconds, as "
             f"Chakra records them), {len(first['gradients'])} gradient collectives as one tensor each "
             f"(comm_size bytes; dtype float32 assumed where it divides by 4), ready when the last backward node "
             f"launched before them ends; optimizer step: {first['optimizer_nodes']} node(s) after the last gradient. "
             f"Not kept: {first['skipped']}. Module hierarchy: none in the trace (layers are operators).")
    if any(op == "REDUCE_SCATTER" for op, _, _ in first["gradients"]):
        warn(g.path, "REDUCE_SCATTER comm_size taken as the gradient's bytes; the Chakra converter adds the op's "
             "output shard to it (1/ranks more)")
    d = {"format": "simfog.model-trace/1", "model": model or Path(g.path).name.split(".")[0],
         "batch_size": batch_size or 1, "dtype": "float32",
         "device": {"kind": "unknown", "name": "unknown (Chakra traces do not name the device)"},
         "software": {"chakra_schema": g.version},
         "provenance": {"command": f"simfog import chakra {names}", "date": str(g.meta.get("time", "unknown")),
                        "host": "unknown", "source": "imported", "estimated": False, "notes": notes},
         "layers": layers, "grad_ready_order": order, "optimizer_s": [r["optimizer"] for r in runs],
         **({"sample_ranks": list(range(ranks))} if ranks > 1 else {})}
    try:
        return model_trace_from_dict(d)
    except ConfigError as e:
        raise e.in_file(g.path) from None


def _phases(g: Graph) -> dict:
    """A trace's device compute split into forward, backward and optimizer, and its gradient collectives (op,
    bytes, the index of the backward node they are ready after)."""
    marked = any("is_cpu_op" in g.attrs(n) for n in g.nodes)
    kernels = [n for n in g.nodes if n.type == _COMP and (not marked or g.is_gpu(n))]
    start = next((i for i, n in enumerate(kernels) if _is_backward(n, g)), None)
    if start is None:
        raise ConfigError("nodes", f"{len(kernels)} compute nodes", "a training step: a backward pass (no compute "
                          "node, nor its host operator, is named *backward*)", source=g.path)
    # A gradient is ready when the last backward kernel launched before its collective ends: node ids follow the
    # host's launch order (the converter numbers nodes as PyTorch recorded them; ASTRA-sim issues by id too), and
    # the framework launches a bucket's collective as soon as its last gradient's kernels are launched.
    backward_ids = sorted(n.id for n in kernels[start:])
    position = {n.id: i for i, n in enumerate(kernels)}
    gradients, skipped = [], {}
    for n in g.nodes:
        if n.type != _COLL or (marked and not g.is_gpu(n)):
            continue
        op = g.attrs(n).get("comm_type")
        launched_after = bisect.bisect_left(backward_ids, n.id)
        if op in _GRADIENT_OPS and launched_after > 0:
            gradients.append((_GRADIENT_OPS[op], g.attrs(n)["comm_size"], backward_ids[launched_after - 1]))
        elif op == COLLECTIVE_TYPES["ALL_REDUCE"]:
            raise ConfigError(f"node {n.id}", "ALL_REDUCE before backward", "gradient allreduces after backward "
                              f"nodes: an allreduce in forward is tensor parallelism's; {chakra_graph.OUT_OF_SCOPE}",
                              source=g.path)
        else:
            skipped[n.name.split("(")[0][:40]] = skipped.get(n.name.split("(")[0][:40], 0) + 1
    if not gradients:
        raise ConfigError("nodes", "(no gradient collective)", "ALL_REDUCE or REDUCE_SCATTER collectives after "
                          "backward compute: data-parallel training communicates gradients", source=g.path)
    last = max(position[i] for _, _, i in gradients)
    tail = [n for n in kernels[last + 1:] if not _is_backward(n, g)]
    in_tail = {n.id for n in tail}
    backward = [n for n in kernels[start:] if n.id not in in_tail]
    index = {n.id: i for i, n in enumerate(backward)}
    us = 1e-6
    return {"forward": [n.duration_micros * us for n in kernels[:start]], "forward_nodes": kernels[:start],
            "backward": [n.duration_micros * us for n in backward], "backward_nodes": backward,
            "optimizer": sum(n.duration_micros for n in tail) * us, "optimizer_nodes": len(tail),
            "gradients": [(op, size, index[i]) for op, size, i in gradients],
            "skipped": ", ".join(f"{k} x{v}" for k, v in skipped.items()) or "nothing"}


def _is_backward(node, g: Graph) -> bool:
    """The node, or the host operator that launched it, is named *backward* (autograd's operators:
    aten::convolution_backward, ...). The launcher is the node's parent, its control dependency; where the
    converter dropped the parent, the host operator it follows (its first data dependency, when that is one)."""
    parents = ([g.by_id[d] for d in node.ctrl_deps if d in g.by_id]
               or [g.by_id[d] for d in node.data_deps[:1] if not g.is_gpu(g.by_id[d])])
    return any("backward" in n.name.lower() for n in (node, *parents))
