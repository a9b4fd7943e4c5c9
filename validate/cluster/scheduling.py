"""How the ranks of a validation run are scheduled on the host: real-time round robin, nice, or as they come.

A simulator assumes dedicated nodes; on a small machine shared by up to 8 ranks (and other work), every wake-up of
a rank or of gloo's threads can be delayed by milliseconds. "rt" moves every thread of a rank to SCHED_RR at a low
real-time priority once its process group is up (`raise_priority`, in the rank), and the validator shortens the
round-robin time slice of the whole machine while the ranks run (`rr_time_slice`). Measured here (2 cores, MLP
replay on 2 nodes at 200 Mbit/s): the std of the iteration time fell from 2-5 ms (none, or nice -20) to
0.1-0.3 ms.

Why the time slice: gloo busy-waits in two places. Its TCP event loop (thread "gloo_tcp_loop") returns from
`Pair::handleEvents` at once when another thread holds the pair's lock, and level-triggered epoll hands it the
same event again; and a worker thread destroying an `UnboundBuffer` spins on `sched_yield` until the loop drops its
reference. At equal SCHED_RR priority a spinner keeps its CPU for the whole time slice (100 ms by default) while
the thread it waits for is queued behind it: `perf sched` showed gloo_tcp_loop threads running 34-100 ms at a
stretch and every rank stalling at once at random iterations (iteration-time CV 0.2-0.7, worst bench errors
-27 %). A lower priority for the loop thread deadlocks instead (the yielding worker never lets it run). With a
1 ms slice the waiting thread gets the CPU within a millisecond: CV 0.05, no iteration above 1.4x the median in
150 (MLP wfbp, 4 nodes at 1 Gbit/s). `sched_rr_timeslice_ms` only affects SCHED_RR threads, i.e. on this machine
only the ranks. The slice is held (validate.cluster.host_settings), not just set: validators running at once share
it, the last one out restores the value found before the first, and a validator's supervisor releases it within a
second when the validator is killed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from validate.cluster import host_settings

PRIORITIES = ("rt", "nice", "none")
RT_PRIORITY = 10  # SCHED_RR, low among real-time priorities; the kernel's RT throttling still applies
RR_TIME_SLICE_MS = 1
SYSCTL = Path("/proc/sys/kernel/sched_rr_timeslice_ms")
SETTING = "rr-timeslice"  # its record in host_settings.STATE_DIR


def raise_priority(kind: str) -> bool:
    """Give every thread of this process real-time round-robin scheduling at RT_PRIORITY ("rt") or nice -20
    ("nice"); "none" leaves it. Call it after the process group is up (at real-time priority from the start, ranks
    importing torch and retrying the rendezvous on 2 cores starve one another) and again after creating process
    groups (their threads are started by the creating thread and inherit its policy, but not retroactively).
    Every thread gets the same priority: see the module docstring. Returns False when not permitted (not root)."""
    if kind == "none":
        return True
    ok = True
    for tid in os.listdir("/proc/self/task"):
        try:
            if kind == "rt":
                os.sched_setscheduler(int(tid), os.SCHED_RR, os.sched_param(RT_PRIORITY))
            else:
                os.setpriority(os.PRIO_PROCESS, int(tid), -20)
        except (PermissionError, ProcessLookupError):
            ok = False
    return ok


@contextlib.contextmanager
def rr_time_slice(ms: int = RR_TIME_SLICE_MS, *, sysctl: Path = SYSCTL,
                  state_dir: Path | None = None) -> Iterator[bool]:
    """Hold the machine's SCHED_RR time slice at `ms` for the duration (host_settings.holding, with its state in
    `state_dir`, default host_settings.STATE_DIR); yields whether it is at `ms` (False without root or without the
    sysctl: the runs still work, with the default slice)."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(host_settings.holding(SETTING, sysctl, lambda original: str(int(ms)),
                                                      state_dir=state_dir))
        except OSError:
            applied = False
        else:
            applied = True
        yield applied
