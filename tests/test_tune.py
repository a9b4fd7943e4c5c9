"""Threshold tuning against optima known by hand, and the guarantee that the search beats wfbp and single."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog import cli
from simfog.errors import ConfigError
from simfog.simulation import simulate
from simfog.tune import BASELINES, tune

from .conftest import make_experiment, make_trace

# Four layers of 1 ms forward and 1 ms backward, each with one 1 MB gradient (250,000 float32).
TRACE = make_trace([0.001] * 4, [0.001] * 4, [250_000] * 4)


def at_most(best, others, rel=1e-9):
    return all(best <= t * (1 + rel) for t in others)


def test_huge_latency_merges_everything():
    # T(M) = 1 s + 0·M: every bucket costs 1 s, so one bucket is optimal: 4 ms forward + 4 ms backward + 1 s.
    # The threshold rule gives one bucket exactly when threshold > 3 MB (the size before the last gradient).
    r = tune(make_experiment(TRACE, alpha=1.0, beta=0.0))
    assert r.best_buckets == 1
    assert 3e6 < r.best_threshold_bytes <= 4e6
    assert r.best_iteration_time_s == pytest.approx(1.008, rel=1e-12)
    assert r.baselines["single"] == r.best_iteration_time_s
    assert r.baselines["wfbp"] == pytest.approx(4.005, rel=1e-12)  # 1 ms to the first gradient + 4 x 1 s
    assert at_most(r.best_iteration_time_s, r.baselines.values())
    assert set(r.baselines) == set(BASELINES)
    # The refinement narrowed the step at 3 MB: some threshold simulated lies within 3 % above it.
    assert r.near_best_bytes[0] < 3e6 * 1.03


def test_bandwidth_bound_without_latency_prefers_wfbp():
    # T(M) = 0 + 10 ns/B·M: 10 ms per gradient, longer than the backward of all remaining layers. WFBP starts
    # the first allreduce at 1 ms and keeps the stream busy: 4 ms forward + 1 ms + 4 x 10 ms = 45 ms. Any merged
    # first bucket starts later, so only thresholds <= 1 MB (every gradient alone) reach 45 ms.
    r = tune(make_experiment(TRACE, alpha=0.0, beta=1e-8))
    assert r.best_buckets == 4
    assert r.best_threshold_bytes <= 1e6
    assert r.best_iteration_time_s == pytest.approx(0.045, rel=1e-12)
    assert r.baselines["wfbp"] == r.best_iteration_time_s
    assert r.baselines["single"] == pytest.approx(0.048, rel=1e-12)  # 4 + 4 + 40 ms
    assert at_most(r.best_iteration_time_s, r.baselines.values())
    assert r.near_best_bytes == (r.best_threshold_bytes, r.best_threshold_bytes)  # 2 buckets: 46 ms, > 1 % worse


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-4, 0.02), st.integers(1, 3_000_000)), min_size=1, max_size=8),
       st.floats(0, 5e-3), st.floats(0, 5e-9))
def test_search_includes_the_extremes_so_it_never_loses_to_wfbp_or_single(layers, alpha, beta):
    trace = make_trace([t for t, _ in layers], [2 * t for t, _ in layers], [n for _, n in layers])
    r = tune(make_experiment(trace, alpha=alpha, beta=beta), points=5, refine=3)
    assert r.best_iteration_time_s <= r.baselines["wfbp"] and r.best_iteration_time_s <= r.baselines["single"]
    sizes = [4 * n for _, n in layers]
    assert r.curve.threshold_bytes.min() == min(sizes) and r.curve.threshold_bytes.max() == sum(sizes)
    assert list(r.curve.threshold_bytes) == sorted(r.curve.threshold_bytes)


def test_uses_mean_layer_times_unless_asked():
    noisy = make_trace([0] * 4, [0] * 4, [250_000] * 4,
                       samples=[([0.001] * 4, [0.001] * 4), ([0.002] * 4, [0.003] * 4)])
    exp = make_experiment(noisy, compute="samples", alpha=1e-3, beta=1e-9, iterations=4)
    r = tune(exp, points=4, refine=0)
    assert r.compute == "mean"
    mean = make_experiment(noisy, compute="mean", alpha=1e-3, beta=1e-9, iterations=4, merge="threshold",
                           threshold_bytes=r.best_threshold_bytes)
    assert r.best_iteration_time_s == simulate(mean).summary()["iteration_time_s"]
    assert tune(exp, points=4, refine=0, samples=True).compute == "samples"


@pytest.mark.parametrize("kwargs, field", [({"points": 1}, "points"), ({"refine": -1}, "refine"),
                                           ({"lo": 0}, "lo"), ({"lo": 1e6, "hi": 1e5}, "hi")])
def test_bad_search_settings(kwargs, field):
    with pytest.raises(ConfigError) as e:
        tune(make_experiment(TRACE), **kwargs)
    assert e.value.field == field


EXP = """
iterations = 2
[workload]
trace = "t.json"
[cluster]
nodes = 1
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
[comm]
collective = "linear"
alpha = "1s"
beta = "0ns/B"
"""


def test_cli_writes_plot_and_curve(tmp_path, capsys):
    TRACE.save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text(EXP)
    assert cli.main(["tune", str(tmp_path / "e.toml"), "--points", "6", "--refine", "2", "-o",
                     str(tmp_path / "out")]) == 0  # -o names the folder
    out = capsys.readouterr().out
    assert "best threshold" in out and "1 buckets" in out and "mgwfbp" in out
    # each default's interval against the best is printed with why it need not be centred on its point
    lines = out.splitlines()
    defaults = [i for i, line in enumerate(lines) if re.match(r"  (ddp|horovod|bagua) .*\(90 %: ", line)]
    why = [i for i, line in enumerate(lines) if line.startswith("  90 % of a default vs best: ")]
    assert len(defaults) == 3 and len(why) == 1 and why[0] > max(defaults)
    assert "both runs at once" in lines[why[0]] and "need not be centred" in lines[why[0]]
    assert (tmp_path / "out" / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(open(tmp_path / "out" / "tune.csv")))
    assert len(rows) >= 6 and {"threshold_bytes", "buckets", "iteration_time_s", "stage"} <= set(rows[0])
    # --merge names a framework whose knobs tune searches (tests/test_tune_framework.py); wfbp has none
    assert cli.main(["tune", str(tmp_path / "e.toml"), "--merge", "wfbp"]) == 2
    assert "--merge" in capsys.readouterr().err


NET_EXP = """
iterations = 2
[workload]
trace = "t.json"
[cluster]
nodes = 2
gpus_per_node = 2
network = "{net}"
[comm]
merge = "ddp"
"""


def test_cli_uses_the_experiments_network_file(tmp_path, capsys):
    """`[cluster] network` (a calibrated NCCL network) prices every run of the search: the baselines and the best
    threshold are what simulating that experiment gives, and a slower network file gives slower ones."""
    from simfog import experiment, nccl, network_file

    TRACE.save(tmp_path / "t.json")
    results = {}
    for name, inter in (("fast", 100e9), ("slow", 0.1e9)):
        network_file.save(tmp_path / f"{name}.toml", nccl.NcclNetwork(intra_bus_Bps=200e9, inter_bus_Bps=inter,
                                                                      latency_inter_s=5e-6))
        exp_path = tmp_path / f"e-{name}.toml"
        exp_path.write_text(NET_EXP.format(net=f"{name}.toml"))
        prefix = tmp_path / name
        assert cli.main(["tune", str(exp_path), "--points", "4", "--refine", "0", "--json", "-o", str(prefix)]) == 0
        r = json.loads(capsys.readouterr().out)
        loaded = experiment.load(exp_path)
        exp = replace(loaded, workload=replace(loaded.workload, compute="mean"))  # tune uses mean layer times
        assert exp.network is not None and r["collective"] == "nccl" == exp.comm.collective
        for policy, t in r["baselines_iteration_time_s"].items():
            assert t == simulate(exp.with_comm(merge=policy, threshold_bytes=None)).summary()["iteration_time_s"]
        best = exp.with_comm(merge="threshold", threshold_bytes=r["best_threshold_bytes"])
        assert r["best_iteration_time_s"] == simulate(best).summary()["iteration_time_s"]
        results[name] = r
    slow, fast = results["slow"]["baselines_iteration_time_s"], results["fast"]["baselines_iteration_time_s"]
    assert all(slow[p] > fast[p] for p in ("wfbp", "single", "ddp"))
    assert results["slow"]["best_iteration_time_s"] > results["fast"]["best_iteration_time_s"]
