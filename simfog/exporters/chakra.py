"""An experiment's workload as Chakra execution traces ASTRA-sim runs: one file per rank, workload.<rank>.et, plus
ASTRA-sim's network, system and memory inputs (simfog.exporters.astra_sim) and export.json, what was written and
how to run it.

One training iteration per rank, in data dependencies (what ASTRA-sim's feeder orders by):

    forward of layer 0 -> ... -> forward of layer L-1 -> backward of layer L-1 -> ... -> backward of layer 0
    bucket k's ALL_REDUCE <- the backward node after which its last gradient is ready, and bucket k-1
    optimizer <- the last backward node and the last bucket

The buckets are the ones simfog's static merge policy makes (simfog.algorithms.allreduce.plan.static_plan), in
launch order on one communication stream; comm_size is the bucket's bytes. Compute nodes last each layer's mean
time on that rank (its recorded rank's mean where the trace has several, times its [heterogeneity] slowdown),
in whole microseconds: the unit of Chakra's duration_micros, which ASTRA-sim replays. Node ids follow issue
order (ASTRA-sim issues the lowest ready id first). Ranks with the same times share one file's bytes (hard links
where the file system has them).

Beside Chakra's fields every node carries simfog's exact values (simfog.importers.chakra: every sample in
seconds, the layers' parameter tensors, each bucket's tensors, the trace's other fields in the GlobalMetadata),
which ASTRA-sim ignores and `simfog import chakra` reads back, so that export then import gives the same
simulation bit for bit.

What the traces cannot say, written in export.json's notes: per-iteration compute draws and stragglers (ASTRA-sim
replays one duration per node), the launch overhead, bucket copies and backward slowdown of [comm] (no node type
holds work on the communication stream), several streams (ASTRA-sim's NPU runs one collective at a time).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from simfog import merge
from simfog.engine.compute import ComputeModel
from simfog.errors import ConfigError
from simfog.exporters import astra_sim
from simfog.importers import chakra as names
from simfog.importers import chakra_schema as schema

ASTRA_BINARY = "AstraSim_Analytical_Congestion_Unaware"
US = 1e6


@dataclass(frozen=True)
class Export:
    """What `export_chakra` wrote: `folder`, `ranks` workload files of which `distinct` differ, `nodes` per file,
    `buckets` collectives per iteration, `notes` (what ASTRA-sim will not see) and ASTRA-sim's command line."""

    folder: Path
    ranks: int
    distinct: int
    nodes: int
    buckets: int
    notes: tuple[str, ...]
    command: str


def check_exportable(exp) -> None:
    """ConfigError naming the [comm] key when `exp` holds what the Chakra export cannot write."""
    c = exp.comm
    if c.algorithm != "allreduce":
        raise ConfigError("comm.algorithm", c.algorithm, '"allreduce" (the export writes bucketed gradient '
                          "allreduces; other algorithms are not exported yet)", source=exp.source)
    if c.merge in merge.DYNAMIC:
        raise ConfigError("comm.merge", c.merge, "a static merge policy (buckets fixed before the run): "
                          f"{', '.join(n for n in merge.POLICIES.names() if n not in merge.DYNAMIC)}",
                          source=exp.source)
    if c.streams != 1:
        raise ConfigError("comm.streams", c.streams, "1: ASTRA-sim runs one collective at a time per NPU",
                          source=exp.source)


