"""Measure a zoo model's per-layer training compute on this machine: the ModelTrace (format 1) simfog replays.
Over 400 lines because the four measurements a trace needs (per-layer times, the bucket copy bandwidth, the
overlap slowdown, activation bytes) share one set of hooks and one provenance record; each is a function here.

One process (or `concurrent` processes at once) runs SGD-with-momentum training steps on fixed random inputs.
Module hooks on every leaf module time each layer's forward and backward; `Tensor.register_post_accumulate_grad_hook`
observes the order in which parameter gradients become ready in backward (what WFBP/DDP bucketing overlaps with).
A separate forward pass on a shape-only ("meta") copy, under `torch.utils.flop_counter.FlopCounterMode`, counts
each layer's forward FLOPs.

Torch-only module (imports torch at module level); `simfog` never imports it.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
import warnings
from datetime import UTC, datetime
from queue import Empty

import numpy
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from simfog.errors import ConfigError
from simfog.progress import bar as progress_bar
from simfog.trace import ModelTrace, model_trace_from_dict
from validate.collect import models
from validate.collect.layer_ops import ops_how, zoo_ops
from validate.ranks.timing import clock_for

_HOOK_WARNING = "Full backward hook is firing when gradients are computed with respect to module outputs"


def collect_model(name: str, batch_size: int, *, iterations: int = 10, warmup: int = 3, threads: int | None = None,
                  seed: int = 0, concurrent: int = 1, device: str | None = None,
                  command: str | None = None, overlap: bool = False) -> ModelTrace:
    """Train zoo model `name` for `warmup + iterations` steps and return the measured, validated ModelTrace.

    Warm-up steps are dropped; every measured step is kept: sample k of each layer (and of `optimizer_s`,
    `forward_wall_s`, `backward_wall_s`) is measured step k. Times are seconds; per-layer forward (backward) times of
    step k sum to that step's forward (backward) wall time. `threads`: torch intra-op threads per process (None:
    torch's default, or cpu_count // concurrent when concurrent > 1). `concurrent` > 1 runs that many processes
    training at once, in lock step (a barrier before each step, as synchronous data parallelism would); the layers
    come from rank 0 and every rank's step times go to `extra["concurrent"]`. `device`: "cpu", "cuda" or None (cuda
    when available). `overlap`: also measure the overlap slowdown (`measure_overlap_slowdown`, a second process and
    a loopback gloo group; off by default) into `comm_overheads`. Raises ConfigError for an unknown model or a bad
    argument.
    """
    models.get(name)
    for field, value, low in (("batch_size", batch_size, 1), ("iterations", iterations, 1), ("warmup", warmup, 0),
                              ("seed", seed, 0), ("concurrent", concurrent, 1), ("threads", threads, 1)):
        if value is None and field == "threads":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(field, value, f"an integer >= {low}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") or device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "cpu, or cuda where a CUDA device is available")
    if threads is None and concurrent > 1:
        threads = max(1, (os.cpu_count() or 1) // concurrent)
    job = {"name": name, "batch_size": batch_size, "iterations": iterations, "warmup": warmup,
           "threads": threads, "seed": seed, "device": device}

    load_before, threads_before = os.getloadavg(), torch.get_num_threads()
    try:
        runs = [_measure(job)] if concurrent == 1 else _measure_concurrent(job, concurrent)
        if threads:
            torch.set_num_threads(threads)
        copy = measure_bucket_copy(name, device)
        activations = measure_activations(name, batch_size, seed=seed)
        _, layer_ops = zoo_ops(name, batch_size)
        slow = gpu_slow = None
        if overlap and device == "cuda":  # NCCL's kernels, stood in for on one GPU
            from validate.collect.gpu_overlap import measure_gpu_overlap

            gpu_slow = measure_gpu_overlap(name, batch_size=batch_size, seed=seed)
        elif overlap:
            slow = measure_overlap_slowdown(name, device, batch_size=batch_size, seed=seed)
    finally:
        torch.set_num_threads(threads_before)  # in-process runs must not change the caller's setting
    load_after = os.getloadavg()
    run = runs[0]
    if command is None:
        command = (f"simfog collect model {name} --batch-size {batch_size} --iterations {iterations} "
                   f"--warmup {warmup} --seed {seed} --concurrent {concurrent}"
                   + (f" --threads {threads}" if threads else "") + (" --overlap" if overlap else ""))
    notes = (f"os.getloadavg() 1/5/15 min before: {_loads(load_before)}; after: {_loads(load_after)}. "
             f"torch threads per process: {run['threads']}; {concurrent} process(es) training at once"
             + (", layers from rank 0, every rank's step totals in concurrent.iteration_s" if concurrent > 1 else "")
             + f". Clock: {run['clock']}. Layer times scaled to steps without hooks: forward x"
             f"{run['scale']['forward_wall_s']:.4f}, backward x{run['scale']['backward_wall_s']:.4f}, optimizer x"
             f"{run['scale']['optimizer_s']:.4f} (see instrumentation). Each layer is charged the time from the "
             "previous leaf module's hook to its "
             "own (work between leaf modules, e.g. residual adds, attention, the loss, goes to the next layer), so "
             "per-layer sums equal each step's forward/backward wall time. FLOPs: FlopCounterMode, forward only; "
             "bytes_accessed: parameters + leaf inputs + outputs, an estimate. "
             f"SGD lr 0.01 momentum 0.9 on fixed random inputs, seed {seed}, {warmup} warm-up steps dropped.")
    data = {
        "format": "simfog.model-trace/1", "model": name, "batch_size": batch_size, "dtype": "float32",
        "device": _device_info(device, run["threads"], concurrent),
        "software": {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__},
        "provenance": {"command": command, "date": datetime.now(UTC).isoformat(timespec="seconds")
                       .replace("+00:00", "Z"), "host": socket.gethostname(), "source": "measured",
                       "estimated": False, "notes": notes},
        "layers": [{**layer, "activation_bytes": activations["layers"].get(layer["name"], 0),
                    "output_bytes": activations["outputs"].get(layer["name"], 0),
                    "ops": layer_ops.get(layer["name"], [])} for layer in run["layers"]],
        "activation_bytes_how": activations["how"], "ops_how": ops_how(),
        "grad_ready_order": run["grad_ready_order"], "optimizer_s": run["optimizer_s"],
        "forward_wall_s": run["forward_wall_s"], "backward_wall_s": run["backward_wall_s"],
        "grad_ready_order_stable": run["grad_ready_order_stable"],
        "instrumentation": {
            "scale": run["scale"], "instrumented": run["instrumented"], "plain": run["plain"],
            "how": f"the layer hooks' own host time is in every instrumented step (launch-bound GPUs: much of it); "
                   f"{iterations} more steps with no hook gave each phase's plain median; every layer's forward "
                   f"(backward) times and the optimizer times were scaled by plain / instrumented median (never "
                   f"above 1; factors in scale), so a step's layers add up to a plain step while each layer's share "
                   f"is the instrumented one (an estimate where the factor is far from 1)"},
        "comm_overheads": {
            "bucket_copy_Bps": copy["Bps"], "collective_overhead_s": None, "overlap_slowdown": None,
            "device": _device_info(device, run["threads"], concurrent)["name"], "how": copy["how"],
            "bucket_copy_s": {"pack": copy["pack_s"], "unpack": copy["unpack_s"]}, "bytes": copy["bytes"],
            "not_measured": "collective_overhead_s and overlap_slowdown: this collector does not measure them "
                            "(simfog uses 0 and 1.0 unless the experiment file sets them); run it with "
                            "--overlap to measure overlap_slowdown"},
    }
    if slow is not None:
        data["comm_overheads"].update({
            "overlap_slowdown": slow["slowdown"], "overlap_slowdown_how": slow["how"],
            "overlap_slowdown_raw": slow["raw"],
            "overlap_backward_s": {"alone": slow["alone_s"], "with_comm": slow["with_comm_s"]},
            "overlap_allreduces": slow["allreduces"], "overlap_allreduce_s": slow["allreduce_s"],
            "overlap_allreduce_bytes": slow["allreduce_bytes"],
            "not_measured": "collective_overhead_s: this collector does not measure it (simfog uses 0 unless the "
                            "experiment file sets it)"})
    if gpu_slow is not None:
        data["comm_overheads"].update(gpu_overlap_record(gpu_slow))
    if concurrent > 1:
        data["concurrent"] = {"processes": concurrent, "trace_from_rank": 0, "iteration_s": [
            [f + b + o for f, b, o in zip(r["forward_wall_s"], r["backward_wall_s"], r["optimizer_s"], strict=True)]
            for r in runs]}
    # Through JSON and the format-1 validator: what we return is exactly what a saved file reloads as.
    return model_trace_from_dict(json.loads(json.dumps(data)))


def gpu_overlap_record(m: dict) -> dict:
    """comm_overheads keys from a measure_gpu_overlap result: overlap_slowdown is the `kernel` stand-in's (NCCL's
    reduction kernels holding SMs), every stand-in's figures kept beside it."""
    kernel = m["standins"]["kernel"]
    return {
        "overlap_slowdown": kernel["slowdown"], "overlap_slowdown_raw": kernel["raw"],
        "overlap_slowdown_estimated": True,
        "overlap_slowdown_how": (
            f"one-GPU stand-in, not a measured collective: backward of {m['model']} batch {m['batch_size']} on "
            f"{m['device']} timed alone and with {kernel['how']} queued on a second stream before it (enough to "
            f"outlast it); median of {m['repeats']} each, alternating; median with / median alone = "
            f"{kernel['raw']:.3f}, clipped below at 1 (validate.collect.gpu_overlap)"),
        "overlap_backward_s": {"alone": m["alone_s"], "with_comm": kernel["with_s"]},
        "overlap_standins": m["standins"],
        "not_measured": "collective_overhead_s: this collector does not measure it (simfog uses 0 unless the "
                        "experiment file sets it)"}


