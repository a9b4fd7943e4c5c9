"""Distributions, not only means: how far a bench's measured per-iteration times lie from the predicted ones, per
family and on the long rows, and how ranks' compute varies together within an iteration.

Per row the comparison keeps the two-sample Kolmogorov-Smirnov distance of the steady-state per-iteration times
(`ks_distance`), its permutation p-value and `ks_same_median`, the median distance of two samples of those sizes
from ONE distribution: the floor a median distance is judged against (validate.comparison.compare.ks_keys). With
9 measured iterations the floor is about 0.33, so a KS test of a short row says little: the long rows (at least
LONG_ROW measured iterations) are where the distributions are judged, against TARGETS: median distance at most the
floor + 0.10, at most 20 % of rows differing at the 5 % level, p99 of the iteration time within 10 %. The same
distance with each sample over its own median (`ks_shape_distance`, compare.ks_shape_keys) says whether the spread
is right once the levels match: the raw distance of a long row mostly measures the mean's error in units of the
row's spread, which rel_error already judges.

`shared_share`: the intraclass correlation of per-(iteration, rank) compute times, the share w of their variance
that the ranks of one iteration share (one-way analysis of variance, iterations as groups), which is the
`compute_draws` mix of simfog.engine.compute: w = 0 independent draws, 1 one draw for all. What w costs a
synchronous step is its slowest rank (`slowest_over_mean`); `predicted_slowest_over_mean` gives it for ranks
drawing recorded values under a given w, to judge a w fitted on one run against another.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from validate.comparison.compare import _finite, _number, algorithm_of

LONG_ROW = 100  # measured iterations that make a row long
TARGETS = {"ks_above_floor": 0.10, "differ5": 0.20, "p99": 0.10}


def family(row: Mapping) -> str:
    """The row's family label: "allreduce", "neighbor", "wagma", "fsdp", ..."""
    return algorithm_of(row).split(":")[0]


def is_long(row: Mapping) -> bool:
    return _number(row.get("iterations")) >= LONG_ROW


def summary(rows: Sequence[Mapping]) -> dict:
    """Over the rows with a KS distance: how many, the median distance, the median floor, the share differing at
    5 %, and (where both p99 are known) the worst |relative error| of the p99 iteration time."""
    ok = [r for r in rows if not r.get("error") and _finite(_number(r.get("ks_distance")))]
    if not ok:
        return {"rows": 0, "ks_median": float("nan"), "ks_floor": float("nan"), "differ5": float("nan"),
                "p99_worst": float("nan"), "shape_median": float("nan"), "shape_differ5": float("nan")}
    p = [_number(r.get("ks_p_value")) for r in ok]
    floor = [_number(r.get("ks_same_median")) for r in ok]
    p99 = [abs(_number(r.get("predicted_p99_iteration_s")) / _number(r.get("measured_p99_iteration_s")) - 1)
           for r in ok if _number(r.get("measured_p99_iteration_s")) > 0]
    p99 = [x for x in p99 if _finite(x)]
    shape = [r for r in ok if _finite(_number(r.get("ks_shape_distance")))]  # rows of older CSVs have none
    return {"shape_median": statistics.median(_number(r["ks_shape_distance"]) for r in shape) if shape
            else float("nan"),
            "shape_differ5": sum(_number(r.get("ks_shape_p_value")) < 0.05 for r in shape) / len(shape) if shape
            else float("nan"),
            "rows": len(ok), "ks_median": statistics.median(_number(r["ks_distance"]) for r in ok),
            "ks_floor": statistics.median(x for x in floor if _finite(x)) if any(map(_finite, floor)) else float("nan"),
            "differ5": sum(x < 0.05 for x in p if _finite(x)) / len(ok),
            "p99_worst": max(p99) if p99 else float("nan")}


