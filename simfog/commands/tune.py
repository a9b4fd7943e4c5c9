"""`simfog tune FILE.toml`: the merge threshold with the least iteration time, against the frameworks' defaults;
`--merge ddp|horovod|bagua` a framework's own knobs (simfog.tune_framework); for fsdp, hsdp and zero3 (experiments
or `--merge`) the sharded knobs (simfog.tune_sharded). Framework and sharded searches end with the setting to
write, in the framework's spelling, or "keep the default"."""

from __future__ import annotations

from simfog import units
from simfog.commands.simulate import add_overrides, load_with_overrides


def add_arguments(parser) -> None:
    parser.add_argument("file", nargs="?", help="experiment TOML (default: the embedded example)")
    add_overrides(parser)
    parser.add_argument("--tolerance", type=float, default=None,
                        help="percent of the best iteration time within which the default is kept and a plateau "
                             "counted: the least gain worth a change (default: 1)")
    parser.add_argument("--level", type=float, default=None,
                        help="the level of the model's interval weighing a change against the default: --merge "
                             "keeps the default unless the gain's lower bound exceeds the tolerance; the generic "
                             "search says whether each framework's default is told apart from the best (default: 0.9)")
    parser.add_argument("--lo", help='smallest threshold searched, e.g. "64KiB" (default: the smallest gradient)')
    parser.add_argument("--hi", help='largest threshold searched, e.g. "1GiB" (default: the whole model)')
    parser.add_argument("--points", type=int, default=None, help="log-spaced thresholds in the first pass "
                        "(default: 25)")
    parser.add_argument("--refine", type=int, default=None, help="thresholds between the best one's neighbours "
                        "(default: 10)")
    parser.add_argument("--sizes", type=int, default=None, help="fsdp/hsdp/zero3: log-spaced unit (or bucket) "
                        "sizes searched (default: 8)")
    parser.add_argument("--max-prefetch", type=int, default=None, help="fsdp/hsdp: prefetch depths 0..N searched "
                        "(default: 2)")
    parser.add_argument("--samples", action="store_true",
                        help="use the trace's sampled layer times (default: means, so the search does not chase "
                             "the noise of a few random draws)")
    parser.add_argument("-o", "--output", metavar="DIR", default=None, help="a folder (made if missing): writes "
                        "DIR/tune.png (plot) and DIR/tune.csv (every setting simulated) (default: a new folder "
                        "simfog-out/tune-<UTC time>/)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing DIR/tune.png or DIR/tune.csv")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def format_result(r) -> str:
    lo, hi = r.near_best_bytes
    lines = [r.title,
             f"  best threshold {units.format_bytes(r.best_threshold_bytes)}: {r.best_buckets} buckets, iteration "
             f"{_with_interval(r)} (within 1 % from {units.format_bytes(lo)} to {units.format_bytes(hi)})",
             f"  widest range within 1 %: {units.format_bytes(r.plateau_bytes[0])} to "
             f"{units.format_bytes(r.plateau_bytes[1])}; its middle, "
             f"{units.format_bytes(r.recommended_threshold_bytes)}, iteration "
             f"{units.format_time(r.recommended_iteration_time_s)}, is the answer robust to a flat curve",
             f"  {'policy':<18} {'iteration':>10} {'vs best':>9}"]
    level = next(iter(r.versus_defaults.values())).level if r.versus_defaults else None
    for row in r.table().itertuples():
        line = f"  {row.policy:<18} {units.format_time(row.iteration_time_s):>10} {100 * row.slower_than_best:>+8.1f}%"
        if row.distinct is not None:
            iv = r.versus_defaults[row.policy]
            line += (f"  ({100 * level:g} %: {100 * (iv.lo - 1):+.1f} to {100 * (iv.hi - 1):+.1f} %: "
                     + ("the model tells them apart)" if row.distinct else "within the model's uncertainty)"))
        lines.append(line + (f"  {row.warnings}" if row.warnings else ""))
    if r.versus_defaults:
        lines.append(f"  {100 * level:g} % of a default vs best: each part's error moved through both runs at once "
                     "(the same faster compute, the same slower network), so the interval need not be centred on "
                     "its point")
    ends = [p for p, iv in r.versus_defaults.items() if _ends_at_its_value(iv)]
    if ends:
        lines.append(f"  {', '.join(ends)}: the interval ends at its point: {_WHY_IT_ENDS}, so the point is the "
                     "largest gap")
    lines.append("  a framework's own setting (bucket_cap_mb, HOROVOD_FUSION_THRESHOLD, ...): "
                 "--merge ddp|horovod|bagua")
    return "\n".join(lines)


