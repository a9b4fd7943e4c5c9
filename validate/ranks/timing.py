"""Clocks of a validation rank: when did compute and each bucket's collective happen, on the device that ran them.

A rank takes *stamps* while it runs an iteration and turns them into seconds once the iteration is over:

    clock.start_iteration()
    s = clock.stamp()                    # where the device's compute queue is now
    clock.on_done(work, box, b)          # box[b] gets the stamp of the collective `work` completing
    clock.settle()                       # after the iteration: everything stamped has happened
    seconds = clock.seconds(s)           # time.perf_counter seconds, one timeline for every process

`HostClock` (CPU, gloo): work runs when the host calls it, so a stamp is `time.perf_counter()` taken right there,
and a collective's completion is stamped in its future's callback (gloo's thread).

`CudaClock` (GPU, NCCL): the host only queues kernels, so a stamp is a CUDA event recorded on the current stream
(it fires when the device gets there), and a collective's completion is an event recorded on a probe stream made to
wait for that collective (`work.wait()` under that stream: the event fires when NCCL's kernel ends, whatever the
compute stream does meanwhile). `start_iteration` synchronises the device once and records a reference event at a
known perf_counter time; `settle` synchronises once more so that every event can be read; an event's seconds are
the reference's perf_counter time plus the event time elapsed since the reference. Those two synchronisations per
iteration are the only ones measurement adds (a training loop without them lets the host run ahead by one
iteration; the measured iteration starts with an idle device instead). Torch-only module.
"""

from __future__ import annotations

import time
from collections.abc import MutableSequence

import torch


class HostClock:
    """Stamps are perf_counter seconds: for work that runs when the host calls it (CPU tensors, gloo)."""

    device = torch.device("cpu")
    name = "time.perf_counter (monotonic host clock)"

    def start_iteration(self) -> None:
        pass

    def stamp(self) -> float:
        return time.perf_counter()

    def on_done(self, work, box: MutableSequence, index: int) -> None:
        """Put into box[index] the time `work` completes (its future's callback), unless something set it first."""

        def done(_fut):
            if box[index] != box[index]:  # NaN: not yet set (finish() may set it right after wait())
                box[index] = time.perf_counter()

        work.get_future().add_done_callback(done)

    def settle(self) -> None:
        pass

    def seconds(self, stamp: float) -> float:
        return float(stamp)

    def between(self, a: float, b: float) -> float:
        """Seconds from stamp `a` to stamp `b`."""
        return b - a


class CudaClock:
    """Stamps are CUDA events on `device` (default: the current one; see the module docstring). Raises
    RuntimeError without CUDA."""

    name = "CUDA events on the current stream"

    def __init__(self, device: torch.device | None = None):
        if not torch.cuda.is_available():
            raise RuntimeError("CudaClock needs a CUDA device; none is available here")
        self.device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        self.probe = torch.cuda.Stream(device=device)  # waits for each collective, in launch order
        self.start_iteration()

    def start_iteration(self) -> None:
        torch.cuda.synchronize(self.device)
        self.reference = torch.cuda.Event(enable_timing=True)
        self.reference_s = time.perf_counter()
        self.reference.record()

    def stamp(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def on_done(self, work, box: MutableSequence, index: int) -> None:
        event = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.probe):
            work.wait()  # the probe stream (not the compute stream) waits for this collective's kernel
            event.record(self.probe)
        box[index] = event

    def settle(self) -> None:
        torch.cuda.synchronize(self.device)

    def seconds(self, stamp) -> float:
        if isinstance(stamp, float):  # a host time (replay waits): already on the perf_counter timeline
            return stamp
        return self.reference_s + self.reference.elapsed_time(stamp) / 1e3

    def between(self, a, b) -> float:
        """Seconds from stamp `a` to stamp `b` (both recorded and reached: after settle()); both measured from the
        reference, so that consecutive intervals add up exactly to the interval they tile."""
        return (self.reference.elapsed_time(b) - self.reference.elapsed_time(a)) / 1e3  # elapsed_time: milliseconds


def clock_for(device: torch.device):
    """CudaClock on a CUDA `device`, else HostClock."""
    return CudaClock(device) if device.type == "cuda" else HostClock()


def to_seconds(clock, stamps) -> list[float]:
    """seconds() of every stamp (NaN stays NaN: a completion never stamped)."""
    return [s if isinstance(s, float) and s != s else clock.seconds(s) for s in stamps]
