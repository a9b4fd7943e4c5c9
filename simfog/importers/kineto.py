"""PyTorch profiler (Kineto) trace of data-parallel training -> ModelTrace (layers, buckets, comm summary). Over 400
lines because the attribution below is one pass over the trace's events (forward ops, backward nodes, DDP buckets,
host time); the event reading itself is in kineto_events and the per-rank folders in kineto_ranks.

How a trace becomes layers (the attribution, in order of preference):
1. Forward ops are the top-level operators of the training thread between an iteration's start and its first
   backward node, outside optimizer annotations and communication. An op that creates an autograd node (its
   `Sequence number` is the one a backward node carries; the last op with that number created it) is a
   *layer op*, unless it is a pure view (t, view, reshape, ...).
2. Ops inside the same innermost nn.Module call (python_function `nn.Module: X` or `..._call_impl` events,
   recorded with with_stack/with_modules) form one layer; ops outside modules form one layer per layer op.
   Ops without a layer op (views, DDP buffer sync, BN's num_batches_tracked) join the next layer.
3. Backward nodes (`autograd::engine::evaluate_function: XBackward`) go to the layer of the forward op with
   the same sequence number (PyTorch's profiler links them so: torch/csrc/autograd/function.h). AccumulateGrad
   nodes, and the DDP hooks inside them, go to the layer of the node that ran just before them (the autograd
   engine runs AccumulateGrad as soon as its input is ready).
Times: the GPU work (kernels, memcpy, memset) launched from an op when the trace has any, else the CPU
duration of the op; communication is excluded from both.
Parameters: from AccumulateGrad's recorded shapes (record_shapes=True), else one pseudo-tensor per DDP
bucket (the allreduces issued in backward), attached to the layer whose backward issued it (an ImporterWarning
says so).
Host time (ModelTrace.host_s): each iteration's span minus that compute minus its exposed communication (the
gradient collectives still running after backward's last op or GPU kernel ended). A launch-bound GPU trace spends
most of its step there; the simulator adds it to the step, so a replay at the trace's own layout takes the
measured step (tests: within 5 % on the A100 ResNet-50 trace).
Collectives other than data parallelism's (alltoall, send/recv, large allgather / reduce_scatter) are named in an
ImporterWarning. `import_kineto_comm` / `network_trace_of` turn the collectives into a NetworkTrace.
A folder of traces, one per rank, imports all ranks at once (kineto_ranks): one rank's collective durations
include its waits for slower peers, so only the folder gives transfer times and per-rank compute.
"""

from __future__ import annotations

import bisect
import datetime
from collections import Counter
from dataclasses import replace
from pathlib import Path

from simfog import units
from simfog.errors import ConfigError
from simfog.importers import kineto_events as ke
from simfog.importers.logs import warn
from simfog.progress import bar as progress_bar
from simfog.trace import BACKENDS, DTYPE_BYTES, Layer, Measurement, ModelTrace, NetworkTrace, Provenance, Tensor

CLOCKS = ("auto", "gpu", "cpu")
# Collectives that plain data parallelism (DDP: gradient allreduce, buffer broadcast) does not issue: model or
# pipeline parallelism (alltoall, send/recv), sharded training or embedding exchange (large allgather /
# reduce_scatter). Allgathers and reduce_scatters under LARGE_BYTES are taken as metadata exchanges.
NOT_DATA_PARALLEL = ("alltoall", "sendrecv", "allgather", "reduce_scatter")
LARGE_BYTES = 1 << 20
_VIEWS = {"aten::t", "aten::view", "aten::reshape", "aten::flatten", "aten::transpose", "aten::permute",
          "aten::expand", "aten::squeeze", "aten::unsqueeze", "aten::contiguous", "aten::as_strided",
          "aten::slice", "aten::select", "aten::narrow", "aten::detach", "aten::_reshape_alias", "aten::alias"}
# Ops whose first input is the activation batch (to read the batch size from record_shapes).
_BATCH_OPS = ("aten::conv", "aten::linear", "aten::batch_norm", "aten::layer_norm", "aten::group_norm",
              "aten::relu", "aten::max_pool", "aten::avg_pool", "aten::matmul")


