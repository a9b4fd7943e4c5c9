"""End-to-end runs of the `simfog` command, as a user types it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from simfog import cli

from .conftest import make_trace

EXP = """
seed = 1
iterations = 2
[workload]
trace = "t.json"
compute = "mean"
[cluster]
nodes = 2
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
nic_latency = "20us"
[comm]
collective = "linear"
merge = "single"
alpha = "1ms"
beta = "1ns/B"
"""


@pytest.fixture
def exp_file(tmp_path):
    make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    path = tmp_path / "exp.toml"
    path.write_text(EXP)
    return path


def run(*argv):
    return subprocess.run([sys.executable, "-m", "simfog.cli", *argv], capture_output=True, text=True, timeout=120)


def test_simulate_json_has_the_documented_keys_and_values(exp_file):
    out = run("simulate", str(exp_file), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    for key in ("ranks", "iteration_time_s", "samples_per_s", "scaling_efficiency", "compute_s", "comm_s",
                "comm_exposed_s", "overlap_fraction", "estimated"):
        assert key in s
    # SyncEASGD with T = 1 ms + 1 ns/B * 3 MB: 30 + 50 + 1 + 3 ms.
    assert s["iteration_time_s"] == pytest.approx(0.084, rel=1e-12)
    assert s["ranks"] == 4 and s["samples_per_s"] == pytest.approx(4 * 8 / 0.084)
    assert s["estimated"] is False


def test_simulate_human_output_and_intervals_csv(exp_file, tmp_path):
    out = run("simulate", str(exp_file), "--intervals", str(tmp_path / "iv.csv"), "--ranks", "8")
    assert out.returncode == 0, out.stderr
    assert "iteration time" in out.stdout and "8 ranks" in out.stdout
    rows = list(csv.DictReader(open(tmp_path / "iv.csv")))
    assert {r["rank"] for r in rows} == {str(i) for i in range(8)}
    assert {r["kind"] for r in rows} == {"forward", "backward", "comm", "optimizer"}


@pytest.mark.parametrize("argv, needle", [
    (["simulate", "nope.toml"], "nope.toml"),
    (["simulate", "{exp}", "--merge", "ddpp"], "--merge = 'ddpp'"),
    (["simulate", "{exp}", "--ranks", "5"], "ranks = 5"),
    (["simulate", "{exp}", "--threshold", "25"], "--threshold = '25'"),
    (["sweep", "{exp}", "--ranks", "4,x"], "--ranks"),
    (["list", "gizmos"], "gizmos"),
])
def test_user_errors_print_one_line_and_exit_2(exp_file, tmp_path, argv, needle):
    argv = [a.replace("{exp}", str(exp_file)) for a in argv]
    out = run(*argv)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simfog: error:") and needle in lines[0]
    assert "Traceback" not in out.stderr


def test_bad_value_in_file_names_file_and_field(exp_file):
    exp_file.write_text(EXP.replace('nic_bandwidth = "10Gbit/s"', "nic_bandwidth = 10"))
    out = run("simulate", str(exp_file))
    assert out.returncode == 2 and str(exp_file) in out.stderr and "cluster.nic_bandwidth = 10" in out.stderr


def test_list_shows_every_registry():
    out = run("list")
    assert out.returncode == 0
    for name in ("ring", "rhd", "tree", "hierarchical", "ps", "linear", "wfbp", "single", "threshold", "ddp",
                 "horovod", "bagua", "mgwfbp", "allreduce"):
        assert f"  {name} " in out.stdout


def test_sweep_writes_table_and_csv_and_resumes(exp_file, tmp_path):
    csv_path = tmp_path / "s.csv"
    argv = ["sweep", str(exp_file), "--ranks", "2,4,6", "--merge", "single,wfbp", "--collective", "ring,rhd",
            "-o", str(csv_path), "--jobs", "1", "--no-progress"]
    out = run(*argv)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 12
    bad = [r for r in rows if r["error"]]
    assert {(r["ranks"], r["collective"]) for r in bad} == {("6", "rhd")}
    assert "power of two" in bad[0]["error"]
    assert "single" in out.stdout and "error" in out.stdout
    again = run(*argv)  # everything done: nothing is re-run or duplicated
    assert again.returncode == 0 and len(list(csv.DictReader(open(csv_path)))) == 12


def test_main_in_process_returns_exit_code(exp_file, capsys):
    assert cli.main(["simulate", str(exp_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"] == 4
