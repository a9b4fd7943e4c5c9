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