def _with_interval(r) -> str:
    """The best threshold's iteration time with its interval ('141 ms (90 %: 98.6–292 ms)'), or alone."""
    from simfog.bands import Interval, format_interval

    b = r.best_interval
    if not b:
        return units.format_time(r.best_iteration_time_s)
    iv = Interval(b["interval_level"], r.best_iteration_time_s, b["iteration_time_lo_s"], b["iteration_time_hi_s"])
    return format_interval(iv, units.format_time)


def _value(knob: str, v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if knob in ("stage3_prefetch_bucket_size", "reduce_bucket_size"):
        return f"{v:.3g}"
    return str(v)


def format_sharded(r) -> str:
    """The sharded search as text: best and defaults, then the best setting for each value of each knob."""
    def describe(row) -> str:
        return ", ".join(f"{k} = {_value(k, row[k])}" for k in r.knobs)

    b, d = r.best, r.default
    limit = r.info.get("gpu_memory_B")
    lines = [r.title,
             f"  best: {describe(b)}: iteration {units.format_time(b['iteration_time_s'])}, peak memory "
             f"{units.format_bytes(b['memory_peak_B'])} per rank",
             f"  {'FSDP2' if r.algorithm != 'zero3' else 'DeepSpeed'} defaults: {describe(d)}: "
             + (f"iteration {units.format_time(d['iteration_time_s'])} "
                f"({100 * (d['iteration_time_s'] / b['iteration_time_s'] - 1):+.2f}% vs best), "
                if d["feasible"] else "INFEASIBLE, ")
             + f"peak memory {units.format_bytes(d['memory_peak_B'])}",
             f"  {r.info['settings_simulated']} distinct settings; {r.infeasible} skipped as infeasible"
             + "".join(f"; {n} {why}" + (f" ({units.format_bytes(limit)})" if "gpu_memory" in why and limit else "")
                       for why, n in r.reasons.items()),
             f"  {'setting':<42} {'iteration':>10} {'vs best':>9} {'memory/rank':>12}"]
    for row in r.table().itertuples():
        lines.append(f"  {row.setting:<42} {units.format_time(row.iteration_time_s):>10} "
                     f"{100 * row.slower_than_best:>+8.2f}% {units.format_bytes(row.memory_peak_B):>12}")
    return "\n".join(lines)


def run(args) -> int:
    from simfog import caveats, plot
    from simfog.bands import DEFAULT_LEVEL, check_level
    from simfog.cli import print_json
    from simfog.commands.outputs import folder_prefix
    from simfog.errors import Caveat, ConfigError
    from simfog.files import atomic_open, new_run_dir, refuse_existing
    from simfog.titles import input_columns
    from simfog.tune import tune
    from simfog.tune_framework import FRAMEWORKS, tune_framework
    from simfog.tune_sharded import ALGORITHMS, tune_sharded

    if args.output is not None:
        args.output = folder_prefix(args.output, "tune")  # -o DIR: DIR/tune.* from here on

    if args.threshold is not None:
        raise ConfigError("--threshold", args.threshold, "not used by tune: it searches the threshold")
    if args.level is not None:
        check_level(args.level, "--level")
    target = args.merge
    if target is not None and target not in ("threshold", *FRAMEWORKS, *ALGORITHMS):
        raise ConfigError("--merge", target, f"a framework whose knobs tune searches: {', '.join(FRAMEWORKS)}; "
                          f"{', '.join(ALGORITHMS)} (sharded); or threshold (the generic search)")
    if args.tolerance is not None and not 0 <= args.tolerance < 100:
        raise ConfigError("--tolerance", args.tolerance, "a percent in [0, 100), e.g. 1")
    tolerance = 0.01 if args.tolerance is None else args.tolerance / 100
    if args.output is not None:
        refuse_existing([f"{args.output}.png", f"{args.output}.csv"], force=args.force)
    args.merge = None  # tune's --merge names what to search, not the experiment's comm.merge
    exp = load_with_overrides(args)
    if target in ALGORITHMS:
        exp = exp.with_comm(algorithm=target)
    elif target in FRAMEWORKS and exp.comm.algorithm in ALGORITHMS:
        raise ConfigError("--merge", target, f"a sharded framework ({', '.join(ALGORITHMS)}) for this experiment's "
                          f"algorithm = {exp.comm.algorithm}, or an allreduce experiment")
    sharded = exp.comm.algorithm in ALGORITHMS
    framework = target if target in FRAMEWORKS else None
    if framework:
        for name in ("lo", "hi", "points", "refine", "sizes", "max_prefetch"):
            if getattr(args, name) is not None:
                raise ConfigError("--" + name.replace("_", "-"), getattr(args, name),
                                  f"not used when tuning {framework}'s own knobs (it searches the values a user "
                                  "would write)")
    own, other = (("sizes", "max_prefetch"), ("lo", "hi", "points", "refine")) if sharded else \
        (("lo", "hi", "points", "refine"), ("sizes", "max_prefetch"))
    for name in other:
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(flag, getattr(args, name), f"not used when tuning algorithm = {exp.comm.algorithm} "
                              f"(use {', '.join('--' + n.replace('_', '-') for n in own)})")
    try:
        if framework:
            result = tune_framework(exp, framework, tolerance=tolerance, samples=args.samples,
                                    tolerance_source="--tolerance" if args.tolerance is not None else "default",
                                    level=DEFAULT_LEVEL if args.level is None else args.level)
        elif sharded:
            searched = {k: getattr(args, k) for k in own if getattr(args, k) is not None}
            result = tune_sharded(exp, samples=args.samples, **searched)
        else:
            bounds = {k: units.nbytes(getattr(args, k), field=f"--{k}") if getattr(args, k) else None
                      for k in ("lo", "hi")}
            result = tune(exp, points=25 if args.points is None else args.points,
                          refine=10 if args.refine is None else args.refine, samples=args.samples,
                          level=DEFAULT_LEVEL if args.level is None else args.level, **bounds)
    except ConfigError as e:
        if e.field in own:  # the library's names for these options
            raise ConfigError("--" + e.field.replace("_", "-"), e.value, e.allowed) from None
        raise

    # A framework's or sharded search: what every setting rests on (the calibration, the layout; the generic search
    # has each threshold's own, sizes included, in its curve and table)
    common = Caveat.line(caveats.of_run(exp, [])) if sharded or framework else ""

    def write(prefix) -> None:
        with atomic_open(f"{prefix}.csv") as f:
            # every row names the trace and network file (simfog.titles.input_columns), as a sweep's rows do
            table = result.settings.assign(warnings=common) if sharded or framework else result.curve
            table.assign(**input_columns(exp)).to_csv(f, index=False)
        figure = (plot.framework_tune_figure if framework else plot.sharded_tune_figure if sharded
                  else plot.tune_figure)(result)
        plot.save(figure, f"{prefix}.png")

    if args.output is not None:
        prefix = args.output
        write(prefix)
    else:
        with new_run_dir("tune") as out:
            write(out.path / "tune")
        prefix = out.final / "tune"
    png, csv = f"{prefix}.png", f"{prefix}.csv"
    if framework:
        if args.json:
            print_json({"framework": framework, "knobs": [k.name for k in result.knobs], "setting": result.setting,
                        "keep_default": result.keep_default, "gain": result.gain, "choice": _plain(result.choice),
                        "best": _plain(result.best), "defaults": _plain(result.default),
                        "tolerance": result.tolerance, "tolerance_source": result.tolerance_source,
                        "keep_reason": result.keep_reason, **_gain_fields(result.gain_interval),
                        "plateau": {k: list(v) for k, v in result.plateau.items()}, "notes": list(result.notes),
                        **result.info, "warnings": common, "plot": png, "csv": csv})
        else:
            print(format_framework(result) + _common_warnings(common))
            print(f"wrote {png}, {csv}")
        return 0
    if sharded:
        choice, keep, reason, iv = result.weigh(tolerance, DEFAULT_LEVEL if args.level is None else args.level)
        if args.json:
            print_json({"algorithm": result.algorithm, "knobs": list(result.knobs), "best": _plain(result.best),
                        "defaults": _plain(result.default), "infeasible": result.infeasible,
                        "infeasible_reasons": result.reasons, "choice": _plain(choice), "keep_default": keep,
                        "setting": result.spelling(choice), "tolerance": tolerance, "keep_reason": reason,
                        **_gain_fields(iv), **result.info, "warnings": common, "plot": png, "csv": csv})
        else:
            print(format_sharded(result) + _common_warnings(common))
            print(_sharded_answer(result, choice, keep, tolerance, args.tolerance is not None, reason, iv))
            print(f"wrote {png}, {csv}")
        return 0
    if args.json:
        print_json({"best_threshold_bytes": result.best_threshold_bytes,
                    "best_iteration_time_s": result.best_iteration_time_s, "best_buckets": result.best_buckets,
                    "best_interval": result.best_interval,
                    "defaults_versus_best": {p: {"ratio": iv.value, "ratio_lo": iv.lo, "ratio_hi": iv.hi,
                                                 "interval_level": iv.level, "distinct": result.distinct(p)}
                                             for p, iv in result.versus_defaults.items()},
                    "near_best_bytes": list(result.near_best_bytes), "baselines_iteration_time_s": result.baselines,
                    "compute_mode": result.compute, **result.info, "warnings": result.warnings, "plot": png,
                    "csv": csv})
    else:
        print(format_result(result))
        print(f"wrote {png}, {csv}")
    return 0


def _common_warnings(line: str) -> str:
    """The line under a framework's or sharded search naming what every setting rests on ("" for nothing)."""
    return f"\n  WARNINGS (every setting): {line}" if line else ""


def _tolerance_line(tolerance: float, stated: bool) -> str:
    return (f"  tolerance {100 * tolerance:g} % of the best iteration time ("
            + ("--tolerance" if stated else "default; --tolerance sets it")
            + "): the least gain worth a change")


def _gain(iv) -> tuple[float, float, float]:
    """(gain, lo, hi): the fraction of the default's time a change saves, from the interval of default / change."""
    return 1 - 1 / iv.value, 1 - 1 / iv.lo, 1 - 1 / iv.hi


def _gain_text(iv) -> str:
    g, lo, hi = _gain(iv)
    return f"{100 * g:.1f} % ({100 * iv.level:g} %: {100 * lo:.1f} to {100 * hi:.1f} %)"


# Why an interval of two runs' ratio can end at its point (simfog.run_bands.ratio_interval): each part is moved to
# both of its bounds in both runs at once, and a side neither bound moves the ratio to has no width.
_WHY_IT_ENDS = ("each part's error, moved to either of its bounds in both runs at once, only narrows the gap (the same "
                "slower or faster compute or network hides or bares both runs' communication)")


def _ends_at_its_value(iv) -> bool:
    return iv.hi == iv.value and iv.lo < iv.value


def _gain_fields(iv) -> dict:
    """JSON keys of a change's gain and its interval (absent when no change was weighed)."""
    if iv is None:
        return {}
    g, lo, hi = _gain(iv)
    return {"choice_gain": g, "choice_gain_lo": lo, "choice_gain_hi": hi, "interval_level": iv.level,
            "gain_interval_parts": {p.name: {"share": iv.shares[p.name], "source": p.source, "measured": p.measured}
                                    for p in iv.parts}}


def format_framework(r) -> str:
    """A framework's knob search as text, ending with the setting to write or "keep the default"."""
    def describe(row) -> str:
        return ", ".join(f"{k.name}={k.show(row[k.name])}" for k in r.knobs)

    d, b, c = r.default, r.best, r.choice
    lines = [r.title,
             f"  searched {len(r.settings)} settings of " + ", ".join(
                 f"{k.name} ({k.show(min(k.values))} .. {k.show(max(k.values))})" for k in r.knobs),
             f"  default ({describe(d)}): iteration {units.format_time(d['iteration_time_s'])}, {d['buckets']:.0f} "
             f"buckets",
             f"  fastest ({describe(b)}): iteration {units.format_time(b['iteration_time_s'])} "
             f"({100 * (1 - b['iteration_time_s'] / d['iteration_time_s']):.2f} % faster than the default)",
             "  widest range within the tolerance: " + "; ".join(
                 f"{k.name} {k.show(r.plateau[k.name][0])} .. {k.show(r.plateau[k.name][1])}"
                 for k in r.knobs if k.name in r.plateau),
             _tolerance_line(r.tolerance, r.tolerance_source == "--tolerance")]
    lines += [f"  note: {n}" for n in r.notes]
    iv = r.gain_interval
    lines += _gain_line(iv)
    if r.keep_default:
        lines.append(f"answer: keep the default, {r.setting}: {r.keep_reason} "
                     f"(it is {100 * (d['iteration_time_s'] / b['iteration_time_s'] - 1):.2f} % slower than the "
                     "fastest)")
    else:
        lines.append(f"answer: {r.setting}   # iteration {units.format_time(d['iteration_time_s'])} -> "
                     f"{units.format_time(c['iteration_time_s'])}, {_gain_text(iv)} faster "
                     f"({c['samples_per_s'] - d['samples_per_s']:+,.0f} samples/s)")
    return "\n".join(lines)


def _gain_line(iv) -> list[str]:
    """The weighed change's gain with its interval and the parts it came from (none when nothing was weighed)."""
    if iv is None:
        return []
    unmeasured = any(not p.measured for p in iv.parts)
    return [f"  the change saves {_gain_text(iv)} of the default's time; parts: "
            + ", ".join(f"{p.name} {100 * iv.shares[p.name]:.0f} %" + ("" if p.measured else " UNMEASURED")
                        for p in iv.parts)
            + (" (unmeasured parts take a stated width: calibrate the network, measure the trace)"
               if unmeasured else "")] + (
        [f"  the interval ends at {100 * _gain(iv)[0]:.1f} %, the gain itself: {_WHY_IT_ENDS}, so the predicted "
         "gain is the largest"] if _ends_at_its_value(iv) else [])


def _sharded_answer(r, choice: dict, keep: bool, tolerance: float, stated: bool, reason: str = "",
                    iv=None) -> str:
    name = "FSDP2" if r.algorithm != "zero3" else "DeepSpeed"
    d = r.default
    lines = [_tolerance_line(tolerance, stated), *_gain_line(iv)]
    if keep:
        lines.append(f"answer: keep {name}'s defaults: {reason} "
                     f"(they are {100 * (d['iteration_time_s'] / r.best['iteration_time_s'] - 1):.2f} % slower "
                     "than the best)")
        return "\n".join(lines)
    gain = (f"iteration {units.format_time(d['iteration_time_s'])} -> "
            f"{units.format_time(choice['iteration_time_s'])}, "
            + (f"{_gain_text(iv)} faster" if iv is not None else
               f"{100 * (1 - choice['iteration_time_s'] / d['iteration_time_s']):.1f} % faster") if d["feasible"]
            else f"the defaults do not fit; iteration {units.format_time(choice['iteration_time_s'])}")
    lines.append(f"answer ({gain}):")
    lines += [f"  {line}" for line in r.spelling(choice)]
    return "\n".join(lines)


def _plain(row: dict) -> dict:
    """A settings row as JSON values (numpy scalars to Python; NaN times of infeasible rows to None)."""
    out = {}
    for k, v in row.items():
        v = v.item() if hasattr(v, "item") else v
        out[k] = None if isinstance(v, float) and v != v else v
    return out
