"""simfog.run_bands: each part's width propagated through the simulation, by hand-worked runs, and the
interval in `simfog simulate`'s output and the Python API's summary."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import simfog
from simfog.bands import UNMEASURED_HALF_WIDTH, conformal_quantile
from simfog.nccl.prior import prior
from simfog.run_bands import attach, compute_part, estimate_scores, iteration_interval
from simfog.simulation import simulate

from .conftest import make_experiment, make_trace

MS = 1e-3


def test_compute_bound_run_interval_is_the_compute_part():
    """One rank (no network): 19 samples whose steps are 10 ms x (1 + k/100), k = -9..9, mean 10 ms. The 90 %
    half-width is the 18th smallest of the 19 scores |ln(step / 10 ms)|: ln 1.09 (|ln 0.91| is the 19th)."""
    samples = [([5 * MS * (1 + k / 100)], [5 * MS * (1 + k / 100)]) for k in range(-9, 10)]
    exp = make_experiment(make_trace([0], [0], [1000], samples=samples), nodes=1, gpus_per_node=1)
    result = simulate(exp)
    t = result.summary()["iteration_time_s"]
    assert t == pytest.approx(10 * MS)
    iv = iteration_interval(result, 0.9)
    q = math.log(1.09)
    assert (iv.lo, iv.hi) == pytest.approx((t * math.exp(-q), t * math.exp(q)))
    assert iv.shares == {"compute": 1.0, "network": 0.0, "run-to-run": 0.0}
    assert iv.parts[1].source == "one rank: no communication"
    # one rank is its own baseline: its efficiency stays 1 at every bound of the compute
    s = attach(result).summary()
    assert s["scaling_efficiency_lo"] == pytest.approx(1.0) and s["scaling_efficiency_hi"] == pytest.approx(1.0)


def test_exposed_communication_takes_the_network_part():
    """2 ranks, one layer (1 ms forward, 2 ms backward) of 10^6 float32 parameters, linear collective
    (1 ms + 1 ns/B: m = 5 ms), nothing overlapping it: T = 3 + 5 = 8 ms. Compute (one sample) is unmeasured: x/2,
    at x2 and /2 11 and 6.5 ms. The links nobody measured take the prior's band for 4 MB (simfog.nccl.prior, transport
    unstated): x/f, network at 3 + 5f and 3 + 5/f ms."""
    exp = make_experiment(make_trace([MS], [2 * MS], [10**6]), nodes=2, gpus_per_node=1)
    result = simulate(exp)
    t = result.summary()["iteration_time_s"]
    assert t == pytest.approx(8 * MS)
    iv = iteration_interval(result, 0.9)
    compute, network, seeds = iv.parts
    assert (seeds.below, seeds.above) == (0.0, 0.0) and "does not move with its seed" in seeds.source
    assert not compute.measured and not network.measured
    assert (compute.below, compute.above) == pytest.approx((math.log(8 / 6.5), math.log(11 / 8)))
    f = math.exp(prior(None).widths.half_width(4e6, 0.9))
    assert (network.below, network.above) == pytest.approx((math.log(8 / (3 + 5 / f)), math.log((3 + 5 * f) / 8)))
    assert iv.hi == pytest.approx(t * math.exp(math.hypot(math.log(11 / 8), math.log((3 + 5 * f) / 8))))
    assert iv.lo == pytest.approx(t * math.exp(-math.hypot(math.log(8 / 6.5), math.log(8 / (3 + 5 / f)))))
    assert iv.shares["network"] > iv.shares["compute"]


def test_compute_part_sources():
    one = make_trace([MS], [MS], [10])
    assert compute_part(one, 0.9).below == UNMEASURED_HALF_WIDTH  # one sample: unmeasured, the default
    few = make_trace([0], [0], [10], samples=[([MS * (1 + k / 10)], [MS]) for k in range(5)])
    assert not compute_part(few, 0.9).measured                     # 5 samples cannot bound 90 %
    assert compute_part(few, 0.5).measured
    scores = estimate_scores()
    estimated = simfog.load().workload.trace                      # the default experiment's retargeted trace
    part = compute_part(estimated, 0.9)
    assert part.below == conformal_quantile(scores, 0.9) and "never saw" in part.source
    wide = compute_part(estimated, 0.99)                          # too few scores: at least the widest seen
    assert not wide.measured and wide.below == max(max(scores), UNMEASURED_HALF_WIDTH)


def test_simulate_prints_and_json_carries_the_interval(capsys):
    from simfog.cli import main

    assert main(["simulate", "--json", "--level", "0.8"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["interval_level"] == 0.8
    assert s["iteration_time_lo_s"] <= s["iteration_time_s"] <= s["iteration_time_hi_s"]
    assert s["samples_per_s_lo"] == pytest.approx(s["samples_per_s"] * s["iteration_time_s"]
                                                  / s["iteration_time_hi_s"])
    assert s["samples_per_s_hi"] == pytest.approx(s["samples_per_s"] * s["iteration_time_s"]
                                                  / s["iteration_time_lo_s"])
    assert sum(p["share"] for p in s["interval_parts"].values()) == pytest.approx(1.0)
    assert s["interval_unmeasured"] == []  # the default's network is a shipped cluster's, measured
    assert "leave-a-scale-out on the cluster's logs" in s["interval_parts"]["network"]["source"]
    # an efficiency is a single rank's time over the iteration's: never above 1, whatever the parts' spread
    assert s["scaling_efficiency_lo"] <= s["scaling_efficiency"] <= s["scaling_efficiency_hi"] <= 1.0
    assert main(["simulate", "--json"]) == 0
    s90 = json.loads(capsys.readouterr().out)
    assert s90["scaling_efficiency"] < s90["scaling_efficiency_hi"] <= 1.0
    # the API's summary: the same keys and numbers
    api = simfog.simulate(simfog.load(), level=0.8).summary()
    for key in ("iteration_time_lo_s", "iteration_time_hi_s", "samples_per_s_lo", "samples_per_s_hi",
                "interval_level", "interval_parts"):
        assert api[key] == s[key]
    assert "interval_level" not in simfog.simulate(simfog.load(), level=None).summary()
    assert main(["simulate", "--explain"]) == 0
    out = capsys.readouterr().out
    t = next(line for line in out.splitlines() if "iteration time" in line)
    assert "(90 %: " in t and "UNMEASURED" not in t
    assert "interval parts (90 %" in out and "compute " in out and "never saw" in out


def test_bad_level_is_one_clear_message(capsys):
    from simfog.cli import main

    assert main(["simulate", "--level", "90"]) != 0
    err = capsys.readouterr().err
    assert "--level" in err and "between 0 and 1" in err and "Traceback" not in err


def test_interval_is_deterministic():
    exp = simfog.load()
    a = attach(simulate(exp)).summary()
    b = attach(simulate(exp)).summary()
    assert a == b and np.isfinite(a["iteration_time_hi_s"])


def test_a_bound_past_the_longest_run_takes_the_whole_factor():
    """3 iterations of 200,000,000 s: the run ends at 6e8 s; compute unmeasured (one sample), its slower bound x2
    would end at 1.2e9 s, past the longest run simfog simulates: the part's whole factor, ln 2, either side."""
    exp = make_experiment(make_trace([1e8], [1e8], [10]), nodes=1, gpus_per_node=1)
    iv = iteration_interval(simulate(exp), 0.9)
    compute = iv.parts[0]
    assert (compute.below, compute.above) == (UNMEASURED_HALF_WIDTH, UNMEASURED_HALF_WIDTH)
    assert "a bound's run failed" in compute.source
    assert iv.hi == pytest.approx(iv.value * 2)


