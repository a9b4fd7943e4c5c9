"""Figures: threshold and sharded tuning, scaling curves, capacity plans, and published points beside simfog's band.
matplotlib without pyplot (no global state, no display needed: figures render with the Agg canvas); files are
written atomically, format from the suffix. Read at a glance: legends inside their axes (in headroom the y axis
makes for them), every band drawn with its edges, a point outside its band hollow."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from simfog import units

#: Labels of the tuning baselines, saying what each default is.
BASELINE_LABELS = {
    "ddp": "PyTorch DDP default (1 MiB, then 25 MiB)",
    "horovod": "Horovod default (128 MiB fusion, 1 ms cycle)",
    "wfbp": "WFBP (one allreduce per tensor)",
    "single": "single allreduce after backward",
    "mgwfbp": "MG-WFBP merging",
    "bagua": "BAGUA default (10 MiB)",
    "optimal": "optimal contiguous buckets (exact)",
}


def save(fig: Figure, path: str | os.PathLike) -> Path:
    """Write `fig` to `path` (format from the suffix: .png, .svg, .pdf) atomically. Returns the path."""
    from simfog.files import atomic_open

    path = Path(path)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format=path.suffix.lstrip(".") or "png", dpi=150, bbox_inches="tight")
    return path


def _ms(seconds) -> np.ndarray:
    return np.asarray(seconds, dtype=float) * 1e3


def _bytes_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=9))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: units.format_bytes(x).replace(".0 ", " ")))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _from_zero(ax) -> None:
    """The y axis from zero to a little above the highest point: a 0.4 % difference looks like one."""
    top = max((np.nanmax(np.asarray(line.get_ydata(), dtype=float)) for line in ax.get_lines()
               if len(line.get_ydata())), default=1.0)
    ax.set_ylim(0, top * 1.05 if top > 0 else 1.0)


def _legend_inside(ax, ncol: int = 2, fontsize: float = 7) -> None:
    """The legend across the top of `ax`, inside it, the y axis raised (from zero still) until no line or band
    reaches under the legend: nothing hidden, no third of the figure's width given to a legend beside it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    legend = ax.legend(fontsize=fontsize, loc="upper left", ncol=ncol, framealpha=0.95, borderaxespad=0.4)
    renderer = FigureCanvasAgg(ax.figure).get_renderer()
    height = legend.get_window_extent(renderer).height / ax.get_window_extent(renderer).height
    lo, top = ax.get_ylim()
    # the data's top stays below the legend's bottom (a 3 % gap): top' = top / (1 - height - gap), from zero
    ax.set_ylim(lo, lo + (top - lo) / max(0.2, 1 - height - 0.03))


def _ranks_axis(ax, ranks) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(r) for r in ranks))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks], rotation=45 if len(ticks) > 8 else 0)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("ranks (GPUs), log2 scale")


