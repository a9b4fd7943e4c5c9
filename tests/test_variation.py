"""Per-call variation (simfog.variation): the Gumbel order statistics against hand-worked numbers and against
drawing every rank, the spread read back from samples, the calibration that fits it, the experiment's keys, and
every family drawing per call (the evaluators agreeing bit for bit is in the tests/test_analytic*.py files)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from simfog import variation
from simfog.calibrate import fit
from simfog.cluster import Link
from simfog.errors import ConfigError
from simfog.experiment import from_dict
from simfog.simulation import new_simulation, simulate
from simfog.trace import Measurement, NetworkTrace, Provenance
from tests.conftest import make_experiment, make_trace

TRACE = make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000])  # 3 MB of gradients, 80 ms of compute


def test_expected_slowest_is_hand_worked():
    # E[max of n standard Gumbels] = γ + ln n, so in standard deviations (√6/π)·ln n: √6/π = 2.4494897 / 3.1415927
    # = 0.7796968, ln 8 = 2.0794415, ln 2048 = 11·ln 2 = 7.6246190, 0.7796968 · 7.6246190 = 5.9448910
    assert variation.expected_slowest(1) == 0.0
    assert variation.expected_slowest(8) == pytest.approx(0.7796968 * 2.0794415, rel=1e-7)
    assert variation.expected_slowest(2048) == pytest.approx(5.9448910, rel=1e-7)
    assert variation.expected_factor(0.05, 2048) == pytest.approx(1.2972446, rel=1e-7)


def test_one_draw_per_call_is_the_slowest_of_every_ranks_draw():
    """Drawing each of n ranks (a standardized Gumbel each) and taking the slowest gives the distribution the model
    draws in one go: same mean ((√6/π)·ln n), same standard deviation (1), at 2 and 2048 ranks."""
    rng = np.random.default_rng(5)
    v = variation.Variation("draw", 3, 20_000)
    for n in (2, 2048):
        per_rank = (rng.gumbel(size=(2_000, n)) - variation.EULER_GAMMA) * variation.SCALE
        slowest = per_rank.max(axis=1)
        one_draw = v.factors(f"n{n}", 1.0, n) - 1.0  # spread 1: the factor minus 1 is the slowest's Y
        for x, k in ((slowest, 2_000), (one_draw, 20_000)):
            assert x.mean() == pytest.approx(variation.expected_slowest(n), abs=4 / math.sqrt(k))
            assert x.std() == pytest.approx(1.0, abs=0.06)


def test_draws_are_seeded_and_each_table_its_own():
    v = variation.Variation("draw", 7, 4)
    a, b = v.factors("x", [0.1, 0.2], 8), v.factors("x", [0.1, 0.2], 8)
    assert a.shape == (4, 2) and (a == b).all()
    assert not (v.factors("y", [0.1, 0.2], 8) == a).any()
    assert not (variation.Variation("draw", 8, 4).factors("x", [0.1, 0.2], 8) == a).any()
    assert v.factors("x", [0.0, 0.0], 8) is None  # nothing varies: nothing drawn
    e = variation.Variation("expected", 7, 3).factors("x", [0.0, 0.05], [4, 2048])
    assert e.tolist() == [[1.0, variation.expected_factor(0.05, 2048)]] * 3


@pytest.mark.parametrize("spread, ranks", [(0.03, 2), (0.05, 8), (0.1, 4)])
def test_spread_is_read_back_from_the_slowest_ranks_samples(spread, ranks):
    """Samples of a call among n ranks (each the slowest rank of a repetition, T·(1 + s·max Y)) give back s, and the
    base time T from their median."""
    rng = np.random.default_rng(ranks)
    T = 2e-3
    samples = T * (1 + spread * variation.SCALE * (rng.gumbel(size=4_000) + math.log(ranks) - variation.EULER_GAMMA))
    s = variation.spread_of(samples, ranks)
    assert s == pytest.approx(spread, rel=0.08)
    assert variation.base_time(float(np.median(samples)), s, ranks) == pytest.approx(T, rel=0.005)
    assert variation.spread_of(samples[:3], ranks) == 0.0  # too few to say
    assert variation.spread_of([T] * 10, ranks) == 0.0
    assert variation.spread_of(T * np.exp(rng.normal(0, 2, 100)), ranks) == variation.MAX_SPREAD


def test_calibration_fits_the_spread_and_the_links_without_their_slowest_rank():
    """Synthetic gloo-like microbenchmarks on 4 nodes (ring allreduce: 6α + 1.5·M·β) with 3 % per-call spread: the
    fit with per_call finds the spread and the α, β the samples were drawn around; without it, the same α and β come
    out larger by the median slowest rank's share, and no spread."""
    rng = np.random.default_rng(1)
    alpha, beta, s, n = 300e-6, 1 / 22e6, 0.03, 4
    ms = []
    for nbytes in (1_000, 10_000, 100_000, 300_000, 1_000_000, 3_000_000):
        T = 6 * alpha + 1.5 * nbytes * beta
        g = rng.gumbel(size=30) + math.log(n) - variation.EULER_GAMMA
        ms.append(Measurement("allreduce", n, n, nbytes, tuple(T * (1 + s * variation.SCALE * g))))
    trace = NetworkTrace("gloo", "tcp", Provenance("test", "2026-11-28", "test", "measured"), tuple(ms))
    with_spread, without = fit(trace, per_call=True).fits["nic"], fit(trace).fits["nic"]
    assert with_spread.spread == pytest.approx(s, rel=0.35) and without.spread == 0.0
    assert with_spread.link.spread == with_spread.spread
    assert 1 / with_spread.bandwidth_Bps == pytest.approx(beta, rel=0.03)
    assert with_spread.latency_s == pytest.approx(alpha, rel=0.05)
    inflation = variation.median_factor(with_spread.spread, n)
    assert without.bandwidth_Bps * inflation == pytest.approx(with_spread.bandwidth_Bps, rel=1e-6)
    with pytest.raises(ConfigError):
        fit(trace, per_call=True, statistic="min")


