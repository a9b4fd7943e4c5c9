"""Tuning the knob a framework has: DDP's bucket_cap_mb, Horovod's HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME,
BAGUA's BAGUA_DEFAULT_BUCKET_SIZE. Each is searched on values a user would write (MiB on a 1-1.5-2-3-5-7 series,
Horovod's thresholds in powers of two, its cycle time in ms), the framework's default included, and the answer is
one setting in the framework's own spelling, or "keep the default".

The answer is chosen in three steps, against a stated tolerance (the least gain worth a change; default 1 %) and
the model's own uncertainty:

1. keep the default when its iteration time is within the tolerance of the best found;
2. otherwise the widest plateau: of the runs of neighbouring values whose times are all within the tolerance of the
   best, the widest (in log scale), and within it the value nearest its middle. A flat curve's least point is a
   razor edge the next software version moves; the middle of its widest plateau is robust to it. With two knobs
   (Horovod), a setting changing one knob is preferred when it reaches the tolerance; else the plateau of the first
   knob's profile (its best over the second) picks the first, then the second's plateau at that value;
3. keep the default after all when the model cannot vouch for the change: the interval of the default's time over
   the choice's (simfog.run_bands.ratio_interval, at `level`: the same model error moved through both
   runs) reaches down to within the tolerance. The answer prints the gain with its interval either way.

Layer times are fixed at their means, as in simfog.tune.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from simfog import merge, units
from simfog.bands import DEFAULT_LEVEL, Interval, check_level
from simfog.errors import ConfigError
from simfog.experiment import Experiment
from simfog.titles import run_title
from simfog.tune import gradients, widest_plateau

FRAMEWORKS = ("ddp", "horovod", "bagua")
#: The tolerance when the caller states none: 1 % of the best iteration time.
TOLERANCE = 0.01
MiB = merge.MiB
#: Mantissas of the MiB series (about six values a decade, the numbers people type).
SERIES = (1, 1.5, 2, 3, 5, 7)
#: Horovod cycle times searched (ms); its default, 1 ms, among them.
CYCLE_TIMES_MS = (0.5, 1, 2, 5, 10, 20)


@dataclass(frozen=True)
class Knob:
    """One setting of a framework: its name as the framework spells it, the Comm field it maps to, the values
    searched (in the knob's own unit), its default (None: left unset), and how a value becomes the Comm's SI value
    and the framework's text."""

    name: str
    comm_field: str
    values: tuple[float, ...]
    default: float | None
    to_si: float          # the knob's unit in SI (MiB in bytes, ms in seconds, 1 for bytes)
    spelling: str         # format of one setting, e.g. "DDP(model, bucket_cap_mb={value})"
    unit: str = ""        # "B" (bytes, shown with their binary size too), "MiB", "ms"

    def show(self, value: float) -> str:
        """`value` as the framework takes it, with its size in words for bytes."""
        if value != value:
            return "unset"
        if self.unit == "B":
            return f"{value:.0f} ({units.format_bytes(value)})"
        return f"{value:g}"

    def si(self, value: float | None) -> float | None:
        return None if value is None else (int(round(value * self.to_si)) if self.to_si >= 1 else value * self.to_si)


@dataclass(frozen=True, eq=False)
class FrameworkTuneResult:
    """`settings`: one row per simulated setting: a column per knob (its framework unit; NaN where left unset),
    iteration_time_s, buckets, default (the framework's defaults row). `choice`: the row recommended, `best`: the row
    of least time (the first simulated among ties), `default`: the defaults row, each a dict. `keep_default`: the
    default is within `tolerance` of the best. `plateau`: knob -> (low, high) of the chosen plateau. `setting`: the
    line to write, in the framework's spelling. `notes`: caveats a user must know (e.g. DDP's first bucket)."""

    framework: str
    knobs: tuple[Knob, ...]
    settings: pd.DataFrame
    choice: dict
    best: dict
    default: dict
    keep_default: bool
    tolerance: float
    tolerance_source: str
    plateau: dict[str, tuple[float, float]]
    setting: str
    notes: tuple[str, ...] = ()
    title: str = ""
    info: dict = field(default_factory=dict)
    gain_interval: Interval | None = None
    keep_reason: str = ""

    @property
    def gain(self) -> float:
        """The fraction of the default's iteration time the choice saves (0 when keeping the default)."""
        return 1 - self.choice["iteration_time_s"] / self.default["iteration_time_s"]


def _series(lo: float, hi: float) -> list[float]:
    """Values of SERIES x 10^k (in the knob's unit) from the largest at or below lo to the smallest at or above
    hi."""
    out = []
    for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        out += [float(f"{m * 10.0 ** k:.6g}") for m in SERIES]
    below = [v for v in out if v <= lo]
    above = [v for v in out if v >= hi]
    first, last = (max(below) if below else min(out)), (min(above) if above else max(out))
    return [v for v in out if first <= v <= last]


def _powers_of_two(lo: float, hi: float) -> list[float]:
    return [float(2 ** k) for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)]


