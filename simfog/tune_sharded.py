"""Tuning sharded data parallelism: which unit granularity, prefetch depth, reshard_after_forward and HSDP group
size (fsdp, hsdp), or which prefetch and reduce bucket sizes (zero3), minimise the iteration time of an experiment,
and what the best setting gains over the frameworks' defaults.

The search is exhaustive over a small grid (every combination is simulated once; settings that give the same plan
are recognised and simulated once):

- fsdp_unit: "layer", "model", the experiment's own, and `sizes` block sizes, log-spaced from the mean parameter
  bytes of the layers that have parameters to the model's bytes, rounded to 3 significant digits (so a size can be
  written back into a TOML file as given). The mean, not the largest layer, starts the range: a model whose
  embedding is a third of it (GPT-2) would otherwise never be tried in blocks of a few layers. Sizes that group the
  layers alike are one setting.
- prefetch: 0 .. `max_prefetch` (capped at units - 1: further all-gathers have no unit to fetch).
- reshard_after_forward: true, false.
- hsdp_group (hsdp only): every group the experiment accepts, i.e. the divisors of the ranks that divide
  gpus_per_node or are multiples of it (1 = no sharding, a replica per rank; the rank count = fsdp).
- zero3: stage3_prefetch_bucket_size (1 element, i.e. the next module only; log-spaced from the mean elements of
  a layer with parameters to the model's; DeepSpeed's 5e7), reduce_bucket_size (log-spaced from the mean tensor's
  elements to the model's; DeepSpeed's 5e8) and overlap_comm. Sizes at or above the model's are one setting.

The defaults row is FSDP2's (`fully_shard` on the units the experiment gives, "layer" unless it says otherwise:
prefetch 1, reshard_after_forward true, hsdp_group the experiment's or gpus_per_node) or DeepSpeed's for zero3
(stage3_prefetch_bucket_size 5e7, reduce_bucket_size 5e8, overlap_comm true), whatever the experiment sets for the
searched knobs. A setting whose peak memory per rank exceeds the cluster's gpu_memory raises
simfog.errors.Infeasible in the simulator: it is skipped, counted, its reason kept, and its memory still reported
(computed without the limit). Best: the least iteration time among feasible settings, ties to the least peak memory,
then to the first in search order. Layer times are fixed at their means, as in simfog.tune.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from simfog.bands import DEFAULT_LEVEL, Interval
from simfog.errors import ConfigError, Infeasible
from simfog.experiment import Comm, Experiment
from simfog.titles import run_title

ALGORITHMS = ("fsdp", "hsdp", "zero3")
#: [comm] key -> Comm field, for the knobs searched.
FIELDS = {"fsdp_unit": "fsdp_unit", "prefetch": "prefetch", "reshard_after_forward": "reshard_after_forward",
          "hsdp_group": "hsdp_group", "stage3_prefetch_bucket_size": "prefetch_bucket_size",
          "reduce_bucket_size": "reduce_bucket_size", "overlap_comm": "overlap_comm"}
#: FSDP2's defaults (prefetch 1: the implicit forward and backward prefetch of one unit) and DeepSpeed's for zero3.
FSDP2_DEFAULTS = {"prefetch": 1, "reshard_after_forward": True}
#: The "near best" range, as in simfog.tune: settings within this fraction of the best iteration time.
NEAR_BEST = 0.01
# The most sizes and prefetch depths searched: every combination is simulated (10**9 sizes never finished).
MAX_SIZES, MAX_PREFETCH = 64, 16
DEEPSPEED_DEFAULTS = {"stage3_prefetch_bucket_size": Comm.prefetch_bucket_size,
                      "reduce_bucket_size": Comm.reduce_bucket_size, "overlap_comm": True}


@dataclass(frozen=True, eq=False)
class ShardedTuneResult:
    """`settings`: one row per distinct setting simulated, in search order: the knobs (their [comm] names; fsdp_unit
    as written in TOML: "layer", "model", "12.5MB" or a list), `units` (fsdp/hsdp), iteration_time_s (NaN when
    infeasible), memory_peak_B (per rank, computed even when infeasible), feasible, reason ("" or why not),
    default (the defaults row). `best`, `default`: those rows as dicts. `infeasible`: how many settings were skipped;
    `reasons`: reason -> count. `knobs`: the searched [comm] keys. `experiment_of`: a row's setting as the
    experiment it was simulated as (for `weigh`)."""

    algorithm: str
    settings: pd.DataFrame
    best: dict
    default: dict
    infeasible: int
    reasons: dict[str, int]
    knobs: tuple[str, ...]
    title: str = ""
    info: dict = field(default_factory=dict)
    experiment_of: Callable[[dict], Experiment] | None = None

    def table(self) -> pd.DataFrame:
        """Best, defaults, the setting of least peak memory within 1 % of the best time, then for every value of
        every knob the best feasible setting with that value: setting (a label), the knobs, iteration_time_s,
        memory_peak_B, feasible, slower_than_best (fraction)."""
        ok = self.settings[self.settings.feasible]
        rows = [{"setting": "best", **self.best}, {"setting": "defaults", **self.default}]
        near = ok[ok.iteration_time_s <= self.best["iteration_time_s"] * (1 + NEAR_BEST)]
        rows.append({"setting": "least memory within 1 %", **near.loc[near.memory_peak_B.idxmin()].to_dict()})
        for knob in self.knobs:
            for value in dict.fromkeys(self.settings[knob]):
                part = ok[[_same(v, value) for v in ok[knob]]]
                if len(part):
                    rows.append({"setting": f"{knob} = {_label(value)}", **_pick(part)})
        df = pd.DataFrame(rows)[["setting", *self.knobs, "iteration_time_s", "memory_peak_B", "feasible"]]
        df["slower_than_best"] = df.iteration_time_s / self.best["iteration_time_s"] - 1
        return df


    def recommend(self, tolerance: float = NEAR_BEST) -> tuple[dict, bool]:
        """(setting, keep_default): the defaults when feasible and within `tolerance` (a fraction) of the best
        time; else, of the feasible settings within it, the one changing the fewest knobs from the defaults, then
        the fastest, then the least memory (a change the model cannot tell from the best is not worth making)."""
        d = self.default
        if d["feasible"] and d["iteration_time_s"] <= self.best["iteration_time_s"] * (1 + tolerance):
            return d, True
        ok = self.settings[self.settings.feasible]
        near = ok[ok.iteration_time_s <= self.best["iteration_time_s"] * (1 + tolerance)]
        changed = [len(self._changed(row)) for _, row in near.iterrows()]
        order = near.assign(changed=changed).sort_values(["changed", "iteration_time_s", "memory_peak_B"],
                                                         kind="stable")
        return order.iloc[0].drop("changed").to_dict(), False

    def weigh(self, tolerance: float = NEAR_BEST,
              level: float = DEFAULT_LEVEL) -> tuple[dict, bool, str, Interval | None]:
        """(setting, keep_default, why kept, interval): `recommend`'s answer, then the model's uncertainty weighed:
        the defaults are kept after all when the interval at `level` of their time over the change's
        (simfog.run_bands.ratio_interval: the same model error through both runs) reaches down to within
        `tolerance`. The interval is None where nothing was weighed (defaults kept within the tolerance, or
        infeasible)."""
        from simfog.run_bands import ratio_interval

        choice, keep = self.recommend(tolerance)
        if keep:
            return choice, True, f"within the {100 * tolerance:g} % tolerance of the best", None
        if not self.default["feasible"] or self.experiment_of is None:
            return choice, False, "", None
        iv = ratio_interval(self.experiment_of(self.default), self.experiment_of(choice), level)
        if iv.lo <= 1 + tolerance:
            return self.default, True, (f"the change's gain is not sure to exceed the {100 * tolerance:g} % "
                                        f"tolerance at {100 * iv.level:g} % (the model's uncertainty)"), iv
        return choice, False, "", iv

    def _changed(self, row) -> list[str]:
        """The knobs `row` sets otherwise than the defaults; prefetch only where it fetches another unit (a
        prefetch beyond the last unit is the same plan as the deepest one there is)."""
        d = self.default
        out = []
        for k in self.knobs:
            a, b = row[k], d[k]
            if k == "prefetch" and "units" in row:
                a, b = min(a, row["units"] - 1), min(b, row["units"] - 1)
            if not _same(a, b):
                out.append(k)
        return out

    def spelling(self, row: dict) -> list[str]:
        """What to change, in the framework's own words (FSDP2's fully_shard, DeepSpeed's config), one line per
        knob that differs from the defaults."""
        lines = []
        changed = self._changed(row)
        if self.algorithm == "zero3":
            if changed:
                body = ", ".join(f'"{k}": ' + (str(row[k]).lower() if isinstance(row[k], bool) else f"{row[k]:.3g}")
                                 for k in changed)
                lines.append(f'DeepSpeed config: "zero_optimization": {{"stage": 3, {body}}}')
            return lines
        for k in changed:
            v = row[k]
            if k == "fsdp_unit":
                lines.append({"layer": "fully_shard(layer) on every layer, then fully_shard(model)",
                              "model": "fully_shard(model) alone (one unit)"}.get(
                    v, f"fully_shard on consecutive layers grouped as fsdp_unit = {v} "
                       "(a size: layers until their parameters reach it), then fully_shard(model)"))
            elif k == "reshard_after_forward":
                lines.append(f"fully_shard(..., reshard_after_forward={v})")
            elif k == "prefetch":
                lines.append("prefetch 0: no prefetch (FSDP1: backward_prefetch=None, forward_prefetch=False)"
                             if v == 0 else f"prefetch {v} units ahead: unit.set_modules_to_forward_prefetch(next "
                             f"{v}) and set_modules_to_backward_prefetch(previous {v})")
            elif k == "hsdp_group":
                ranks = self.info["ranks"]
                lines.append(f'mesh = init_device_mesh("cuda", ({ranks // int(v)}, {int(v)})); '
                             "fully_shard(..., mesh=mesh)")
        return lines


def _same(a, b) -> bool:
    return (a == b) if not (isinstance(a, float) and isinstance(b, float)) else a == b or (a != a and b != b)


def _label(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return f"{value:.0f}"
    return str(value)


def _pick(part: pd.DataFrame) -> dict:
    """The best row of `part` (feasible rows): least time, then least memory, then first."""
    least = part.iteration_time_s.min()
    tied = part[part.iteration_time_s <= least * (1 + 1e-12)]
    return tied.loc[tied.memory_peak_B.idxmin()].to_dict()


def _sig3(x: float) -> float:
    """x rounded to 3 significant digits."""
    return float(f"{x:.3g}")


def _size_label(nbytes: float) -> str:
    """A TOML size string that parses back to exactly `nbytes` (3 significant digits)."""
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= f:
            return f"{nbytes / f:g}{unit}"
    return f"{nbytes:g}B"


def hsdp_groups(ranks: int, gpus_per_node: int) -> list[int]:
    """Every hsdp_group the experiment accepts on `ranks` ranks: divisors of ranks that divide gpus_per_node or are
    multiples of it, ascending."""
    L = gpus_per_node
    return [g for g in range(1, ranks + 1) if ranks % g == 0 and (L % g == 0 or g % L == 0)]


def _fsdp_space(exp: Experiment, sizes: int, max_prefetch: int):
    from simfog.algorithms.sharded.plan import fsdp_units

    trace = exp.workload.trace
    layer_B = [b for layer in trace.layers if (b := sum(t.nbytes for t in layer.params)) > 0]
    mean, total = float(np.mean(layer_B)), float(sum(layer_B))
    units = {"layer": "layer", "model": "model"}
    given = exp.comm.fsdp_unit
    key_given = _size_label(given) if isinstance(given, float) else (list(given) if isinstance(given, tuple)
                                                                     else given)
    for s in np.geomspace(mean, total, sizes) if sizes > 1 else [mean] * sizes:
        s = _sig3(float(s))
        units[_size_label(s)] = s
    units[str(key_given)] = given
    # One entry per distinct grouping, first label kept ("layer" and "model" first, then ascending sizes).
    seen, candidates = {}, {}
    for label, spec in units.items():
        shape = tuple(len(u) for u in fsdp_units(trace, spec))
        if shape not in seen or spec == given:
            seen.setdefault(shape, label)
            candidates[label] = (spec, shape)
    space = {"fsdp_unit": list(candidates), "prefetch": list(range(max_prefetch + 1)),
             "reshard_after_forward": [True, False]}
    default = {"fsdp_unit": str(key_given), **FSDP2_DEFAULTS}
    if exp.comm.algorithm == "hsdp":
        space["hsdp_group"] = hsdp_groups(exp.ranks, exp.cluster.ranks_per_node)
        default["hsdp_group"] = exp.comm.hsdp_group or exp.cluster.ranks_per_node

    def resolve(setting: dict) -> tuple[dict, tuple]:
        spec, shape = candidates[setting["fsdp_unit"]]
        changes = {"fsdp_unit": spec, "prefetch": setting["prefetch"],
                   "reshard_after_forward": setting["reshard_after_forward"]}
        if "hsdp_group" in setting:
            changes["hsdp_group"] = setting["hsdp_group"]
        # prefetch beyond the last unit fetches nothing more: the same plan
        key = (shape, min(setting["prefetch"], max(len(shape) - 1, 0)), setting["reshard_after_forward"],
               setting.get("hsdp_group"))
        return changes, key

    return space, default, resolve, {"units": lambda s: len(candidates[s["fsdp_unit"]][1])}


def _zero3_space(exp: Experiment, sizes: int):
    trace = exp.workload.trace
    layer_elems = [e for layer in trace.layers if (e := sum(t.elements for t in layer.params)) > 0]
    tensor_elems = [t.elements for t in trace.tensors.values()]
    total = sum(layer_elems)

    def grid(lo, extra):
        values = np.geomspace(lo, total, sizes) if sizes > 1 else [lo] * sizes
        return sorted({*(min(int(_sig3(float(v))), total) for v in values), *extra})

    default = dict(DEEPSPEED_DEFAULTS)
    space = {"stage3_prefetch_bucket_size": grid(np.mean(layer_elems), [1, default["stage3_prefetch_bucket_size"]]),
             "reduce_bucket_size": grid(np.mean(tensor_elems), [default["reduce_bucket_size"]]),
             "overlap_comm": [True, False]}

    def resolve(setting: dict) -> tuple[dict, tuple]:
        changes = {FIELDS[k]: v for k, v in setting.items()}
        # a bucket of at least the model's elements holds everything: the same plan whatever its size
        return changes, tuple(min(v, total) if not isinstance(v, bool) else v for v in setting.values())

    return space, default, resolve, {}


def tune_sharded(exp: Experiment, *, sizes: int = 8, max_prefetch: int = 2,
                 samples: bool = False) -> ShardedTuneResult:
    """Search the sharded knobs of `exp` (algorithm fsdp, hsdp or zero3; see the module docstring): `sizes` block
    sizes (fsdp/hsdp unit sizes, zero3 bucket sizes), prefetch depths 0..`max_prefetch`. `samples`: the trace's
    sampled layer times instead of means. Returns a ShardedTuneResult. Raises ConfigError for another algorithm or
    bad counts; Infeasible when no setting fits the cluster's gpu_memory (the message counts and says why); whatever
    simulate raises for the experiment itself otherwise."""
    from simfog.progress import bar as progress_bar
    from simfog.simulation import new_simulation, simulate

    algorithm = exp.comm.algorithm
    if algorithm not in ALGORITHMS:
        raise ConfigError("comm.algorithm", algorithm, f"one of {', '.join(ALGORITHMS)} for the sharded search",
                          source=exp.source)
    for name, value, most in (("sizes", sizes, MAX_SIZES), ("max_prefetch", max_prefetch, MAX_PREFETCH)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
            raise ConfigError(name, value, f"an integer in 0..{most} (the search simulates every combination)")
    compute = "samples" if samples else "mean"
    exp = replace(exp, workload=replace(exp.workload, compute=compute))
    if algorithm == "zero3":
        space, default, resolve, extra = _zero3_space(exp, sizes)
    else:
        space, default, resolve, extra = _fsdp_space(exp, sizes, max_prefetch)
    knobs = tuple(space)
    # The defaults first: always a row of its own, and ties go to it (no change recommended for nothing).
    combos = [default, *(c for values in itertools.product(*space.values())
                         if (c := dict(zip(knobs, values, strict=True))) != default)]
    unlimited = replace(exp, cluster=replace(exp.cluster, gpu_memory_B=None))
    seen: set[tuple] = set()
    rows = []
    bar = progress_bar(total=len(combos), desc="tune", unit="sim")
    for setting in combos:
        bar.update(1)
        changes, key = resolve(setting)
        if key in seen:  # the same plan as a setting already simulated
            continue
        seen.add(key)
        run = exp.with_comm(**changes)
        try:
            s = simulate(run).summary()
            outcome = {"iteration_time_s": s["iteration_time_s"], "memory_peak_B": s["memory_peak_B"],
                       "feasible": True, "reason": ""}
        except Infeasible as e:
            try:
                peak = new_simulation(replace(unlimited, comm=run.comm)).memory.peak_B
            except Infeasible:
                peak = math.nan
            reason = "over cluster.gpu_memory" if "gpu_memory" in str(e) else str(e)
            outcome = {"iteration_time_s": math.nan, "memory_peak_B": peak, "feasible": False, "reason": reason}
        rows.append({**setting, **{k: f(setting) for k, f in extra.items()}, **outcome, "default": not rows})
    bar.close()
    settings = pd.DataFrame(rows)
    skipped = settings[~settings.feasible]
    reasons = {str(r): int(n) for r, n in skipped.reason.value_counts().items()}
    limit = exp.cluster.gpu_memory_B
    ok = settings[settings.feasible]
    if not len(ok):
        from simfog.units import format_bytes

        raise Infeasible(f"no {algorithm} setting of the {len(settings)} searched fits: "
                         + "; ".join(f"{n} {r}" + (f" ({format_bytes(limit)})" if "gpu_memory" in r and limit else "")
                                     for r, n in reasons.items()))
    best = _pick(ok)
    default_row = settings.iloc[0].to_dict()
    trace = exp.workload.trace
    title = run_title(exp, extra=algorithm)
    info = {"model": trace.model, "ranks": exp.ranks, "collective": exp.comm.collective,
            "estimated": bool(exp.estimated), "gpu_memory_B": limit, "compute_mode": compute,
            "settings_simulated": len(settings)}

    def experiment_of(row: dict) -> Experiment:
        return exp.with_comm(**resolve({k: row[k] for k in knobs})[0])

    return ShardedTuneResult(algorithm, settings, best, default_row, len(skipped), reasons, knobs, title, info,
                             experiment_of)
