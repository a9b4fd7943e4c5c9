"""`simfog validate` killed with SIGKILL at random moments (seeded: while it starts and builds its cluster, while
its calibration ranks run, while the validated ranks run; the process or its whole process group) leaves the host as
it was within seconds: the RR time slice and the allowed congestion-control list, network namespaces, the host's
links and qdiscs, processes and temporary folders. A second validator (this test process, holding the slice and a
cluster of its own) keeps what it holds. Needs root, `ip` and tc (a real emulated cluster)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from validate.cluster import host_settings, netemu
from validate.cluster.netemu import ALLOWED_CONGESTION_CONTROL, CC_SETTING, EmulatedCluster
from validate.cluster.scheduling import SETTING as RR_SETTING
from validate.cluster.scheduling import SYSCTL as RR_SYSCTL
from validate.cluster.scheduling import rr_time_slice

from ..conftest import make_trace
from .conftest import emulation_available, wait_until

REPO = Path(__file__).resolve().parents[2]
SEED = 22
BACK_WITHIN_S = 15.0  # the bound for the host to be as it was; the supervisor needs well under a second here
MARK_VAR = "SIMFOG_TEST_KILL"  # in the validator's environment, so in every process it starts
# Validators older than the shared records (validate.cluster.host_settings) keep the value they found here while
# they run, and restore it at their end whoever holds the setting then. A host may still run them beside this test:
# while one does, the settings are not compared (the older validator changes them by its own rules).
LEGACY = {RR_SETTING: Path("/run/simfog-validate-rr-timeslice"),
          CC_SETTING: Path("/run/simfog-validate-allowed-congestion-control")}
SETTINGS = ("rr_time_slice_ms", "allowed_congestion_control")

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", autouse=True)
def _needs_emulation():
    ok, why = emulation_available()
    if not ok:
        pytest.skip(f"no emulated cluster here: {why}")
    if not RR_SYSCTL.exists():
        pytest.skip(f"no {RR_SYSCTL}")


@pytest.fixture
def experiment(tmp_path) -> Path:
    """The smallest run with calibration and ranks: 2 nodes x 1 rank at 1 Gbit/s, 3 layers, 3 iterations (~9 s)."""
    make_trace([2e-3] * 3, [4e-3] * 3, [16384] * 3).save(tmp_path / "trace.json")
    path = tmp_path / "exp.toml"
    path.write_text('seed = 1\niterations = 3\n[workload]\ntrace = "trace.json"\ncompute = "mean"\n'
                    '[cluster]\nnodes = 2\ngpus_per_node = 1\nnic_bandwidth = "1Gbit/s"\n[comm]\nmerge = "wfbp"\n')
    return path


def resting(setting: str, sysctl: Path) -> str:
    """The setting's value when no validator holds it: the value found before the first holder while live ones
    hold it (a record of dead holders only is a leftover: then the value is the current one)."""
    record = host_settings.read_record(setting, host_settings.STATE_DIR)
    if record is not None and any(host_settings.holder_alive(h) for h in record["holders"]):
        return record["original"]
    legacy = LEGACY[setting]
    if legacy.is_file():
        return legacy.read_text().strip().split("\n")[-1]
    return sysctl.read_text().strip()


def holders_of(pid: int) -> list[str]:
    return [h for s in (RR_SETTING, CC_SETTING) for h in (host_settings.read_record(s) or {}).get("holders", [])
            if h.startswith(f"{pid}-")]


def host_state(tmp: Path) -> dict:
    """What a validator may change on the host (the host namespace's links and qdiscs, which no run should touch)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, check=True).stdout
    return {"rr_time_slice_ms": resting(RR_SETTING, RR_SYSCTL),
            "allowed_congestion_control": resting(CC_SETTING, ALLOWED_CONGESTION_CONTROL),
            "links": sorted(line.split(":")[1].strip() for line in links.splitlines()),
            "qdiscs": sorted(qdiscs.splitlines()),
            "temporary folders": sorted(os.listdir(tmp))}


def older_validator_running() -> bool:
    return any(path.exists() for path in LEGACY.values())


def marked_processes(mark: str) -> dict[int, str]:
    """Live (non-zombie) processes whose environment carries MARK_VAR=mark: pid -> command line."""
    found = {}
    needle = f"{MARK_VAR}={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
    return found


def namespaces_of(pid: int) -> list[str]:
    return [ns for ns in netemu._namespaces() if ns.startswith(f"sf{pid}-")]


class Validator:
    """`simfog validate` on the experiment in a session of its own, its stderr's milestones timed."""

    def __init__(self, experiment: Path, tmp: Path):
        self.mark = uuid.uuid4().hex
        env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp), MARK_VAR: self.mark}
        self.proc = subprocess.Popen([sys.executable, "-m", "simfog", "validate", str(experiment), "--warmup", "1",
                                      "--emulate", "--csv", str(experiment.with_suffix(".csv")), "--force"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                                     start_new_session=True)
        self.seen: dict[str, float] = {"start": time.monotonic()}
        self.said: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.said.append(line)
            for milestone in ("calibrating", "running"):
                if milestone in line and milestone not in self.seen:
                    self.seen[milestone] = time.monotonic()

    def wait_for(self, milestone: str, bound_s: float = 120.0) -> None:
        assert wait_until(lambda: milestone in self.seen or self.proc.poll() is not None, bound_s), \
            f"no {milestone!r} within {bound_s} s"
        assert milestone in self.seen, f"the validator ended before {milestone!r}: {''.join(self.said)[-2000:]}"


def kill_and_check(experiment: Path, tmp: Path, phase: str, delay_s: float, group: bool) -> dict:
    """Start a validator, SIGKILL it (or its process group) `delay_s` after `phase`, and assert that the host is
    back to what it was before within BACK_WITHIN_S. Returns what the validator had changed when it was killed
    and whether an older validator ran meanwhile."""
    older = [older_validator_running()]
    before = host_state(tmp)
    v = Validator(experiment, tmp)
    pid = v.proc.pid
    try:
        v.wait_for(phase)
        time.sleep(max(0.0, v.seen[phase] + delay_s - time.monotonic()))
        assert v.proc.poll() is None, f"the validator ended before the kill: {''.join(v.said)[-2000:]}"
        older.append(older_validator_running())
        changed = {"rr_time_slice_ms": RR_SYSCTL.read_text().strip(), "namespaces": namespaces_of(pid),
                   "ranks": [c for c in marked_processes(v.mark).values() if "validate.ranks.worker" in c]}
    finally:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
        v.proc.wait()

    def differences() -> dict:
        older.append(older_validator_running())
        return {k: (before[k], now) for k, now in host_state(tmp).items()
                if now != before[k] and not (any(older) and k in SETTINGS)}

    def back() -> bool:
        return not differences() and not namespaces_of(pid) and not marked_processes(v.mark) and not holders_of(pid)

    if not wait_until(back, BACK_WITHIN_S, 0.1):
        left = differences()
        pytest.fail(f"{BACK_WITHIN_S} s after kill -9 ({phase} + {delay_s:.2f} s): changed {left}, namespaces "
                    f"{namespaces_of(pid)}, processes {marked_processes(v.mark)}, holds {holders_of(pid)}")
    return {**changed, "older validator": any(older)}


def kill_moments(rng: random.Random, n: int) -> list[tuple[str, float, bool]]:
    """(phase, delay after it, kill the whole process group): each phase once, then the process group while ranks
    run, then at random. Unloaded, the cluster is built 1.1-1.3 s after the start, calibration takes ~4 s and the
    validated run ~3 s, ranks included from their start (importing torch)."""
    windows = {"start": (0.3, 2.0), "calibrating": (0.3, 3.5), "running": (0.2, 2.0)}
    moments = [(p, rng.uniform(*windows[p]), False) for p in windows]
    p = rng.choice(["calibrating", "running"])
    moments.append((p, rng.uniform(*windows[p]), True))
    for _ in range(n - len(moments)):
        p = rng.choice(list(windows))
        moments.append((p, rng.uniform(*windows[p]), rng.random() < 0.5))
    return moments[:n]


def _kill_at_random_moments(experiment: Path, tmp_path: Path, n: int) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for phase, delay_s, group in kill_moments(random.Random(SEED), n):
        changed = kill_and_check(experiment, tmp, phase, delay_s, group)
        if phase != "start":  # the kill found the host changed (so the checks above compare something)
            assert len(changed["namespaces"]) == 3 and changed["ranks"], changed
            assert changed["rr_time_slice_ms"] == "1" or changed["older validator"], changed


def test_kill_9_at_random_moments_leaves_the_host_as_it_was(experiment, tmp_path):
    _kill_at_random_moments(experiment, tmp_path, 4)


@pytest.mark.slow
def test_kill_9_at_many_random_moments_leaves_the_host_as_it_was(experiment, tmp_path):
    _kill_at_random_moments(experiment, tmp_path, 15)


def test_a_killed_validator_leaves_another_validator_s_slice_and_cluster(experiment, tmp_path):
    """This process plays the validator that keeps running: it holds the slice and has a cluster of its own while
    another is killed during its ranks; both stay, and its own end restores the slice."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    if not wait_until(lambda: RR_SYSCTL.read_text().strip() != "1" or host_settings.read_record(RR_SETTING), 60, 1):
        pytest.skip("the RR time slice is at 1 ms outside the shared records (a validator of an older version?)")
    original = resting(RR_SETTING, RR_SYSCTL)
    with rr_time_slice() as applied, EmulatedCluster(2, 125e6, prefix="sfk") as ours:
        assert applied
        mine = [ours.switch, *(n.namespace for n in ours.nodes)]
        st = host_settings.STATE_DIR.lstat()  # the records: in a folder only root may write
        assert st.st_uid == 0 and not st.st_mode & 0o022
        kill_and_check(experiment, tmp, "running", 0.5, False)
        assert RR_SYSCTL.read_text().strip() == "1"  # still held by this process
        assert set(mine) <= set(netemu._namespaces())
        record = host_settings.read_record(RR_SETTING)
        assert record["original"] == original and any(h.startswith(f"{os.getpid()}-") for h in record["holders"])
    if resting(RR_SETTING, RR_SYSCTL) == original and host_settings.read_record(RR_SETTING) is None:
        assert RR_SYSCTL.read_text().strip() == original  # nobody else holds it: back to what the host had
    assert not set(mine) & set(netemu._namespaces())
