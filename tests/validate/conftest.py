"""Shared helpers of the tests that run ranks for real."""

from __future__ import annotations


def emulation_available() -> tuple[bool, str]:
    """(True, "") when torch is installed and network namespaces with tc can be made here, else (False, why)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False, "torch is not installed"
    from validate.cluster import netemu

    return netemu.available()


def skip_timing_if_host_limited(*rows) -> None:
    """Skip what is left of a test (call it after the checks that do not time anything) when any of `rows` ran
    HOST-LIMITED (validate.comparison.compare.host_limited, the validator's own rule: the host's CPUs, not the
    emulated network, bounded the run): its times then say how loaded this machine was, not how the launcher or
    the model did (issue 36: 270 ms against 58 ms for one configuration, both rows host-limited, under a loaded
    suite; the same test passes alone)."""
    import pytest

    from validate.comparison.compare import host_limited

    limited = [str(r.get("id", i)) for i, r in enumerate(rows) if host_limited(r)]
    if limited:
        busy = ", ".join(f"{float(r.get('host_cpu_busy') or 0):.0%}" for r in rows if host_limited(r))
        pytest.skip(f"HOST-LIMITED ({', '.join(limited)}; CPUs {busy} busy): times of real processes on a loaded "
                    "host are not compared (the run's other checks passed)")


def supervisor_of(pid: int) -> int | None:
    """The pid of process `pid`'s cleanup supervisor (validate.cluster.supervisor), None while it has none."""
    import os

    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"validate.cluster.supervisor" in cmd:
            return int(entry)
    return None


def kill_with_supervisor(proc) -> None:
    """SIGKILL a process and, first, its supervisor: what a kill -9 leaves when nothing cleans up after it."""
    import os
    import signal

    sup = supervisor_of(proc.pid)
    assert sup is not None, f"process {proc.pid} has no supervisor"
    os.kill(sup, signal.SIGKILL)
    proc.kill()
    proc.wait()


def wait_until(condition, bound_s: float = 10.0, poll_s: float = 0.05) -> bool:
    """Polls `condition()` until it holds or `bound_s` passed; returns its last answer."""
    import time

    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            return bool(condition())
        time.sleep(poll_s)
    return True