def _bad(path, field, value, allowed):
    return ConfigError(field, value, allowed, source=path)


class _Iteration:
    """One iteration: forward groups (layers), backward per layer, optimizer, grads and buckets."""

    def __init__(self, trace: ke.Trace, main, window, use_gpu: bool, comms: list):
        self.name, self.start, self.end = window
        cost = (lambda e: e.gpu_us) if use_gpu else (lambda e: e.dur - sum(
            s.dur for s in e.subtree if s.comm and not (s.parent and s.parent.comm)))
        inside = [e for e in trace.tops() if self.start <= e.ts <= self.end]
        bwd = [e for e in inside if e.name.startswith("autograd::engine::evaluate_function")]
        if not bwd:
            raise ConfigError("backward", f"(none in {self.name})", "an iteration with a backward pass")
        first_bwd = bwd[0].ts
        opt = [a for a in trace.annotations("Optimizer.") if a.thread == main and self.start <= a.ts <= self.end]
        in_opt = lambda e: any(a.ts <= e.ts <= a.end for a in opt)
        fwd = [e for e in inside if e.thread == main and e.ts < first_bwd and not in_opt(e) and not e.comm]
        self.optimizer_us = sum(cost(e) for e in inside if e.thread == main and in_opt(e) and not e.comm)
        creator = {}
        for i, top in enumerate(fwd):
            for s in top.subtree:
                if s.seq is not None:
                    creator[s.seq] = i
        wanted = {e.seq for e in bwd if e.seq is not None}
        layer_ops = {i for s, i in creator.items() if s in wanted and fwd[i].name not in _VIEWS}
        self.groups = self._group(fwd, layer_ops)
        if not self.groups:
            raise ConfigError("forward", f"(no layer ops in {self.name})", "forward ops that autograd records")
        group_of = {i: g for g, (_, members) in enumerate(self.groups) for i in members}
        self.names = self._names(fwd, layer_ops)
        self.forward_us = [sum(cost(fwd[i]) for i in members) for _, members in self.groups]
        self.backward_us = [0.0] * len(self.groups)
        self.grads: list[tuple[int, int | None, str | None]] = []   # (layer, elements, dtype) in ready order
        self.unattributed = 0
        current = len(self.groups) - 1
        layer_of_node = {}
        for e in bwd:
            if "AccumulateGrad" in e.name:
                leaf = next((s for s in e.subtree if s.name == "torch::autograd::AccumulateGrad"), e)
                self.grads.append((current, ke.elements_of(ke.first_arg(leaf.args, "Input Dims")),
                                   ke.DTYPES.get(str(ke.first_arg(leaf.args, "Input type")).lower())))
            elif e.seq in creator:
                current = group_of[creator[e.seq]]
            else:
                self.unattributed += 1
            layer_of_node[id(e)] = current
            self.backward_us[current] += cost(e)
        times = [e.ts for e in bwd]
        self.comms, self.buckets = [], []
        for c in comms:
            if not self.start <= c.issue.ts <= self.end:
                continue
            self.comms.append(c)
            if c.collective == "allreduce" and c.issue.ts >= first_bwd and not in_opt(c.issue):
                k = bisect.bisect_right(times, c.issue.ts) - 1
                layer = layer_of_node.get(id(c.issue.top), layer_of_node[id(bwd[k])] if k >= 0 else current)
                self.buckets.append((layer, c))
        # The step's critical path: compute (as attributed above) plus the communication the step waited for,
        # i.e. the gradient collectives still running after backward's last work (CPU op, or GPU kernel) ended.
        # The rest of the step is host time: data loading, launch gaps, Python between ops.
        bwd_end = max(e.end for e in bwd)
        if use_gpu:
            bwd_end = max([bwd_end] + [e.gpu_end for e in bwd if e.gpu_end is not None])
        done = [c.start_us + c.duration_us for _, c in self.buckets if c.duration_us is not None]
        self.exposed_us = min(max(0.0, max(done) - bwd_end), max(0.0, self.end - bwd_end)) if done else 0.0
        self.compute_us = sum(self.forward_us) + sum(self.backward_us) + self.optimizer_us
        self.host_us = max(0.0, (self.end - self.start) - self.compute_us - self.exposed_us)
        self.batch = None   # the first layer op that takes the activation batch as its first input
        for i in sorted(layer_ops):
            dims = ke.first_arg(fwd[i].args, "Input Dims")
            if fwd[i].name.startswith(_BATCH_OPS) and isinstance(dims, list) and dims and ke.is_dim(dims[0]):
                self.batch = dims[0]
                break

    @staticmethod
    def _group(fwd, layer_ops) -> list[tuple[object, list[int]]]:
        groups: list[list] = []   # [module key, member indices, has layer op]
        for i, e in enumerate(fwd):
            key = id(e.module) if e.module is not None else None
            if not groups or groups[-1][0] != key or (key is None and groups[-1][2]):
                groups.append([key, [], False])
            groups[-1][1].append(i)
            groups[-1][2] |= i in layer_ops
        out, pending = [], []
        for key, members, has_layer in groups:   # groups without a layer op join the next group
            if has_layer:
                out.append((key, pending + members))
                pending = []
            else:
                pending += members
        if pending and out:
            out[-1] = (out[-1][0], out[-1][1] + pending)
        return out

    def _names(self, fwd, layer_ops) -> list[str]:
        names, seen = [], Counter()
        for _, members in self.groups:
            first = fwd[next(i for i in members if i in layer_ops)]
            if first.module is not None and first.module.name.startswith("nn.Module: "):
                names.append(first.module.name.removeprefix("nn.Module: "))   # torch's own instance label
                continue
            base = first.name.split("::")[-1].rstrip("_")
            names.append(f"{base}_{seen[base]}")
            seen[base] += 1
        if len(set(names)) < len(names):   # module labels repeat when one module instance runs twice
            names = [f"{n}#{k}" for k, n in enumerate(names)]
        return names


