"""MG-WFBP / B-Caffe layer-wise logs (`tmp<N>comm.log`) -> ModelTrace, with the measured communication as extra.

Each line is printed by B-Caffe's `DistManager::print_overheads()` (hclhkbu/B-Caffe `src/caffe/distributed.cpp`):
`[param_id, #elements, compute_us, comm_us(, merged_us)]`, one line per learnable blob in forward order; a
file holds one or two dumps of all blobs. What the columns mean and which dump to use, read from that source and
checked on the authors' published logs, give these rules:

- compute/comm come from the first dump whose compute column is not all zero (older builds printed a dump of
  zeros before measuring); merged_us from the last dump (it is filled at the end of training);
- `compute_us` is the owning layer's backward time, repeated on each of its blobs: consecutive blobs with the
  same value form one layer (GoogLeNet: weight + bias), and the value is counted once;
- `comm_us` is the time of one reduction bucket, written on the bucket's lowest param id; the blobs after it
  with 0 belong to the same bucket.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from simfog import files
from simfog.errors import ConfigError
from simfog.trace import Layer, Measurement, ModelTrace, NetworkTrace, Provenance, Tensor

EXPECTED = ("an MG-WFBP/B-Caffe layer-wise log (glog lines 'distributed.cpp:...] [param_id, elements, "
            "compute_us, comm_us(, merged_us)]')")
_LINE = re.compile(r"^I(\d\d)(\d\d) (\d\d:\d\d:\d\d)\.\d+\s+\d+\s+distributed\.cpp:\d+\]\s*\[([^\]]*)\]")
_NODES = re.compile(r"tmp(\d+)o?comm")


def _googlenet() -> list[tuple[str, int, int]]:
    """(layer, weight elements, output channels) of Caffe's bvlc_googlenet train_val.prototxt, in layer order
    (the auxiliary classifiers loss1/loss2 come right after inception_4a/4d). Used only to name the layers, and
    only when every weight count in the log matches."""
    out = [("conv1/7x7_s2", 3 * 64 * 49, 64), ("conv2/3x3_reduce", 64 * 64, 64), ("conv2/3x3", 64 * 192 * 9, 192)]
    inception = [("3a", 192, (64, 96, 128, 16, 32, 32)), ("3b", 256, (128, 128, 192, 32, 96, 64)),
                 ("4a", 480, (192, 96, 208, 16, 48, 64)), ("4b", 512, (160, 112, 224, 24, 64, 64)),
                 ("4c", 512, (128, 128, 256, 24, 64, 64)), ("4d", 512, (112, 144, 288, 32, 64, 64)),
                 ("4e", 528, (256, 160, 320, 32, 128, 128)), ("5a", 832, (256, 160, 320, 32, 128, 128)),
                 ("5b", 832, (384, 192, 384, 48, 128, 128))]
    for name, cin, (c1, r3, c3, r5, c5, pp) in inception:
        p = f"inception_{name}/"
        out += [(p + "1x1", cin * c1, c1), (p + "3x3_reduce", cin * r3, r3), (p + "3x3", r3 * c3 * 9, c3),
                (p + "5x5_reduce", cin * r5, r5), (p + "5x5", r5 * c5 * 25, c5), (p + "pool_proj", cin * pp, pp)]
        if name in ("4a", "4d"):
            aux, cin_aux = ("loss1", 512) if name == "4a" else ("loss2", 528)
            out += [(f"{aux}/conv", cin_aux * 128, 128), (f"{aux}/fc", 2048 * 1024, 1024),
                    (f"{aux}/classifier", 1024 * 1000, 1000)]
    return out + [("loss3/classifier", 1024 * 1000, 1000)]


def _dumps(path: str) -> tuple[list[list[tuple]], str]:
    """The dumps (lists of rows (param_id, elements, compute_us, comm_us, merged_us|None)) and the first stamp."""
    dumps, first = [], None
    for number, line in enumerate(files.read_text(path).split("\n"), 1):
        m = _LINE.match(line.strip())
        if m is None:
            continue
        first = first or f"{m.group(1)}-{m.group(2)}T{m.group(3)}"
        try:
            fields = [float(x) for x in m.group(4).split(",")]
        except ValueError:
            raise ConfigError(f"line {number}", m.group(4), EXPECTED, source=path) from None
        if len(fields) not in (4, 5) or fields[0] != int(fields[0]) or fields[1] < 1 or min(fields[2:]) < 0:
            raise ConfigError(f"line {number}", m.group(4), EXPECTED, source=path)
        pid = int(fields[0])
        if pid == 0:
            dumps.append([])
        if not dumps or pid != len(dumps[-1]):
            raise ConfigError(f"line {number}", f"param_id {pid}", "param ids 0, 1, 2, ... in each dump",
                              source=path)
        dumps[-1].append((pid, int(fields[1]), fields[2], fields[3], fields[4] if len(fields) == 5 else None))
    if not dumps:
        hint = " (this looks like an OSU log: use kind 'osu')" if "# OSU" in files.read_text(path) else ""
        raise ConfigError("format", "(no distributed.cpp rows)", EXPECTED + hint, source=path)
    if len({len(d) for d in dumps}) > 1 or len({tuple(r[1] for r in d) for d in dumps}) > 1:
        raise ConfigError("dumps", [len(d) for d in dumps], "dumps of the same blobs (same count and sizes)",
                          source=path)
    return dumps, first


def _buckets(rows: list[tuple], column: int, names: list[str]) -> list[dict]:
    """Reduction buckets: a non-zero time on blob i covers i and the following blobs that show 0."""
    out = []
    for pid, elements, *values in rows:
        t = values[column - 2]
        if t > 0 or not out:
            out.append({"params": [], "elements": 0, "time_s": t * 1e-6 if t > 0 else None})
        out[-1]["params"].append(names[pid])
        out[-1]["elements"] += elements
    for b in out:
        b["bytes"] = 4 * b["elements"]  # MPI_FLOAT
    return out


def import_mgwfbp(path, *, nodes: int | None = None, batch_size: int = 64,
                  forward_per_backward: float | None = None) -> ModelTrace:
    """MG-WFBP/B-Caffe per-layer log -> ModelTrace: backward time per layer, parameter blobs, comm as extra.

    The log has no forward times: forward_s is 0 unless `forward_per_backward` (forward = ratio x backward, an
    estimate, marked so) is given. `nodes` defaults to N in the file name `tmp<N>comm.log` (inferred).
    batch_size 64 is what the authors' simulator uses for these traces (inferred, see provenance notes).
    Extra key `mgwfbp` holds the measured reduction buckets (seconds, bytes); `network_trace_of` turns them into
    a NetworkTrace. Raises ConfigError naming the file for other logs or bad options.
    """
    path = str(path)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError("batch_size", batch_size, "an integer >= 1", source=path)
    if forward_per_backward is not None and (isinstance(forward_per_backward, bool) or not isinstance(
            forward_per_backward, (int, float)) or not 0 <= forward_per_backward < math.inf):
        raise ConfigError("forward_per_backward", forward_per_backward, "a number >= 0 (e.g. 0.5)", source=path)
    dumps, stamp = _dumps(path)
    used = next((i for i, d in enumerate(dumps) if any(r[2] > 0 for r in d)), None)
    if used is None:
        raise ConfigError("compute_us", "(all zero)", "a dump with measured compute times", source=path)
    rows, last = dumps[used], dumps[-1]
    groups: list[list[tuple]] = []
    for r in rows:  # consecutive blobs with the same backward time belong to one layer
        if groups and groups[-1][-1][2] == r[2]:
            groups[-1].append(r)
        else:
            groups.append([r])
    table = _googlenet()
    googlenet = len(table) == len(groups) and all(   # biases are aligned up to a multiple of 64 elements
        len(g) == 2 and g[0][1] == w and g[1][1] == -(-c // 64) * 64
        for g, (_, w, c) in zip(groups, table, strict=True))
    if nodes is None:
        m = _NODES.search(Path(path).name)
        nodes = int(m.group(1)) if m else None
    elif not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ConfigError("nodes", nodes, "an integer >= 1", source=path)
    layers, names = [], [""] * len(rows)
    for i, g in enumerate(groups):
        lname = table[i][0] if googlenet else f"layer{i:02d}"
        suffixes = ["weight", "bias"] if len(g) == 2 else ["weight"] if len(g) == 1 else [
            f"param{k}" for k in range(len(g))]
        params = tuple(Tensor(f"{lname}.{s}", r[1]) for s, r in zip(suffixes, g, strict=True))
        for t, r in zip(params, g, strict=True):
            names[r[0]] = t.name
        bwd = g[0][2] * 1e-6
        layers.append(Layer(lname, ((forward_per_backward or 0.0) * bwd,), (bwd,), params))
    extra = {"nodes": nodes, "dumps": len(dumps), "dump_used": used + 1, "bucket_timer": (
        "host-staged MPI_Allreduce: GPU->pinned host copy, MPI_Allreduce(MPI_FLOAT, MPI_SUM), scaling, copy back "
        "to every local GPU"), "comm_buckets": _buckets(rows, 3, names)}
    if last[0][4] is not None and any(r[4] > 0 for r in last):
        extra["merged_buckets"] = _buckets(last, 4, names)
    est = forward_per_backward is not None
    notes = (
        f"Imported by `simfog import mgwfbp {Path(path).name}` from B-Caffe's print_overheads() log (MG-WFBP, "
        f"Shi et al., INFOCOM 2019). Dump {used + 1} of {len(dumps)} used for compute/comm; merged times from "
        f"dump {len(dumps)}. backward_s = compute_us of each layer, counted once per layer (weight and bias rows "
        f"repeat it), from one iteration (not an average). The log has no forward times: forward_s = "
        + (f"{forward_per_backward} x backward_s (ESTIMATED, given ratio)." if est else "0 (unknown, not measured).")
        + " Gradients become ready from the last blob to the first (Caffe backward order). Parameter sizes are "
        "Caffe's aligned counts (biases rounded up to a multiple of 64 elements). "
        + ("Layer names are bvlc_googlenet's, matched by every weight count (inferred). " if googlenet else
           "Layer names are positional. ")
        + f"Batch size {batch_size}: inferred (the authors' simulator uses 64), not in the log. Nodes: "
        + (f"{nodes} from the file name (inferred). " if nodes else "unknown. ")
        + "Date: glog stamp without a year, host-local time. GPU: unknown (the authors' script says K80, "
        "unverified).")
    return ModelTrace(
        model="googlenet" if googlenet else Path(path).stem, batch_size=batch_size, dtype="float32",
        device={"kind": "gpu", "name": "unknown (K80 per the authors' scripts, unverified)", "nodes": nodes},
        software={"framework": "B-Caffe (NVCaffe fork)", "communication": "MPI over 10GbE (per the paper)"},
        provenance=Provenance(command="B-Caffe DistManager::print_overheads()", date=f"{stamp} (year unknown)",
                              host="unknown", source="imported", estimated=est, notes=notes),
        layers=tuple(layers), grad_ready_order=tuple(reversed(names)), optimizer_s=(), extra={"mgwfbp": extra})


def network_trace_of(trace: ModelTrace, *, merged: bool = False) -> NetworkTrace:
    """The measured buckets of an imported MG-WFBP trace as a NetworkTrace (allreduce, ranks = nodes = the
    trace's node count, one sample each). `merged` picks the merged (dump 2) times. Raises ConfigError when the
    trace has no such data or no node count."""
    data = trace.extra.get("mgwfbp")
    key = "merged_buckets" if merged else "comm_buckets"
    if not isinstance(data, dict) or key not in data:
        raise ConfigError(f"mgwfbp.{key}", "(missing)", "a trace imported with `simfog import mgwfbp`")
    if not data.get("nodes"):
        raise ConfigError("mgwfbp.nodes", data.get("nodes"), "a node count (import with nodes=N)")
    n = data["nodes"]
    ms = tuple(Measurement("allreduce", n, n, b["bytes"], (b["time_s"],)) for b in data[key] if b["time_s"])
    return NetworkTrace("mpi", "tcp", trace.provenance, ms, extra={"note": data["bucket_timer"]})
