"""Merge-threshold tuning: which bucket size (DDP bucket_cap_mb, Horovod fusion threshold) minimises the iteration
time, and what it gains over the frameworks' defaults and over MG-WFBP.

The search simulates merge = "threshold" on a log grid of thresholds, then a finer log grid between the best
grid point's neighbours. The grid always holds the two extremes: the smallest gradient's size (every tensor alone,
the same bucket plan as wfbp) and the model's size (one bucket, as single), so the best found is never worse than
either. Thresholds that give the same bucket plan are simulated once.

Layer times are fixed at their means (compute = "mean") unless asked otherwise: with sampled times every threshold
would be scored on a few random draws, and the search would chase the threshold whose draws happened to be fast
rather than the one whose bucket plan is best. Means also let the engine take its symmetric fast path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from simfog import merge
from simfog.bands import DEFAULT_LEVEL, Interval, check_level
from simfog.caveats import of_result
from simfog.errors import Caveat, ConfigError
from simfog.experiment import Experiment
from simfog.titles import run_title

#: Policies the best threshold is compared with, each with its own default sizes; "optimal" is the exact least
#: iteration over every contiguous plan (simfog.merge.optimal_groups), so no threshold can beat it.
BASELINES = ("optimal", "ddp", "horovod", "bagua", "wfbp", "single", "mgwfbp")
#: The frameworks' defaults weighed against the best threshold with the model's uncertainty.
FRAMEWORK_DEFAULTS = ("ddp", "horovod", "bagua")
#: The "near best" range: thresholds whose iteration time is within this fraction of the best.
NEAR_BEST = 0.01


@dataclass(frozen=True, eq=False)
class TuneResult:
    """`curve`: one row per simulated threshold (threshold_bytes, buckets, iteration_time_s, stage "grid" or
    "refine"), sorted by threshold. `best_*`: the smallest threshold reaching the least iteration time (s), and its
    bucket count. `baselines`: policy -> iteration time (s) with that policy's defaults. `near_best_bytes`: the
    smallest and largest threshold simulated within 1 % of the best. `compute`: "mean" or "samples".
    `plateau_bytes`: the widest run of neighbouring thresholds within 1 % of the best (simfog.tune.widest_plateau),
    `recommended_*`: its threshold nearest the run's middle (log scale), the answer robust to a flat curve.
    `versus_defaults`: per framework default (FRAMEWORK_DEFAULTS), the interval at `level` of its iteration time over
    the best threshold's (simfog.run_bands.ratio_interval: the same model error through both runs);
    `distinct(p)` says whether it excludes 1. `best_interval`: the best threshold's run's interval at `level`
    (simfog.run_bands.summary_fields: iteration_time_lo_s / _hi_s, samples_per_s_lo / _hi, ...). `warnings`: per
    row of table(), what its run rests on (simfog.caveats; `curve` has them per threshold)."""

    curve: pd.DataFrame
    best_threshold_bytes: float
    best_iteration_time_s: float
    best_buckets: int
    baselines: dict[str, float]
    near_best_bytes: tuple[float, float]
    compute: str
    title: str = ""
    info: dict = field(default_factory=dict)
    plateau_bytes: tuple[float, float] = (math.nan, math.nan)
    recommended_threshold_bytes: float = math.nan
    recommended_iteration_time_s: float = math.nan
    versus_defaults: dict[str, Interval] = field(default_factory=dict)
    best_interval: dict = field(default_factory=dict)
    warnings: dict[str, str] = field(default_factory=dict)  # table() policy -> its run's caveats (simfog.caveats)

    def distinct(self, policy: str) -> bool | None:
        """Whether the model tells `policy`'s defaults from the best threshold at its interval's level (None: not
        weighed)."""
        iv = self.versus_defaults.get(policy)
        return None if iv is None else not iv.lo <= 1 <= iv.hi

    def table(self) -> pd.DataFrame:
        """Best threshold and baselines: policy, threshold_bytes (NaN for baselines), iteration_time_s,
        slower_than_best (fraction: 0.05 = 5 % slower), distinct (the frameworks' defaults: whether the model's
        interval tells them from the best; None for the others)."""
        rows = [{"policy": "threshold (best)", "threshold_bytes": self.best_threshold_bytes,
                 "iteration_time_s": self.best_iteration_time_s}]
        rows += [{"policy": p, "threshold_bytes": math.nan, "iteration_time_s": t} for p, t in self.baselines.items()]
        df = pd.DataFrame(rows)
        df["slower_than_best"] = df.iteration_time_s / self.best_iteration_time_s - 1
        df["distinct"] = [None, *(self.distinct(p) for p in self.baselines)]
        df["warnings"] = [self.warnings.get(p, "") for p in df.policy]
        return df


# The most thresholds one pass simulates (each a whole simulation): 10**9 of them never finished.
MAX_POINTS = 1000


def _check(name: str, value, minimum: int, maximum: int = MAX_POINTS) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(name, value, f"an integer in {minimum}..{maximum:,} (each a simulation)")
    return value


def tune(exp: Experiment, *, lo: float | None = None, hi: float | None = None, points: int = 25, refine: int = 10,
         samples: bool = False, level: float = DEFAULT_LEVEL) -> TuneResult:
    """Search the merge threshold of `exp` (its cluster, collective and rank count) between `lo` and `hi` bytes
    (default: the smallest gradient's size and the model's size) on `points` log-spaced thresholds, then `refine`
    more between the best one's neighbours. `samples`: use the trace's sampled layer times instead of means.
    The frameworks' defaults are weighed against the best at `level` (TuneResult.versus_defaults). Returns a
    TuneResult. Raises ConfigError for bad bounds, counts or level, or a trace without gradients; whatever
    simulate raises for the experiment itself (e.g. Infeasible for rhd on 6 ranks)."""
    from simfog.progress import bar as progress_bar
    from simfog.run_bands import attach, ratio_interval
    from simfog.simulation import simulate

    level = check_level(level, "level")
    _check("points", points, 2)
    _check("refine", refine, 0)
    tensors, smallest, total = gradients(exp)
    lo = smallest if lo is None else float(lo)
    hi = total if hi is None else float(hi)
    if not (math.isfinite(lo) and lo > 0):
        raise ConfigError("lo", lo, "a size in bytes > 0")
    if not (math.isfinite(hi) and hi >= lo):
        raise ConfigError("hi", hi, f"a size in bytes >= lo ({lo:g} B)")
    compute = "samples" if samples else "mean"
    exp = replace(exp, workload=replace(exp.workload, compute=compute))

    by_plan: dict[tuple, float] = {}
    rows: dict[float, dict] = {}
    # Each simulation at scale can take seconds: a bar (on a terminal only) over the thresholds and baselines.
    bar = progress_bar(total=points + 2 + refine + len(BASELINES), desc="tune", unit="sim")

    def evaluate(thresholds, stage: str) -> None:
        for t in thresholds:
            bar.update(1)
            t = float(t)
            if t in rows:
                continue
            plan = merge.plan("threshold", tensors, merge.MergeSettings(threshold_bytes=t))
            key = tuple(len(b.tensors) for b in plan)
            if key not in by_plan:
                result = simulate(exp.with_comm(merge="threshold", threshold_bytes=t))
                by_plan[key] = result.summary()["iteration_time_s"], Caveat.line(of_result(result))
            time, warned = by_plan[key]
            rows[t] = {"threshold_bytes": t, "buckets": len(plan), "iteration_time_s": time, "stage": stage,
                       "warnings": warned}

    evaluate([*_logspace(lo, hi, points), smallest, total], "grid")
    if refine:
        ts = sorted(rows)
        i = ts.index(_best(rows))
        evaluate(_logspace(ts[max(i - 1, 0)], ts[min(i + 1, len(ts) - 1)], refine + 2)[1:-1], "refine")
    best = _best(rows)
    t_best = rows[best]["iteration_time_s"]
    near = [t for t, r in rows.items() if r["iteration_time_s"] <= t_best * (1 + NEAR_BEST)]
    baselines, warnings = {}, {"threshold (best)": rows[best]["warnings"]}
    for p in BASELINES:
        bar.update(1)
        result = simulate(exp.with_comm(merge=p, threshold_bytes=None))
        baselines[p], warnings[p] = result.summary()["iteration_time_s"], Caveat.line(of_result(result))
    best_run = exp.with_comm(merge="threshold", threshold_bytes=best)
    versus = {p: ratio_interval(exp.with_comm(merge=p, threshold_bytes=None), best_run, level)
              for p in FRAMEWORK_DEFAULTS}
    best_summary = attach(simulate(best_run), level).summary()
    interval = {k: best_summary[k] for k in ("iteration_time_lo_s", "iteration_time_hi_s", "samples_per_s",
                                             "samples_per_s_lo", "samples_per_s_hi", "interval_level")}
    bar.close()
    curve = pd.DataFrame(sorted(rows.values(), key=lambda r: r["threshold_bytes"]))
    title = run_title(exp)
    a, b, pick = widest_plateau(curve.threshold_bytes, curve.iteration_time_s, NEAR_BEST)
    return TuneResult(curve, best, t_best, rows[best]["buckets"], baselines, (min(near), max(near)), compute, title,
                      {"model": exp.workload.trace.model, "ranks": exp.ranks, "collective": exp.comm.collective,
                       "estimated": bool(exp.estimated), "model_bytes": total, "smallest_tensor_bytes": smallest},
                      (float(curve.threshold_bytes.iloc[a]), float(curve.threshold_bytes.iloc[b])),
                      float(curve.threshold_bytes.iloc[pick]), float(curve.iteration_time_s.iloc[pick]), versus,
                      interval, warnings)


def widest_plateau(xs, ys, tolerance: float, least: float | None = None) -> tuple[int, int, int]:
    """Of points (xs ascending, > 0; ys their times), the widest run of neighbours all within `tolerance` (a
    fraction) of `least` (default: the least y), its width measured as log(x_last / x_first). Returns (first, last,
    pick): indices of the run's ends and of its point nearest the run's middle in log scale (ties: the lower time,
    then the smaller x). Ties between runs of equal width go to the run holding the least y."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(xs) == 0 or len(xs) != len(ys) or not np.all(xs > 0) or np.any(np.diff(xs) <= 0):
        raise ConfigError("curve", list(xs), "positive values in ascending order, one time each")
    least = min(ys.min(), least) if least is not None else ys.min()
    inside = ys <= least * (1 + tolerance)
    runs, start = [], None
    for i, ok in enumerate([*inside, False]):
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            runs.append((start, i - 1))
            start = None
    logx = np.log(xs)

    def rank(run):
        a, b = run
        return (round(logx[b] - logx[a], 9), ys[a:b + 1].min() == ys.min())

    a, b = max(runs, key=rank) if runs else (int(ys.argmin()),) * 2
    middle = (logx[a] + logx[b]) / 2
    # distances rounded: two points equally far from the middle in exact arithmetic must tie
    pick = min(range(a, b + 1), key=lambda i: (round(abs(logx[i] - middle), 9), ys[i], xs[i]))
    return a, b, pick


def gradients(exp: Experiment) -> tuple[tuple[merge.GradTensor, ...], float, float]:
    """The experiment's gradient tensors, the smallest non-empty one's bytes and the model's: the range a bucket
    size search spans. Raises ConfigError for a trace without gradients."""
    tensors = merge.grad_tensors(exp.workload.trace)
    sizes = [t.nbytes for t in tensors if t.nbytes > 0]
    if not sizes:
        raise ConfigError("workload.trace", exp.workload.trace_path, "a model with gradient tensors",
                          source=exp.source)
    return tensors, float(min(sizes)), float(sum(sizes))


def _logspace(a: float, b: float, n: int) -> list[float]:
    """n log-spaced values from a to b, endpoints exact, none outside [a, b] by rounding."""
    return [a, *np.clip(np.geomspace(a, b, n)[1:-1], a, b), b]


def _best(rows: dict[float, dict]) -> float:
    """The smallest threshold whose iteration time equals the least one (ties: equal plans or exact ties)."""
    least = min(r["iteration_time_s"] for r in rows.values())
    return min(t for t, r in rows.items() if r["iteration_time_s"] <= least * (1 + 1e-12))