def _tensor_names(layer: str, grads: list) -> list[str]:
    """weight/bias for one tensor, or a pair whose first (in forward order) is the larger (linear, conv);
    param<k> otherwise (e.g. batch norm's two equal vectors)."""
    if len(grads) == 1:
        return [f"{layer}.weight"]
    if len(grads) == 2 and grads[0][1] > grads[1][1]:
        return [f"{layer}.weight", f"{layer}.bias"]
    return [f"{layer}.param{k}" for k in range(len(grads))]


def check_options(path: str, *, clock: str = "auto", skip: int = 0, step_time: str | None = None) -> float | None:
    """Raise ConfigError naming `path` for a clock not in CLOCKS, a skip that is not an integer >= 0 or a step time
    that is not a time with its unit; returns the step time in seconds (None when not given)."""
    if clock not in CLOCKS:
        raise _bad(path, "clock", clock, f"one of {', '.join(CLOCKS)}")
    if not isinstance(skip, int) or isinstance(skip, bool) or skip < 0:
        raise _bad(path, "skip", skip, "an integer >= 0")
    if step_time is None:
        return None
    seconds = units.parse(step_time, "time", field="step_time", source=path)
    if seconds <= 0:
        raise _bad(path, "step_time", step_time, "a time > 0 with its unit, e.g. 22ms")
    return seconds


def import_kineto(path, *, model: str | None = None, batch_size: int | None = None, clock: str = "auto",
                  skip: int = 0, step_time: str | None = None) -> ModelTrace:
    """PyTorch profiler (Kineto) JSON of DDP training -> ModelTrace, one sample per iteration; comm in extra.
    A folder of traces, one per rank (as HTA's TraceAnalysis reads it), imports every rank (simfog.importers.import_file
    hands a folder to kineto_ranks.import_folder).

    Iterations: ProfilerStep#N spans, else spans ending at each Optimizer.step; the first `skip` are dropped.
    `clock`: "gpu" sums the GPU work each op launched, "cpu" the op durations, "auto" picks gpu when the trace
    has GPU activity. `batch_size` is read from the first layer's input shape when shapes were recorded, else
    must be given. Extra key `kineto`: iterations, every collective (elements, bytes, issue/start/duration in
    seconds from the iteration start), DDP buckets per iteration. `step_time` ("22ms"): the step as it runs
    without the profiler, when known (a throughput log gives it): each iteration's host time becomes that step
    minus its compute and exposed communication, instead of the profiled span's remainder, which the profiler's
    own overhead lengthens (record_shapes, with_stack: on an H200, ResNet-50 batch 32 stepped in 34-37 ms
    profiled and 20-24 ms not). Raises ConfigError naming the file for a truncated or non-Kineto file, a trace
    without iterations/backward, or bad options.
    """
    path = str(path)
    step_s = check_options(path, clock=clock, skip=skip, step_time=step_time)
    data = ke.load(path)
    return import_loaded(path, data, ke.Trace(data, path), model=model, batch_size=batch_size, clock=clock,
                         skip=skip, step_s=step_s)


