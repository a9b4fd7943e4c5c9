"""Prediction intervals in sweeps, curves and the API (`--level`, simfog.sweeps.INTERVAL_COLUMNS): each row's
interval is the one `simfog simulate --level` gives for the same point, resumes keep one level per file, files
written before the intervals still resume, and curves shade the band."""

from __future__ import annotations

import csv
import json

import pytest

import simfog
from simfog import cli
from simfog import sweeps as sweep
from simfog.errors import ConfigError

from .conftest import make_experiment, make_trace

# 20 recorded iterations (each layer ±1 %, ±2 %): enough samples to measure the compute part at 80 %
SAMPLES = [([0.001 * (1 + 0.01 * ((k % 5) - 2))] * 4, [0.002 * (1 + 0.01 * ((k % 3) - 1))] * 4) for k in range(20)]


def experiment():
    trace = make_trace([0.001] * 4, [0.002] * 4, [250_000, 500_000, 1_000_000, 60_000], samples=SAMPLES)
    return make_experiment(trace, collective="ring", merge="ddp", iterations=2)


def test_each_row_carries_the_interval_simulate_gives_for_its_point(tmp_path):
    exp = experiment()
    points = sweep.grid([2, 4], ["ddp", "wfbp"], ["ring"])
    rows = sweep.run(exp, points, tmp_path / "s.csv", progress=False, level=0.8)
    assert len(rows) == 4 and list(rows[0]) == sweep.COLUMNS
    for row, point in zip(rows, points, strict=True):
        alone = simfog.simulate(point.apply(exp), level=0.8).summary()
        assert float(row["interval_level"]) == 0.8
        for c in ("iteration_time_s", "iteration_time_lo_s", "iteration_time_hi_s", "samples_per_s_lo",
                  "samples_per_s_hi", "scaling_efficiency_lo", "scaling_efficiency_hi"):
            assert float(row[c]) == alone[c], c
        assert float(row["iteration_time_lo_s"]) < float(row["iteration_time_s"]) < float(row["iteration_time_hi_s"])
        # the α-β links are unmeasured (a stated x/2); the trace's 20 samples measure the compute
        assert row["interval_unmeasured"] == "network" == ",".join(alone["interval_unmeasured"])


def test_no_level_no_interval_and_a_resume_keeps_one_level_per_file(tmp_path):
    exp = experiment()
    points = sweep.grid([2], ["ddp"], ["ring"])
    out = tmp_path / "s.csv"
    (row,) = sweep.run(exp, points, out, progress=False)
    assert row["interval_level"] == "none" and row["iteration_time_lo_s"] == "" == row["interval_unmeasured"]
    with pytest.raises(ConfigError, match="interval_level none, this sweep asks for 0.9"):
        sweep.run(exp, sweep.grid([2, 4], ["ddp"], ["ring"]), out, progress=False, level=0.9)
    at = tmp_path / "at.csv"
    sweep.run(exp, points, at, progress=False, level=0.9)
    with pytest.raises(ConfigError, match="interval_level 0.9, this sweep asks for none"):
        sweep.run(exp, points, at, progress=False)
    with pytest.raises(ConfigError, match="level"):
        sweep.run(exp, points, tmp_path / "bad.csv", progress=False, level=1.2)
    assert not (tmp_path / "bad.csv").exists()
    # the same level resumes: the row is reused, the new one runs
    rows = sweep.run(exp, sweep.grid([2, 4], ["ddp"], ["ring"]), at, progress=False, level=0.9)
    assert [r["ranks"] for r in rows] == ["2", "4"] and all(r["interval_level"] == "0.9" for r in rows)