def measure_bucket_copy(name: str, device: str = "cpu", *, repeats: int = 15) -> dict:
    """Flat-buffer copy bandwidth on `device` for the gradients of zoo model `name` (`measure_copy` with one tensor
    per trainable parameter: its shapes, dtypes and order)."""
    with torch.device("meta"):
        shapes = [(p.shape, p.dtype) for p in models.get(name).build().parameters() if p.requires_grad]
    return measure_copy(shapes, device, repeats=repeats)


def measure_copy(shapes, device: str = "cpu", *, repeats: int = 15) -> dict:
    """Copy one tensor per (shape, dtype) of `shapes` into one flat buffer (pack, as DDP and Horovod fill a
    bucket) and back out (unpack), `repeats` times after one warm-up; the median of each. Returns Bps (bytes /
    mean of the pack and unpack medians), pack_s, unpack_s (medians), bytes and how (a sentence)."""
    dev = torch.device(device)
    clock = clock_for(dev)
    grads = [torch.randn(s, device=dev).to(d) for s, d in shapes]
    total = sum(g.numel() for g in grads)
    flat = torch.empty(total, dtype=grads[0].dtype if grads else torch.float32, device=dev)
    views, offset = [], 0
    for g in grads:
        views.append(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    pack, unpack = [], []
    with torch.no_grad():
        for i in range(repeats + 1):
            t0 = clock.stamp()
            for v, g in zip(views, grads):
                v.copy_(g)
            t1 = clock.stamp()
            for v, g in zip(views, grads):
                g.copy_(v)
            t2 = clock.stamp()
            clock.settle()
            if i:
                pack.append(clock.between(t0, t1))
                unpack.append(clock.between(t1, t2))
    nbytes = sum(g.numel() * g.element_size() for g in grads)
    p, u = float(numpy.median(pack)), float(numpy.median(unpack))
    return {"Bps": nbytes / ((p + u) / 2) if p + u > 0 else None, "pack_s": p, "unpack_s": u, "bytes": nbytes,
            "how": f"{len(grads)} gradient-shaped tensors ({nbytes} B) copied into one flat buffer and back, "
                   f"{torch.get_num_threads()} torch thread(s), median of {repeats} after 1 warm-up; "
                   f"bytes / mean(pack, unpack)"}


def measure_activations(name: str, batch_size: int, *, seed: int = 0) -> dict:
    """Bytes autograd keeps for backward, per leaf module of zoo model `name` at `batch_size`: one forward pass in
    training mode on CPU under torch.autograd.graph.saved_tensors_hooks, each saved tensor's storage counted once
    (the storage a view belongs to, whole; parameters not counted: they are memory of their own), charged to the
    leaf module whose forward saved it (what is saved between two leaves, e.g. residual adds, to the later one, as
    compute time is), the loss's to the last. In the same pass, each leaf's output bytes: its output tensors that
    require a gradient, the size of the gradient backward hands it. Returns {"layers": {leaf: bytes}, "outputs":
    {leaf: bytes}, "how": a sentence}."""
    torch.manual_seed(seed)
    entry = models.get(name)
    model = entry.build().train()
    inputs, targets = entry.make_inputs(batch_size, torch.Generator().manual_seed(seed))
    leaves = _leaves(model)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    pending = [0]
    per_layer: dict[str, int] = {}
    outputs: dict[str, int] = {}
    order: list[str] = []

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in seen and ptr not in params and ptr != 0:
            seen.add(ptr)
            pending[0] += storage.nbytes()
        return t

    def done(layer: str):
        def hook(_m, _a, out):
            per_layer[layer] = per_layer.get(layer, 0) + pending[0]
            pending[0] = 0
            outputs[layer] = outputs.get(layer, 0) + _grad_bytes(out)
            if layer not in order:
                order.append(layer)
        return hook

    handles = [m.register_forward_hook(done(n)) for n, m in leaves.items()]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = entry.loss(model(*inputs), targets)
    finally:
        for h in handles:
            h.remove()
    if order:
        per_layer[order[-1]] += pending[0]
    del loss
    return {"layers": per_layer, "outputs": outputs,
            "how": f"bytes saved for backward (torch.autograd.graph.saved_tensors_hooks, each storage once, "
                   f"parameters excluded) and output bytes (each leaf's outputs that require a gradient) in one "
                   f"CPU forward pass at batch {batch_size}, torch {torch.__version__}"}


def _grad_bytes(out) -> int:
    """Bytes of the tensors in a module's output (a tensor, or a tuple / list / dict of them) that require a
    gradient: what backward hands the module."""
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size() if out.requires_grad else 0
    if isinstance(out, dict):
        out = list(out.values())
    return sum(_grad_bytes(o) for o in out) if isinstance(out, (tuple, list)) else 0


def _loads(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def _device_info(device: str, threads: int, processes: int) -> dict:
    if device == "cuda":
        return {"kind": "cuda", "name": torch.cuda.get_device_name(), "threads": threads, "processes": processes}
    return {"kind": "cpu", "name": _cpu_name(), "threads": threads, "cores": os.cpu_count(), "processes": processes}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _charge(events: list, start, end, clock, totals: dict[str, float]) -> None:
    """Add to `totals[layer]` the time from the previous event (the first: from `start`) to each (mark, layer) event;
    the time after the last event, up to `end`, goes to the last event's layer.

    Hooks fire only at leaf-module boundaries: work done between two leaf modules (functional residual adds,
    torch.cat, attention, flatten, the loss) belongs to no module. Charging each gap to the layer whose hook closes it
    keeps every moment of the step in exactly one layer, so the per-layer sums equal the measured wall time and a
    replay of the layers reproduces the measured step (and when each gradient is ready) rather than undercounting it.
    """
    previous = start
    for mark, layer in events:
        totals[layer] = totals.get(layer, 0.0) + clock.between(previous, mark)
        previous = mark
    if events:
        layer = events[-1][1]
        totals[layer] += clock.between(previous, end)


# ---- the measurement, run in this process or in each concurrent one ----

def _leaves(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in model.named_modules() if n and not any(True for _ in m.children())}


def _probe(model, leaves, inputs) -> tuple[list[str], dict[str, float], dict[str, float]]:
    """One untimed forward pass: leaf modules in call order, and each one's forward FLOPs and bytes (estimated).
    Works on "meta" tensors (FLOPs and bytes depend only on shapes).

    FLOPs between two leaf hooks are charged to the later leaf, as time is in `_charge`."""
    order, flops, nbytes, handles = [], {}, {}, []
    # CPU attention runs this fused kernel, which FlopCounterMode (torch 2.13) has no formula for.
    cpu_sdpa = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
                lambda q, k, v, *args, out_shape=None, **kw: sdpa_flop_count(q, k, v)}
    counter = FlopCounterMode(display=False, custom_mapping=cpu_sdpa)
    seen = [0]

    def size(xs) -> int:
        xs = xs if isinstance(xs, (tuple, list)) else (xs,)
        return sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))

    def hook(name):
        def after(module, args, output):
            total = counter.get_total_flops()
            flops[name] = flops.get(name, 0) + total - seen[0]
            seen[0] = total
            params = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
            nbytes[name] = nbytes.get(name, 0) + params + size(args) + size(output)
            if name not in order:
                order.append(name)
        return after

    handles = [m.register_forward_hook(hook(n)) for n, m in leaves.items()]
    try:
        with torch.no_grad(), counter:
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    if order:
        flops[order[-1]] += counter.get_total_flops() - seen[0]
    return order, flops, nbytes