# A GPU trace whose host time is more than this share of its profiled step is warned about (without step_time).
HOST_SHARE_WARNING = 0.3


def import_loaded(path: str, data: dict, trace: ke.Trace, *, model, batch_size, clock, skip,
                  step_s: float | None = None) -> ModelTrace:
    """import_kineto of a file already read (`data`) and parsed (`trace`); options already checked (`step_s`: the
    step time in seconds, check_options' result)."""
    main = trace.main_thread()
    windows = trace.windows(main)
    if skip >= len(windows):
        raise _bad(path, "skip", skip, f"fewer than the {len(windows)} iterations in the trace")
    has_gpu = any(t.gpu_us > 0 for t in trace.tops())
    use_gpu = has_gpu if clock == "auto" else clock == "gpu"
    if use_gpu and not has_gpu:
        raise _bad(path, "clock", clock, "cpu: the trace has no GPU activity linked to operators")
    comms = ke.collectives(trace)
    _warn_not_data_parallel(path, comms, windows[skip:])
    try:
        # A large trace has many iterations of thousands of events each: a bar (on a terminal only) over them.
        its = [_Iteration(trace, main, w, use_gpu, comms)
               for w in progress_bar(windows[skip:], desc="import kineto", unit="iteration")]
    except ConfigError as e:
        raise e.in_file(path) from None
    ref = its[-1]   # the last iteration: DDP has rebuilt its buckets by then
    for it in its:
        if it.names != ref.names:
            raise _bad(path, "layers", f"{len(it.names)} in {it.name}, {len(ref.names)} in {ref.name}",
                       "the same forward layers in every iteration (use skip=N to drop different ones)")
    by_layer: dict[int, list] = {}
    shapes = bool(ref.grads) and all(n is not None for _, n, _ in ref.grads)
    if shapes:
        for k, (layer, n, dtype) in enumerate(ref.grads):
            by_layer.setdefault(layer, []).append((k, n, dtype or "float32"))
    elif ref.buckets and all(c.elements for _, c in ref.buckets):
        warn(path, f"parameters are NOT the model's tensors: the trace has no AccumulateGrad shapes "
             f"(record_shapes=False), so each of the {len(ref.buckets)} DDP buckets of {ref.name} becomes one "
             "pseudo-tensor on the layer whose backward issued it")
        for k, (layer, c) in enumerate(ref.buckets):
            by_layer.setdefault(layer, []).append((k, c.elements, c.dtype or "float32"))
    else:
        raise _bad(path, "parameters", "(sizes not recorded)",
                   "a trace with record_shapes=True or with DDP allreduce sizes (record_param_comms / c10d Input Dims)")
    layers, ready = [], {}
    for i, name in enumerate(ref.names):
        grads = list(reversed(by_layer.get(i, [])))   # ready order is backward; forward order is its reverse
        tnames = _tensor_names(name, grads) if shapes else [f"bucket{k}" for k, _, _ in grads]
        params = tuple(Tensor(t, n, d) for t, (_, n, d) in zip(tnames, grads, strict=True))
        ready.update({k: t for t, (k, _, _) in zip(tnames, grads, strict=True)})
        layers.append(Layer(name, tuple(it.forward_us[i] * 1e-6 for it in its),
                            tuple(it.backward_us[i] * 1e-6 for it in its), params))
    batch = batch_size if batch_size is not None else ref.batch
    if batch is None:
        raise _bad(path, "batch_size", "(not in the trace: no input shapes recorded)", "pass batch_size=N")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise _bad(path, "batch_size", batch, "an integer >= 1")
    profiled_host_s = [it.host_us * 1e-6 for it in its]
    if step_s is not None:
        for it in its:
            it.host_us = max(0.0, step_s * 1e6 - it.compute_us - it.exposed_us)
    else:
        share = sum(it.host_us for it in its) / sum(it.end - it.start for it in its)
        if use_gpu and share > HOST_SHARE_WARNING:
            span_ms = sum(it.end - it.start for it in its) / len(its) / 1e3
            warn(path, f"host time is {share:.0%} of the profiled step (mean "
                 f"{sum(profiled_host_s) / len(its) * 1e3:.3g} of {span_ms:.3g} ms; "
                 "GPU compute and exposed communication are the rest). The profiler's own overhead (record_shapes, "
                 "with_stack, with_modules) lengthens it, so a replay takes the profiled step: if the step runs "
                 "faster without the profiler, pass step_time=<that step> (-s step_time=22ms)")
    trace_out = _assemble(path, data, trace, its, layers, tuple(ready[k] for k in sorted(ready)), shapes,
                          use_gpu, model, batch, batch_size is None)
    if step_s is not None:
        extra = dict(trace_out.extra)
        extra["kineto"] = {**extra["kineto"], "profiled_host_s": profiled_host_s, "step_time_s": step_s}
        notes = (trace_out.provenance.notes + f" host_s from the step without the profiler given at import "
                 f"(step_time {step_s * 1e3:.4g} ms): that step minus each iteration's compute and exposed "
                 f"communication; under the profiler it was {sum(profiled_host_s) / len(its) * 1e3:.3g} ms per step.")
        trace_out = replace(trace_out, extra=extra, provenance=replace(trace_out.provenance, notes=notes))
    return trace_out