def knobs_of(framework: str, smallest_B: float, model_B: float) -> tuple[Knob, ...]:
    """The knobs searched for `framework` on a model whose gradients span smallest_B .. model_B bytes."""
    if framework == "ddp":
        values = sorted({*_series(smallest_B / MiB, model_B / MiB), merge.DDP_BUCKET_CAP_BYTES / MiB})
        return (Knob("bucket_cap_mb", "threshold_bytes", tuple(values), None, MiB,
                     "DDP(model, bucket_cap_mb={value:g})", "MiB"),)
    if framework == "bagua":
        values = sorted({*_series(smallest_B / MiB, model_B / MiB), merge.BAGUA_BUCKET_BYTES / MiB})
        return (Knob("BAGUA_DEFAULT_BUCKET_SIZE", "threshold_bytes", tuple(float(round(v * MiB)) for v in values),
                     merge.BAGUA_BUCKET_BYTES, 1, "BAGUA_DEFAULT_BUCKET_SIZE={value:.0f}", "B"),)
    if framework == "horovod":
        values = sorted({*_powers_of_two(smallest_B, model_B), float(merge.HOROVOD_FUSION_BYTES)})
        return (Knob("HOROVOD_FUSION_THRESHOLD", "threshold_bytes", tuple(values), merge.HOROVOD_FUSION_BYTES, 1,
                     "HOROVOD_FUSION_THRESHOLD={value:.0f}", "B"),
                Knob("HOROVOD_CYCLE_TIME", "cycle_time_s", CYCLE_TIMES_MS, merge.HOROVOD_CYCLE_S * 1e3, 1e-3,
                     "HOROVOD_CYCLE_TIME={value:g}", "ms"))
    raise ConfigError("--merge", framework, f"one of {', '.join(FRAMEWORKS)} for a framework's own knobs")


def _choose(rows: pd.DataFrame, knobs: tuple[Knob, ...], tolerance: float, least: float) -> tuple[pd.Series, dict]:
    """The plateau choice among `rows` (every combination of the knobs' values), within `tolerance` of `least`:
    see the module docstring. Returns the row and knob -> (low, high) of the plateaus it came from."""
    if len(knobs) == 2:
        for moved, kept in ((knobs[0], knobs[1]), (knobs[1], knobs[0])):
            line = rows[np.isclose(rows[kept.name], kept.default, rtol=1e-12)].sort_values(moved.name)
            if len(line) and line.iteration_time_s.min() <= least * (1 + tolerance):
                a, b, i = widest_plateau(line[moved.name], line.iteration_time_s, tolerance, least)
                return line.iloc[i], {moved.name: (float(line[moved.name].iloc[a]), float(line[moved.name].iloc[b]))}
    first = knobs[0].name
    profile = rows.groupby(first, sort=True).iteration_time_s.min()
    a, b, i = widest_plateau(profile.index, profile.values, tolerance, least)
    plateau = {first: (float(profile.index[a]), float(profile.index[b]))}
    at = rows[rows[first] == profile.index[i]]
    if len(knobs) == 1:
        return at.iloc[0], plateau
    chosen, rest = _choose(at, knobs[1:], tolerance, least)
    return chosen, {**plateau, **rest}