def test_experiment_keys_and_their_checks(tmp_path):
    TRACE.save(tmp_path / "t.json")
    base = {"workload": {"trace": "t.json"}, "cluster": {"nodes": 2, "nic_bandwidth": "10Gbit/s"}}
    exp = from_dict({**base, "cluster": {**base["cluster"], "nic_spread": 0.03, "intra_spread": 0.01},
                     "comm": {"variation": "expected"}, "workload": {"trace": "t.json", "compute_draws": "shared"}},
                    base_dir=tmp_path)
    assert (exp.cluster.nic.spread, exp.cluster.intra.spread, exp.comm.variation) == (0.03, 0.01, "expected")
    assert exp.workload.compute_shared == 1.0
    assert from_dict(base, base_dir=tmp_path).cluster.nic.spread == 0.0
    for section, key, value in (("cluster", "nic_spread", 0.5), ("cluster", "intra_spread", "3%"),
                                ("comm", "variation", "sometimes"), ("workload", "compute_draws", 1.5),
                                ("workload", "compute_draws", "mixed")):
        table = {**base, section: {**base.get(section, {}), key: value}}
        if section == "workload":
            table["workload"]["trace"] = "t.json"
        with pytest.raises(ConfigError) as e:
            from_dict(table, base_dir=tmp_path, source="e.toml")
        assert e.value.field == f"{section}.{key}" and e.value.source == "e.toml"
    with pytest.raises(ConfigError):
        Link(1e-6, 1e9, spread=-0.1)


def _spread(exp, nic=0.05, intra=0.02):
    c = exp.cluster
    return replace(exp, cluster=replace(c, nic=replace(c.nic, spread=nic), intra=replace(c.intra, spread=intra)))


def test_a_call_varies_as_its_bottleneck_class_does():
    """A call that crosses nodes takes the spread of its slowest class per byte (the NIC here), not the larger spread:
    a noisy but fast loopback is hidden behind the NIC's hop; a call inside one node takes the intra spread; one
    rank none."""
    exp = _spread(make_experiment(make_trace([1e-3], [2e-3], [1000]), nodes=2, gpus_per_node=4), nic=0.03,
                  intra=0.25)
    cost = new_simulation(exp).cost
    assert exp.cluster.nic.beta_s_per_B > exp.cluster.intra.beta_s_per_B
    assert cost.spread() == 0.03 and cost.spread([0, 1, 2, 3]) == 0.25 and cost.spread([5]) == 0.0
    fast_nic = replace(exp, cluster=replace(exp.cluster, nic=replace(exp.cluster.nic, bandwidth_Bps=1e12)))
    assert new_simulation(fast_nic).cost.spread() == 0.25  # the loopback is the bottleneck then


