"""Validation rows' intervals held out by configuration kind, and the KS distance judged against its own floor."""

import csv
import math

import numpy as np
import pandas as pd
import pytest

from simfog.bands import conformal_quantile
from validate.comparison import compare
from validate.comparison.held_out import held_out_keys, held_out_line, host_half_width, kind_of


def row(kind: str, model: str, measured: float, predicted: float = 1.0, **extra) -> dict:
    return {"id": f"{kind}-{model}-{measured}", "algorithm": kind, "model": model, "measured_iteration_s": measured,
            "predicted_iteration_s": predicted, "error": "", **extra}


def rows_of_three_kinds():
    # allreduce/mlp off by e^0.01..e^0.10, neighbour/mlp by e^0.2 .. e^0.29, allreduce/resnet by e^0.05 each
    a = [row("allreduce", "mlp", math.exp(0.01 * k)) for k in range(1, 11)]
    b = [row("neighbor:exp2", "mlp", math.exp(0.2 + 0.01 * k)) for k in range(10)]
    c = [row("allreduce", "resnet20", math.exp(-0.05)) for _ in range(10)]
    return a, b, c


def test_a_rows_interval_comes_from_the_other_kinds_only():
    a, b, c = rows_of_three_kinds()
    keys = held_out_keys(a + b + c)
    # an allreduce/mlp row: q from the 20 rows of b and c, never from a's own scores
    q_a = conformal_quantile([0.2 + 0.01 * k for k in range(10)] + [0.05] * 10, 0.9)
    assert q_a == pytest.approx(0.28)  # k = ceil(21 x 0.9) = 19th of 20: b's 9th
    k0 = keys[0]
    assert (k0["held_out_lo_s"], k0["held_out_hi_s"]) == pytest.approx((math.exp(-q_a), math.exp(q_a)))
    assert k0["held_out_rows"] == 20 and k0["inside_held_out"] is True
    # a neighbour row: q from a and c (at most 0.10), so its own 0.2-0.29 errors fall outside
    q_b = conformal_quantile([0.01 * k for k in range(1, 11)] + [0.05] * 10, 0.9)
    assert q_b == pytest.approx(0.09)
    assert [k["inside_held_out"] for k in keys[10:20]] == [False] * 10
    assert keys[10]["held_out_hi_s"] == pytest.approx(math.exp(q_b))


def test_too_few_other_rows_and_failed_rows_have_no_interval():
    a, b, _ = rows_of_three_kinds()
    few = a + b[:3]  # a's rows see 3 others: k = ceil(4 x 0.9) = 4 > 3
    keys = held_out_keys(few)
    assert keys[0]["held_out_lo_s"] == "" and keys[0]["inside_held_out"] == ""
    failed = [{**a[0], "error": "boom"}] + b
    k = held_out_keys(failed)
    assert k[0]["inside_held_out"] == "" and k[1]["held_out_rows"] == 0  # the failed row scores nothing


def test_rows_read_back_from_a_csv_by_pandas_count_alike(tmp_path):
    """Empty cells come back as NaN from pandas and as '' from csv: neither is a job or an error."""
    a, b, c = rows_of_three_kinds()
    rows = a + b + c
    path = tmp_path / "v.csv"
    compare.write_csv(rows, path)
    by_pandas = pd.read_csv(path).to_dict("records")
    with open(path, newline="") as f:
        by_csv = list(csv.DictReader(f))
    assert kind_of(by_pandas[0]) == kind_of(by_csv[0]) == ("allreduce", "mlp", False)
    assert [k["inside_held_out"] for k in held_out_keys(by_pandas)] == \
        [k["inside_held_out"] for k in held_out_keys(rows)]
    written = [r["inside_held_out"] for r in by_csv]  # write_csv computed them from the rows it wrote
    assert written == [str(k["inside_held_out"]) for k in held_out_keys(rows)]


def test_the_line_counts_the_rows_inside_and_the_host_width_uses_every_row():
    a, b, c = rows_of_three_kinds()
    rows = a + b + c
    line = held_out_line(rows)
    assert "20 of 30 rows inside their 90 % interval (67%)" in line
    every = [0.01 * k for k in range(1, 11)] + [0.2 + 0.01 * k for k in range(10)] + [0.05] * 10
    assert host_half_width(rows) == pytest.approx(conformal_quantile(every, 0.9))
    assert f"{math.sinh(conformal_quantile(every, 0.9)):.1%}" in line
    assert held_out_line([]) == ""


def test_jobs_rows_are_a_kind_of_their_own():
    plain = row("allreduce", "mlp", 1.0)
    assert kind_of(plain) != kind_of({**plain, "job": "job0"})


def test_ks_keys_judge_the_distance_against_samples_of_one_distribution():
    rng = np.random.default_rng(7)
    apart = compare.ks_keys(np.arange(9.0), np.arange(9.0) + 100)
    assert apart["ks_distance"] == 1.0
    # only the observed split and its mirror reach 1 among C(18, 9) = 48,620: p is the observed one's 1/1000
    assert apart["ks_p_value"] == pytest.approx(1 / 1000)
    same = compare.ks_keys(rng.normal(size=9), rng.normal(size=9))
    # two samples of 9 from one distribution: the median distance is 1/3 (the exact null's median)
    assert same["ks_same_median"] == pytest.approx(1 / 3)
    assert 0 < same["ks_p_value"] <= 1
    assert compare.ks_keys([1.0, 2.0], [1.5]) == compare.ks_keys([1.0, 2.0], [1.5])  # seeded
    assert math.isnan(compare.ks_keys([], [1.0])["ks_p_value"])


def test_ks_shape_keys_match_the_levels_before_comparing():
    """A sample and the same sample twice as slow (exactly, in binary): no overlap, so the raw distance is 1; over
    their medians they are one sample (distance 0, p 1). A spread four times as wide around the same median is what
    the levels-matched distance still sees."""
    rng = np.random.default_rng(11)
    base = 1.0 + 0.01 * rng.standard_normal(120)
    assert compare.ks_keys(base, 2 * base)["ks_distance"] == 1.0
    same = compare.ks_shape_keys(base, 2 * base)
    assert same["ks_shape_distance"] == pytest.approx(0.0, abs=1e-12) and same["ks_shape_p_value"] == 1.0
    wider = compare.ks_shape_keys(base, 1.0 + 0.04 * rng.standard_normal(120))
    # N(0, 1) against N(0, 4): the largest gap of the two CDFs, Phi(x) - Phi(x / 4), is 0.29 (x = 1.72), against
    # a two-sample floor of about 0.1 at 120 a side
    assert 0.15 < wider["ks_shape_distance"] < 0.45 and wider["ks_shape_p_value"] < 0.05
    assert math.isnan(compare.ks_shape_keys([], [1.0])["ks_shape_distance"])


def test_the_table_marks_each_row_held_out_and_ends_with_the_line():
    a, b, c = rows_of_three_kinds()
    full = [{**r, "merge": "wfbp", "ranks": 2, "nodes": 1, "ranks_per_node": 2, "nic_bandwidth_Bps": 1e9,
             "buckets": 1, "measured_iteration_std_s": 0.0,
             "rel_error": (r["predicted_iteration_s"] - r["measured_iteration_s"]) / r["measured_iteration_s"]}
            for r in a + b + c]
    lines = compare.format_table(full).splitlines()
    assert lines[0].endswith("held out")
    body = lines[2:32]
    assert [line.split()[-1] for line in body] == ["yes"] * 10 + ["no"] * 10 + ["yes"] * 10
    assert held_out_line(full) in lines