def test_links_calibrated_from_microbenchmarks_measure_the_network_part(tmp_path):
    """The same run as above (one 4 MB bucket: the "medium" regime) on links whose calibration left 19 residuals
    0.01 .. 0.19 (ln) on 1 MiB messages and 19 of 0.5 on 1 KiB ones: the 90 % conformal half-width of the run's
    regime is the 18th smallest, 0.18, measured; the small messages' scores do not count. Network at exp(±0.18):
    3 + 5·exp(±0.18) ms."""
    from dataclasses import replace

    exp = make_experiment(make_trace([MS], [2 * MS], [10**6]), nodes=2, gpus_per_node=1)
    scores = tuple((2**20, k / 100) for k in range(1, 20)) + ((1024, 0.5),) * 19
    assert conformal_quantile([s for _, s in scores[:19]], 0.9) == pytest.approx(0.18)
    iv = iteration_interval(simulate(replace(exp, link_scores=scores)), 0.9)
    network = iv.parts[1]
    assert network.measured and "38 microbenchmark points" in network.source
    assert (network.below, network.above) == pytest.approx(
        (math.log(8 / (3 + 5 * math.exp(-0.18))), math.log((3 + 5 * math.exp(0.18)) / 8)))
    # too few in the run's regime for the level: unmeasured, never narrower than the scores seen
    few = iteration_interval(simulate(replace(exp, link_scores=((2**20, 0.5), (2**20, 0.7)))), 0.9).parts[1]
    assert not few.measured and "2 microbenchmark points of medium messages" in few.source
    assert "x/2.01" in few.source  # the wider of the default x/2 and the 0.7 seen: exp(0.7)


def test_a_network_trace_experiment_carries_its_calibration_residuals(tmp_path):
    from pathlib import Path

    from simfog import experiment
    from simfog.calibrate import link_calibration

    root = Path(__file__).resolve().parents[1]
    make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text(
        f'[workload]\ntrace = "t.json"\n[cluster]\nnodes = 2\ngpus_per_node = 1\nnetwork_trace = '
        f'"{root / "traces" / "net-gloo-loopback.json.gz"}"\n[comm]\ncollective = "ring"\n')
    exp = experiment.load(tmp_path / "e.toml")
    expected = link_calibration(root / "traces" / "net-gloo-loopback.json.gz").link_scores()
    assert exp.link_scores == expected and len(expected) > 20
    s = simfog.simulate(exp, level=0.9).summary()
    assert s["interval_parts"]["network"]["measured"] and "network" not in s["interval_unmeasured"]


