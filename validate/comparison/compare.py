"""Measured against predicted: the measured run as a `simfog.results.Result`, one comparison row per configuration,
error statistics, the CSV and the printed table.

The measured run is turned into the very records the engine writes (rank, iteration, kind, name, start_s, end_s),
so both sides' iteration times come from the same code (iteration k ends when the last rank ends its optimizer
step; `steady_iteration_s` averages the differences of those ends after iteration 0), and the two interval frames
can be joined. Relative errors are signed: (predicted − measured) / measured.

How measured intervals are formed (per rank, perf_counter seconds from the earliest measured iteration start):
forward = [start, forward_end]; backward = [forward_end, backward_end]; optimizer = [optimizer_start, end]; per
bucket b, a collective cannot start before its last rank launched it: with S_b the latest launch over ranks, wait =
[own launch, S_b] and comm = [S_b, own completion]. gloo may run two collectives at once (two threads), so measured
comm intervals of one rank can overlap, which the simulator never does. Decentralized records
(validate.ranks.decentralized) name the ranks that gate a rank's exchange ("peers": its neighbours, or its group),
so S_b is the latest launch among those, and the interval carries the simulator's name ("neighbor", "group",
"global").
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from simfog import units
from simfog.bands import DEFAULT_LEVEL
from simfog.files import atomic_open
from simfog.results import Result
from validate.comparison.held_out import held_out_keys, held_out_line

COLUMNS = ["id", "model", "mode", "algorithm", "merge", "ranks", "nodes", "ranks_per_node", "nic_bandwidth_Bps",
           "emulated", "iterations", "warmup", "buckets", "buckets_match", "measured_iteration_s",
           "measured_iteration_std_s", "predicted_iteration_s", "predicted_iteration_std_s", "rel_error",
           "measured_median_iteration_s", "predicted_median_iteration_s", "rel_error_median",
           "predicted_iteration_lo_s", "predicted_iteration_hi_s",
           "interval_level", "inside_interval", "held_out_lo_s", "held_out_hi_s", "inside_held_out", "held_out_rows",
           "ks_distance", "ks_p_value", "ks_same_median", "ks_shape_distance", "ks_shape_p_value",
           "measured_backward_s",
           "predicted_backward_s", "measured_comm_exposed_s", "predicted_comm_exposed_s", "measured_comm_s",
           "predicted_comm_s", "nic_latency_s", "nic_fit_bandwidth_Bps", "nic_capacity_Bps", "intra_latency_s",
           "intra_fit_bandwidth_Bps", "nic_spread", "intra_spread", "measured_p99_iteration_s",
           "predicted_p99_iteration_s",
           "bucket_copy_Bps", "collective_overhead_s", "overlap_slowdown", "host_excess_s", "host_excess_s_per_B",
           "overheads_source", "predicted_without_probe_s", "rel_error_without_probe",
           "load_average", "host_cpu_busy", "host_runnable", "host_oversubscribed", "host_limited",
           "host_steal", "host_cpu_model", "host_cores", "host_kernel", "host_microbenchmark_s",
           "dropped_packets", "measured_memory_B", "predicted_memory_B", "memory_rel_error", "calibration", "trace",
           "note", "error"]
# switch tiers and several jobs on them (validate.jobs): where the job ran, and its slowdown beside the others
COLUMNS[-2:-2] = ["fabric", "placement", "job", "measured_alone_s", "predicted_alone_s", "measured_slowdown",
                  "predicted_slowdown", "slowdown_rel_error", "overlap", "start_offset_s",
                  "predicted_slowdown_lo", "predicted_slowdown_hi"]


def measured_result(experiment, ranks: Sequence[Mapping], *, bucket_prefix: str = "bucket",
                    bucket_bytes: Sequence[int] = (), single_rank_time_s: float = float("nan")) -> Result:
    """A Result built from every rank's worker record of one configuration (`validate.ranks.worker.run_config`, in rank
    order). Times are rebased so the earliest measured iteration start is 0. Buckets are named
    f"{bucket_prefix}{b}" as the engine names them; `bucket_bytes[b]` goes into `Result.buckets`."""
    origin = min(r["iterations"][0]["start"] for r in ranks)
    n_it = min(len(r["iterations"]) for r in ranks)
    records, comm_s = [], {}
    for it in range(n_it):
        rows = [r["iterations"][it] for r in ranks]
        n_b = min(len(d["launch"]) for d in rows)
        latest = [max(d["launch"][b] for d in rows) for b in range(n_b)]
        for rank, d in enumerate(rows):
            t = {k: d[k] - origin for k in ("start", "forward_end", "optimizer_start", "end")}
            bwd = d["backward_end"] - origin if _finite(d["backward_end"]) else t["forward_end"]
            bwd = min(max(bwd, t["forward_end"]), t["optimizer_start"])
            records += [(rank, it, "forward", "forward", t["start"], t["forward_end"]),
                        (rank, it, "backward", "backward", t["forward_end"], bwd),
                        (rank, it, "optimizer", "optimizer", t["optimizer_start"], t["end"])]
            for b in range(n_b):
                launch, done = d["launch"][b] - origin, d["done"][b] - origin
                gate = max(rows[q]["launch"][b] for q in d["peers"][b]) if "peers" in d else latest[b]
                start = min(gate - origin, done)
                name = d["names"][b] if "names" in d else f"{bucket_prefix}{b}"
                if start > launch:
                    records.append((rank, it, "wait", name, launch, start))
                records.append((rank, it, "comm", name, start, done))
                comm_s.setdefault(b, []).append(done - start)
    buckets = [{"bucket": b, "tensors": len(ranks[0]["buckets"][b]) if b < len(ranks[0]["buckets"]) else 0,
                "bytes": int(bucket_bytes[b]) if b < len(bucket_bytes) else 0,
                "allreduce_s": float(np.median(v))} for b, v in sorted(comm_s.items())]
    return Result(experiment, records, symmetric=False, single_rank_time_s=single_rank_time_s, buckets=buckets)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def iteration_times(result: Result) -> np.ndarray:
    """Per iteration (s): when its last rank ended, minus when the previous iteration's last rank ended (the first
    from 0), as `Result.summary` averages them."""
    ends = result.iterations().groupby("iteration")["end_s"].max().to_numpy()
    return np.diff(np.concatenate([[0.0], ends]))


def steady_iteration_s(result: Result) -> float:
    """Mean iteration time in steady state (s): from the end of iteration 0 to the end of the last, per iteration
    (ends as in `iteration_times`). Iteration 0 also holds the start-up skew of the ranks (the barrier before it
    releases them up to a few ms apart), which the simulator, starting every rank at 0, does not have. With one
    iteration, its time."""
    times = iteration_times(result)
    return float(np.mean(times[1:])) if len(times) > 1 else float(times[0])


def ks_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sample Kolmogorov-Smirnov distance: the largest gap between the empirical distribution functions of
    `a` and `b` (0: the same distribution of values, 1: no overlap); NaN when either is empty."""
    a, b = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    if not a.size or not b.size:
        return float("nan")
    x = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, x, "right") / a.size - np.searchsorted(b, x, "right") / b.size)))