def _line(label: str, s: dict) -> str:
    differ = round(s["differ5"] * s["rows"])
    return (f"{label}: {s['rows']} rows, median KS {s['ks_median']:.1%} (floor for their sizes {s['ks_floor']:.1%}), "
            f"{differ} of {s['rows']} ({s['differ5']:.0%}) differ at 5 %"
            + (f", p99 worst {s['p99_worst']:.1%}" if _finite(s["p99_worst"]) else "")
            + (f"; levels matched (each over its median): median KS {s['shape_median']:.1%}, "
               f"{s['shape_differ5']:.0%} differ at 5 %" if _finite(s["shape_median"]) else ""))


def lines(rows: Sequence[Mapping]) -> list[str]:
    """Per family its KS summary, then the long rows' against TARGETS ([] without a KS distance anywhere)."""
    out = []
    for name in sorted({family(r) for r in rows}):
        s = summary([r for r in rows if family(r) == name])
        if s["rows"]:
            out.append(_line(f"distribution {name}", s))
    long = summary([r for r in rows if is_long(r)])
    if long["rows"]:
        met = (long["ks_median"] <= long["ks_floor"] + TARGETS["ks_above_floor"]
               and long["differ5"] <= TARGETS["differ5"]
               and not long["p99_worst"] > TARGETS["p99"])
        out.append(_line(f"long rows (>= {LONG_ROW} iterations)", long) +
                   f"; target median <= floor + {TARGETS['ks_above_floor']:.0%}, <= {TARGETS['differ5']:.0%} differ, "
                   f"p99 within {TARGETS['p99']:.0%}: {'MET' if met else 'NOT MET'}")
    return out


def shared_share(table: np.ndarray) -> float:
    """The intraclass correlation of `table` (iterations, ranks): (MSB − MSW) / (MSB + (k − 1)·MSW), between
    iterations (MSB) and within them (MSW), k ranks; clipped to [0, 1]; NaN for fewer than 2 iterations or ranks,
    0 when nothing varies."""
    x = np.asarray(table, dtype=float)
    iterations, k = x.shape
    if iterations < 2 or k < 2:
        return float("nan")
    means = x.mean(axis=1)
    msb = k * float(np.sum((means - x.mean()) ** 2)) / (iterations - 1)
    msw = float(np.sum((x - means[:, None]) ** 2)) / (iterations * (k - 1))
    if msb + (k - 1) * msw == 0:
        return 0.0
    return float(min(1.0, max(0.0, (msb - msw) / (msb + (k - 1) * msw))))


def slowest_over_mean(table: np.ndarray) -> float:
    """What a synchronous step pays for its slowest rank's compute: the mean over iterations of the slowest rank's
    time, over the mean time of all (iterations, ranks) of `table`."""
    x = np.asarray(table, dtype=float)
    return float(x.max(axis=1).mean() / x.mean())


def predicted_slowest_over_mean(values, ranks: int, shared: float, iterations: int = 20_000,
                                seed: int = 0) -> float:
    """`slowest_over_mean` of `ranks` ranks drawing from `values` (recorded compute times) as simfog draws them
    with compute_draws = `shared` (simfog.engine.compute: per iteration, with probability `shared` one draw for
    all ranks, else one per rank), over `iterations` seeded iterations."""
    v = np.asarray(values, dtype=float).ravel()
    rng = np.random.default_rng(seed)
    own = rng.integers(0, v.size, size=(iterations, ranks))
    common = rng.integers(0, v.size, size=(iterations, 1))
    rows = np.where(rng.random((iterations, 1)) < shared, common, own)
    return slowest_over_mean(v[rows])


def shared_interval(table: np.ndarray, level: float = 0.9, resamples: int = 2000, seed: int = 0) -> tuple:
    """`shared_share` of `table` and its bootstrap interval at `level` (iterations resampled with replacement)."""
    x = np.asarray(table, dtype=float)
    rng = np.random.default_rng(seed)
    boot = [shared_share(x[rng.integers(0, len(x), len(x))]) for _ in range(resamples)]
    lo, hi = np.nanpercentile(boot, [50 * (1 - level), 50 * (1 + level)])
    return shared_share(x), float(lo), float(hi)