def test_run_to_run_part_is_the_spread_over_other_seeds():
    """Random stragglers (each rank's iteration delayed with probability 0.3 by 4 ms on average): the mean of a
    3-iteration run moves with the seed. At 90 % the part is the conformal half-width (the 9th of 9) of
    |ln(t_seed / t)| over seeds 1..9 beside the run's own 0; at 99 % no affordable number of seeds bounds it."""
    from dataclasses import replace

    from simfog.experiment import Heterogeneity
    from simfog.run_bands import run_to_run_parts, seeds_needed

    exp = replace(make_experiment(make_trace([MS], [2 * MS], [1000]), nodes=2, gpus_per_node=1),
                  heterogeneity=Heterogeneity(straggler_rate=0.3, straggler_delay_s=4 * MS))
    t = simulate(exp).summary()["iteration_time_s"]
    others = [simulate(replace(exp, seed=k)).summary()["iteration_time_s"] for k in range(1, 10)]
    assert len(set(others)) > 1
    want = max(abs(math.log(x / t)) for x in others)  # conformal_rank(9, 0.9) = 9: the largest
    on_time, on_eff = run_to_run_parts(exp, simulate(exp).summary(), 0.9)
    assert (on_time.below, on_time.above) == pytest.approx((want, want)) and on_time.measured
    assert on_eff.below > 0
    assert seeds_needed(0.9) == 9 and seeds_needed(0.95) == 19 and seeds_needed(0.99) == 99
    wide, _ = run_to_run_parts(exp, simulate(exp).summary(), 0.99)
    assert not wide.measured and wide.below >= want and "needs 99 seeds" in wide.source
    s = attach(simulate(exp), 0.9).summary()
    assert s["interval_parts"]["run-to-run"]["below"] == pytest.approx(want)


def test_a_ratios_run_to_run_part_draws_each_run_with_its_own_seeds():
    """Two settings of a run with random stragglers: their ratio moves with the seeds. Each run of seed offset k
    draws with its own seed (the second run INDEPENDENT_SEEDS further), as two real runs draw independently."""
    from dataclasses import replace

    from simfog.experiment import Heterogeneity
    from simfog.run_bands import INDEPENDENT_SEEDS, ratio_interval, reseeded

    exp = replace(make_experiment(make_trace([MS] * 4, [2 * MS] * 4, [250_000] * 4), nodes=2, gpus_per_node=1),
                  heterogeneity=Heterogeneity(straggler_rate=0.3, straggler_delay_s=4 * MS))
    slower, faster = exp.with_comm(merge="single"), exp.with_comm(merge="wfbp")

    def t(e):
        return simulate(e).summary()["iteration_time_s"]

    ratio = t(slower) / t(faster)
    others = [t(reseeded(slower, k)) / t(reseeded(faster, k + INDEPENDENT_SEEDS)) for k in range(1, 10)]
    want = max(abs(math.log(x / ratio)) for x in others)  # the 9th of 9 at 90 %
    iv = ratio_interval(slower, faster, 0.9)
    seeds, = [p for p in iv.parts if p.name == "run-to-run"]
    assert want > 0 and (seeds.below, seeds.above) == pytest.approx((want, want))


def test_a_pinned_trace_is_exact_on_one_rank_and_no_run_beats_its_step():
    """A trace pinned to a measured step (simfog.retarget.pin_step): on one rank the run IS that step (no compute
    part), and on several no bound of the iteration is shorter than it."""
    from dataclasses import replace

    from simfog.retarget import pin_step

    trace = pin_step(make_trace([MS], [2 * MS], [10**6]), 4 * MS, "a measured step")
    one = attach(simulate(make_experiment(trace, nodes=1, gpus_per_node=1)), 0.9).summary()
    assert one["iteration_time_s"] == pytest.approx(4 * MS)
    assert one["interval_parts"]["compute"]["below"] == 0.0 and "pinned" in one["interval_parts"]["compute"]["source"]
    two = attach(simulate(make_experiment(trace, nodes=2, gpus_per_node=1)), 0.9).summary()
    assert two["interval_parts"]["compute"]["measured"] and two["interval_parts"]["compute"]["below"] > 0
    assert two["iteration_time_lo_s"] >= 4 * MS
    unpinned = replace(trace, extra={})
    free = attach(simulate(make_experiment(unpinned, nodes=2, gpus_per_node=1)), 0.9).summary()
    # unmarked, the same trace takes the estimate's error: a wider band than the pinned estimates'
    assert free["iteration_time_lo_s"] < two["iteration_time_lo_s"] and free["iteration_time_hi_s"] > \
        two["iteration_time_hi_s"]
