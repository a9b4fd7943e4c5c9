"""How much slower backward runs on one GPU while collective-like work runs beside it: a one-GPU stand-in for the
slowdown NCCL's kernels cause in data-parallel training (simfog's `overlap_slowdown`).

NCCL cannot run two ranks on one GPU, so the collective itself cannot run here. What a collective does to the
compute beside it is mostly two things, and each has a stand-in on a second CUDA stream:

- `kernel`: NCCL's reduction kernels are persistent blocks, one per channel, each reading two buffers and writing
  one (reduce-copy) for the collective's whole length, so they hold those SMs and take memory bandwidth. The stand-in
  is a Triton kernel of `ctas` blocks of 512 threads (NCCL's usual block size) doing c = a + b over a gradient-sized
  buffer, looping; without Triton, torch.add over the whole GPU (an upper bound: every SM).
- `copy`: a NIC reads and writes GPU memory by DMA (GPUDirect RDMA) at the network's rate; the stand-in is
  back-to-back pinned device-to-host and host-to-device copies of the gradients on the copy engines.

For each stand-in the backward (forward untimed) is timed `repeats` times alone and `repeats` times with the
stand-in queued on the side stream before backward starts (enough of it to outlast backward), alternating in
rounds; the slowdown is the median with over the median alone. Launching all the side work before backward keeps
the host out of it: a launch-bound backward would otherwise be slowed by a second Python thread, which NCCL (one
launch per bucket) does not cost. The figure is a stand-in, not a measured collective: the trace says so.
Torch-only module; CUDA only.
"""

from __future__ import annotations

import math

import numpy
import torch

from validate.collect import models
from validate.ranks.timing import CudaClock

BLOCK_THREADS = 512
STANDINS = ("kernel", "copy")


def _reduce_copy(ctas: int | None):
    """A function (a, b, c) -> None queuing one reduce-copy c = a + b on the current stream: Triton with `ctas`
    persistent blocks where Triton is available and ctas is given, else torch.add (every SM). Returns (fn, how)."""
    if ctas:
        try:
            from validate.collect.triton_reduce import reduce_copy
        except ImportError:  # no Triton on this machine
            pass
        else:
            return (lambda a, b, c: reduce_copy(a, b, c, ctas)), (
                f"a Triton reduce-copy kernel on {ctas} persistent blocks of {BLOCK_THREADS} threads")
    return (lambda a, b, c: torch.add(a, b, out=c)), "torch.add (every SM: an upper bound)"


def _standin(kind: str, numel: int, ctas: int | None, device: torch.device):
    """(launch, how) for stand-in `kind`: launch() queues one unit of side work on the current stream."""
    if kind == "kernel":
        a, b, c = (torch.ones(numel, dtype=torch.float32, device=device) for _ in range(3))
        fn, how = _reduce_copy(ctas)
        return (lambda: fn(a, b, c)), how + f" over {numel * 4} B"
    if kind == "copy":
        gpu = torch.ones(numel, dtype=torch.float32, device=device)
        host = torch.empty(numel, dtype=torch.float32, pin_memory=True)

        def launch() -> None:
            host.copy_(gpu, non_blocking=True)
            gpu.copy_(host, non_blocking=True)

        return launch, f"pinned device-to-host then host-to-device copies of {numel * 4} B"
    raise ValueError(f"stand-in {kind!r}: one of {', '.join(STANDINS)}")


def measure_gpu_overlap(name: str, *, batch_size: int, standins=STANDINS, ctas: int = 16, repeats: int = 20,
                        rounds: int = 4, warmup: int = 3, seed: int = 0) -> dict:
    """Backward of zoo model `name` on the current CUDA device, alone and beside each stand-in (module docstring).

    Returns {"alone_s": median backward alone, "standins": {kind: {"with_s", "raw", "slowdown", "launch_s",
    "launches", "how"}}, "repeats", "ctas"}; slowdown = max(1, raw). Raises RuntimeError without CUDA and
    ValueError for an unknown stand-in."""
    if not torch.cuda.is_available():
        raise RuntimeError("measure_gpu_overlap needs a CUDA device; none is available here")
    dev = torch.device("cuda", torch.cuda.current_device())
    clock = CudaClock(dev)
    torch.manual_seed(seed)
    entry = models.get(name)
    model = entry.build().to(dev).train()
    inputs, targets = entry.make_inputs(batch_size, torch.Generator().manual_seed(seed))
    inputs, targets = tuple(x.to(dev) for x in inputs), targets.to(dev)
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    side = torch.cuda.Stream(device=dev)

    def backward_s() -> float:
        model.zero_grad(set_to_none=True)
        loss = entry.loss(model(*inputs), targets)
        t0 = clock.stamp()
        loss.backward()
        t1 = clock.stamp()
        clock.settle()
        return clock.between(t0, t1)

    def launch_s(launch) -> float:
        """Median seconds of one unit of side work alone."""
        times = []
        for _ in range(5):
            with torch.cuda.stream(side):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(side)
                launch()
                end.record(side)
            side.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return float(numpy.median(times[1:]))

    for _ in range(warmup):
        backward_s()
    reference = float(numpy.median([backward_s() for _ in range(5)]))
    alone: list[float] = []
    out: dict = {}
    per_round = max(1, math.ceil(repeats / rounds))
    for kind in standins:
        launch, how = _standin(kind, numel, ctas, dev)
        one = launch_s(launch)
        launches = max(2, math.ceil(3 * reference / max(one, 1e-6)))  # outlasts a slowed backward
        beside: list[float] = []
        for _ in range(rounds):
            for _ in range(per_round):
                if kind == standins[0]:
                    alone.append(backward_s())
                torch.cuda.synchronize(dev)
                with torch.cuda.stream(side):
                    for _ in range(launches):
                        launch()
                beside.append(backward_s())
                side.synchronize()
        out[kind] = {"launch_s": one, "launches": launches, "how": how, "with_s": float(numpy.median(beside))}
        del launch
        torch.cuda.empty_cache()
    a = float(numpy.median(alone))
    for rec in out.values():
        rec["raw"] = rec["with_s"] / a
        rec["slowdown"] = max(1.0, rec["raw"])
    return {"alone_s": a, "standins": out, "repeats": len(alone), "ctas": ctas, "model": name,
            "batch_size": batch_size, "device": torch.cuda.get_device_name(dev)}