def _warn_not_data_parallel(path: str, comms: list, windows) -> None:
    """An ImporterWarning naming the collectives in the imported iterations that data-parallel training does not
    issue (NOT_DATA_PARALLEL; allgather / reduce_scatter from LARGE_BYTES or of unknown size): the ModelTrace then
    models only the gradient allreduces, and a replay misses the rest."""
    found: dict[str, list] = {}
    for c in comms:
        if c.collective not in NOT_DATA_PARALLEL or not any(s <= c.issue.ts <= e for _, s, e in windows):
            continue
        nbytes = c.elements * DTYPE_BYTES[c.dtype] if c.elements and c.dtype in DTYPE_BYTES else None
        if c.collective in ("allgather", "reduce_scatter") and nbytes is not None and nbytes < LARGE_BYTES:
            continue
        found.setdefault(c.collective, []).append(nbytes)
    if found:
        what = "; ".join(
            f"{k} x{len(v)}" + (f" (largest {max(b for b in v if b is not None):,} bytes)"
                                if any(b is not None for b in v) else " (size not recorded)")
            for k, v in found.items())
        warn(path, f"not plain data-parallel training: the trace has {what} besides gradient allreduces. "
             "The model trace keeps only the DDP buckets (allreduces issued in backward); a simulation of it "
             "does not include these collectives")


def _device(data: dict, trace: ke.Trace, use_gpu: bool) -> dict:
    if not use_gpu:
        return {"kind": "cpu", "name": str(data.get("host_name", "unknown")), "threads": "unknown"}
    ids = Counter(g.args.get("device") for g in trace.gpu if "device" in g.args)
    dev = ids.most_common(1)[0][0] if ids else 0
    props = next((p for p in data.get("deviceProperties") or [] if p.get("id") == dev), {})
    return {"kind": "gpu", "name": props.get("name", "unknown"), "index": dev,
            "memory_bytes": props.get("totalGlobalMem"),
            "compute_capability": f"{props['computeMajor']}.{props['computeMinor']}" if props else None}


