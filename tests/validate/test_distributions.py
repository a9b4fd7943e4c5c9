"""validate.comparison.distributions: the intraclass correlation by hand and on draws of known mix, and the bench's
per-family and long-row lines on rows of known KS figures."""

from __future__ import annotations

import numpy as np
import pytest

from simfog.engine.compute import ComputeModel
from tests.conftest import make_trace
from validate.comparison import distributions


@pytest.mark.parametrize("table, share", [
    ([[1, 1], [3, 3]], 1.0),    # ranks equal within every iteration: all shared
    ([[1, 3], [3, 1]], 0.0),    # iteration means equal, ranks apart: (0 − 2) / (0 + 2) = −1, clipped
    ([[0, 2], [4, 4]], 0.8),    # means 1 and 4: MSB = 2·(1.5² + 1.5²) = 9, MSW = (1 + 1 + 0 + 0) / 2 = 1: 8 / 10
    ([[5, 5], [5, 5]], 0.0),    # nothing varies
])
def test_shared_share_by_hand(table, share):
    assert distributions.shared_share(np.array(table)) == pytest.approx(share, abs=1e-12)
    assert np.isnan(distributions.shared_share(np.ones((1, 4))))


@pytest.mark.parametrize("w", [0.0, 0.3, 1.0])
def test_shared_share_recovers_the_mix_the_draws_were_made_with(w):
    """Compute times drawn as simfog draws them with compute_draws = w (simfog.engine.compute) give back w, inside
    the bootstrap interval."""
    trace = make_trace([0.01], [0.02], [10], samples=[([0.01 + 0.001 * k], [0.02]) for k in range(40)])
    model = ComputeModel.from_trace(trace, "samples")
    rows = model.draw(np.random.default_rng(3), 600, 4, shared=w)
    times = model.forward_s[rows] + model.backward_s[rows]
    share, lo, hi = distributions.shared_interval(times, resamples=300)
    assert share == pytest.approx(w, abs=0.07)
    assert lo <= share <= hi and (w in (0.0, 1.0) or lo <= w <= hi)


def _row(alg, iterations, ks, p, floor, p99=("", ""), error=""):
    return {"algorithm": alg, "iterations": iterations, "ks_distance": ks, "ks_p_value": p, "ks_same_median": floor,
            "measured_p99_iteration_s": p99[0], "predicted_p99_iteration_s": p99[1], "error": error}


def test_lines_per_family_and_long_rows():
    rows = [_row("allreduce", 30, 0.30, 0.01, 0.22), _row("allreduce", 30, 0.10, 0.6, 0.22),
            _row("neighbor:one_peer_exp2", 120, 0.12, 0.3, 0.11, (0.10, 0.104)),
            _row("fsdp:300kB:reshard:k1", 120, 0.20, 0.2, 0.11, (0.20, 0.21)),
            _row("wagma:S2:every5", 120, 0.40, 0.001, 0.11), _row("allreduce", 120, 0.15, 0.1, 0.11),
            _row("allreduce", 30, "", "", "", error="launch failed")]
    out = distributions.lines(rows)
    assert out[0] == ("distribution allreduce: 3 rows, median KS 15.0% (floor for their sizes 22.0%), 1 of 3 (33%) "
                      "differ at 5 %")
    assert [line.split(":")[0] for line in out] == ["distribution allreduce", "distribution fsdp",
                                                    "distribution neighbor", "distribution wagma",
                                                    "long rows (>= 100 iterations)"]
    # long rows: KS 0.12, 0.20, 0.40, 0.15 -> median 0.175 <= 0.11 + 0.10; 1 of 4 differs (25 % > 20 %): NOT MET
    assert out[-1].startswith("long rows (>= 100 iterations): 4 rows, median KS 17.5% (floor for their sizes 11.0%), "
                              "1 of 4 (25%) differ at 5 %, p99 worst 5.0%")
    assert out[-1].endswith("NOT MET")
    assert "levels matched" not in out[-1]  # rows without ks_shape_distance (older CSVs): nothing said
    shaped = [{**r, "ks_shape_distance": 0.05 * k, "ks_shape_p_value": 0.5 if k else 0.01}
              for k, r in enumerate(rows[2:6])]
    # levels matched: distances 0, 0.05, 0.10, 0.15 -> median 0.075; the first of 4 differs at 5 %
    assert distributions.lines(shaped)[-1].split("; target")[0].endswith(
        "; levels matched (each over its median): median KS 7.5%, 25% differ at 5 %")
    s = distributions.summary([r for r in rows if distributions.is_long(r) and r["algorithm"] != "wagma:S2:every5"])
    assert (s["rows"], s["differ5"], s["p99_worst"]) == (3, 0.0, pytest.approx(0.05))


def test_slowest_over_mean_by_hand_and_under_each_mix():
    # iterations (1, 3) and (2, 2): slowest 3 and 2, mean 2 over all: (3 + 2) / 2 / 2 = 1.25
    assert distributions.slowest_over_mean(np.array([[1, 3], [2, 2]])) == 1.25
    values = [1.0, 2.0]  # two ranks drawing 1 or 2: independent, the slowest is 2 unless both draw 1 (1/4)
    assert distributions.predicted_slowest_over_mean(values, 2, 0.0) == pytest.approx((0.25 * 1 + 0.75 * 2) / 1.5,
                                                                                      abs=0.01)
    assert distributions.predicted_slowest_over_mean(values, 2, 1.0) == pytest.approx(1.0)  # one draw: no straggler
    half = distributions.predicted_slowest_over_mean(values, 2, 0.5)
    assert half == pytest.approx((0.5 * 1.5 + 0.5 * 1.75) / 1.5, abs=0.01)


def test_the_validators_calibration_fits_the_spread_and_its_prediction_draws_from_it():
    """gloo allreduce microbenchmarks on 4 nodes, 30 repetitions per size with 4 % per-call spread: the calibration
    carries it into the simulated links, whose prediction then varies from iteration to iteration where the same
    experiment without the spread does not."""
    import math
    from dataclasses import replace

    from simfog import variation
    from simfog.simulation import simulate
    from simfog.trace import Measurement, NetworkTrace, Provenance
    from tests.conftest import make_experiment
    from validate.calibration import calibration_of, simulated_experiment

    rng = np.random.default_rng(2)
    ms = [Measurement("allreduce", 4, 4, m, tuple((6 * 3e-4 + 1.5 * m / 2.2e7) * (1 + 0.04 * variation.SCALE * (
        rng.gumbel(size=30) + math.log(4) - variation.EULER_GAMMA)))) for m in (1e3, 1e4, 1e5, 3e5, 1e6, 3e6)]
    net = NetworkTrace("gloo", "tcp", Provenance("test", "2026-11-28", "test"), tuple(ms))
    cal = calibration_of(net, "allreduce")
    assert cal.fits["nic"].spread == pytest.approx(0.04, rel=0.4)
    exp = make_experiment(make_trace([1e-3] * 2, [2e-3] * 2, [250_000] * 2), nodes=4, gpus_per_node=1, iterations=8)
    sim_exp = simulated_experiment(exp, cal)
    assert sim_exp.cluster.nic.spread == cal.fits["nic"].spread
    varied = simulate(sim_exp).iterations().groupby("iteration").end_s.max().diff().dropna()
    assert varied.std() > 0
    plain = simulate(replace(sim_exp, cluster=replace(sim_exp.cluster, nic=replace(sim_exp.cluster.nic, spread=0))))
    assert plain.iterations().groupby("iteration").end_s.max().diff().dropna().std() == pytest.approx(0, abs=1e-12)
