"""The Python API (simfog.load / simulate / sweep) gives the command line's numbers for the same experiment and
seed, types its sweep columns, and reports bad input as the CLI's one-line ConfigError."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import simfog
from simfog import cli

from .conftest import make_trace

# Sampled compute (three recorded iterations that differ), so the seed changes the numbers.
EXP = """
seed = 1
iterations = 3
[workload]
trace = "t.json"
compute = "samples"
[cluster]
nodes = 2
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
nic_latency = "20us"
[comm]
collective = "ring"
merge = "ddp"
"""
SAMPLES = [([0.010, 0.020, 0.005], [0.020, 0.030, 0.010]), ([0.012, 0.018, 0.006], [0.025, 0.020, 0.015]),
           ([0.009, 0.024, 0.004], [0.018, 0.035, 0.012])]


@pytest.fixture
def exp_file(tmp_path):
    make_trace([0] * 3, [0] * 3, [250_000, 500_000, 1_000], samples=SAMPLES, optimizer=0.002).save(tmp_path / "t.json")
    path = tmp_path / "exp.toml"
    path.write_text(EXP)
    return path


def run_cli(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_public_names():
    assert set(simfog.__all__) == {"load", "simulate", "sweep", "jobs", "ConfigError", "SimfogError", "__version__"}
    for name in simfog.__all__:
        assert getattr(simfog, name) is not None
    assert callable(simfog.jobs.run) and callable(simfog.jobs.load)  # as docs/fabrics.md uses it
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        simfog.nonesuch  # noqa: B018 (the access is what is tested)
    for f in (simfog.load, simfog.simulate, simfog.sweep):
        assert ">>>" in f.__doc__  # every entry point shows an example


def test_jobs_after_a_bare_import_in_a_fresh_interpreter():
    """`import simfog` then `simfog.jobs.run(...)`, the docs' usage, in a process that imported nothing else."""
    code = ("import sys, simfog; assert 'simfog.jobs' not in sys.modules; "
            "print(type(simfog.jobs.run(simfog.jobs.load('examples/jobs/two-ddp.toml'))).__name__)")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "JobsResult"


@pytest.mark.parametrize("seed", [1, 5])
def test_simulate_summary_equals_cli_json(exp_file, capsys, seed):
    cli_summary = json.loads(run_cli(capsys, "simulate", str(exp_file), "--json", "--seed", str(seed),
                                     "--ranks", "4"))
    r = simfog.simulate(simfog.load(exp_file, seed=seed, ranks=4))
    assert r.summary() == cli_summary  # bit for bit: JSON round-trips floats exactly


def test_seed_changes_the_result_and_the_same_seed_repeats_it(exp_file):
    a, b = (simfog.simulate(simfog.load(exp_file, seed=s)) for s in (1, 2))
    assert not a.intervals().equals(b.intervals())  # other draws of the recorded iterations
    again = simfog.simulate(exp_file)  # a path works too; seed 1 is the file's
    assert again.summary() == a.summary() and again.intervals().equals(a.intervals())


def test_intervals_equal_cli_csv(exp_file, capsys, tmp_path):
    out = tmp_path / "intervals.csv"
    run_cli(capsys, "simulate", str(exp_file), "--intervals", str(out))
    df = simfog.simulate(simfog.load(exp_file)).intervals()
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["rank", "iteration", "kind", "name", "start_s", "end_s"]
    pd.testing.assert_frame_equal(df, pd.read_csv(out, keep_default_na=False), check_dtype=False)