def _date(data: dict, trace: ke.Trace) -> str:
    t0 = min((e.ts for e in trace.cpu), default=0.0)
    base = data.get("baseTimeNanoseconds")
    seconds = base / 1e9 + t0 / 1e6 if isinstance(base, (int, float)) else t0 / 1e6 if t0 > 1e14 else None
    if seconds is None:
        return "unknown"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _assemble(path, data, trace, its, layers, ready, shapes, use_gpu, model, batch, batch_inferred) -> ModelTrace:
    ref = its[-1]
    info = data.get("distributedInfo") or {}
    starts = {id(it): it.start for it in its}
    rel = lambda it, us: None if us is None else round((us - starts[id(it)]) * 1e-6, 9)
    comms = [{"iteration": k, "collective": c.collective, "elements": c.elements, "dtype": c.dtype,
              "bytes": c.elements * DTYPE_BYTES[c.dtype] if c.elements and c.dtype in DTYPE_BYTES else None,
              "group_size": c.group_size, "issue_s": rel(it, c.issue.ts), "start_s": rel(it, c.start_us),
              "duration_s": None if c.duration_us is None else c.duration_us * 1e-6}
             for k, it in enumerate(its) for c in it.comms]
    dtypes = Counter(c.dtype for _, c in ref.buckets if c.dtype) or Counter(d for _, _, d in ref.grads if d)
    modules = any(e.module is not None for e in trace.cpu if e.cat == "cpu_op")
    params_total = sum(t.elements for layer in layers for t in layer.params)
    bucket_total = sum(c.elements or 0 for _, c in ref.buckets)
    missing = sum(1 for c in comms if c["duration_s"] is None)
    coverage = sum(sum(it.forward_us) + sum(it.backward_us) + it.optimizer_us for it in its) / sum(
        it.end - it.start for it in its)
    notes = (
        f"Imported by `simfog import kineto {Path(path).name}` from a PyTorch profiler trace (rank "
        f"{info.get('rank', '?')} of {info.get('world_size', '?')}, backend {info.get('backend', '?')}). "
        f"{len(its)} iterations ({', '.join(it.name for it in its)}). Layers: top-level forward ops grouped by "
        + ("innermost nn.Module call (python stack in the trace)" if modules else
           "autograd-recording op (no module hierarchy in the trace: layer = op such as conv2d, batch_norm, relu)")
        + "; backward nodes attributed by autograd sequence number, AccumulateGrad/DDP hooks to the layer before. "
        + ("Times: GPU kernel/memcpy/memset durations launched by each layer (CPU launch overhead and GPU idle gaps "
           "not counted)" if use_gpu else "Times: CPU durations of each layer's operators")
        + ", communication excluded. optimizer_s: ops inside Optimizer.step/zero_grad annotations. "
        + ("Parameters: one tensor per AccumulateGrad, sizes from its recorded shape; names weight/bias/param<k> "
           "are inferred. " if shapes else
           "Parameters: NOT the model's tensors (AccumulateGrad shapes are not in the trace): one pseudo-tensor "
           f"per DDP bucket of {ref.name}, on the layer whose backward issued it; per-tensor sizes are unknown. ")
        + f"Sum of parameter elements {params_total}; sum of bucket elements in {ref.name} {bucket_total}. "
        + ("The bucket layout changes between iterations (DDP rebuilds its buckets after the first). "
           if len({tuple(c.elements for _, c in it.buckets) for it in its}) > 1 else "")
        + ("Batch size read from the first layer's input shape. " if batch_inferred else "Batch size given. ")
        + f"{sum(it.unattributed for it in its)} backward nodes had no forward op (attributed to the layer before). "
        + f"Layer and optimizer times cover {coverage:.0%} of the iteration spans (the rest: "
        + ("GPU idle, e.g. waiting for CPU launches, and communication). " if use_gpu else
           "time outside operators and in communication). ")
        + f"host_s (mean {sum(it.host_us for it in its) / len(its) / 1e3:.3g} ms): each iteration's span minus that "
        "compute minus its exposed communication (the gradient collectives still running after backward's last "
        f"{'CPU op or GPU kernel' if use_gpu else 'op'} ended; mean "
        f"{sum(it.exposed_us for it in its) / len(its) / 1e3:.3g} ms): data loading, host launch gaps, Python "
        "between ops, DDP buffer broadcasts. The simulator runs it with the optimizer step (it never overlaps "
        "communication), so a replay at the trace's own layout takes the measured step. "
        + f"Communication durations include waiting for the peers (single-rank trace); {missing} of "
        f"{len(comms)} collectives have no execution record (kernel or gloo annotation) in the trace.")
    extra = {"kineto": {
        "file": Path(path).name, "rank": info.get("rank"), "world_size": info.get("world_size"),
        "host_devices": len(data.get("deviceProperties") or []),
        "backend": info.get("backend"), "clock": "gpu" if use_gpu else "cpu",
        "attribution": "nn.Module" if modules else "aten ops",
        "params_from": "AccumulateGrad shapes" if shapes else "DDP buckets",
        "iterations": [{"name": it.name, "duration_s": (it.end - it.start) * 1e-6,
                        "compute_s": it.compute_us * 1e-6, "exposed_comm_s": it.exposed_us * 1e-6,
                        "host_s": it.host_us * 1e-6,
                        "accumulate_grad": len(it.grads), "unattributed_backward": it.unattributed} for it in its],
        "buckets": [[c.elements for _, c in it.buckets] for it in its],
        "collectives": comms}}
    software = {k: str(v) for k, v in (("backend", info.get("backend")), ("nccl", info.get("nccl_version")),
                                       ("kineto_schema", data.get("schemaVersion"))) if v is not None}
    return ModelTrace(
        model=model or Path(path).name.split(".")[0], batch_size=batch,
        dtype=dtypes.most_common(1)[0][0] if dtypes else "float32",
        device=_device(data, trace, use_gpu), software=software,
        provenance=Provenance(command=f"torch.profiler trace {data.get('traceName', Path(path).name)}",
                              date=_date(data, trace), host=str(data.get("host_name", "unknown")),
                              source="imported", estimated=False, notes=notes),
        layers=tuple(layers), grad_ready_order=ready,
        optimizer_s=tuple(it.optimizer_us * 1e-6 for it in its), extra=extra,
        host_s=tuple(round(it.host_us * 1e-6, 9) for it in its))


