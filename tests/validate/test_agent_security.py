"""The node agents (validate.launch.shared_dir) run only what the validator sent: each attack found on the agents'
shared folder is played against real agents (threads running `run_agent` on a temporary workdir, the validator's
side played by hand through the files, as an attacker would) and shown refused, the agent answering with an error
report and living on; the legitimate flow still runs end to end through SharedDirLauncher."""

from __future__ import annotations

import grp
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog.errors import ConfigError
from validate.launch.agent_request import (
    ENV,
    PROGRAMS,
    WORKER_OPTIONS,
    LaunchRequest,
    RequestError,
    load_secret,
    new_secret,
    parse_request,
    seal,
    unseal,
)
from validate.launch.private_files import UnsafeFile, write_private
from validate.launch.shared_dir import SharedDirLauncher, run_agent

SECRET = b"0123456789abcdef0123456789abcdef"
HOSTS = ["h0", "h1"]
REPO = Path(__file__).resolve().parents[2]


class Agent:
    """Node 1's agent of HOSTS, in a thread, on `root`; the validator's side by hand: signed files as the validator
    writes them (`start_run`, `send`, `stop`), or any bytes an attacker writes (`put`)."""

    def __init__(self, root: Path):
        self.root, self.logs, self.codes = root, [], []
        root.mkdir(mode=0o700, exist_ok=True)
        self.thread = threading.Thread(target=lambda: self.codes.append(
            run_agent(root, 1, HOSTS, secret=SECRET, port=29999, idle_timeout_s=120, log=self.logs.append)))
        self.thread.start()
        announcement = root / "agents" / "node1.json"
        _wait(announcement.exists)
        self.nonce = unseal(announcement.read_bytes(), "agent", SECRET)["nonce"]
        self.run = None

    def start_run(self, name: str) -> Path:
        folder = self.root / "launches" / name
        folder.mkdir(mode=0o700, parents=True)
        write_private(self.root / "launches" / "current.json", seal("current", {"run": name}, SECRET), self.root)
        self.run = name
        return folder

    def body(self, k: int, /, **changes) -> dict:
        """A legitimate request for launch k of the current run: node 0 only, so that node 1 answers at once."""
        return {"run": self.run, "k": k, "nodes": [0], "nproc_per_node": 1, "module": "validate.ranks.worker",
                "args": ["spec.json", "ranks"], "env": {"OMP_NUM_THREADS": "1"}, "agents": ["0" * 32, self.nonce],
                **changes}

    def put(self, k: int, raw: bytes, *, mode: int = 0o600, uid: int = -1, gid: int = -1) -> None:
        """An attacker's launch-k.json: `raw`, with that mode and owner, in place at once (made aside, renamed)."""
        folder = self.root / "launches" / self.run
        aside = folder.parent / f"aside-{k}"
        aside.write_bytes(raw)
        os.chown(aside, uid, gid)
        aside.chmod(mode)
        os.replace(aside, folder / f"launch-{k}.json")

    def send(self, k: int, /, **changes) -> None:
        """The validator's launch-k.json, written as SharedDirLauncher writes it."""
        folder = self.root / "launches" / self.run
        write_private(folder / f"launch-{k}.json", seal("request", self.body(k, **changes), SECRET), self.root)

    def report(self, k: int) -> dict:
        path = self.root / "launches" / self.run / f"launch-{k}.node1.json"
        _wait(lambda: path.exists() and not path.is_symlink())  # a link planted there is not the agent's answer
        return unseal(path.read_bytes(), "report", SECRET)

    def stop(self) -> list[int]:
        write_private(self.root / "launches" / self.run / "stop", seal("stop", {"run": self.run}, SECRET), self.root)
        self.thread.join(timeout=30)
        return self.codes


