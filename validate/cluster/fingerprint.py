"""Which machine ran a validation: its fingerprint, recorded in every row, so that two runs on two machines can be
told apart and compared.

A validation row measures the host as much as simfog (gloo's threads, Python around each collective, replayed
compute on shared cores), so a figure means little without the machine it came from. The fingerprint is what a
reader needs to tell two hosts apart: the CPU model and core count the kernel reports, the kernel release, and the
time of a fixed single-core microbenchmark (pure Python: what the ranks' host work runs on), measured once per
validator run. Steal time (a virtual machine's vCPU waiting for its hypervisor) and the load before each row are
per row: validate.cluster.hostload samples them.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from functools import lru_cache

MICROBENCHMARK_N = 300_000  # loop steps: ~30-60 ms on the 2-core VMs this was written on
MICROBENCHMARK_RUNS = 7


def microbenchmark_s(n: int = MICROBENCHMARK_N, runs: int = MICROBENCHMARK_RUNS) -> float:
    """Median seconds of a fixed pure-Python loop (integer arithmetic, a dict and a list: the interpreter's own
    work, one core), over `runs` runs after one warm-up. The same code and n on every machine, so only the machine
    moves it."""
    def once() -> float:
        t0 = time.perf_counter()
        table: dict[int, int] = {}
        acc = 0
        for i in range(n):
            acc = (acc * 31 + i) % 1_000_003
            table[i & 1023] = acc
        sorted(table.values())
        return time.perf_counter() - t0

    once()
    times = sorted(once() for _ in range(runs))
    return times[len(times) // 2]


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU model the kernel reports ("model name" of /proc/cpuinfo), else the platform's processor string."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@dataclass(frozen=True)
class HostFingerprint:
    """The machine: CPU model, logical cores, kernel release and the microbenchmark's median seconds."""

    cpu_model: str
    cores: int
    kernel: str
    microbenchmark_s: float

    def row(self) -> dict:
        """Columns of a comparison row (validate.comparison.compare.COLUMNS)."""
        return {"host_cpu_model": self.cpu_model, "host_cores": self.cores, "host_kernel": self.kernel,
                "host_microbenchmark_s": self.microbenchmark_s}

    def describe(self) -> str:
        return (f"{self.cpu_model}, {self.cores} cores, kernel {self.kernel}, fixed single-core microbenchmark "
                f"{self.microbenchmark_s * 1e3:.1f} ms")


@lru_cache(maxsize=1)
def fingerprint() -> HostFingerprint:
    """This machine's fingerprint, measured once per process (the microbenchmark takes about half a second)."""
    return HostFingerprint(cpu_model(), os.cpu_count() or 1, platform.release(), microbenchmark_s())
