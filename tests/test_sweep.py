"""Sweeps on Dask give the local results, and a sweep killed mid-run resumes without losing or repeating a row."""

from __future__ import annotations

import csv
import subprocess
import sys
import time

import pytest

from simfog import sweep
from simfog.dask_backend import execute
from simfog.errors import ConfigError, SimfogError

from .conftest import make_experiment, make_trace

# Four recorded iterations of eight layers: sampled compute, so ranks differ and every rank is simulated.
SAMPLES = [([0.001 * (1 + (i + k) % 3) for i in range(8)], [0.002 * (1 + (i * k) % 4) for i in range(8)])
           for k in range(4)]
ELEMENTS = [1000, 250_000, 4000, 500_000, 20_000, 1_000_000, 300, 60_000]


def sampled_experiment(iterations=4):
    trace = make_trace([0] * 8, [0] * 8, ELEMENTS, samples=SAMPLES, optimizer=0.001)
    return make_experiment(trace, compute="samples", collective="ring", iterations=iterations, seed=7)


def by_key(rows):
    return {sweep.key_of_row(r): r for r in rows}


def test_dask_cluster_gives_the_local_results(tmp_path):
    distributed = pytest.importorskip("distributed", reason="the dist extra (dask distributed) is not installed")
    exp = sampled_experiment()
    points = sweep.grid([2, 4, 6], ["wfbp", "horovod", "mgwfbp"], ["ring", "rhd"])  # rhd on 6 ranks: error row
    local = sweep.run(exp, points, tmp_path / "local.csv", jobs=1, progress=False)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        remote = sweep.run(exp, points, tmp_path / "dask.csv", scheduler=lc.scheduler_address, progress=False)
    assert len(remote) == len(points) == len(local)
    assert by_key(remote) == by_key(local)
    assert sorted((r["ranks"], r["collective"]) for r in remote if r["error"]) == [("6", "rhd")] * 3


def test_missing_dask_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the dist extra were not installed
    with pytest.raises(SimfogError, match=r"pip install -e '\.\[dist\]'"):
        next(execute(sampled_experiment(), sweep.grid([2], ["wfbp"], ["ring"]), "tcp://127.0.0.1:8786"))


def test_unreachable_scheduler_is_a_config_error():
    pytest.importorskip("distributed", reason="the dist extra (dask distributed) is not installed")
    with pytest.raises(ConfigError) as e:
        next(execute(sampled_experiment(), sweep.grid([2], ["wfbp"], ["ring"]), "tcp://127.0.0.1:1", timeout_s=1))
    assert e.value.field == "--scheduler"


def test_no_points_needs_no_scheduler():
    assert list(execute(sampled_experiment(), [], "tcp://nowhere:1")) == []


EXP = """
seed = 3
iterations = 30
[workload]
trace = "t.json"
compute = "samples"
[cluster]
nodes = 1
gpus_per_node = 4
nic_bandwidth = "10Gbit/s"
nic_latency = "10us"
"""
RANKS, MERGES, COLLECTIVES = [4, 8, 16, 32], ["wfbp", "mgwfbp", "single", "ddp", "bagua"], ["ring", "tree", "rhd"]


def test_killed_sweep_resumes_without_losing_or_repeating_rows(tmp_path):
    trace = make_trace([0] * 8, [0] * 8, ELEMENTS, samples=SAMPLES, optimizer=0.001)
    trace.save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text(EXP)
    out = tmp_path / "s.csv"
    argv = [sys.executable, "-m", "simfog.cli", "sweep", str(tmp_path / "e.toml"), "--ranks", "4,8,16,32",
            "--merge", ",".join(MERGES), "--collective", ",".join(COLLECTIVES), "--threshold", "1MiB",
            "-o", str(out), "--jobs", "1", "--no-progress"]
    total = len(RANKS) * len(MERGES) * len(COLLECTIVES)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_text().count("\n") >= 2:  # header and at least one row
                break
            time.sleep(0.005)
        assert proc.poll() is None, f"the sweep ended before it could be interrupted: {proc.stderr.read()}"
        proc.kill()  # SIGKILL: no chance to clean up
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = out.read_text()
    rows_before = list(csv.DictReader(before.splitlines()))
    assert before.endswith("\n") and 1 <= len(rows_before) < total, "kill the sweep while it runs"

    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = out.read_text()
    assert after.startswith(before)  # rows written before the kill are unchanged
    rows = list(csv.DictReader(after.splitlines()))
    assert len(rows) == total
    keys = [sweep.key_of_row(r) for r in rows]
    assert len(set(keys)) == total  # every point exactly once
    assert set(keys) == {p.key() for p in sweep.grid(RANKS, MERGES, COLLECTIVES, [2.0 ** 20])}
    header = sweep.KEY_COLUMNS + sweep.SUMMARY_COLUMNS + sweep.RECORD_COLUMNS
    for line in after.splitlines():
        assert len(next(csv.reader([line]))) == len(header)  # no partial line
    for r in rows:
        assert all(r[c] != "" for c in header if c != "error"), r  # every column filled
        assert r["error"] == ""


def test_resume_cuts_a_partial_last_line(tmp_path):
    from simfog.sweep import KEY_COLUMNS, SUMMARY_COLUMNS, _drop_partial_last_line

    path = tmp_path / "s.csv"
    header = ",".join(KEY_COLUMNS + SUMMARY_COLUMNS) + "\n"
    path.write_text(header + "4,ddp,ring,,0.1")  # killed mid-row
    _drop_partial_last_line(path)
    assert path.read_text() == header
