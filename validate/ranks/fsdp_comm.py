"""FSDP2's collectives as the validator's ranks run them (validate.ranks.fsdp): FSDP2's Comm interface per unit
(`comms`: all-gather and reduce-scatter, stamped and recorded under the simulated plan's names), issued one at a time
in issue order on CPUs (`FSDPComm.issue`: gloo would run two of a group's collectives at once, NCCL runs a
communicator's one at a time, which is what simfog models), and the buffers FSDP2 lets go of freed in the rank's
thread (`_let_go`). torch is imported inside the functions that need it."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence


class FSDPComm:
    """Per-iteration record of an FSDP2 model's collectives, by the plan's names: `launch_s`, `done_s` (perf_counter;
    NaN when not run), `launch_order` (plan indices); `phase` ("fwd" | "bwd") names the all-gathers; `finish()` waits
    for the reduce-scatters in flight."""

    def __init__(self, names: Sequence[str], clock=None, blocked=lambda seconds: None):
        from validate.ranks.timing import HostClock

        self.names, self.clock, self.blocked = list(names), clock or HostClock(), blocked
        self.index = {n: i for i, n in enumerate(self.names)}
        # gloo runs two collectives of a process group at once (two worker threads); NCCL, whose schedule simfog
        # models, one at a time per communicator: on CPUs every collective is issued after the one before ended
        self.in_order = self.clock.device.type == "cpu"
        self._issue_queue: queue.Queue | None = None
        self.start_iteration()

    def start_iteration(self) -> None:
        n = len(self.names)
        self.launch_s, self.done_s = [float("nan")] * n, [float("nan")] * n
        self.launch_order: list[int] = []
        self.phase = "fwd"
        self.reduce_scatters: list = []

    def backward_started(self) -> None:
        self.phase = "bwd"

    def issue(self, name: str, start):
        """Run collective `name` (`start()` issues it, asynchronously, and returns its Work) as NCCL would: on a
        GPU, as issued; on CPUs, in a thread of its own after every collective issued before it has completed
        (stamped when it really starts). Returns what to wait for (a Work or an `_InOrder`)."""
        if not self.in_order:
            t = time.perf_counter()
            work = start()
            self.launched(name, work, t)
            return work
        if self._issue_queue is None:
            self._issue_queue = queue.Queue()
            threading.Thread(target=self._issue_in_order, name="simfog-fsdp-issuer", daemon=True).start()
        pending = _InOrder()
        self._issue_queue.put((name, start, pending))
        return pending

    def _issue_in_order(self) -> None:
        while True:
            name, start, pending = self._issue_queue.get()
            i, work = self.index[name], None
            try:
                self.launch_s[i] = time.perf_counter()
                self.launch_order.append(i)
                work = start()
                work.wait()
                self.done_s[i] = time.perf_counter()
            except BaseException as exc:  # raised again in the rank's thread, by whoever waits for it
                pending.error = exc
            del start, work  # they hold the collective's buffers
            pending.done.set()
            self._issue_queue.task_done()

    def launched(self, name: str, work, launch_s: float) -> None:
        i = self.index[name]
        self.launch_s[i] = launch_s
        self.launch_order.append(i)
        self.clock.on_done(work, self.done_s, i)

    def wait(self, work) -> None:
        """Wait for `work` in the rank's thread, telling `blocked` how long that took."""
        t = time.perf_counter()
        work.wait()
        self.blocked(time.perf_counter() - t)

    def finish(self) -> None:
        while self.reduce_scatters:  # the last one in flight (each waits for the one before)
            work, input_tensor = self.reduce_scatters.pop()
            work.wait()
            _let_go(input_tensor)
        if self._issue_queue is not None:
            self._issue_queue.join()  # every completion stamped

    def record(self) -> dict:
        return {"names": list(self.names)}


class _InOrder:
    """A collective waiting its turn in FSDPComm's issuer thread: `wait()` until it has completed."""

    def __init__(self):
        self.done, self.error = threading.Event(), None

    def wait(self, timeout=None) -> bool:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.done.is_set()


def _let_go(tensor) -> None:
    """Free `tensor`, a done collective's buffer FSDP2 let go of, in the rank's thread: its Work would free it a moment
    later in gloo's or the waiter thread, unseen by torch.profiler, and MemoryProfile count it until its address is
    reused (+0.8 MB, 10 %, in two of five 2-rank MLP runs at 200 Mbit/s)."""
    tensor.untyped_storage().resize_(0)


def comms(unit_name: str, recorder: FSDPComm, predivide: bool = False):
    """(all-gather, reduce-scatter) comm objects of one unit, FSDP2's Comm interface (_fsdp_api.py); `predivide`:
    the reduce-scatter divides its input by the group size before summing."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    class BlockTimedWork(dist.Work):  # FSDP2 tests isinstance(work, Work) before waiting on it
        def __init__(self, work, output):
            super().__init__()
            self._work, self._output = work, output

        def __del__(self):  # FSDP2 drops its all-gather result, output and work together, once copied out
            if self._work.is_completed():
                _let_go(self._output)

        def wait(self, timeout=None):
            recorder.wait(self._work)
            return True

        def is_completed(self):
            return self._work.is_completed()

        def get_future(self):
            return self._work.get_future()

    class TimedAllGather(AllGather):
        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            work = recorder.issue(f"allgather.{recorder.phase}.{unit_name}", lambda: dist.all_gather_into_tensor(
                output_tensor, input_tensor, group=group, async_op=True))
            if async_op:
                return BlockTimedWork(work, output_tensor)
            recorder.wait(work)
            return None

    class TimedReduceScatter(ReduceScatter):
        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            if recorder.reduce_scatters:  # post_backward waits for the unit before's reduce-scatter
                previous, previous_input = recorder.reduce_scatters.pop()  # and lets it go (FSDP2 dropped its input)
                recorder.wait(previous)
                _let_go(previous_input)
            if predivide:  # the mean, computed before the sum (FSDP2's own division is switched off: see make)
                input_tensor.div_(group.size())
            work = recorder.issue(f"reduce_scatter.{unit_name}", lambda: dist.reduce_scatter_tensor(
                output_tensor, input_tensor, op=op, group=group, async_op=True))
            recorder.reduce_scatters.append((work, input_tensor))
            return work

    return TimedAllGather(), TimedReduceScatter()