def export_chakra(exp, folder: str | os.PathLike, *, force: bool = False) -> Export:
    """Write `exp`'s workload and ASTRA-sim's inputs into the new folder `folder` (see the module docstring): it
    appears complete or not at all. Raises ConfigError for an experiment the export cannot write (check_exportable,
    astra_sim.config) or a folder that exists (unless `force`, which replaces it)."""
    from simfog.algorithms.allreduce.plan import static_plan
    from simfog.simulation import new_simulation

    folder = Path(folder)
    if os.path.lexists(folder) and not force:
        raise ConfigError("-o", str(folder), "a folder that does not exist yet (add --force to replace it)")
    check_exportable(exp)
    astra = astra_sim.config(exp.cluster, exp.comm.collective, source=exp.source)
    buckets = static_plan(exp)
    sim = new_simulation(exp)  # checks the run as `simfog simulate` does (memory, groups); its rank slowdowns
    means = ComputeModel.from_trace(exp.workload.trace, "mean")
    metadata = _metadata(exp)
    contents: dict[bytes, list[int]] = {}
    for rank in range(exp.ranks):
        row = rank % len(means.forward_s)
        factor = sim.slowdown[rank]
        times = (means.layer_forward_s[row] * factor, means.layer_backward_s[row] * factor,
                 means.optimizer_s[row] * factor)
        nodes = workload_nodes(exp.workload.trace, buckets, times)
        contents.setdefault(schema.encode(metadata, nodes), []).append(rank)
    notes = (*_notes(exp), *astra.notes)
    command = (f"{ASTRA_BINARY} --workload-configuration={folder}/workload --system-configuration={folder}/"
               f"system.json --network-configuration={folder}/network.yml --remote-memory-configuration={folder}/"
               "memory.json")
    manifest = {"format": "simfog.chakra-export/1", "experiment": exp.source, "ranks": exp.ranks,
                "algorithm": exp.comm.algorithm, "merge": exp.comm.merge, "collective": exp.comm.collective,
                "buckets": [{"bytes": b.nbytes, "tensors": len(b.tensors)} for b in buckets],
                "chakra_schema": schema.WRITTEN_VERSION, "astra_sim": command, "notes": list(notes)}
    _write(folder, contents, astra, manifest, force)
    return Export(folder, exp.ranks, len(contents), len(nodes), len(buckets), notes, command)


def workload_nodes(trace, buckets, times) -> list:
    """One rank's nodes for one iteration: `times` = (forward (L,), backward (L,), optimizer) seconds on that rank."""
    forward, backward, optimizer = times
    layer_of = trace.layer_index()
    nodes: list = []

    def add(name: str, kind: str, deps, duration_s: float | None = None, attrs=()) -> int:
        node = schema.Node(id=len(nodes), name=name, type=schema.NODE_TYPES[kind], data_deps=[d for d in deps
                                                                                               if d is not None])
        if duration_s is not None:
            node.duration_micros = round(duration_s * US)
        node.attr.extend([schema.attr("is_cpu_op", bool_val=False), *attrs])
        nodes.append(node)
        return node.id

    prev = None
    for i, layer in enumerate(trace.layers):
        numbers = [schema.attr(f"simfog.{k}", double_val=getattr(layer, k)) for k in names.LAYER_NUMBERS
                   if getattr(layer, k) is not None]
        prev = add(f"forward:{layer.name}", "COMP_NODE", [prev], forward[i],
                   [*_layer_attrs(layer, "forward"), *numbers])
    # a bucket launches once its last gradient is ready and the bucket before it has launched: backward runs from
    # layer L-1 down to 0, so bucket k goes after the backward of layer min(ready[:k + 1])
    ready = [min(layer_of[t] for t in b.tensors) for b in buckets]
    launch_at = [min(ready[:k + 1]) for k in range(len(ready))]
    backward_node: dict[int, int] = {}
    last_coll, k = None, 0
    for i in reversed(range(len(trace.layers))):
        layer = trace.layers[i]
        params = [schema.attr(names.PARAMS, string_list=[t.name for t in layer.params]),
                  schema.attr(names.ELEMENTS, int64_list=[t.elements for t in layer.params]),
                  schema.attr(names.DTYPES, string_list=[t.dtype for t in layer.params])]
        prev = backward_node[i] = add(f"backward:{layer.name}", "COMP_NODE", [prev], backward[i],
                                      [*_layer_attrs(layer, "backward"), *params])
        while k < len(buckets) and launch_at[k] == i:
            b = buckets[k]
            last_coll = add(f"allreduce:bucket{k}", "COMM_COLL_NODE", [backward_node[ready[k]], last_coll],
                            attrs=[schema.attr("comm_type", int64_val=schema.COLLECTIVE_TYPES["ALL_REDUCE"]),
                                   schema.attr("comm_size", int64_val=b.nbytes),
                                   schema.attr(names.TENSORS, string_list=list(b.tensors))])
            k += 1
    add("optimizer", "COMP_NODE", [prev, last_coll], optimizer,
        [schema.attr(names.PHASE, string_val="optimizer"),
         schema.attr(names.SAMPLES, double_list=list(trace.optimizer_s)),
         schema.attr(names.HOST, double_list=list(trace.host_s))])
    return nodes