def test_sweep_equals_cli_csv_and_types_its_columns(exp_file, capsys, tmp_path):
    out = tmp_path / "sweep.csv"
    run_cli(capsys, "sweep", str(exp_file), "--ranks", "4,6", "--merge", "ddp,wfbp", "--collective", "ring,rhd",
            "--threshold", "1MiB", "-o", str(out), "--jobs", "1", "--no-progress")
    df = simfog.sweep(exp_file, ranks=[4, 6], merge=["ddp", "wfbp"], collective=["ring", "rhd"], threshold="1MiB")
    with open(out, newline="") as f:
        rows = {(r["ranks"], r["merge"], r["collective"]): r for r in csv.DictReader(f)}
    assert len(df) == len(rows) == 8
    assert list(df[["ranks", "merge", "collective"]].itertuples(index=False, name=None)) == [
        (r, m, c) for r in (4, 6) for m in ("ddp", "wfbp") for c in ("ring", "rhd")]  # grid order
    for row in df.to_dict("records"):
        cli_row = rows[(str(row["ranks"]), row["merge"], row["collective"])]
        assert row["error"] == cli_row["error"]
        for col in ("threshold_bytes", "iteration_time_s", "samples_per_s", "scaling_efficiency", "comm_s"):
            assert (pd.isna(row[col]) and cli_row[col] == "") or row[col] == float(cli_row[col])
        assert (pd.isna(row["buckets"]) and cli_row["buckets"] == "") or str(row["buckets"]) == cli_row["buckets"]

    dtypes = df.dtypes.map(str).to_dict()
    assert dtypes["ranks"] == "int64" and dtypes["buckets"] == "Int64" and dtypes["estimated"] == "boolean"
    for col in ("threshold_bytes", "iteration_time_s", "samples_per_s", "scaling_efficiency", "compute_s", "comm_s",
                "comm_exposed_s", "idle_s", "overlap_fraction"):
        assert dtypes[col] == "float64", col
    for col in ("merge", "collective", "error"):
        assert pd.api.types.is_string_dtype(df[col]), col
    # rhd needs a power-of-two rank count: that point's row says why and has no numbers.
    bad = df[df.error != ""]
    assert sorted(set(zip(bad.ranks, bad.collective))) == [(6, "rhd")]
    assert bad.iteration_time_s.isna().all() and bad.buckets.isna().all() and bad.estimated.isna().all()
    assert df.threshold_bytes.eq(2**20).all()


def test_sweep_defaults_writes_nothing_and_output_resumes(exp_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    df = simfog.sweep(simfog.load(exp_file))
    assert len(df) == 1 and df.ranks.tolist() == [4] and df["merge"].tolist() == ["ddp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.toml", "t.json"]  # no CSV left behind

    out = tmp_path / "s.csv"
    first = simfog.sweep(exp_file, ranks=[2, 4], output=out)
    again = simfog.sweep(exp_file, ranks=[4], output=out)  # resumed from the CSV: the same row, nothing rerun
    assert len(out.read_text().splitlines()) == 3
    pd.testing.assert_frame_equal(again, first[first.ranks == 4].reset_index(drop=True))


@pytest.mark.parametrize("call, field", [
    (lambda f: simfog.load(f.parent / "nope.toml"), "path"),
    (lambda f: simfog.simulate(f.parent / "nope.toml"), "path"),
    (lambda f: simfog.simulate({"seed": 1}), "experiment"),
    (lambda f: simfog.load(f, ranks=0), "ranks"),
    (lambda f: simfog.load(f, merge="fastest"), "merge"),
    (lambda f: simfog.sweep(f, ranks=["8"]), "ranks"),
    (lambda f: simfog.sweep(f, collective=["ring", "warp"]), "collective"),
    (lambda f: simfog.sweep(f, threshold="25"), "threshold"),
])
def test_bad_input_is_a_one_line_config_error(exp_file, call, field):
    with pytest.raises(simfog.ConfigError) as e:
        call(exp_file)
    assert e.value.field == field and "\n" not in str(e.value)


def test_import_simfog_imports_no_heavy_module():
    code = ("import sys, simfog; heavy = {'pandas', 'numpy', 'matplotlib', 'torch', 'simpy'} & set(sys.modules); "
            "print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_docs_python_api_example_runs(capsys, monkeypatch):
    """The Python API example (docs/guide.md, which the README links), run as written from the repository root."""
    root = Path(__file__).resolve().parents[1]
    code = re.search(r"## The Python API\n.*?```python\n(.*?)```", (root / "docs" / "guide.md").read_text(),
                     re.S).group(1)
    monkeypatch.chdir(root)
    exec(compile(code, "docs/guide.md", "exec"), {})
    out = capsys.readouterr().out
    assert "samples/s, estimated: True" in out and "mgwfbp" in out