def tune_figure(result) -> Figure:
    """Iteration time (ms) against the merge threshold (log x) for a `simfog.tune.TuneResult`, the best threshold
    starred, the thresholds within 1 % of it shaded and every baseline policy a horizontal line."""
    fig = Figure(figsize=(11, 6))
    ax = fig.add_subplot()
    curve = result.curve.sort_values("threshold_bytes")
    ax.plot(curve.threshold_bytes, _ms(curve.iteration_time_s), "-", color="0.35", lw=1, zorder=2)
    for stage, marker in (("grid", "o"), ("refine", ".")):
        part = curve[curve.stage == stage]
        ax.plot(part.threshold_bytes, _ms(part.iteration_time_s), marker, color="0.2", ms=5 if marker == "o" else 7,
                ls="none", label="threshold search" if stage == "grid" else "refinement", zorder=3)
    # Distinct colours and dash patterns: baselines often tie (e.g. wfbp and MG-WFBP) and must stay visible.
    styles = iter(zip(["tab:cyan", "tab:blue", "tab:orange", "tab:olive", "tab:green", "tab:red", "tab:purple",
                       "tab:brown"],
                      ["-", "--", (0, (1, 1)), (0, (3, 1, 1, 1)), "-.", (0, (5, 2, 1, 2, 1, 2)), (0, (8, 3)), ":"],
                      strict=True))
    for name, t in result.baselines.items():
        color, ls = next(styles)
        if np.isfinite(t):
            ax.axhline(t * 1e3, color=color, ls=ls, lw=1.4,
                       label=f"{BASELINE_LABELS.get(name, name)}: {units.format_time(t)}")
    ax.plot([result.best_threshold_bytes], [result.best_iteration_time_s * 1e3], "*", color="gold", mec="k", ms=16,
            zorder=4, label=f"best threshold {units.format_bytes(result.best_threshold_bytes)}: "
                            f"{units.format_time(result.best_iteration_time_s)} ({result.best_buckets} buckets)")
    lo, hi = result.near_best_bytes
    ax.axvspan(lo, hi, color="tab:green", alpha=0.15, lw=0, zorder=1,
               label=f"within 1 % of the best: {units.format_bytes(lo)} to {units.format_bytes(hi)}")
    _versus_best_bars(ax, result, curve.threshold_bytes)
    _bytes_axis(ax)
    ax.set_xlabel("merge threshold (bucket size), log scale")
    ax.set_ylabel("iteration time (ms)")
    _from_zero(ax)
    ax.set_title(result.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    _legend_inside(ax)
    return fig


def _versus_best_bars(ax, result, xs) -> None:
    """Each framework default the tune weighed (TuneResult.versus_defaults): where its time lies against the best
    threshold's within the model's uncertainty (the best's time x the ratio's interval), as an error bar in its
    baseline's colour right of the search; a bar that reaches the best's time cannot be told from it."""
    colors = {line.get_label().split(":")[0]: line.get_color() for line in ax.get_lines()}
    right = float(np.max(xs))
    for i, (policy, iv) in enumerate(result.versus_defaults.items()):
        t, best = result.baselines[policy] * 1e3, result.best_iteration_time_s * 1e3
        x = right * 2 ** (0.4 * (i + 1))
        # max(0, ...): where the interval ends at the value, best x ratio can round below it
        ax.errorbar([x], [t], yerr=[[max(0.0, t - best * iv.lo)], [max(0.0, best * iv.hi - t)]], fmt="o", ms=4,
                    capsize=4,
                    color=colors.get(BASELINE_LABELS.get(policy, policy), "0.3"),
                    label=f"{BASELINE_LABELS.get(policy, policy)} / best at {100 * iv.level:g} %: "
                          f"x{iv.lo:.3f}-{iv.hi:.3f}")


def framework_tune_figure(result) -> Figure:
    """Iteration time (ms, from zero) against a framework's first knob (log x) for a
    `simfog.tune_framework.FrameworkTuneResult`: one line per value of its second knob (Horovod's cycle time), the
    default a horizontal line with the tolerance band above the best (its edges drawn: 1 % of an axis from zero is
    a hair) and the values of the widest range within it shaded, the chosen setting starred."""
    fig = Figure(figsize=(11, 6))
    ax = fig.add_subplot()
    knob = result.knobs[0]
    df = result.settings.dropna(subset=[k.name for k in result.knobs])
    groups = df.groupby(result.knobs[1].name, sort=True) if len(result.knobs) > 1 else [(None, df)]
    for value, part in groups:
        part = part.sort_values(knob.name)
        label = f"{result.knobs[1].name}={value:g}" if value is not None else knob.name
        ax.plot(part[knob.name], _ms(part.iteration_time_s), "o-", ms=3, lw=1, label=label)
    least = result.best["iteration_time_s"] * 1e3
    ax.axhspan(least, least * (1 + result.tolerance), color="tab:green", alpha=0.3, ec="tab:green", lw=0.8,
               label=f"within {100 * result.tolerance:g} % of the best (the tolerance)")
    if knob.name in result.plateau:
        a, b = result.plateau[knob.name]
        ax.axvspan(a, b, color="tab:green", alpha=0.12, lw=0, zorder=1,
                   label=f"widest range within it: {knob.name} {knob.show(a)} .. {knob.show(b)}")
    ax.axhline(result.default["iteration_time_s"] * 1e3, color="tab:orange", ls="--", lw=1.2,
               label=f"default: {units.format_time(result.default['iteration_time_s'])}")
    c = result.choice
    iv = result.gain_interval
    if iv is not None:  # where the default lies against the choice within the model's uncertainty
        ax.axhspan(c["iteration_time_s"] * 1e3 * iv.lo, c["iteration_time_s"] * 1e3 * iv.hi, color="tab:orange",
                   alpha=0.15, label=f"default / {result.setting} at {100 * iv.level:g} %: x{iv.lo:.3f}-{iv.hi:.3f}")
    if not result.keep_default:
        ax.plot([c[knob.name]], [c["iteration_time_s"] * 1e3], "*", color="gold", mec="k", ms=16, zorder=4,
                label=f"{result.setting}: {units.format_time(c['iteration_time_s'])}")
    if knob.unit == "B":
        _bytes_axis(ax)
    else:
        ax.set_xscale("log")
    ax.set_xlabel(f"{knob.name}" + (f" ({knob.unit})" if knob.unit else "") + ", log scale")
    ax.set_ylabel("iteration time (ms)")
    _from_zero(ax)
    ax.set_title(result.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    _legend_inside(ax)
    return fig


def sharded_tune_figure(result) -> Figure:
    """Iteration time (ms) against peak memory per rank for every setting of a
    `simfog.tune_sharded.ShardedTuneResult`: feasible settings as dots (filled: reshard_after_forward or zero3's
    overlap_comm true), infeasible ones as crosses at the time axis' floor, the cluster's gpu_memory a vertical
    line, the best starred and the defaults a diamond."""
    fig = Figure(figsize=(11, 6))
    ax = fig.add_subplot()
    df = result.settings
    ok, bad = df[df.feasible], df[~df.feasible]
    flag = "reshard_after_forward" if "reshard_after_forward" in df else "overlap_comm"
    for value, face in ((True, "tab:blue"), (False, "none")):
        part = ok[ok[flag] == value]
        ax.plot(part.memory_peak_B, _ms(part.iteration_time_s), "o", mfc=face, mec="tab:blue", ms=5, ls="none",
                label=f"{flag} = {str(value).lower()}", zorder=2)
    floor = _ms(ok.iteration_time_s).min()
    if len(bad):
        ax.plot(bad.memory_peak_B, [floor] * len(bad), "x", color="tab:red", ms=6, ls="none",
                label=f"infeasible ({len(bad)}), memory only", zorder=2)
    limit = result.info.get("gpu_memory_B")
    if limit:
        ax.axvline(limit, color="tab:red", ls="--", lw=1.2, label=f"gpu_memory {units.format_bytes(limit)}")
    d, b = result.default, result.best
    if d["feasible"]:
        ax.plot([d["memory_peak_B"]], [d["iteration_time_s"] * 1e3], "D", color="tab:orange", mec="k", ms=9,
                zorder=4, label=f"defaults: {units.format_time(d['iteration_time_s'])}")
    ax.plot([b["memory_peak_B"]], [b["iteration_time_s"] * 1e3], "*", color="gold", mec="k", ms=16, zorder=5,
            label=f"best: {units.format_time(b['iteration_time_s'])}, " + ", ".join(
                f"{k} {str(b[k]).lower() if isinstance(b[k], bool) else b[k]}" for k in result.knobs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: units.format_bytes(x)))
    ax.set_xlabel("peak memory per rank")
    ax.set_ylabel("iteration time (ms)")
    _from_zero(ax)
    ax.set_title(result.title, fontsize=10)
    ax.grid(True, alpha=0.3)
    _legend_inside(ax)
    return fig


def _series_label(row: pd.Series, vary: list[str]) -> str:
    return " / ".join(str(row[c]) for c in vary) if vary else f"{row['merge']} / {row['collective']}"


def curve_figure(df: pd.DataFrame, title: str = "") -> Figure:
    """Two panels against ranks (log2 x): throughput (samples/s, log y, with ideal linear scaling dashed) and
    scaling efficiency (%). One line per merge policy / collective in `df` (columns of a simfog sweep CSV), each
    with its prediction interval shaded where the rows carry one (a sweep run with --level)."""
    fig = Figure(figsize=(11, 4.5))
    ax_t, ax_e = fig.subplots(1, 2)
    ok = df[df["error"].fillna("") == ""] if "error" in df else df
    vary = [c for c in ("merge", "collective") if ok[c].nunique() > 1] if len(ok) else []
    for _, part in ok.groupby(["merge", "collective"], sort=False):
        part = part.sort_values("ranks")
        label = _series_label(part.iloc[0], vary)
        line, = ax_t.plot(part.ranks, part.samples_per_s, "o-", ms=4, label=label)
        # clip_on False: points at 100 % sit on the axis' top edge, whole
        ax_e.plot(part.ranks, 100 * part.scaling_efficiency, "o-", ms=4, color=line.get_color(), label=label,
                  clip_on=False)
        band = part.reindex(columns=["samples_per_s_lo", "samples_per_s_hi", "scaling_efficiency_lo",
                                     "scaling_efficiency_hi"]).apply(pd.to_numeric, errors="coerce")
        if band.notna().all().all():
            ax_t.fill_between(part.ranks, band.samples_per_s_lo, band.samples_per_s_hi, color=line.get_color(),
                              alpha=0.15, lw=0)
            ax_e.fill_between(part.ranks, 100 * band.scaling_efficiency_lo, 100 * band.scaling_efficiency_hi,
                              color=line.get_color(), alpha=0.15, lw=0)
    if len(ok):
        # Ideal: ranks x the single-rank throughput (= samples_per_s / scaling_efficiency of any row).
        per_rank = float((ok.samples_per_s / ok.scaling_efficiency / ok.ranks).iloc[0])
        r = np.array(sorted(ok.ranks.unique()), dtype=float)
        ax_t.plot(r, r * per_rank, "--", color="0.5", lw=1, label="ideal (linear scaling)")
        ax_e.axhline(100, color="0.5", ls="--", lw=1)
    for ax in (ax_t, ax_e):
        _ranks_axis(ax, ok.ranks if len(ok) else [1])
        ax.grid(True, which="major", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("throughput (samples/s), log scale")
    ax_e.set_ylabel("scaling efficiency (%)")
    ax_e.set_ylim(0, 100)
    levels = pd.to_numeric(ok.get("interval_level", pd.Series(dtype=float)), errors="coerce").dropna()
    if len(levels):
        ax_e.text(0.01, 0.01, f"shaded: {100 * levels.iloc[0]:g} % prediction interval", transform=ax_e.transAxes,
                  fontsize=8, color="0.3")
    ax_t.legend(fontsize=8, title=" / ".join(vary) or None, title_fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plan_figure(result) -> Figure:
    """Cost against throughput (both log) for every configuration a `simfog.plan.PlanResult` evaluated: cost per
    epoch when an epoch was given (then lower is better at any throughput), else per hour. One line per option /
    collective / merge through its GPU counts, the target a vertical line, the cheapest configuration circled. A plan
    with --confidence draws each point's prediction interval (a bar across the throughput axis) and its throughput
    reached with that confidence (a hollow triangle at the interval's lower bound: the target is met on it)."""
    fig = Figure(figsize=(9, 5))
    ax = fig.add_subplot()
    df = result.candidates
    df = df[df["error"] == ""]
    y = result.cost_column
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
              "tab:olive", "tab:cyan"]
    cmap = {o: colors[i % len(colors)] for i, o in enumerate(df.option.unique())}
    styles = {}
    for (option, coll, merge), part in df.groupby(["option", "collective", "merge"], sort=False):
        part = part.sort_values("samples_per_s", kind="stable")  # joined in the x axis' order, not evaluation's
        ls = styles.setdefault((coll, merge), ["-", "--", ":", "-."][len(styles) % 4])
        ax.plot(part.samples_per_s, part[y], marker="o", ms=3, ls=ls, color=cmap[option], lw=1,
                label=f"{option}: {coll} / {merge}")
        if "samples_per_s_lo" in part:
            _sure_points(ax, part, y, cmap[option])
    confidence = result.info.get("confidence")
    if "samples_per_s_lo" in df and len(df):
        # proxies in grey: one legend entry each, not one per series
        from simfog.bands import one_sided_level

        ax.errorbar([], [], xerr=[], fmt="none", ecolor="0.4", alpha=0.3, elinewidth=3,
                    label=f"{100 * one_sided_level(confidence):g} % prediction interval" if confidence else
                    "prediction interval")
        if confidence:
            ax.plot([], [], "<", mfc="none", mec="0.3", ms=5, ls="none",
                    label=f"{100 * confidence:g} % sure: its lower bound (the target is met on it)")
    if result.target_samples_per_s == result.target_samples_per_s:  # NaN: a plan at fixed counts, no target
        ax.axvline(result.target_samples_per_s, color="k", lw=1, ls="--",
                   label=f"target {result.target_samples_per_s:,.0f} samples/s")
    if result.best is not None:
        b = result.best
        ax.plot([b["samples_per_s"]], [b[y]], "o", ms=14, mfc="none", mec="k", mew=2,
                label=f"cheapest: {b['option']}, {b['gpus']} GPUs, {b['collective']} / {b['merge']}: "
                      f"{b[y]:,.2f} {result.currency}")
        if confidence and b.get("samples_per_s_lo") == b.get("samples_per_s_lo"):  # NaN: no interval
            ax.plot([b["samples_per_s_lo"]], [b[y]], "<", ms=11, mfc="none", mec="k", mew=2,
                    label=f"its {100 * confidence:g} % sure throughput: {b['samples_per_s_lo']:,.0f} samples/s")
    ax.set_xscale("log")
    # Log only when costs span more than a factor 20 (cost per hour usually does; cost per epoch often does not,
    # and a log axis over a narrow range has almost no tick labels).
    log_y = len(df) and df[y].max() > 20 * df[y].min() > 0
    if log_y:
        ax.set_yscale("log")
    else:
        _from_zero(ax)
    ax.set_xlabel("throughput (samples/s), log scale")
    what = "per epoch" if y == "cost_per_epoch" else "per hour"
    ax.set_ylabel(f"cost {what} ({result.currency})" + (", log scale" if log_y else ""))
    ax.set_title(result.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def _sure_points(ax, part: pd.DataFrame, y: str, color) -> None:
    """A plan series' prediction intervals as bars across the throughput axis, and their lower bounds (the
    throughput reached with the plan's confidence) as hollow triangles."""
    lo = part.samples_per_s_lo.to_numpy(dtype=float)
    hi = part.samples_per_s_hi.to_numpy(dtype=float)
    x = part.samples_per_s.to_numpy(dtype=float)
    ax.errorbar(x, part[y], xerr=[x - lo, hi - x], fmt="none", ecolor=color, alpha=0.3, elinewidth=3)
    ax.plot(lo, part[y], "<", mfc="none", mec=color, ms=5, ls="none")


def published_beside_band(ax, x, published, predicted, lo, hi, inside, *, color, ideal=None, reading=None,
                          network=None, joined: bool = True, marker: str = "o", point_color="black",
                          what: str = "published", where: str = "", level: float = 0.9,
                          ymax: float | None = None) -> None:
    """Published points beside simfog's prediction and its band on `ax`, read at a glance: the band shaded with
    its edges drawn, the prediction a line (`joined`; else each point's band a bar and its prediction a tick), and
    every published point filled (`point_color`) where it lies inside its band, hollow where it lies outside
    (`inside`: per point, as the caller judged it), with ± its reading's precision (`reading`) as a bar. `ideal`
    (per point, e.g. GPUs x one GPU's rate): every value is divided by it, so the axis is the share of linear
    scaling, linear from zero (up to `ymax` when given), where a band of ±5 % is as wide at 128 GPUs as at 4; on a
    log axis of throughput it is a hair. `network`: the (lo, hi) of the band's network part alone, shaded darker.
    `where` ends every label (", 4 x 4 GPUs"): several calls on one axis stay apart in its legend."""
    order = np.argsort(np.asarray(x, dtype=float), kind="stable")
    x = np.asarray(x, dtype=float)[order]
    scale = np.ones(len(x)) if ideal is None else np.asarray(ideal, dtype=float)[order]

    def per(v):
        return np.asarray(v, dtype=float)[order] / scale

    pub, pred, low, high = per(published), per(predicted), per(lo), per(hi)
    ins = np.asarray(inside, dtype=bool)[order]
    band = f"simfog {100 * level:g} % band{where}"
    if joined:
        ax.fill_between(x, low, high, color=color, alpha=0.18, lw=0, label=band)
        ax.plot(x, low, color=color, lw=0.8, alpha=0.8)
        ax.plot(x, high, color=color, lw=0.8, alpha=0.8)
        if network is not None:
            ax.fill_between(x, per(network[0]), per(network[1]), color=color, alpha=0.35, lw=0,
                            label=f"its network part alone{where}")
        ax.plot(x, pred, color=color, lw=1.5, label=f"simfog prediction{where}")
    else:
        ax.vlines(x, low, high, color=color, alpha=0.35, lw=7, label=band)
        ax.plot(x, pred, "_", color=color, ms=14, mew=2, ls="none", label=f"simfog prediction{where}")
    if reading is not None:
        ax.errorbar(x, pub, yerr=per(reading), fmt="none", ecolor=point_color, elinewidth=0.8, capsize=2)
    for sel, face, side in ((ins, point_color, "inside"), (~ins, "white", "outside")):
        if sel.any():
            ax.plot(x[sel], pub[sel], marker, mfc=face, mec=point_color, mew=1.2, ms=6, ls="none", zorder=4,
                    label=f"{what}{where}, {side} the band")
    if ideal is not None:
        ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
        top = max(ax.get_ylim()[1] if ax.get_ylim()[0] == 0 else 0, 1.1,
                  1.05 * float(np.nanmax(np.concatenate([high, pub]))))
        ax.set_ylim(0, ymax if ymax is not None else top)