def _wait(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def agent(tmp_path):
    a = Agent(tmp_path / "shared")
    yield a
    if a.thread.is_alive():  # a failed test: end the agent through a run of its own
        a.start_run("teardown")
        a.stop()


def _evil_module(folder: Path, marker: Path) -> None:
    (folder / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")


def test_a_request_naming_the_attackers_module_and_environment_is_refused(agent, tmp_path):
    """The attack: `{"module": "evilmod", "env": {"PYTHONPATH": <shared>}}` with the module beside it ran as the
    agent's user; LD_PRELOAD the same. Unsigned, with a forged signature, and even signed with the secret, each is
    answered with an error report naming what is refused; nothing runs, and the agent serves the next request."""
    marker = tmp_path / "pwned"
    _evil_module(agent.root, marker)
    agent.start_run("r1")
    evil = agent.body(0, module="evilmod", nodes=[1], args=[], env={"PYTHONPATH": str(agent.root)})
    agent.put(0, json.dumps(evil).encode())  # the attack as found: a plain request, no signature
    assert "launch-0.json: message = " in agent.report(0)["error"]
    agent.put(1, json.dumps({"kind": "request", "body": agent.body(1, module="evilmod", nodes=[1]),
                             "mac": "0" * 64}).encode())
    assert "mac = '0000000000000000...': the signature of the secret" in agent.report(1)["error"]
    # signed (the secret leaked, or a validator gone wrong): still only the rank program, and no such variables
    for k, changes, field in ((2, {"module": "evilmod"}, "module = 'evilmod'"),
                              (3, {"env": {"PYTHONPATH": str(agent.root)}}, "env = 'PYTHONPATH'"),
                              (4, {"env": {"LD_PRELOAD": str(agent.root / "evil.so")}}, "env = 'LD_PRELOAD'"),
                              (5, {"args": ["spec.json", "ranks", "--exec", "evilmod"]}, "args[2] = '--exec'")):
        agent.send(k, nodes=[1], **changes)
        report = agent.report(k)
        assert report["rc"] is None and field in report["error"], report
    assert not marker.exists()
    agent.send(6)
    assert agent.report(6) == {"run": "r1", "k": 6, "node": 1, "rc": 0, "stderr": "", "error": ""}
    assert agent.stop() == [0]
    assert not marker.exists()
    assert sum("refused" in line for line in agent.logs) == 6


def test_a_current_run_outside_the_workdir_is_ignored(agent, tmp_path):
    """The attack: current.json with {"run": "../../outside"} made the agent read requests from and write its
    results into any folder. Unsigned or signed, a run name with a path is ignored, as is a run folder that is a
    link out of the workdir; nothing is written outside, and a legitimate run that follows is served."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "launch-0.json").write_text("{}")
    launches = agent.root / "launches"
    launches.mkdir(mode=0o700)
    (launches / "current.json").write_text(json.dumps({"run": "../../outside"}))
    _wait(lambda: any("ignoring" in line and "message =" in line for line in agent.logs))
    write_private(launches / "current.json", seal("current", {"run": "../../outside"}, SECRET), agent.root)
    _wait(lambda: any("current.json run = '../../outside'" in line for line in agent.logs))
    (launches / "elsewhere").symlink_to(outside)
    write_private(launches / "current.json", seal("current", {"run": "elsewhere"}, SECRET), agent.root)
    _wait(lambda: any("elsewhere = 'a symbolic link'" in line for line in agent.logs))
    time.sleep(0.5)  # a few more polls: still nothing written outside
    assert sorted(p.name for p in outside.iterdir()) == ["launch-0.json"]
    agent.start_run("r1")
    agent.send(0)
    assert agent.report(0)["error"] == ""
    assert agent.stop() == [0]
    assert sorted(p.name for p in outside.iterdir()) == ["launch-0.json"]


def test_planted_links_never_redirect_a_write(agent, tmp_path):
    """The attack: temporary files named .<name>.<pid>.tmp, the PID published, so a link planted at that name made
    the agent (and the validator, often under sudo) overwrite another file. Links at the old temporary names and at
    the final names are planted for the agent's report and the validator's request and current.json: the victim
    is left as it was, each link replaced by the file; a request that is itself a link is refused."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    pid = os.getpid()  # the agent is a thread of this process
    launches = agent.root / "launches"
    launches.mkdir(mode=0o700)
    for name in ("current.json", f".current.json.{pid}.tmp"):
        (launches / name).symlink_to(victim)
    folder = agent.start_run("r1")
    assert not (launches / "current.json").is_symlink()
    for name in ("launch-0.node1.json", "launch-1.node1.json", "stop"):  # where the agent or validator will write
        (folder / name).symlink_to(victim)
    for name in ("launch-0.node1.json", "launch-1.json", "launch-1.node1.json", "stop"):
        (folder / f".{name}.{pid}.tmp").symlink_to(victim)
    (tmp_path / "elsewhere.json").write_bytes(seal("request", agent.body(0), SECRET))
    (folder / "launch-0.json").symlink_to(tmp_path / "elsewhere.json")
    assert "launch-0.json = 'a symbolic link'" in agent.report(0)["error"]
    agent.send(1)  # the validator's write replaces nothing but the planted files' names
    assert agent.report(1)["error"] == ""
    assert not (folder / "launch-1.node1.json").is_symlink()
    assert agent.stop() == [0]
    assert not (folder / "stop").is_symlink()
    assert victim.read_text() == "precious"
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_malformed_requests_are_answered_and_the_agent_lives_on(agent):
    """The attack: `"nodes": 5` killed the agent with a traceback. Signed or not, malformed requests are answered
    with an error report naming the field and value, one after the other, and the agent serves the next one."""
    agent.start_run("r1")
    cases = [(b'{"kind": "request", "body": {"nodes": 5}', "JSON"), (b"[" * 100_000, "JSON"),
             (b"\xff\xfe\x00", "JSON"), (b'{"kind": "request", "body": {"a": NaN}, "mac": "' + b"0" * 64 + b'"}',
                                         "without NaN")]
    for k, (raw, expected) in enumerate(cases):
        agent.put(k, raw)
        assert expected in agent.report(k)["error"]
    signed = [({"nodes": 5}, "nodes = 5"), ({"nodes": [1, 1]}, "increasing order"), ({"nodes": [7]}, "nodes[] = 7"),
              ({"nproc_per_node": 10**30}, "nproc_per_node"), ({"k": "0"}, "k = '0'"), ({"args": "x"}, "args = 'x'"),
              ({"args": ["../../etc/x.json", "ranks"]}, "args[0]"), ({"args": ["/etc/passwd.json", "r"]}, "args[0]"),
              ({"args": ["spec.json", "ranks", "--timeout", "nan"]}, "args[3] (--timeout)"),
              ({"env": {"OMP_NUM_THREADS": "0"}}, "env.OMP_NUM_THREADS"), ({"agents": []}, "agents"),
              ({"extra": 1}, "exactly the fields")]
    for k, (changes, expected) in enumerate(signed, start=len(cases)):
        agent.send(k, **changes)
        report = agent.report(k)
        assert expected in report["error"] and report["rc"] is None, (changes, report)
    k = len(cases) + len(signed)
    agent.send(k)
    assert agent.report(k)["error"] == ""
    assert agent.stop() == [0]


def test_replayed_requests_are_refused(agent, tmp_path):
    """A signed request copied into another run, or into another index, or made for an earlier start of the agent
    (another nonce) is refused."""
    agent.start_run("r1")
    agent.send(0)
    assert agent.report(0)["error"] == ""
    old = (agent.root / "launches" / "r1" / "launch-0.json").read_bytes()
    agent.put(1, old)
    assert "run, k = ['r1', 0]" in agent.report(1)["error"]
    agent.start_run("r2")
    agent.put(0, old)
    assert "run, k = ['r1', 0]" in agent.report(0)["error"]
    agent.send(1, agents=["0" * 32, "f" * 32])
    assert "agents[1] = 'ffffffffffffffffffffffffffffffff'" in agent.report(1)["error"]
    assert agent.stop() == [0]


def test_files_and_folders_other_users_can_write_are_refused(agent, tmp_path):
    """The workdir, the run folder and every file read are refused when another user can write them (as root here:
    files given to another uid, or made group- or world-writable)."""
    folder = agent.start_run("r1")
    signed = [seal("request", agent.body(k), SECRET) for k in range(4)]
    agent.put(0, signed[0], mode=0o666)
    assert "writable by every user (mode 666)" in agent.report(0)["error"]
    agent.put(1, signed[1], uid=12345)
    assert "owned by uid 12345" in agent.report(1)["error"]
    agent.put(2, signed[2], gid=54321, mode=0o660)  # a group of nobody known: not the owner's private group
    assert "writable by group 54321" in agent.report(2)["error"]
    folder.chmod(0o777)  # the run folder itself: the agent can neither trust a request nor answer there
    agent.put(3, signed[3])
    _wait(lambda: any("cannot answer" in line and "leaving run r1" in line for line in agent.logs))
    assert not (folder / "launch-3.node1.json").exists()
    agent.start_run("r2")
    agent.send(0)
    assert agent.report(0)["error"] == ""
    assert agent.stop() == [0]
    for mode in (0o777, 0o757):
        unsafe = tmp_path / f"unsafe{mode:o}"
        unsafe.mkdir()
        unsafe.chmod(mode)
        with pytest.raises(UnsafeFile, match="writable by every user"):
            run_agent(unsafe, 0, HOSTS, secret=SECRET)
        with pytest.raises(UnsafeFile, match="writable by every user"):
            SharedDirLauncher(unsafe, HOSTS, secret=SECRET)
    inside = tmp_path / "open" / "work"  # a folder above the workdir that anyone can write (no sticky bit)
    inside.mkdir(parents=True)
    inside.parent.chmod(0o777)
    with pytest.raises(UnsafeFile, match="writable by every user .mode 777.; it holds the workdir"):
        run_agent(inside, 0, HOSTS, secret=SECRET)
    root_group = grp.getgrgid(0)
    if root_group.gr_name == "root" and not set(root_group.gr_mem) - {"root"}:
        private = tmp_path / "private"  # group-writable by the owner's own private group (umask 002): accepted
        private.mkdir(mode=0o770)
        private.chmod(0o770)
        SharedDirLauncher(private, HOSTS, secret=SECRET).stop()


def test_the_secret_file_must_be_private(tmp_path):
    """new_secret writes a file only its user can read, never over an existing one; load_secret refuses one that
    group or others can read, a link, a short one; the agent's command line says so in one line, exit 2."""
    key = new_secret(tmp_path / "key")
    assert oct(key.stat().st_mode & 0o777) == "0o600" and len(load_secret(key)) == 64
    with pytest.raises(ConfigError, match="does not exist yet"):
        new_secret(key)
    (tmp_path / "link").symlink_to(key)
    with pytest.raises(ConfigError, match="not a link"):
        load_secret(tmp_path / "link")
    (tmp_path / "short").write_text("abc")
    (tmp_path / "short").chmod(0o600)
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        load_secret(tmp_path / "short")
    key.chmod(0o640)
    with pytest.raises(ConfigError, match="mode 640: chmod 600"):
        load_secret(key)
    done = subprocess.run([sys.executable, "-m", "validate.launch.shared_dir", "--workdir", str(tmp_path / "w"),
                           "--node", "0", "--hosts", "h0", "--secret-file", str(key)], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("node agent: error: --secret-file = ") and "chmod 600" in done.stderr


def test_the_validator_shows_an_agents_refusal_and_the_legitimate_flow_runs(tmp_path):
    """End to end through SharedDirLauncher and two agents: a request planted before the validator's is refused,
    and the validator's launch that finds that answer says which node refused and why; the next launch, a real
    calibration microbenchmark with the environment validate.run gives (its PYTHONPATH left to the agents), runs
    torchrun on both nodes and leaves each rank's record. Links planted where the validator writes (current.json,
    stop, their old temporary names) leave their target as it was."""
    pytest.importorskip("torch")
    from validate.collect.collect_network import free_port, make_plan
    from validate.launch.launcher import LaunchError

    root, port, hosts = tmp_path / "shared", free_port(), ["127.0.0.1", "127.0.0.1"]
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (root / "launches").mkdir(mode=0o700, parents=True)
    for name in ("current.json", f".current.json.{os.getpid()}.tmp"):
        (root / "launches" / name).symlink_to(victim)
    launcher = SharedDirLauncher(root, hosts, secret=SECRET, port=port, log=lambda s: None)
    for name in ("stop", f".stop.{os.getpid()}.tmp"):
        (launcher.launches / name).symlink_to(victim)
    codes = []
    agents = [threading.Thread(target=lambda i=i: codes.append(run_agent(root, i, hosts, secret=SECRET, port=port)))
              for i in range(2)]
    for a in agents:
        a.start()
    try:
        launcher.wait_for_agents()
        planted = launcher.launches / "launch-0.json"
        planted.write_text(json.dumps({"module": "evilmod"}))
        _wait(lambda: all((launcher.launches / f"launch-0.node{i}.json").exists() for i in range(2)))
        out = root / "calibration"
        out.mkdir()
        (out / "plan.json").write_text(json.dumps(make_plan(("allreduce",), [4096], 2, 2, 1)))
        argv = [sys.executable, "-m", "validate.ranks.worker", str(out / "plan.json"), str(out), "--calibrate",
                "--priority", "none", "--timeout", "120", "--backend", "gloo"]
        env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/nowhere"}
        with pytest.raises(LaunchError, match=r"node 0 \(127.0.0.1\) refused launch 0: \S+/launch-0.json: message"):
            launcher.launch([0, 1], 1, argv, env=env, timeout_s=120)
        results = launcher.launch([0, 1], 1, argv, env=env, timeout_s=180)
        assert [r.returncode for r in results] == [0, 0]
        records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert [[len(s) for s in rec["samples"]["allreduce"].values()] for rec in records] == [[2], [2]], records
    finally:
        launcher.stop()
        for a in agents:
            a.join(timeout=30)
    assert codes == [0, 0]
    assert victim.read_text() == "precious" and not (launcher.launches / "stop").is_symlink()


# --- the request format, as a fuzzer sees it -------------------------------------------------------------------

VALID = {"run": "123-abcdef01", "k": 3, "nodes": [0, 1], "nproc_per_node": 8, "module": "validate.ranks.worker",
         "args": ["calibration-nic/plan.json", "calibration-nic", "--calibrate", "--priority", "rt", "--timeout",
                  "300.0", "--backend", "nccl"], "env": {"OMP_NUM_THREADS": "1"}, "agents": ["a" * 32, "b" * 32]}


def _json(finite: bool):
    floats = st.floats(allow_nan=False, allow_infinity=not finite)
    return st.recursive(st.none() | st.booleans() | st.integers() | floats | st.text(max_size=20),
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                    max_size=4), max_leaves=12)


JSON, FINITE_JSON = _json(False), _json(True)  # a signed body never holds infinity (seal refuses it)


def test_a_valid_request_parses_to_its_frozen_form():
    request = parse_request(json.dumps(VALID).encode(), 2)
    assert request == LaunchRequest("123-abcdef01", 3, (0, 1), 8, "validate.ranks.worker", tuple(VALID["args"]),
                                    (("OMP_NUM_THREADS", "1"),), ("a" * 32, "b" * 32))
    assert request.body() == VALID and parse_request(request.body(), 2) == request
    with pytest.raises(AttributeError):
        request.module = "evilmod"


def test_the_agents_allow_list_matches_the_worker_s_command_line():
    pytest.importorskip("torch")
    from validate.cluster.scheduling import PRIORITIES
    from validate.ranks.worker import BACKENDS

    assert PROGRAMS == ("validate.ranks.worker",) and ENV == ("OMP_NUM_THREADS",)
    assert WORKER_OPTIONS["--priority"] == PRIORITIES and WORKER_OPTIONS["--backend"] == BACKENDS


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(VALID)), value=JSON)
def test_any_field_value_gives_a_request_or_a_request_error(field, value):
    try:
        request = parse_request({**VALID, field: value}, 2)
    except RequestError as e:
        assert e.field.split("[")[0].split(".")[0] == field, (e.field, field)
    else:
        assert request.body()[field] == value


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_give_a_request_or_a_request_error(raw):
    for parse in (lambda: parse_request(raw, 2), lambda: unseal(raw, "request", SECRET)):
        try:
            parse()
        except RequestError:
            pass


@settings(max_examples=200, deadline=None)
@given(body=st.dictionaries(st.text(max_size=8), FINITE_JSON, max_size=5), kind=st.sampled_from(["request", "report"]))
def test_a_signature_holds_for_its_body_and_kind_only(body, kind):
    sealed = seal(kind, body, SECRET)
    assert unseal(sealed, kind, SECRET) == body
    other = "report" if kind == "request" else "request"
    for raw, k, secret in ((sealed, other, SECRET), (sealed, kind, SECRET[::-1]),
                           (sealed.replace(b'"body": {', b'"body": {"tampered!": 1, ', 1), kind, SECRET)):
        with pytest.raises(RequestError):
            unseal(raw, k, secret)
