"""The embedded default (what the README's first command shows) is a GPU-class workload where communication
matters, and every summary says where its compute times came from."""

from __future__ import annotations

import json

from simfog import cli, experiment
from simfog.simulation import simulate

from .conftest import make_experiment, make_trace


def _summary(capsys, *argv) -> dict:
    assert cli.main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_is_an_estimated_gpu_workload_in_mean_mode(capsys):
    s = _summary(capsys)
    assert s["estimated"] is True
    assert s["compute_mode"] == "mean"  # one sample per layer: drawing samples would add nothing
    assert s["compute_source"].startswith("ESTIMATED for a100")
    trace = experiment.load(cli.DEFAULT_EXPERIMENT).workload.trace
    assert trace.samples == 1 and trace.device["kind"] == "gpu" and trace.device["precision"] == "torch"


def test_default_communication_matters(capsys):
    """Communication is a large part of the iteration and the merge policy changes the answer: what simfog is
    for (the old CPU default gave 83 % from compute noise alone, the same for every policy)."""
    ddp = _summary(capsys)
    wfbp = _summary(capsys, "--merge", "wfbp")
    assert ddp["comm_exposed_s"] > 0.2 * ddp["iteration_time_s"]
    assert ddp["scaling_efficiency"] < 0.8
    assert wfbp["iteration_time_s"] > 1.2 * ddp["iteration_time_s"]


def test_human_summary_names_the_compute_source(capsys):
    assert cli.main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATED" in out.splitlines()[0]
    assert "per rank, from ESTIMATED for a100 (simfog retarget" in out


def test_measured_trace_source_says_device_date_and_draws():
    trace = make_trace([1e-3, 2e-3], [2e-3, 4e-3], [10, 20], samples=[([1e-3, 2e-3], [2e-3, 4e-3])] * 3)
    sampled = make_experiment(trace, compute="samples")
    src = simulate(sampled).summary()["compute_source"]
    assert src == "measured on synthetic (2026-11-21): each rank draws one of 3 recorded iterations per iteration"
    mean = make_experiment(trace, compute="mean")
    assert mean.workload.compute_source() == "measured on synthetic (2026-11-21): means of 3 recorded iterations"


def test_default_reads_only_what_the_package_installs():
    """A plain `pip install .` (no source checkout beside it) runs the README's first command: the default's trace
    is package data, resolved inside the installed simfog package, and the packaging ships simfog/data/*."""
    import tomllib
    from pathlib import Path

    import simfog

    package = Path(simfog.__file__).resolve().parent
    exp = experiment.load(cli.DEFAULT_EXPERIMENT)
    assert Path(exp.workload.trace_path).resolve().is_relative_to(package / "data")
    project = tomllib.loads((package.parent / "pyproject.toml").read_text())
    assert "data/*" in project["tool"]["setuptools"]["package-data"]["simfog"]
