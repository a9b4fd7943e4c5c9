"""Prices without a target: every option of a catalogue at the GPU or node counts people buy (`simfog plan --gpus
16,64,256`), and the cost columns `sweep` and `curve` add to their rows with a catalogue. Cost is GPUs x the
option's price per GPU-hour, as in simfog.plan."""

from __future__ import annotations

import math

from simfog.bands import one_sided_level
from simfog.errors import ConfigError
from simfog.experiment import MAX_RANK_ITERATIONS, Experiment
from simfog.plan import (
    Catalogue,
    ClusterOption,
    PlanResult,
    candidates_frame,
    evaluate_configuration,
    series,
    with_compute,
)
from simfog.titles import input_columns, plan_title


def option_named(catalogue: Catalogue, name: str | None) -> ClusterOption:
    """The option called `name`; None picks the only one. Raises ConfigError naming the choices otherwise."""
    names = [o.name for o in catalogue.options]
    if name is None and len(names) == 1:
        return catalogue.options[0]
    for o in catalogue.options:
        if o.name == name:
            return o
    raise ConfigError("--option", "(missing)" if name is None else name,
                      f"one of the catalogue's options: {', '.join(names)}", source=catalogue.source)


COST_COLUMNS = ("price_per_gpu_hour", "cost_per_hour", "epoch_time_s", "cost_per_epoch")


def priced(rows: list[dict], option: ClusterOption, epoch_samples: float | None = None) -> list[dict]:
    """Sweep rows (simfog.sweeps: `ranks`, `samples_per_s`, as numbers or CSV strings) with their cost at `option`'s
    price: price_per_gpu_hour, cost_per_hour = ranks x price and, with `epoch_samples`, epoch_time_s and
    cost_per_epoch (cost per hour x epoch time). Rows that could not run get empty costs beside the price."""
    out = []
    for r in rows:
        row = {**r, "price_per_gpu_hour": option.price_per_gpu_hour}
        sps = float(r["samples_per_s"]) if r.get("samples_per_s") not in ("", None) and not r.get("error") else None
        row["cost_per_hour"] = int(r["ranks"]) * option.price_per_gpu_hour if sps else ""
        if epoch_samples:
            row["epoch_time_s"] = epoch_samples / sps if sps else ""
            row["cost_per_epoch"] = row["cost_per_hour"] * row["epoch_time_s"] / 3600 if sps else ""
        out.append(row)
    return out


def plan_counts(exp: Experiment, catalogue: Catalogue, *, gpus: list[int] | None = None,
                nodes: list[int] | None = None, epoch_samples: float | None = None,
                compute: str | None = None, confidence: float | None = None) -> PlanResult:
    """Every option, collective and merge policy of `catalogue` at fixed counts, with no target: `gpus` (GPU
    counts; a count above one node must be whole nodes of the option) or `nodes` (whole nodes of each option),
    one of the two. A count an option cannot hold (not whole nodes, over max_nodes) is a row with its `error`.
    `compute`: the layer times' mode (None: the experiment's, as simfog.plan.plan).
    `confidence`: each row gains its interval's bounds at that one-sided confidence (simfog.plan.plan). Returns a
    PlanResult whose target is NaN, best None, and candidates sorted by GPUs, then cost. Raises ConfigError for bad
    counts or confidence."""
    from simfog.progress import bar as progress_bar

    if (gpus is None) == (nodes is None):
        raise ConfigError("--gpus", gpus, "either GPU counts or --nodes counts, one of the two")
    counts, name = (gpus, "--gpus") if gpus is not None else (nodes, "--nodes")
    if not counts or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_RANK_ITERATIONS
                         for n in counts):
        raise ConfigError(name, counts, f"comma-separated integers in 1..{MAX_RANK_ITERATIONS:,}, e.g. 16,64,256")
    level = one_sided_level(confidence, "--confidence")
    exp = with_compute(exp, compute)
    rows = []
    bar = progress_bar(desc="plan", unit="sim")
    for opt, base, coll, m in series(exp, catalogue):
        for n in sorted(set(counts)):
            g = n if gpus is not None else n * opt.gpus_per_node
            why = _unusable(opt, g)
            if why:
                rows.append({"option": opt.name, "gpus": g, "nodes": -(-g // opt.gpus_per_node),
                             "collective": coll, "merge": m, "error": why, **input_columns(base)})
                continue
            bar.update(1)
            rows.append(evaluate_configuration(base, opt, coll, m, g, exp.comm.threshold_bytes, epoch_samples,
                                               level))
    bar.close()
    df = candidates_frame(rows, epoch_samples).drop(columns=["meets_target"])
    df["error"] = df["error"].fillna("")
    cost = "cost_per_epoch" if epoch_samples else "cost_per_hour"
    df = df.sort_values(["gpus", cost, "option"], kind="stable", na_position="last").reset_index(drop=True)
    what = ("GPUs " + ", ".join(map(str, sorted(set(counts))))) if gpus is not None else \
        ("nodes " + ", ".join(map(str, sorted(set(counts)))))
    title = plan_title(exp, catalogue, f"at {what}")
    return PlanResult(df, None, math.nan, catalogue.currency, epoch_samples, title,
                      {"catalogue": catalogue.source, "note": catalogue.note, "estimated": bool(exp.estimated),
                       "confidence": confidence})


def _unusable(opt: ClusterOption, gpus: int) -> str:
    """Why `opt` cannot hold `gpus` GPUs, or ""."""
    if gpus > opt.gpus_per_node and gpus % opt.gpus_per_node:
        return f"{gpus} GPUs are not whole nodes of {opt.gpus_per_node}"
    if gpus > opt.max_nodes * opt.gpus_per_node:
        return f"{gpus} GPUs need more than the option's {opt.max_nodes} nodes"
    return ""
