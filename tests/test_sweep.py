"""Sweeps on Dask give the local results, and a sweep killed mid-run resumes without losing or repeating a row."""

from __future__ import annotations

import csv
import subprocess
import sys
import time

import pytest

from simfog import sweeps as sweep
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
        next(execute(sampled_experiment(), sweep.grid([2], ["wfbp"], ["ring"]), "tcp://127.0.0.1:8786",
                             sweep.run_point))


def test_unreachable_scheduler_is_a_config_error():
    pytest.importorskip("distributed", reason="the dist extra (dask distributed) is not installed")
    with pytest.raises(ConfigError) as e:
        next(execute(sampled_experiment(), sweep.grid([2], ["wfbp"], ["ring"]), "tcp://127.0.0.1:1", sweep.run_point,
                     timeout_s=1))
    assert e.value.field == "--scheduler"


def test_no_points_needs_no_scheduler():
    assert list(execute(sampled_experiment(), [], "tcp://nowhere:1", sweep.run_point)) == []


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
    header = sweep.COLUMNS
    for line in after.splitlines():
        assert len(next(csv.reader([line]))) == len(header)  # no partial line
    for r in rows:
        # every column filled; a sweep without --level says "none" and leaves the interval's bounds empty
        assert r["interval_level"] == sweep.NO_INTERVAL
        assert all(r[c] != "" for c in header if c not in ("error", "warnings")
                   and c not in sweep.INTERVAL_COLUMNS[1:]), r
        assert r["warnings"] == ""  # nothing to warn of: no network file
        assert r["error"] == ""


def test_resume_cuts_a_partial_last_line(tmp_path):
    from simfog.sweeps import KEY_COLUMNS, SUMMARY_COLUMNS, _drop_partial_last_line

    path = tmp_path / "s.csv"
    header = ",".join(KEY_COLUMNS + SUMMARY_COLUMNS) + "\n"
    path.write_text(header + "4,ddp,ring,,0.1")  # killed mid-row
    _drop_partial_last_line(path)
    assert path.read_text() == header


def _exp_file(tmp_path, name, seed):
    from .conftest import make_trace

    trace = make_trace([1e-3, 2e-3], [2e-3, 4e-3], [1000, 2000])
    trace.save(tmp_path / "t.json")
    f = tmp_path / name
    f.write_text(f'seed = {seed}\niterations = 2\n[workload]\ntrace = "t.json"\ncompute = "mean"\n'
                 '[cluster]\nnodes = 1\ngpus_per_node = 2\nnic_bandwidth = "1Gbit/s"\n')
    return f


