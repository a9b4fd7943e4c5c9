"""Faults leave nothing behind: a SIGKILLed sweep's worker processes exit, and the temporary file of a SIGKILLed
atomic write is removed by the next write to the same path (a live writer's is not)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from simfog.files import atomic_open, write_json

from .conftest import make_trace

# Enters atomic_open(argv[1]), writes a little, says so and waits to be killed (or for stdin to close).
WRITER = textwrap.dedent("""
    import sys
    from simfog.files import atomic_open
    with atomic_open(sys.argv[1]) as f:
        f.write("half of it")
        print("writing", flush=True)
        sys.stdin.read()
""")


def _writer(path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    return proc


def _temps(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_next_write_removes_the_temporary_file_of_a_killed_writer(tmp_path):
    path = tmp_path / "out.json"
    killed = _writer(path)
    killed.kill()  # SIGKILL: its `finally` never runs
    killed.wait()
    left = _temps(tmp_path)
    assert len(left) == 1 and left[0].startswith(".out.json.")
    live = _writer(path)  # another writer of the same path, still in its block
    try:
        mine = _writer(tmp_path / "out.json.1")  # a writer of another path whose name begins alike
        try:
            (tmp_path / ".out.json.keep.tmp").write_text("not ours")  # not a name atomic_open gives

            write_json(path, {"a": 1})

            assert path.read_text() == '{\n "a": 1\n}\n'
            temps = _temps(tmp_path)
            assert left[0] not in temps  # the dead writer's file is gone
            assert len(temps) == 3  # the live writers' files and the foreign file stay
            assert ".out.json.keep.tmp" in temps
        finally:
            mine.communicate("")  # closes stdin: it finishes and replaces its file
    finally:
        live.communicate("")
    assert path.read_text() == "half of it"
    assert _temps(tmp_path) == [".out.json.keep.tmp"]


def test_atomic_write_still_replaces_only_on_success(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("old")
    try:
        with atomic_open(path) as f:
            f.write("new")
            raise RuntimeError("writer failed")
    except RuntimeError:
        pass
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["x.txt"]
    with atomic_open(path) as f:
        f.write("new")
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["x.txt"]


def _children(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is `pid` (a /proc scan)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except (OSError, IndexError):
            continue
        if fields[0] not in "ZX" and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


# Enough work for two workers to be busy well beyond the time it takes to find and kill them.
SLOW_SWEEP = """
seed = 1
iterations = 200
[workload]
trace = "t.json"
compute = "samples"
[cluster]
nodes = 16
gpus_per_node = 4
nic_bandwidth = "10Gbit/s"
"""


def test_workers_of_a_killed_sweep_exit(tmp_path):
    samples = [([1e-3 * (1 + (i + k) % 3) for i in range(8)], [2e-3] * 8) for k in range(4)]
    make_trace([0] * 8, [0] * 8, [100_000] * 8, samples=samples).save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text(SLOW_SWEEP)
    argv = [sys.executable, "-m", "simfog.cli", "sweep", str(tmp_path / "e.toml"), "--ranks", "64,128,256",
            "--merge", "wfbp,mgwfbp,single", "--collective", "ring,tree", "-o", str(tmp_path / "s.csv"),
            "--jobs", "2", "--no-progress"]
    sweep = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and sweep.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            workers = _children(sweep.pid)
        assert len(workers) == 2 and sweep.poll() is None, f"no workers to orphan: {sweep.stderr.read()}"
        sweep.send_signal(signal.SIGKILL)  # no chance to shut the pool down
        sweep.wait()
        deadline = time.monotonic() + 30  # a liveness bound, generous for a loaded machine
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [w for w in workers if _alive(w)] == [], "workers of the killed sweep are still running"
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
        for w in workers:  # never leave an orphan behind, even when the test fails
            if _alive(w) and str(tmp_path).encode() in _cmdline(w):  # still ours (forked: the sweep's argv)
                os.kill(w, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_workers_that_watch_the_sweep_give_the_same_rows(tmp_path):
    from simfog import sweeps as sweep

    from .conftest import make_experiment

    samples = [([1e-3 * (1 + (i + k) % 3) for i in range(4)], [2e-3] * 4) for k in range(3)]
    trace = make_trace([0] * 4, [0] * 4, [1000, 50_000, 300, 8000], samples=samples)
    exp = make_experiment(trace, compute="samples", iterations=4, seed=7)
    points = sweep.grid([2, 4], ["wfbp", "single"], ["ring"])
    one = sweep.run(exp, points, tmp_path / "one.csv", jobs=1, progress=False)
    two = sweep.run(exp, points, tmp_path / "two.csv", jobs=2, progress=False)
    key = sweep.key_of_row
    assert sorted(two, key=key) == sorted(one, key=key)