def _measure(job: dict, barrier=None) -> dict:
    """Build, probe and train; return plain lists (picklable) for the trace."""
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    torch.manual_seed(job["seed"])
    entry = models.get(job["name"])
    dev = torch.device(job["device"])
    clock = clock_for(dev)
    model = entry.build().to(dev).train()
    inputs, targets = entry.make_inputs(job["batch_size"], torch.Generator().manual_seed(job["seed"]))
    inputs, targets = tuple(x.to(dev) for x in inputs), targets.to(dev)
    leaves = _leaves(model)
    with torch.device("meta"):  # shapes are all the probe needs: a copy on "meta" costs no compute
        shadow = entry.build()
    order, flops, nbytes = _probe(shadow, _leaves(shadow), tuple(x.to("meta") for x in inputs))

    # Each parameter belongs to the first leaf, in call order, that holds it (a tied tensor to its first user).
    owner, names = {}, {id(p): n for n, p in model.named_parameters()}
    params = {layer: [] for layer in order}
    for layer in order:
        for p in leaves[layer].parameters(recurse=False):
            if p.requires_grad and id(p) not in owner:
                owner[id(p)] = layer
                params[layer].append(p)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if len(owner) != len(trainable):
        raise ConfigError("model", job["name"], "a model whose every trainable parameter belongs to a leaf module "
                          "called in forward")

    fwd_events, bwd_events, ready = [], [], []
    handles = []
    for layer in order:
        module = leaves[layer]
        handles.append(module.register_forward_hook(lambda m, a, o, n=layer: fwd_events.append((clock.stamp(), n))))
        # A layer's backward is done once autograd has its input gradient (this hook) and its parameter gradients
        # (the accumulate hook below). Where no input needs a gradient (first conv, embeddings) this hook fires
        # early, at output-gradient time; the accumulate event that follows closes the layer correctly.
        handles.append(module.register_full_backward_hook(
            lambda m, gi, go, n=layer: bwd_events.append((clock.stamp(), n))))
    def accumulated(layer: str, pname: str):
        def hook(tensor) -> None:
            bwd_events.append((clock.stamp(), layer))
            ready.append(pname)
        return hook

    handles += [p.register_post_accumulate_grad_hook(accumulated(owner[id(p)], names[id(p)])) for p in trainable]

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    steps = {k: [] for k in ("forward", "backward", "optimizer_s", "forward_wall_s", "backward_wall_s", "orders")}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_HOOK_WARNING)
            # Steps of a large model take seconds each: a bar on a terminal, from one process only.
            for step in progress_bar(range(job["warmup"] + job["iterations"]), desc=f"collect {job['name']}",
                                     unit="step", enabled=barrier is None):
                t0, t1, t2, t3 = _step(model, entry, inputs, targets, optimizer, clock, barrier,
                                       before=lambda: (fwd_events.clear(), bwd_events.clear(), ready.clear()))
                if step < job["warmup"]:
                    continue
                fwd, bwd = {}, {}
                _charge(fwd_events, t0, t1, clock, fwd)
                _charge(bwd_events, t1, t2, clock, bwd)
                steps["forward"].append(fwd)
                steps["backward"].append(bwd)
                steps["forward_wall_s"].append(clock.between(t0, t1))
                steps["backward_wall_s"].append(clock.between(t1, t2))
                steps["optimizer_s"].append(clock.between(t2, t3))
                steps["orders"].append(list(ready))
    finally:
        for h in handles:
            h.remove()
    plain = _plain_steps(model, entry, inputs, targets, optimizer, clock, job["iterations"], barrier)
    instrumented = {phase: list(steps[phase]) for phase in PHASES}
    scale = plain_scale(instrumented, plain)
    steps["forward"] = [{k: v * scale["forward_wall_s"] for k, v in f.items()} for f in steps["forward"]]
    steps["backward"] = [{k: v * scale["backward_wall_s"] for k, v in b.items()} for b in steps["backward"]]
    for phase in PHASES:
        steps[phase] = [t * scale[phase] for t in steps[phase]]

    layers = [{"name": layer, "forward_s": [f.get(layer, 0.0) for f in steps["forward"]],
               "backward_s": [b.get(layer, 0.0) for b in steps["backward"]],
               "params": [{"name": names[id(p)], "elements": p.numel(), "dtype": str(p.dtype).removeprefix("torch.")}
                          for p in params[layer]],
               "flops": flops.get(layer, 0), "bytes_accessed": nbytes.get(layer, 0)} for layer in order]
    orders = steps["orders"]
    return {"layers": layers, "grad_ready_order": orders[0], "grad_ready_order_stable": all(o == orders[0]
                                                                                            for o in orders),
            "optimizer_s": steps["optimizer_s"], "forward_wall_s": steps["forward_wall_s"],
            "backward_wall_s": steps["backward_wall_s"], "threads": torch.get_num_threads(), "clock": clock.name,
            "instrumented": instrumented, "plain": plain, "scale": scale}