def _layer_attrs(layer, phase: str) -> list:
    return [schema.attr(names.LAYER, string_val=layer.name), schema.attr(names.PHASE, string_val=phase),
            schema.attr(names.SAMPLES, double_list=list(getattr(layer, f"{phase}_s")))]


def _metadata(exp):
    """The GlobalMetadata: Chakra's version and simfog's schema, and the trace's fields but its layers and step
    times (those ride on the nodes)."""
    d = exp.workload.trace.to_dict()
    for key in ("layers", "optimizer_s", "host_s"):
        d.pop(key, None)
    experiment = {"source": exp.source, "ranks": exp.ranks, "algorithm": exp.comm.algorithm, "merge": exp.comm.merge,
                  "collective": exp.comm.collective}
    return schema.GlobalMetadata(version=schema.WRITTEN_VERSION, attr=[
        schema.attr("schema", string_val=names.SIMFOG_SCHEMA),
        schema.attr(names.TRACE, string_val=json.dumps(d, sort_keys=True)),
        schema.attr("simfog.experiment", string_val=json.dumps(experiment, sort_keys=True))])


def _notes(exp) -> list[str]:
    """What simfog simulates for `exp` that the exported traces do not hold."""
    notes = []
    trace, compute = exp.workload.trace, exp.workload.compute
    if compute != "mean" and trace.samples > (len(set(trace.sample_ranks)) or 1):
        notes.append(f'compute = "{compute}": simfog draws each rank\'s layer times per iteration from '
                     f"{trace.samples} samples; the traces hold each layer's mean (ASTRA-sim replays one duration)")
    h = exp.heterogeneity
    if h.straggler_rate and h.straggler_delay_s:
        notes.append("stragglers (heterogeneity.straggler_rate) are drawn per run: not in the traces")
    oh = exp.overheads()
    if oh.any:
        notes.append("per-bucket launch overhead, bucket copies and the backward slowdown beside a collective "
                     "([comm] overheads) are not in the traces: ASTRA-sim has no work on the communication stream")
    return notes


def _write(folder: Path, contents: dict, astra, manifest: dict, force: bool) -> None:
    """Every file into a hidden folder beside `folder`, renamed into place at the end (replacing an old one when
    `force`): a failure leaves nothing."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    try:
        for data, ranks in contents.items():
            first = tmp / f"workload.{ranks[0]}.et"
            first.write_bytes(data)
            for rank in ranks[1:]:
                try:
                    os.link(first, tmp / f"workload.{rank}.et")
                except OSError:  # no hard links here: a copy
                    shutil.copyfile(first, tmp / f"workload.{rank}.et")
        (tmp / "network.yml").write_text(astra.network_yaml())
        (tmp / "system.json").write_text(json.dumps(astra.system(), indent=1) + "\n")
        (tmp / "memory.json").write_text(json.dumps(astra.memory(), indent=1) + "\n")
        (tmp / "export.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if os.path.lexists(folder):
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".old", dir=folder.parent))
            os.replace(folder, old / "x")
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    except OSError as e:
        raise ConfigError("-o", str(folder), f"a folder that can be written ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