def tune_framework(exp: Experiment, framework: str, *, tolerance: float = TOLERANCE,
                   tolerance_source: str = "stated", samples: bool = False,
                   level: float = DEFAULT_LEVEL) -> FrameworkTuneResult:
    """Search `framework`'s own knobs (one of FRAMEWORKS) on `exp` (its cluster, collective, ranks) and choose a
    setting: the default when within `tolerance` (a fraction of the best iteration time) of the best or when the
    model's interval at `level` cannot tell the change from the tolerance, else the middle of the widest plateau
    (module docstring). `tolerance_source` says where the tolerance came from, for the output. Raises ConfigError
    for another framework, a bad tolerance or level, or a model without gradients."""
    from simfog.progress import bar as progress_bar
    from simfog.run_bands import ratio_interval
    from simfog.simulation import simulate

    if framework not in FRAMEWORKS:
        raise ConfigError("--merge", framework, f"one of {', '.join(FRAMEWORKS)} for a framework's own knobs")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise ConfigError("tolerance", tolerance, "a fraction in [0, 1), e.g. 0.01 for 1 %")
    level = check_level(level, "level")
    _, smallest, total = gradients(exp)
    compute = "samples" if samples else "mean"
    exp = replace(exp, workload=replace(exp.workload, compute=compute))
    knobs = knobs_of(framework, smallest, total)
    grid = [dict(zip([k.name for k in knobs], combo, strict=True))
            for combo in itertools.product(*(k.values for k in knobs))]
    defaults = {k.name: k.default for k in knobs}
    if defaults not in grid:
        grid.insert(0, defaults)
    bar = progress_bar(total=len(grid), desc="tune", unit="sim")
    rows = []

    def at(setting: dict) -> Experiment:
        return exp.with_comm(merge=framework, **{k.comm_field: k.si(_unset(setting[k.name])) for k in knobs})

    for setting in grid:
        bar.update(1)
        s = simulate(at(setting)).summary()
        rows.append({**{n: (math.nan if v is None else v) for n, v in setting.items()},
                     "iteration_time_s": s["iteration_time_s"], "buckets": s["buckets"],
                     "samples_per_s": s["samples_per_s"], "default": setting == defaults})
    bar.close()
    table = pd.DataFrame(rows)
    default = table[table.default].iloc[0].to_dict()
    best = table.loc[table.iteration_time_s.idxmin()].to_dict()
    least = best["iteration_time_s"]
    keep = default["iteration_time_s"] <= least * (1 + tolerance)
    on_grid = table.dropna(subset=[k.name for k in knobs])
    choice, plateau = _choose(on_grid, knobs, tolerance, least)
    choice = choice.to_dict()
    gain_interval, reason = None, ""
    if keep:
        reason = f"within the {100 * tolerance:g} % tolerance of the fastest"
    elif choice["iteration_time_s"] * (1 + tolerance) >= default["iteration_time_s"]:
        keep, reason = True, f"the plateau's middle is within the {100 * tolerance:g} % tolerance of the default"
    else:
        gain_interval = ratio_interval(at(default), at(choice), level)
        if gain_interval.lo <= 1 + tolerance:
            keep = True
            reason = (f"the change's gain is not sure to exceed the {100 * tolerance:g} % tolerance at "
                      f"{100 * level:g} % (the model's uncertainty)")
    if keep:
        choice = default
    setting = _spell(framework, knobs, choice, keep)
    notes = []
    if framework == "ddp":
        first = merge.DDP_FIRST_BUCKET_BYTES / MiB
        cap = merge.DDP_BUCKET_CAP_BYTES / MiB
        explicit = table[table.bucket_cap_mb == cap].iloc[0]
        notes.append(f"an explicit bucket_cap_mb also makes DDP's first bucket that size (left unset: {first:g} MiB "
                     f"first, then {cap:g} MiB): bucket_cap_mb={cap:g} written out gives "
                     f"{explicit.iteration_time_s * 1e3:.4g} ms against {default['iteration_time_s'] * 1e3:.4g} ms "
                     f"unset")
    trace = exp.workload.trace
    title = run_title(exp, extra=framework)
    info = {"model": trace.model, "ranks": exp.ranks, "collective": exp.comm.collective,
            "estimated": bool(exp.estimated), "compute_mode": compute, "model_bytes": total,
            "smallest_tensor_bytes": smallest}
    return FrameworkTuneResult(framework, knobs, table, choice, best, default, keep, float(tolerance),
                               tolerance_source, plateau, setting, tuple(notes), title, info, gain_interval, reason)


def _spell(framework: str, knobs: tuple[Knob, ...], row: dict, keep: bool) -> str:
    """The setting in the framework's own spelling: only the knobs that differ from the default."""
    if keep:
        return {"ddp": "DDP(model)  (bucket_cap_mb left unset)",
                "horovod": "HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME left unset",
                "bagua": "BAGUA_DEFAULT_BUCKET_SIZE left unset"}[framework]
    parts = [k.spelling.format(value=row[k.name]) for k in knobs
             if k.default is None or not _equal(row[k.name], k.default)]
    return " ".join(parts)


def _unset(value: float) -> float | None:
    """A knob's table value (NaN where left unset) as the setting: None for unset."""
    return None if value != value else value


def _equal(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12)