PHASES = ("forward_wall_s", "backward_wall_s", "optimizer_s")


def plain_scale(instrumented: dict, plain: dict) -> dict[str, float]:
    """Per phase (PHASES): plain median / instrumented median, never above 1 (1 where the instrumented median is 0).

    The layer hooks' own host time is in every instrumented step: on a CPU a sliver, on a launch-bound GPU most of
    a small model's step (H200, ResNet-50 batch 32: forward 32.4 ms with hooks, 8.5 ms without). Scaling every
    layer of a phase by this factor makes a step's layers add up to a step without hooks while each layer keeps its
    instrumented share (an estimate of the split where the factor is far from 1)."""
    out = {}
    for phase in PHASES:
        hooked = float(numpy.median(instrumented[phase]))
        out[phase] = min(1.0, float(numpy.median(plain[phase])) / hooked) if hooked > 0 else 1.0
    return out


def _plain_steps(model, entry, inputs, targets, optimizer, clock, iterations: int, barrier=None) -> dict:
    """`iterations` more training steps with no hook on the model: only the step's phases are stamped. Returns
    {"forward_wall_s", "backward_wall_s", "optimizer_s"}: lists of seconds, one per step."""
    plain = {phase: [] for phase in PHASES}
    for _ in range(iterations):
        t0, t1, t2, t3 = _step(model, entry, inputs, targets, optimizer, clock, barrier)
        for phase, (a, b) in zip(PHASES, ((t0, t1), (t1, t2), (t2, t3)), strict=True):
            plain[phase].append(clock.between(a, b))
    return plain