def import_kineto_comm(path, *, nodes: int | None = None, skip: int = 0) -> NetworkTrace:
    """The collectives of a PyTorch profiler (Kineto) trace -> NetworkTrace (for `simfog calibrate`). A folder of
    traces, one per rank, gives transfer times measured across ranks, without the waits
    (kineto_ranks.import_folder_comm, through simfog.importers.import_file).

    One measurement per (collective, bytes, ranks), its samples the execution times of every such collective in
    the iterations kept (the first `skip` dropped): NCCL kernel durations, or gloo worker annotations. On a
    single-rank trace they include waiting for the peers. `nodes`: hosts the ranks ran on; by default 1 when the
    host shows at least as many GPUs as there are ranks (inferred, said in the notes), else it must be given.
    Raises ConfigError naming the file for a bad file or option, or a trace without timed collectives."""
    path = str(path)
    check_options(path, skip=skip)
    data = ke.load(path)
    trace = ke.Trace(data, path)
    windows = trace.windows(trace.main_thread())
    if skip >= len(windows):
        raise _bad(path, "skip", skip, f"fewer than the {len(windows)} iterations in the trace")
    rows = []
    for c in ke.collectives(trace):
        k = next((k for k, (_, s, e) in enumerate(windows[skip:]) if s <= c.issue.ts <= e), None)
        if k is not None:
            rows.append({"iteration": k, "collective": c.collective, "group_size": c.group_size,
                         "bytes": c.elements * DTYPE_BYTES[c.dtype] if c.elements and c.dtype in DTYPE_BYTES
                         else None, "duration_s": None if c.duration_us is None else c.duration_us * 1e-6})
    info = data.get("distributedInfo") or {}
    try:
        return _network(Path(path).name, rows, info.get("backend"), info.get("rank"), info.get("world_size"),
                        len(data.get("deviceProperties") or []), nodes, _date(data, trace),
                        str(data.get("host_name", "unknown")), len(windows) - skip)
    except ConfigError as e:
        raise e.in_file(path) from None