def test_a_csv_written_before_the_intervals_resumes_without_them(tmp_path):
    exp = experiment()
    whole = sweep.run(exp, sweep.grid([2, 4], ["ddp"], ["ring"]), tmp_path / "whole.csv", progress=False)
    old = tmp_path / "old.csv"
    with open(old, "w", newline="") as f:  # as the sweep wrote it before the interval columns: 2 ranks only
        writer = csv.DictWriter(f, fieldnames=sweep.PREVIOUS_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerow(whole[0])
    rows = sweep.run(exp, sweep.grid([2, 4], ["ddp"], ["ring"]), old, progress=False)
    assert rows == [{**whole[0], "warnings": sweep.NOT_RECORDED}, whole[1]]  # the old row's warnings: unknown
    with pytest.raises(ConfigError, match="--level"):  # its rows have none: a level is another sweep
        sweep.run(exp, sweep.grid([2, 4], ["ddp"], ["ring"]), old, progress=False, level=0.9)


def _files(tmp_path):
    exp_file = tmp_path / "e.toml"
    experiment().workload.trace.save(tmp_path / "t.json")
    exp_file.write_text('iterations = 2\n[workload]\ntrace = "t.json"\n[cluster]\nnodes = 2\ngpus_per_node = 2\n'
                        'nic_bandwidth = "10Gbit/s"\n[comm]\ncollective = "ring"\nmerge = "ddp"\n')
    return exp_file


def test_cli_sweep_and_curve_with_a_level(tmp_path, capsys):
    from matplotlib.collections import PolyCollection

    from simfog import plot
    from simfog.commands.curve import curve_frame

    exp_file = _files(tmp_path)
    assert cli.main(["sweep", str(exp_file), "--ranks", "2,4", "--level", "0.8", "-o", str(tmp_path / "s.csv"),
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "80 % interval" in out and "*" in out and "interval_unmeasured names them" in out
    assert cli.main(["sweep", str(exp_file), "--ranks", "2,4", "--level", "0.8", "-o", str(tmp_path / "s.csv"),
                     "--no-progress", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["interval_level"] for r in rows] == [0.8, 0.8] and rows[0]["interval_unmeasured"] == ["network"]
    assert all(r["iteration_time_lo_s"] < r["iteration_time_s"] < r["iteration_time_hi_s"] for r in rows)
    assert cli.main(["sweep", str(exp_file), "--ranks", "2", "--level", "90", "-o", str(tmp_path / "x.csv"),
                     "--no-progress"]) == 2
    assert "--level" in capsys.readouterr().err and not (tmp_path / "x.csv").exists()

    assert cli.main(["curve", str(exp_file), "--ranks", "2,4,8", "--merge", "ddp,wfbp", "--level", "0.8", "-o",
                     str(tmp_path / "c"), "--no-progress"]) == 0
    df = curve_frame(list(csv.DictReader(open(tmp_path / "c" / "curve.csv", newline=""))),
                     sweep.grid([2, 4, 8], ["ddp", "wfbp"], ["ring"]))
    fig = plot.curve_figure(df)
    bands = [c for ax in fig.axes for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 4  # a band per series (2) on each panel (2)
    assert not [c for ax in plot.curve_figure(df.drop(columns=["samples_per_s_lo"])).axes for c in ax.collections
                if isinstance(c, PolyCollection)]


def test_api_sweep_with_a_level_is_typed(tmp_path):
    df = simfog.sweep(experiment(), ranks=[2, 4], level=0.8)
    assert df.interval_level.tolist() == [0.8, 0.8] and df.iteration_time_lo_s.dtype == "float64"
    assert (df.iteration_time_lo_s < df.iteration_time_s).all() and (df.iteration_time_s < df.iteration_time_hi_s).all()
    plain = simfog.sweep(experiment(), ranks=[2])
    assert plain.interval_level.isna().all() and plain.iteration_time_lo_s.isna().all()
    with pytest.raises(ConfigError, match="level"):
        simfog.sweep(experiment(), ranks=[2], level=0)


def test_rows_the_model_cannot_tell_from_the_fastest_are_marked(tmp_path, capsys):
    # T(M) = 1 s, 4 gradients of 1 MB: BAGUA's 10 MiB bucket and "single" both run one allreduce (1.008 s), the same
    # plan whatever the model's error, so their ratio is exactly 1: not told apart. DDP's default runs two (2.006 s):
    # twice as slow at every bound of the unmeasured parts.
    trace = make_trace([0.001] * 4, [0.001] * 4, [250_000] * 4)
    exp = make_experiment(trace, alpha=1.0, beta=0.0)
    rows = sweep.run(exp, sweep.grid([4], ["ddp", "bagua", "single"], ["linear"]), tmp_path / "s.csv",
                     progress=False, level=0.9)
    marked = {r["merge"]: r for r in sweep.against_fastest(exp, rows, 0.9)}
    assert marked["bagua"]["vs_fastest"] == 0.0 and marked["bagua"]["within_uncertainty"] is False
    assert marked["single"]["vs_fastest"] == 0.0 and marked["single"]["within_uncertainty"] is True
    assert marked["ddp"]["vs_fastest"] == pytest.approx(2.006 / 1.008 - 1, rel=1e-9)
    assert marked["ddp"]["within_uncertainty"] is False
    from simfog.commands.sweep import format_table, typed_row

    table = format_table(list(marked.values()))
    assert "vs fastest" in table and "≈ the model cannot tell" in table
    assert [line.endswith("≈") for line in table.splitlines()[1:4]] == [False, False, True]
    assert typed_row(marked["single"])["within_uncertainty"] is True