def _step(model, entry, inputs, targets, optimizer, clock, barrier=None, before=lambda: None) -> tuple:
    """One training step, stamped at its start and at the end of forward, backward and the optimizer step (stamps
    readable on return: the device has settled). `before` runs after the barrier, just before the first stamp."""
    optimizer.zero_grad(set_to_none=True)
    if barrier is not None:
        barrier.wait()
    clock.start_iteration()  # a reference per step keeps CUDA event times short and exact to subtract
    before()
    t0 = clock.stamp()
    loss = entry.loss(model(*inputs), targets)
    t1 = clock.stamp()
    loss.backward()
    t2 = clock.stamp()
    optimizer.step()
    t3 = clock.stamp()
    clock.settle()
    return t0, t1, t2, t3


def _worker(rank: int, job: dict, barrier, queue) -> None:
    try:
        queue.put((rank, _measure(job, barrier)))
    except BaseException as e:  # report, never hang the parent on a barrier or a queue
        barrier.abort()
        queue.put((rank, f"{type(e).__name__}: {e}"))


def _measure_concurrent(job: dict, processes: int) -> list[dict]:
    """Run `_measure` in `processes` spawned processes at once; their results ordered by rank."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, job, barrier, queue), daemon=True) for r in range(processes)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    while len(results) < processes:
        try:
            rank, result = queue.get(timeout=5)
            results[rank] = result
        except Empty:  # a process killed outright (e.g. out of memory) reports nothing
            for r, p in enumerate(procs):
                if r not in results and not p.is_alive() and queue.empty():
                    barrier.abort()
                    results[r] = f"process exited with code {p.exitcode} without a result"
    for p in procs:
        p.join()
    failed = {r: v for r, v in results.items() if isinstance(v, str)}
    if failed:
        raise RuntimeError(f"concurrent measurement failed: {failed}")
    return [results[r] for r in range(processes)]


# ---- overlap slowdown: backward alone vs beside back-to-back gloo allreduces (opt-in) ----

def measure_overlap_slowdown(name: str, device: str = "cpu", *, batch_size: int = 32, repeats: int = 20,
                             rounds: int = 3, warmup: int = 3, seed: int = 0, timeout_s: float = 120.0) -> dict:
    """How much slower zoo model `name`'s backward runs on `device` while a collective runs beside it.

    A 2-rank gloo process group on loopback (a TCP store on 127.0.0.1, the peer a child process that only runs the
    matching allreduces) and, in this process, a thread that runs back-to-back allreduces of a float32 buffer as
    large as the model's gradients. The backward (forward untimed) is timed `repeats` times alone and `repeats`
    times with the allreduces running, alternating in `rounds` rounds after `warmup` untimed steps each way.
    Returns slowdown (max(1, raw)), raw (median with / median alone), alone_s, with_comm_s (the medians),
    allreduces (how many completed while measuring), allreduce_s (their median duration), allreduce_bytes, repeats
    and how (a sentence). Everything is bounded by
    `timeout_s`; the child is always stopped. Raises RuntimeError when the peer fails."""
    import datetime
    import subprocess
    import sys
    import tempfile
    import threading

    import torch.distributed as dist

    dev = torch.device(device)
    clock = clock_for(dev)
    torch.manual_seed(seed)
    entry = models.get(name)
    model = entry.build().to(dev).train()
    inputs, targets = entry.make_inputs(batch_size, torch.Generator().manual_seed(seed))
    inputs, targets = tuple(x.to(dev) for x in inputs), targets.to(dev)
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
    errors = tempfile.TemporaryFile(mode="w+")  # not a pipe: a chatty peer must never block on it
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    child = subprocess.Popen([sys.executable, "-c", "import sys; from validate.collect.collect_model import "
                              "_overlap_peer; _overlap_peer(*map(float, sys.argv[1:]))", str(store.port), str(numel),
                              str(timeout_s), device == "cuda" and "1" or "0"],
                             env=env, stdout=subprocess.DEVNULL, stderr=errors)
    buf = torch.zeros(numel + 1, dtype=torch.float32, device=dev)  # the last element: 1 from us = "stop"
    running, idle, stop, failed = threading.Event(), threading.Event(), threading.Event(), []
    durations: list[float] = []  # of every allreduce but the last ("stop"), host clock
    pg = thread = None

    def communicate() -> None:
        try:
            while True:
                if not running.is_set():
                    idle.set()  # no allreduce in flight: backward may be timed alone
                running.wait()
                last = stop.is_set()  # read once: the peer stops after the very allreduce that says so
                buf[-1] = 1.0 if last else 0.0
                t0 = time.perf_counter()
                pg.allreduce([buf]).wait()
                if last:
                    return
                durations.append(time.perf_counter() - t0)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            failed.append(f"{type(e).__name__}: {e}")
            running.clear()
            idle.set()

    def backward_s(n: int, timed: list | None) -> None:
        for _ in range(n):
            if failed:
                raise RuntimeError(f"overlap measurement: the allreduce thread failed: {failed[0]}")
            model.zero_grad(set_to_none=True)
            loss = entry.loss(model(*inputs), targets)
            t0 = clock.stamp()
            loss.backward()
            t1 = clock.stamp()
            clock.settle()
            if timed is not None:
                timed.append(clock.between(t0, t1))

    alone, beside = [], []
    try:
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        opts._timeout = timeout
        pg = dist.ProcessGroupGloo(dist.PrefixStore("overlap", store), 0, 2, opts)
        thread = threading.Thread(target=communicate, name="overlap-allreduce", daemon=True)
        thread.start()
        backward_s(warmup, None)
        per_round = max(1, -(-repeats // rounds))
        for r in range(rounds):
            n = min(per_round, repeats - len(alone))
            if n <= 0:
                break
            running.clear()
            if not idle.wait(timeout_s):  # the allreduce in flight finishes before backward is timed alone
                raise RuntimeError(f"overlap measurement: an allreduce took over {timeout_s} s")
            backward_s(warmup if r == 0 else 1, None)
            backward_s(n, alone)
            idle.clear()
            running.set()
            backward_s(warmup if r == 0 else 1, None)
            backward_s(n, beside)
        ran = len(durations)
    finally:
        stop.set()
        running.set()
        if thread is not None:
            thread.join(timeout=min(timeout_s, 30.0))
        try:
            child.wait(timeout=10 if thread is not None and not thread.is_alive() else 0.1)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if thread is not None:
            thread.join(timeout=10)
        errors.seek(0)
        child_err = errors.read()
        errors.close()
    if failed or child.returncode != 0:
        tail = child_err.strip().splitlines()[-3:]
        raise RuntimeError(f"overlap measurement failed: {failed[0] if failed else ''} peer exit "
                           f"{child.returncode}: {' | '.join(tail)}")
    a, w = float(numpy.median(alone)), float(numpy.median(beside))
    raw = w / a
    nbytes = numel * 4
    return {"slowdown": max(1.0, raw), "raw": raw, "alone_s": a, "with_comm_s": w, "allreduces": ran,
            "allreduce_s": float(numpy.median(durations[:ran])) if ran else None,
            "allreduce_bytes": nbytes, "repeats": len(alone),
            "how": f"backward of {name} batch {batch_size} ({torch.get_num_threads()} torch thread(s)) timed alone "
                   f"and while a thread ran back-to-back gloo allreduces of {nbytes} B (the gradients) with a second "
                   f"process over loopback; median of {len(alone)} each, alternating in {rounds} rounds; "
                   f"median with / median alone = {raw:.3f}, clipped below at 1"}


def _overlap_peer(port: float, numel: float, timeout_s: float, cuda: float = 0.0) -> None:
    """The second rank of `measure_overlap_slowdown`: join, then run matching allreduces until told to stop."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", int(port), 2, False, timeout=timeout)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    opts._timeout = timeout
    pg = dist.ProcessGroupGloo(dist.PrefixStore("overlap", store), 1, 2, opts)
    torch.set_num_threads(1)
    buf = torch.zeros(int(numel) + 1, dtype=torch.float32, device="cuda" if cuda else "cpu")
    while True:
        buf[-1] = 0.0
        pg.allreduce([buf]).wait()
        if buf[-1].item() > 0:
            os._exit(0)  # at once: tearing down a gloo group whose peer still holds it can wait


def add_activations(trace: ModelTrace, *, seed: int = 0) -> ModelTrace:
    """`trace` (of a zoo model) with every layer's activation_bytes and output_bytes measured by
    `measure_activations` at its batch size; times and everything else unchanged, the measurement noted in
    extra["activation_bytes_how"]."""
    from dataclasses import replace

    measured = measure_activations(trace.model, trace.batch_size, seed=seed)
    layers, outputs = measured["layers"], measured["outputs"]
    unknown = [layer.name for layer in trace.layers if layer.name not in layers]
    if unknown and len(unknown) == len(trace.layers):
        raise ConfigError("layers", unknown[0], f"layer names of zoo model {trace.model} (the trace was not "
                          "collected from it)")
    return replace(trace, layers=tuple(replace(layer, activation_bytes=float(layers.get(layer.name, 0)),
                                               output_bytes=float(outputs.get(layer.name, 0)))
                                       for layer in trace.layers),
                   extra={**trace.extra, "activation_bytes_how": measured["how"] + " (added to this trace by "
                          "`simfog collect activations`; its times are unchanged)"})
