"""Host settings shared by validators running at once: one ending (cleanly or by kill -9) never resets what another
still holds, the last one out restores the value found before the first, and a killed holder's supervisor releases
it within seconds. Files in tmp_path stand in for the sysctls."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from validate.cluster import host_settings, netemu
from validate.cluster.scheduling import SETTING, rr_time_slice

from .conftest import kill_with_supervisor, wait_until

REPO = Path(__file__).resolve().parents[2]

# Holds the slice (sysctl argv[1], state folder argv[2]) at 1 ms, says so, and waits to be killed.
HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from validate.cluster.scheduling import rr_time_slice
    with rr_time_slice(1, sysctl=Path(sys.argv[1]), state_dir=Path(sys.argv[2])) as applied:
        print("held" if applied else "not held", flush=True)
        time.sleep(60)
""")


@pytest.fixture
def sysctl(tmp_path):
    path = tmp_path / "sched_rr_timeslice_ms"
    path.write_text("100\n")
    return path


@pytest.fixture
def holder(sysctl, tmp_path):
    """Starts a validator stand-in in another process that holds the slice; kills it (-9) at the end."""
    procs = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(sysctl), str(tmp_path / "state")],
                                stdout=subprocess.PIPE, text=True, cwd=REPO)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def holders(tmp_path) -> list[str]:
    record = host_settings.read_record(SETTING, tmp_path / "state")
    return [] if record is None else record["holders"]


def test_one_validator_ending_leaves_the_slice_of_another_that_runs(sysctl, tmp_path, holder):
    """B starts while A runs and ends first: A keeps its 1 ms; A's end restores the host's 100 ms."""
    a = holder()
    with rr_time_slice(1, sysctl=sysctl, state_dir=tmp_path / "state") as applied:
        assert applied and sysctl.read_text() == "1"
        assert len(holders(tmp_path)) == 2
    assert sysctl.read_text() == "1"  # B's end did not "restore" under A
    assert [h.split("-")[0] for h in holders(tmp_path)] == [str(a.pid)]
    a.kill()  # A's supervisor releases it: the last one out restores what the first found
    a.wait()
    assert wait_until(lambda: sysctl.read_text() == "100")
    assert holders(tmp_path) == []


def test_a_killed_validator_s_supervisor_releases_only_its_own_hold(sysctl, tmp_path, holder):
    with rr_time_slice(1, sysctl=sysctl, state_dir=tmp_path / "state"):
        b = holder()
        b.kill()
        b.wait()
        assert wait_until(lambda: len(holders(tmp_path)) == 1)
        assert holders(tmp_path)[0].startswith(f"{os.getpid()}-")
        assert sysctl.read_text() == "1"  # still held by this process
    assert sysctl.read_text() == "100"


def test_a_validator_killed_with_its_supervisor_is_released_by_the_next(sysctl, tmp_path, holder):
    kill_with_supervisor(holder())
    assert sysctl.read_text() == "1" and len(holders(tmp_path)) == 1  # nobody left to restore it ...
    with rr_time_slice(1, sysctl=sysctl, state_dir=tmp_path / "state"):
        assert host_settings.read_record(SETTING, tmp_path / "state")["original"] == "100"  # ... but the next knows
    assert sysctl.read_text() == "100"


def test_a_reused_pid_is_not_a_live_holder():
    me = host_settings.new_holder()
    pid, start, serial = me.split("-")
    assert pid == str(os.getpid()) and host_settings.holder_alive(me)
    assert not host_settings.holder_alive(f"{pid}-{int(start) + 1}-{serial}")  # same pid, another process
    assert not host_settings.holder_alive("junk")


def test_holds_in_one_process_are_counted_apart(sysctl, tmp_path):
    state = tmp_path / "state"
    first, second = host_settings.new_holder(), host_settings.new_holder()
    want = lambda original: "1"  # noqa: E731
    assert host_settings.acquire(SETTING, sysctl, want, first, state_dir=state)
    assert host_settings.acquire(SETTING, sysctl, want, second, state_dir=state)
    host_settings.release(SETTING, sysctl, first, state_dir=state)
    assert sysctl.read_text() == "1" and holders(tmp_path) == [second]
    host_settings.release(SETTING, sysctl, first, state_dir=state)  # twice: idempotent
    assert sysctl.read_text() == "1"
    host_settings.release(SETTING, sysctl, second, state_dir=state)
    assert sysctl.read_text() == "100" and holders(tmp_path) == []


def test_the_congestion_control_list_is_shared_the_same_way(tmp_path):
    allowed = tmp_path / "tcp_allowed_congestion_control"
    allowed.write_text("reno bbr\n")
    state = tmp_path / "state"
    a = netemu.allowed_congestion_control("cubic", sysctl=allowed, state_dir=state)
    b = netemu.allowed_congestion_control("cubic", sysctl=allowed, state_dir=state)
    a.__enter__()
    b.__enter__()
    assert allowed.read_text().split() == ["reno", "bbr", "cubic"]
    a.__exit__(None, None, None)
    assert allowed.read_text().split() == ["reno", "bbr", "cubic"]  # B still selects cubic
    b.__exit__(None, None, None)
    assert allowed.read_text().split() == ["reno", "bbr"]