KS_PERMUTATIONS = 999


def ks_keys(a: Sequence[float], b: Sequence[float], permutations: int = KS_PERMUTATIONS, seed: int = 0) -> dict:
    """ks_distance of `a` and `b`; ks_p_value, the share of the pooled values' random splits into groups of their
    sizes (the observed one counted) whose distance is at least as large; ks_same_median, the median distance of
    those splits: what two samples of these sizes from ONE distribution typically show (about 0.33 with 9 values
    a side, 0.22 with 29), the floor a median KS distance is judged against."""
    d = ks_distance(a, b)
    if not len(a) or not len(b):
        return {"ks_distance": d, "ks_p_value": float("nan"), "ks_same_median": float("nan")}
    pooled, rng = np.concatenate([np.asarray(a, float), np.asarray(b, float)]), np.random.default_rng(seed)
    null = []
    for _ in range(permutations):
        x = rng.permutation(pooled)
        null.append(ks_distance(x[:len(a)], x[len(a):]))
    null = np.asarray(null)
    return {"ks_distance": d, "ks_p_value": float((1 + np.sum(null >= d - 1e-12)) / (1 + permutations)),
            "ks_same_median": float(np.median(null))}


def ks_shape_keys(a: Sequence[float], b: Sequence[float], permutations: int = KS_PERMUTATIONS, seed: int = 0) -> dict:
    """ks_shape_distance and ks_shape_p_value: `ks_keys` of each sample over its own median, i.e. whether the two
    spread alike once their levels are matched. With 100 iterations at a 1 % coefficient of variation, a mean off
    by 0.5 % already puts the raw distance near 0.2 and one off by 2 % near 0.7: the raw distance judges the mean
    in units of the row's own spread (the mean is judged by rel_error); this one judges the spread and its tail,
    what per-call variation (simfog.variation) is meant to get right."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not a.size or not b.size or not np.median(a) > 0 or not np.median(b) > 0:
        return {"ks_shape_distance": float("nan"), "ks_shape_p_value": float("nan")}
    k = ks_keys(a / np.median(a), b / np.median(b), permutations, seed)
    return {"ks_shape_distance": k["ks_distance"], "ks_shape_p_value": k["ks_p_value"]}


def interval_keys(predicted: Result, t_p: float, t_m: float, level: float = DEFAULT_LEVEL) -> dict:
    """The prediction's interval at `level` (simfog.run_bands; computed when the Result has none) around
    its steady-state iteration `t_p` (the interval's relative bounds), and whether the measured `t_m` falls inside."""
    from simfog.run_bands import attach

    s = (predicted.interval and predicted.summary()) or attach(predicted, level).summary()
    lo = t_p * s["iteration_time_lo_s"] / s["iteration_time_s"]
    hi = t_p * s["iteration_time_hi_s"] / s["iteration_time_s"]
    return {"predicted_iteration_lo_s": lo, "predicted_iteration_hi_s": hi, "interval_level": s["interval_level"],
            "inside_interval": bool(lo <= t_m <= hi)}


def compare(config: Mapping, measured: Result, predicted: Result) -> dict:
    """One comparison row (the COLUMNS): `config` gives the keys (id, model, mode, ...) and calibration figures;
    the Results the rest. Iteration times are `steady_iteration_s` on both sides; the std is over the measured
    steady-state iterations. The row says whether the measured iteration falls inside the prediction's interval
    (`interval_keys`) and how far apart the two distributions of steady-state iteration times are (`ks_distance`)."""
    m, p = measured.summary(), predicted.summary()
    t_m, t_p = steady_iteration_s(measured), steady_iteration_s(predicted)
    per_it = iteration_times(measured)[1:]
    # Medians too, for looking into rows hit by a stalled iteration of the shared host. Not a headline: algorithms
    # whose iterations alternate (one-peer exp2 intra/inter steps, WAGMA's global step) make medians jump.
    med_m = float(np.median(per_it)) if len(per_it) else t_m
    per_p = iteration_times(predicted)[1:]
    med_p = float(np.median(per_p)) if len(per_p) else t_p
    row = {c: config.get(c, "") for c in COLUMNS}
    row.update({
        "buckets": p["buckets"],
        "measured_iteration_s": t_m, "measured_iteration_std_s": float(np.std(per_it)) if len(per_it) else 0.0,
        "predicted_iteration_s": t_p, "rel_error": (t_p - t_m) / t_m if t_m > 0 else float("nan"),
        "predicted_iteration_std_s": float(np.std(per_p)) if len(per_p) else 0.0,
        "measured_median_iteration_s": med_m, "predicted_median_iteration_s": med_p,
        "measured_p99_iteration_s": float(np.percentile(per_it, 99)) if len(per_it) else t_m,
        "predicted_p99_iteration_s": float(np.percentile(per_p, 99)) if len(per_p) else t_p,
        "rel_error_median": (med_p - med_m) / med_m if med_m > 0 else float("nan"),
        "measured_backward_s": float(measured.iterations()["backward_s"].mean()),
        "predicted_backward_s": float(predicted.iterations()["backward_s"].mean()),
        "measured_comm_exposed_s": m["comm_exposed_s"], "predicted_comm_exposed_s": p["comm_exposed_s"],
        "measured_comm_s": m["comm_s"], "predicted_comm_s": p["comm_s"], "error": config.get("error", ""),
        **interval_keys(predicted, t_p, t_m), **ks_keys(per_it, per_p if len(per_p) else [t_p]),
        **ks_shape_keys(per_it, per_p if len(per_p) else [t_p]),
    })
    return row


def failed_row(config: Mapping, error: str) -> dict:
    """The row of a configuration that could not be measured: keys from `config`, numbers empty, `error` set."""
    row = {c: config.get(c, "") for c in COLUMNS}
    row["error"] = error
    return row


def error_stats(rows: Iterable[Mapping], key: str = "rel_error") -> dict:
    """Over the rows without error: configurations, median and worst |relative error| (column `key`), mean signed
    error, and the id of the worst one. NaN statistics when no row succeeded."""
    rows = list(rows)
    ok = [{**r, "rel_error": r.get(key)} for r in rows if not r.get("error") and _finite(r.get(key))]
    if not ok:
        return {"configurations": 0, "median_abs_rel_error": float("nan"), "worst_abs_rel_error": float("nan"),
                "mean_rel_error": float("nan"), "worst_id": ""}
    errs = [abs(r["rel_error"]) for r in ok]
    worst = max(ok, key=lambda r: abs(r["rel_error"]))
    return {"configurations": len(ok), "median_abs_rel_error": statistics.median(errs),
            "worst_abs_rel_error": max(errs), "mean_rel_error": statistics.fmean(r["rel_error"] for r in ok),
            "worst_id": worst["id"]}


def write_csv(rows: Sequence[Mapping], path) -> None:
    """Write the rows (COLUMNS, seconds and bytes/s) to `path` atomically, each with its interval held out from the
    other configuration kinds' rows (validate.comparison.held_out: it depends on every row, so it is computed
    here, from the rows written)."""
    rows = [{**r, **k} for r, k in zip(rows, held_out_keys(rows), strict=True)]
    with atomic_open(path) as f:
        pd.DataFrame([{c: r.get(c, "") for c in COLUMNS} for r in rows], columns=COLUMNS).to_csv(f, index=False)


def algorithm_of(row: Mapping) -> str:
    """The row's training algorithm label ("allreduce" for rows that have none)."""
    return row.get("algorithm") or "allreduce"


def failure_line(error: object, width: int = 200) -> str:
    """One line for a failed row: the error's first line and, when more follows (a rank's stderr), its last
    non-empty line without the `[rankN]: ` prefix, which is where Python puts the exception."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    cause = re.sub(r"^\[rank\d+\]:\s*", "", lines[-1]) if len(lines) > 1 else ""
    text = lines[0] + (f" ... {cause}" if cause and cause != lines[0] else "")
    return text if len(text) <= width else text[:width - 3] + "..."


def format_table(rows: Sequence[Mapping]) -> str:
    """Measured and predicted iteration time and the relative error, one line per configuration, then the stats
    (over all rows, and per algorithm when there are several), then the rows' notes."""
    head = (f"{'configuration':48s} {'buckets':>7s} {'measured':>10s} {'± std':>9s} {'predicted':>10s} "
            f"{'error':>7s} {'inside':>6s} {'held out':>8s}")
    lines = [head, "-" * len(head)]
    held = held_out_keys(rows)
    for r, h in zip(rows, held, strict=True):
        what = r["merge"] if algorithm_of(r) == "allreduce" else r["algorithm"]
        name = (f"{r['model']} {what} {r['ranks']}r {r['nodes']}x{r['ranks_per_node']} "
                f"{units.format_bandwidth(r['nic_bandwidth_Bps']) if r['nodes'] > 1 else 'intra'}")
        if r.get("error"):
            lines.append(f"{name:48s} FAILED: {failure_line(r['error'])}")
            continue
        lines.append(f"{name:48s} {r['buckets']:7d} {units.format_time(r['measured_iteration_s']):>10s} "
                     f"{units.format_time(r['measured_iteration_std_s']):>9s} "
                     f"{units.format_time(r['predicted_iteration_s']):>10s} {r['rel_error']:+7.1%} "
                     f"{_inside(r):>6s} {_inside({'inside_interval': h['inside_held_out']}):>8s}"
                     + (f"  HOST-LIMITED ({r['host_oversubscribed']:.0%} of samples over the cores)"
                        if host_limited(r) else ""))
    lines.append(_stats_line(rows, "configurations"))
    lines.append(coverage_line(rows))
    lines.append(held_out_line(rows))
    limited = [r for r in rows if host_limited(r)]
    if limited:
        emulable = _stats_line([r for r in rows if not host_limited(r)], "rows the rig can emulate")
        lines.append(f"  {emulable or 'no row the rig can emulate'}")
        lines.append(f"  {_stats_line(limited, 'host-limited rows (the CPU, not the network, bounded them)')}")
    kinds = sorted({algorithm_of(r).split(":")[0] for r in rows})
    if len(kinds) > 1:
        for kind in kinds:
            line = _stats_line([r for r in rows if algorithm_of(r).split(":")[0] == kind], "configurations")
            if line:
                lines.append(f"  {kind}: {line}")
    for note in dict.fromkeys(r.get("note") for r in rows if r.get("note")):
        lines.append(f"note: {note}")
    return "\n".join(line for line in lines if line.strip())


def host_limited(row: Mapping) -> bool:
    """True when the host's CPU rather than the emulated network limited the row's run (validate.cluster.hostload's
    criterion on the row's host_cpu_busy and host_oversubscribed, so that a CSV is judged by today's criterion;
    its host_limited column where those are missing)."""
    from validate.cluster.hostload import is_limited

    try:
        return is_limited(float(row["host_cpu_busy"]), float(row["host_oversubscribed"]))
    except (KeyError, TypeError, ValueError):
        return row.get("host_limited") in (True, "True", "true")


def _inside(row: Mapping) -> str:
    """'yes' / 'no': the measured iteration inside the prediction's interval ('' for a row without one)."""
    v = row.get("inside_interval")
    return "" if v in ("", None) else ("yes" if v in (True, "True", "true") else "no")


def coverage_line(rows: Sequence[Mapping]) -> str:
    """How many rows' measured iterations fall inside their predicted interval, the intervals' median relative
    half-width, and the median Kolmogorov-Smirnov distance of per-iteration times ('' without such rows)."""
    ok = [r for r in rows if not r.get("error") and _inside(r)]
    if not ok:
        return ""
    inside = sum(_inside(r) == "yes" for r in ok)
    level = float(ok[0]["interval_level"])
    width = statistics.median((float(r["predicted_iteration_hi_s"]) - float(r["predicted_iteration_lo_s"]))
                              / 2 / float(r["predicted_iteration_s"]) for r in ok)
    ks = [float(r["ks_distance"]) for r in ok if _finite(r.get("ks_distance"))]
    same = [float(r["ks_same_median"]) for r in ok if _finite(_number(r.get("ks_same_median")))]
    apart = [r for r in ok if _finite(_number(r.get("ks_p_value"))) and float(r["ks_p_value"]) < 0.05]
    ks_text = (f"; median KS distance {statistics.median(ks):.1%}" if ks else "") + (
        f" (samples of these sizes from one distribution: {statistics.median(same):.1%}; {len(apart)} of {len(same)} "
        f"rows' per-iteration times differ at the 5 % level)" if ks and same else "")
    return (f"  inside the {100 * level:g} % interval (from the inputs): {inside} of {len(ok)} rows "
            f"({inside / len(ok):.0%}); median relative half-width {width:.1%}{ks_text}")


def _number(x) -> float:
    """A cell as a float (NaN where it is empty or not a number: rows read back from a CSV hold strings)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _stats_line(rows: Sequence[Mapping], what: str) -> str:
    s = error_stats(rows)
    if not s["configurations"]:
        return ""
    return (f"{s['configurations']} {what}: median |error| {s['median_abs_rel_error']:.1%}, "
            f"worst {s['worst_abs_rel_error']:.1%} ({s['worst_id']}), mean signed {s['mean_rel_error']:+.1%}")
