"""Is the host's CPU, not the emulated network, what limits a validation run?

On a machine with few cores, eight ranks' gloo threads (and their replayed compute) can want more CPU than there
is: the run then measures the host, which no simulator input describes, and its row must be reported apart rather
than counted against the network model (or dropped silently). `HostSampler` samples /proc/stat while the ranks run:
the kernel's count of runnable tasks (`procs_running`, every thread that is running or waiting for a core) and
the CPU time split. A run is host-limited when the CPUs were busy for at least HOST_BUSY_LIMIT of its time, or when
more tasks were runnable than the machine has cores (the sampler's own thread not counted) for more than
HOST_LIMITED_FRACTION of the samples: either way some rank was waiting for a core, not for the wire, for most of
the run.

The limits are definitions ("saturated", "most of the run"), not fits; they were set after the first bench run
of this validator had shown what the samples look like: a first cut at 25 % of the samples over the cores marked
2-rank runs whose error was 2 % (short bursts of gloo's spinning threads), and runs with the CPUs 95 % busy but few
samples over the cores were 27 % off. Rows are reported either way; the criterion only decides which ones the
bench's target statistics count.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass

#: a run is host-limited when more tasks than cores were runnable in more than this fraction of the samples,
HOST_LIMITED_FRACTION = 0.5
#: or when the CPUs were busy at least this fraction of the time
HOST_BUSY_LIMIT = 0.9
SAMPLE_S = 0.02


@dataclass(frozen=True)
class HostLoad:
    """What the host's CPUs did during a run: `busy` (fraction of all cores' time not idle), `runnable` (mean
    runnable tasks, the sampler not counted), `oversubscribed` (fraction of samples with more runnable tasks than
    `cores`), `samples`, `steal` (fraction of all cores' time a hypervisor took) and `limited` (the criterion)."""

    busy: float
    runnable: float
    oversubscribed: float
    samples: int
    cores: int
    steal: float = 0.0  # fraction of all cores' time stolen by the hypervisor (0 on bare metal)

    @property
    def limited(self) -> bool:
        return self.samples > 0 and is_limited(self.busy, self.oversubscribed)

    def row(self) -> dict:
        """Columns of a comparison row (validate.comparison.compare.COLUMNS)."""
        return {"host_cpu_busy": self.busy, "host_runnable": self.runnable,
                "host_oversubscribed": self.oversubscribed, "host_limited": self.limited, "host_steal": self.steal}


def is_limited(busy: float, oversubscribed: float) -> bool:
    """The host-limited criterion (module docstring) on a run's CPU busy fraction and oversubscribed samples."""
    return busy >= HOST_BUSY_LIMIT or oversubscribed > HOST_LIMITED_FRACTION


def read_stat(path: str = "/proc/stat") -> tuple[int, tuple[int, int]]:
    """(procs_running, (idle + iowait jiffies, total jiffies)) from a /proc/stat text."""
    running, idle, total, _ = _read(path)
    return running, (idle, total)


def _read(path: str) -> tuple[int, int, int, int]:
    """(procs_running, idle + iowait, total, steal jiffies) from a /proc/stat text. Steal: time a virtual machine's
    vCPUs were ready to run but the hypervisor ran something else (the 8th field of the cpu line)."""
    running, idle, total, steal = 0, 0, 0, 0
    with open(path, encoding="ascii") as f:
        for line in f:
            if line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:]]
                idle, total = v[3] + (v[4] if len(v) > 4 else 0), sum(v[:8])
                steal = v[7] if len(v) > 7 else 0
            elif line.startswith("procs_running"):
                running = int(line.split()[1])
    return running, idle, total, steal


class HostSampler:
    """Context manager: samples /proc/stat every `every_s` seconds in a thread until exit. `load(t0, t1)` is the
    HostLoad of the samples taken between two time.perf_counter() readings (the clock the ranks record their
    iterations with: CLOCK_MONOTONIC, shared by every process of the machine); `load()` of all of them. All zeros
    where /proc/stat cannot be read (not Linux)."""

    def __init__(self, every_s: float = SAMPLE_S, stat_path: str = "/proc/stat"):
        self.every_s, self.path = every_s, stat_path
        self.cores = os.cpu_count() or 1
        # (perf_counter, runnable, idle jiffies, total, steal jiffies); a sample without steal counts none
        self.samples: list[tuple] = []
        self._stop = threading.Event()

    def _take(self) -> None:
        try:
            running, idle, total, steal = _read(self.path)
        except OSError:
            return
        self.samples.append((time.perf_counter(), max(running - 1, 0), idle, total, steal))  # not this thread

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._take()

    def __enter__(self) -> HostSampler:
        self._take()
        self._thread = threading.Thread(target=self._loop, name="host-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def load(self, t0: float = -math.inf, t1: float = math.inf) -> HostLoad:
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        busy = steal = 0.0
        if len(inside) >= 2:
            d_idle, d_total = inside[-1][2] - inside[0][2], inside[-1][3] - inside[0][3]
            busy = 1.0 - d_idle / d_total if d_total > 0 else 0.0
            d_steal = (inside[-1][4] - inside[0][4]) if len(inside[0]) > 4 and len(inside[-1]) > 4 else 0
            steal = d_steal / d_total if d_total > 0 else 0.0
        n = len(inside)
        over = sum(1 for s in inside if s[1] > self.cores) / n if n else 0.0
        return HostLoad(busy, sum(s[1] for s in inside) / n if n else 0.0, over, n, self.cores, steal)