def network_trace_of(trace: ModelTrace, *, nodes: int | None = None) -> NetworkTrace:
    """The collectives recorded in a trace made by `simfog import kineto` (extra["kineto"]["collectives"]) as a
    NetworkTrace, as import_kineto_comm makes it from the Kineto file or folder. Raises ConfigError when the trace
    has no such data, or as import_kineto_comm."""
    k = trace.extra.get("kineto")
    if not isinstance(k, dict) or not isinstance(k.get("collectives"), list):
        raise ConfigError("kineto.collectives", "(missing)", "a trace imported with `simfog import kineto`")
    ranks = k.get("ranks")
    return _network(k.get("file", "?"), k["collectives"], k.get("backend"), ranks if ranks else k.get("rank"),
                    k.get("world_size"), k.get("host_devices") or 0, nodes, trace.provenance.date,
                    trace.provenance.host, len(k.get("iterations") or []) // max(1, len(ranks or [0])),
                    hosts=len(k["hosts"]) if k.get("hosts") else None)


def _network(name, rows, backend, rank, world_size, devices, nodes, date, host, iterations, *,
             hosts: int | None = None) -> NetworkTrace:
    """`rows` (collective, group_size, bytes, duration_s) -> NetworkTrace. `rank`: the trace's rank, or the list
    of ranks of a folder, whose durations are transfer times across ranks (kineto_ranks); `hosts`: how many
    distinct host names the folder's traces give (nodes inferred from them when not given)."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        ranks = r.get("group_size") or world_size
        if not r.get("bytes") or not r.get("duration_s") or not isinstance(ranks, int) or ranks < 2:
            continue
        nbytes = r["bytes"] * (ranks if r["collective"] == "allgather" else 1)   # allgather: the gathered output
        groups.setdefault((r["collective"], nbytes, ranks), []).append(r["duration_s"])
    if not groups:
        raise ConfigError("collectives", "(none timed)", "collectives among 2 or more ranks with a size and an "
                          "execution record (NCCL kernel or gloo annotation)")
    most = max(n for _, _, n in groups)
    if nodes is None:
        if hosts is not None:
            nodes, how = hosts, f"{hosts}, INFERRED: the rank traces name {hosts} host(s) (host_name)"
        elif devices < most:
            raise ConfigError("nodes", "(not in the trace)", f"nodes=N: on how many hosts the {most} ranks ran "
                              f"(the host shows {devices} GPU(s), so they need not all be on it)")
        else:
            nodes, how = 1, f"1, INFERRED: the host shows {devices} GPUs, enough for all {most} ranks"
    else:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= most:
            raise ConfigError("nodes", nodes, f"an integer in 1..{most} (the ranks of the largest group)")
        how = f"{nodes}, given"
    ms = tuple(Measurement(c, n, min(nodes, n), b, tuple(t)) for (c, b, n), t in groups.items())
    if isinstance(rank, list):
        what = (f"the PyTorch profiler traces in {name} (ranks {', '.join(map(str, rank))} of "
                f"{world_size if world_size is not None else '?'}, backend {backend or '?'})")
        timing = ("the transfer time of each such collective across ranks: its end on the last rank to finish "
                  "minus its start on the last rank to start (whose arrival released it), so waiting for a slower "
                  "peer is not counted")
    else:
        what = (f"the PyTorch profiler trace {name} (rank {rank if rank is not None else '?'} of "
                f"{world_size if world_size is not None else '?'}, backend {backend or '?'})")
        timing = ("the execution times of each such collective (NCCL kernel duration or gloo worker annotation). "
                  "A single rank's record includes waiting for the slower peers, so the times are upper bounds on "
                  "the transfer")
    notes = (f"Imported from {what}, {iterations} iteration(s): one measurement per collective, size and group, its "
             f"samples {timing}. Nodes: {how}. Transport: not recorded in Kineto traces.")
    # a backend the format does not name (e.g. "cpu:gloo,cuda:nccl") stays in the notes above
    return NetworkTrace(backend if backend in BACKENDS else "unknown", "unknown",
                        Provenance(command=f"simfog import kineto-comm {name}", date=date, host=host,
                                   source="imported", estimated=False, notes=notes), ms,
                        extra={"kineto": [{"file": name, "rank": rank, "world_size": world_size,
                                           "iterations": iterations, "measurements": [0, len(ms)]}]})
