"""One answer per question: plan, simulate, sweep and curve give the same throughput for the same configuration, at
several rank counts, because they run it through the one path (simfog.sweeps.run_point -> simfog.simulation) with
the experiment's own compute mode ([workload] compute), whatever its default."""

from __future__ import annotations

import json

import pytest

from simfog import cli, nccl, network_file

from .conftest import make_trace

RANKS = (8, 64, 256)


@pytest.fixture
def files(tmp_path):
    """An experiment on a network file with three recorded iterations drawn per rank ("samples"), and a catalogue
    whose one option is that same cluster."""
    samples = [([0.010, 0.020, 0.015], [0.020, 0.030, 0.025]), ([0.012, 0.018, 0.016], [0.024, 0.027, 0.021]),
               ([0.009, 0.022, 0.014], [0.019, 0.033, 0.026])]
    make_trace([0.01, 0.02, 0.015], [0.02, 0.03, 0.025], [2_000_000, 500_000, 4_000_000],
               samples=samples).save(tmp_path / "t.json")
    network_file.save(tmp_path / "net.toml", nccl.NcclNetwork(230e9, 40e9, latency_inter_s=5e-6, version="2.21.5"))
    cluster = 'gpus_per_node = 8\nintra_latency = "1us"\ngpu_memory = "80GB"\nnetwork = "net.toml"\n'
    (tmp_path / "e.toml").write_text('seed = 7\niterations = 3\n[workload]\ntrace = "t.json"\ncompute = "samples"\n'
                                     f'[cluster]\nnodes = 1\n{cluster}[comm]\nmerge = "ddp"\n')
    (tmp_path / "cat.toml").write_text(f'currency = "EUR"\n[[option]]\nname = "same"\nmax_nodes = 32\n{cluster}'
                                       "price_per_gpu_hour = 1.0\n")
    return tmp_path


def _json(capsys, *argv) -> dict:
    assert cli.main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_simulate_sweep_and_curve_agree_at_several_rank_counts(files, capsys):
    exp, cat = str(files / "e.toml"), str(files / "cat.toml")
    ranks = ",".join(map(str, RANKS))
    simulated = {n: _json(capsys, "simulate", exp, "--ranks", str(n), "--json")["samples_per_s"] for n in RANKS}
    planned = {r["gpus"]: r["samples_per_s"] for r in _json(capsys, "plan", exp, "--catalogue", cat, "--gpus", ranks,
                                                              "--json", "-o", str(files / "plan"))["rows"]}
    swept = {r["ranks"]: r["samples_per_s"] for r in _json(capsys, "sweep", exp, "--ranks", ranks, "--json",
                                                           "-o", str(files / "s.csv"), "--no-progress")["rows"]}
    curved = {r["ranks"]: r["samples_per_s"] for r in _json(capsys, "curve", exp, "--ranks", ranks, "--json",
                                                            "-o", str(files / "c"), "--no-progress")["rows"]}
    assert planned == swept == curved == simulated  # bit for bit: one path
    # the agreement is the compute mode's, not an accident: means give other numbers, and plan follows --compute
    means = {r["gpus"]: r["samples_per_s"] for r in _json(capsys, "plan", exp, "--catalogue", cat, "--gpus", ranks,
                                                            "--compute", "mean", "--json", "-o", str(files / "m"))[
                                                                "rows"]}
    assert all(means[n] != planned[n] for n in RANKS)


def test_a_trace_planned_alone_runs_as_an_experiment_file_naming_only_it(files, capsys):
    """`plan TRACE` takes the defaults an experiment file takes (seed, iterations, compute mode)."""
    (files / "alone.toml").write_text('[workload]\ntrace = "t.json"\n[cluster]\nnodes = 1\ngpus_per_node = 8\n'
                                      'intra_latency = "1us"\ngpu_memory = "80GB"\nnetwork = "net.toml"\n')
    simulated = _json(capsys, "simulate", str(files / "alone.toml"), "--ranks", "64", "--json")
    planned = _json(capsys, "plan", str(files / "t.json"), "--catalogue", str(files / "cat.toml"), "--gpus", "64",
                    "--json", "-o", str(files / "plan"))
    assert planned["rows"][0]["samples_per_s"] == simulated["samples_per_s"]
    assert f"; {simulated['compute_mode']} layer times" in planned["title"]


def test_plan_samples_is_compute_samples_and_refuses_another_mode(files, capsys):
    cat = str(files / "cat.toml")
    a = _json(capsys, "plan", str(files / "e.toml"), "--catalogue", cat, "--gpus", "16", "--samples", "--json",
              "-o", str(files / "a"))
    b = _json(capsys, "plan", str(files / "e.toml"), "--catalogue", cat, "--gpus", "16", "--compute", "samples",
              "--json", "-o", str(files / "b"))
    assert a["rows"][0]["samples_per_s"] == b["rows"][0]["samples_per_s"]
    assert cli.main(["plan", str(files / "e.toml"), "--catalogue", cat, "--gpus", "16", "--samples", "--compute",
                     "mean"]) == 2
    assert "--samples = True: --compute samples, not beside --compute mean" in capsys.readouterr().err
