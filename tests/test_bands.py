"""simfog.bands: the conformal rule, the combination of parts, the default for what nothing measured."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog import units
from simfog.bands import (
    UNMEASURED_HALF_WIDTH,
    Part,
    combine,
    conformal_quantile,
    conformal_rank,
    effect,
    format_interval,
    log_scores,
)
from simfog.errors import ConfigError


def test_conformal_rank_by_hand():
    # k = ceil((n + 1) L): 9 scores at 90 % -> the 9th (the largest); 19 -> the 18th; 8 -> none (k = 9 > 8)
    assert conformal_rank(9, 0.9) == 9
    assert conformal_rank(19, 0.9) == 18
    assert conformal_rank(99, 0.5) == 50
    assert conformal_quantile(np.arange(1, 10) / 100, 0.9) == pytest.approx(0.09)
    assert conformal_quantile(np.arange(1, 20) / 100, 0.9) == pytest.approx(0.18)
    assert conformal_quantile(np.arange(1, 9) / 100, 0.9) is None
    assert conformal_quantile([], 0.5) is None


def test_level_must_be_a_fraction():
    for bad in (0, 1, 1.5, -0.1, "0.9", True):
        with pytest.raises(ConfigError, match="level"):
            conformal_quantile([0.1, 0.2], bad)


@settings(max_examples=60, deadline=None)
@given(st.integers(20, 300), st.sampled_from([0.5, 0.8, 0.9, 0.95]), st.integers(0, 2**31))
def test_conformal_coverage_on_exchangeable_points(n, level, seed):
    """The guarantee the rule rests on: over many draws of n calibration scores and one new score from the same
    distribution, the new score falls at or under the half-width in at least `level` of the draws (and less than
    level + 1/(n+1) + sampling noise)."""
    rng = np.random.default_rng(seed)
    trials = 4000
    scores = np.abs(rng.standard_t(3, size=(trials, n + 1)))
    k = conformal_rank(n, level)
    q = np.sort(scores[:, :n], axis=1)[:, k - 1]
    covered = float(np.mean(scores[:, n] <= q))
    noise = 4 * math.sqrt(level * (1 - level) / trials)
    assert level - noise <= covered <= level + 1 / (n + 1) + noise


def test_log_scores_are_symmetric_in_ratio():
    s = log_scores([1.0, 1.0], [2.0, 0.5])
    assert s == pytest.approx([math.log(2), math.log(2)])


def test_combine_root_sum_square_in_log_space():
    a = Part("network", 0.03, 0.04, "held-out")
    b = Part("compute", 0.04, 0.03, "samples")
    iv = combine(0.1, 0.9, [a, b])
    assert iv.lo == pytest.approx(0.1 * math.exp(-0.05))   # sqrt(0.03² + 0.04²) = 0.05
    assert iv.hi == pytest.approx(0.1 * math.exp(0.05))
    assert iv.shares == pytest.approx({"network": 0.5, "compute": 0.5})
    one = combine(2.0, 0.8, [Part.symmetric("compute", 0.1, "x")])
    assert (one.lo, one.hi) == pytest.approx((2 * math.exp(-0.1), 2 * math.exp(0.1)))
    assert one.shares == {"compute": 1.0}
    empty = combine(3.0, 0.9, [])
    assert (empty.lo, empty.hi, empty.shares) == (3.0, 3.0, {})


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.floats(0, 2)), min_size=1, max_size=5))
def test_combine_properties(widths):
    parts = [Part(f"p{i}", lo, hi, "x") for i, (lo, hi) in enumerate(widths)]
    iv = combine(1.0, 0.9, parts)
    assert iv.lo <= iv.value <= iv.hi
    if sum(lo ** 2 + hi ** 2 for lo, hi in widths) > 0:  # (squares of denormals are 0: no shares)
        assert sum(iv.shares.values()) == pytest.approx(1.0)
    # adding a part never narrows the interval
    wider = combine(1.0, 0.9, [*parts, Part("extra", 0.01, 0.0, "x")])
    assert wider.lo <= iv.lo and wider.hi >= iv.hi


def test_unmeasured_widens_and_says_so():
    measured = combine(1.0, 0.9, [Part.symmetric("compute", 0.02, "samples")])
    with_gap = combine(1.0, 0.9, [Part.symmetric("compute", 0.02, "samples"),
                                  Part.symmetric("network", None, "no network file")])
    assert with_gap.unmeasured == ("network",)
    assert with_gap.lo < measured.lo and with_gap.hi > measured.hi
    net = with_gap.parts[1]
    assert (net.below, net.above) == (UNMEASURED_HALF_WIDTH, UNMEASURED_HALF_WIDTH)
    assert "UNMEASURED (no network file)" in net.source


def test_effect_reads_each_side():
    p = effect("network", 100.0, 90.0, 125.0, "bounds")
    assert (p.below, p.above) == pytest.approx((math.log(100 / 90), math.log(1.25)))
    assert effect("network", 100.0, 100.0, 100.0, "no effect").below == 0.0
    # a part that moves the result one way only (e.g. a cap): the other side stays 0
    one_way = effect("network", 100.0, 110.0, 120.0, "x")
    assert one_way.below == 0.0 and one_way.above == pytest.approx(math.log(1.2))


def test_reciprocal_swaps_bounds_and_format():
    iv = combine(0.142, 0.9, [Part("compute", math.log(0.142 / 0.131), math.log(0.158 / 0.142), "x")])
    assert format_interval(iv, units.format_time) == "142 ms (90 %: 131–158 ms)"
    rate = iv.reciprocal(64.0)
    assert rate.lo == pytest.approx(64 / 0.158) and rate.hi == pytest.approx(64 / 0.131)
    assert rate.contains(64 / 0.142) and not rate.contains(64 / 0.2)
    assert iv.relative_half_width == pytest.approx((0.158 - 0.131) / 2 / 0.142)
    assert iv.to_dict("iteration_time", "_s") == {"iteration_time_lo_s": iv.lo, "iteration_time_hi_s": iv.hi}


def test_bad_half_width():
    with pytest.raises(ConfigError, match="network.below"):
        Part("network", -0.1, 0.1, "x")