def test_resume_refuses_rows_of_another_experiment(tmp_path, capsys):
    """`sweep a.toml` then `sweep b.toml` into one file printed a's rows for b: now b is refused in one line and
    the file is left as it was."""
    from simfog import cli

    a, b = _exp_file(tmp_path, "a.toml", 1), _exp_file(tmp_path, "b.toml", 2)
    out = tmp_path / "s.csv"
    assert cli.main(["sweep", str(a), "--ranks", "2", "--merge", "wfbp", "--collective", "ring", "-o", str(out)]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert cli.main(["sweep", str(b), "--ranks", "2", "--merge", "wfbp", "--collective", "ring", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "rows of another" in err and "experiment_sha256" in err
    assert out.read_bytes() == before
    # the same experiment resumes: nothing to rerun, the same rows
    assert cli.main(["sweep", str(a), "--ranks", "2", "--merge", "wfbp", "--collective", "ring", "-o", str(out)]) == 0
    assert out.read_bytes() == before


@pytest.mark.parametrize("cut", range(1, 10))
def test_a_torn_last_row_is_run_again_never_lost(tmp_path, cut):
    """Cut the last row at 9 positions (a kill in the middle of its write): the resumed file holds every point
    exactly once, with the same numbers as an uninterrupted run."""
    from simfog import sweeps as sw
    from simfog.experiment import load

    exp = load(_exp_file(tmp_path, "a.toml", 1))
    points = sw.grid([2], ["wfbp", "ddp"], ["ring"])
    whole = tmp_path / "whole.csv"
    sw.run(exp, points, whole, progress=False)
    text = whole.read_text()
    last = text.rstrip("\n").rfind("\n") + 1
    torn = tmp_path / "torn.csv"
    torn.write_text(text[:last + (len(text) - last) * cut // 10])
    rows = sw.run(exp, points, torn, progress=False)
    assert sorted((r["merge"], r["iteration_time_s"]) for r in rows) == sorted(
        (r["merge"], r["iteration_time_s"]) for r in csv.DictReader(open(whole, newline="")))


def test_a_garbage_line_is_one_clean_error(tmp_path):
    from simfog import sweeps as sw
    from simfog.errors import ConfigError
    from simfog.experiment import load

    exp = load(_exp_file(tmp_path, "a.toml", 1))
    out = tmp_path / "s.csv"
    sw.run(exp, sw.grid([2], ["wfbp"], ["ring"]), out, progress=False)
    with open(out, "a") as f:
        f.write("garbage,\n")
    with pytest.raises(ConfigError, match=r"line 3"):
        sw.run(exp, sw.grid([2], ["wfbp", "ddp"], ["ring"]), out, progress=False)


def test_rows_sorted_by_the_sweeps_axes_and_a_resume_announced(tmp_path, capsys):
    """Rows came out in completion order (16, 256, 64); now the table, the JSON and the file follow the axes:
    ranks as numbers, then merge and collective in the order given. A resumed sweep says how many rows it reused."""
    import json

    from simfog import cli

    a = _exp_file(tmp_path, "a.toml", 1)
    out = tmp_path / "s.csv"
    argv = ["sweep", str(a), "--merge", "wfbp,single", "--collective", "ring", "-o", str(out), "--jobs", "2",
            "--no-progress"]
    assert cli.main([*argv, "--ranks", "16,2,8", "--json"]) == 0
    captured = capsys.readouterr()
    keys = [(r["ranks"], r["merge"]) for r in json.loads(captured.out)["rows"]]
    assert keys == [(2, "wfbp"), (2, "single"), (8, "wfbp"), (8, "single"), (16, "wfbp"), (16, "single")]
    assert "resuming" not in captured.err
    assert [(r["ranks"], r["merge"]) for r in csv.DictReader(open(out))] == [(str(r), m) for r, m in keys]
    # two more points, four reused
    assert cli.main([*argv, "--ranks", "4,16,2"]) == 0
    captured = capsys.readouterr()
    assert f"resuming {out}: 4 of 6 rows reused from it, 2 to run" in captured.err
    ranks = [line.split()[0] for line in captured.out.splitlines() if line.strip()[:1].isdigit()]
    assert ranks == ["2", "2", "4", "4", "8", "8", "16", "16"]  # the earlier run's 8 kept, in its place
    assert [r["ranks"] for r in csv.DictReader(open(out))] == ranks


def test_every_row_names_its_trace_and_network_file(tmp_path):
    """A sweep CSV read on its own says which trace and network file its numbers came from; "none" (not an empty
    cell, which reads as a lost value) where the experiment writes its links itself."""
    from simfog import cli, nccl, network_file

    make_trace([0.02, 0.03], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    network_file.save(tmp_path / "a100-ib.toml", nccl.NcclNetwork(230e9, 129.5e9, version="2.21.5"))
    (tmp_path / "e.toml").write_text('[workload]\ntrace = "t.json"\n[cluster]\nnodes = 2\ngpus_per_node = 2\n'
                                     'network = "a100-ib.toml"\n[comm]\ncollective = "nccl"\n')
    out = tmp_path / "s.csv"
    assert cli.main(["sweep", str(tmp_path / "e.toml"), "--ranks", "2,4", "-o", str(out), "--no-progress"]) == 0
    rows = list(csv.DictReader(open(out, newline="")))
    assert len(rows) == 2
    for r in rows:
        assert r["trace"] == str((tmp_path / "t.json").resolve())
        assert r["network_file"] == str((tmp_path / "a100-ib.toml").resolve())
        assert r["network_trace"] == "none"
    plain = tmp_path / "plain.csv"
    assert cli.main(["sweep", str(_exp_file(tmp_path, "a.toml", 1)), "--ranks", "2", "-o", str(plain),
                     "--no-progress"]) == 0
    (row,) = csv.DictReader(open(plain, newline=""))
    assert row["network_file"] == row["network_trace"] == "none"


def test_a_csv_written_before_the_network_columns_resumes(tmp_path, capsys):
    """A sweep CSV of the columns sweeps wrote before network_file and network_trace (OLD_COLUMNS) still resumes:
    its rows are reused, not rerun, and the file comes out with every column, its old rows given the network of
    this same experiment (their experiment_sha256 says it is the same)."""
    from simfog import cli

    a = _exp_file(tmp_path, "a.toml", 1)
    argv = ["sweep", str(a), "--merge", "wfbp", "--collective", "ring", "--no-progress"]
    whole = tmp_path / "whole.csv"
    assert cli.main([*argv, "--ranks", "2,4", "-o", str(whole)]) == 0
    expected = list(csv.DictReader(open(whole, newline="")))
    old = tmp_path / "old.csv"
    with open(old, "w", newline="") as f:  # as an older simfog wrote it: the 2-rank row only, no network columns
        writer = csv.DictWriter(f, fieldnames=sweep.OLD_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerow(expected[0])
    assert "network_file" not in old.read_text()
    capsys.readouterr()
    assert cli.main([*argv, "--ranks", "2,4", "-o", str(old)]) == 0
    assert f"resuming {old}: 1 of 2 rows reused from it, 1 to run" in capsys.readouterr().err
    with open(old, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == sweep.COLUMNS
        # the reused row's numbers as written, the network columns filled, its warnings unknown (not "none")
        assert list(reader) == [{**expected[0], "warnings": sweep.NOT_RECORDED}, expected[1]]