@pytest.mark.parametrize("comm", [dict(merge="wfbp"), dict(merge="wfbp", streams=2), dict(merge="horovod"),
                                  dict(algorithm="fsdp"), dict(algorithm="hsdp"), dict(algorithm="zero3"),
                                  dict(algorithm="neighbor"), dict(algorithm="decentralized"),
                                  dict(algorithm="wagma", merge="wfbp"), dict(algorithm="fp16")])
def test_every_family_pays_its_calls_slowest_rank(comm):
    """With a spread, every family's calls pay their slowest participant: each call's expected slowest lengthens
    the mean iteration ("expected"); the draws change it, seeded (the same run twice gives the same numbers); a
    spread of 0 gives the numbers of no spread, bit for bit. A slow NIC (20 MB/s): communication is exposed."""
    exp = make_experiment(TRACE, nodes=4, gpus_per_node=2, collective="ring", iterations=6, nic=Link(10e-6, 2e7),
                          **comm)
    plain = simulate(exp).summary()["iteration_time_s"]
    assert simulate(_spread(exp).with_comm(variation="expected")).summary()["iteration_time_s"] > plain
    drawn = simulate(_spread(exp)).summary()
    assert drawn == simulate(_spread(exp)).summary() and drawn["iteration_time_s"] != plain
    assert simulate(_spread(exp, 0.0, 0.0)).summary()["iteration_time_s"] == plain


def test_shared_groups_forbid_the_symmetric_path_only_when_drawing():
    for algorithm, symmetric in (("allreduce", True), ("fsdp", True), ("hsdp", False)):
        exp = _spread(make_experiment(TRACE, nodes=2, gpus_per_node=2, collective="ring", algorithm=algorithm))
        assert new_simulation(exp).symmetric is symmetric
        assert new_simulation(exp.with_comm(variation="expected")).symmetric is True
        assert new_simulation(make_experiment(TRACE, nodes=2, gpus_per_node=2, collective="ring",
                                              algorithm=algorithm)).symmetric is True


def test_expected_mode_on_a_hand_worked_iteration():
    """One bucket after backward (merge single) on a linear collective (T = 10 ms + 1 ns/B · 3 MB = 13 ms at every
    rank count): the iteration is 80 ms of compute plus 13 ms · (1 + 0.05·(√6/π)·ln n)."""
    for n, factor in ((8, 1.0810667), (2048, 1.2972446)):
        exp = make_experiment(TRACE, nodes=n // 2, gpus_per_node=2, merge="single", alpha=10e-3, beta=1e-9,
                              variation="expected")
        s = simulate(_spread(exp)).summary()
        assert s["iteration_time_s"] == pytest.approx(0.08 + 0.013 * factor, rel=1e-7)
        assert (s["nic_spread"], s["intra_spread"], s["variation"]) == (0.05, 0.02, "expected")  # said in the output
        assert "nic_spread" not in simulate(exp).summary()


def test_compute_draws_shared_independent_and_mixed():
    from simfog.engine.compute import ComputeModel

    samples = make_trace([0.01], [0.02], [10], samples=[([0.01 * (k + 1)], [0.02]) for k in range(50)])
    model = ComputeModel.from_trace(samples, "samples")
    independent = model.draw(np.random.default_rng(4), 400, 64)
    assert (independent == np.random.default_rng(4).integers(0, 50, size=(400, 64))).all()  # as it always was
    shared = model.draw(np.random.default_rng(4), 400, 64, shared=1.0)
    assert (shared == shared[:, :1]).all()
    mixed = model.draw(np.random.default_rng(4), 4000, 16, shared=0.3)
    together = (mixed == mixed[:, :1]).all(axis=1)
    assert together.mean() == pytest.approx(0.3, abs=0.03)
    t = mixed.astype(float)
    assert np.corrcoef(t[:, 0], t[:, 1])[0, 1] == pytest.approx(0.3, abs=0.05)  # two ranks correlate by w


def test_simulate_says_the_spread_it_drew(tmp_path, capsys):
    from simfog import cli

    TRACE.save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text('[workload]\ntrace = "t.json"\n[cluster]\nnodes = 2\nnic_bandwidth = "1Gbit/s"\n'
                                     "nic_spread = 0.03\n")
    assert cli.main(["simulate", str(tmp_path / "e.toml")]) == 0
    assert "per-call spread 3 % between nodes, 0 % within (drawn per call)" in capsys.readouterr().out
