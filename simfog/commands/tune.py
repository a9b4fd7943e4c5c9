"""`simfog tune FILE.toml`: the merge threshold with the least iteration time, against the frameworks' defaults; for
fsdp, hsdp and zero3 experiments the sharded knobs instead (simfog.tune_sharded)."""

from __future__ import annotations

from simfog import units
from simfog.commands.simulate import add_overrides, load_with_overrides


def add_arguments(parser) -> None:
    parser.add_argument("file", nargs="?", help="experiment TOML (default: the embedded example)")
    add_overrides(parser)
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
    parser.add_argument("-o", "--output", default=None, help="writes PREFIX.png (plot) and PREFIX.csv (curve) "
                        "(default: a new folder simfog-out/tune-<UTC time>/ holding tune.png and tune.csv)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing PREFIX.png or PREFIX.csv")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def format_result(r) -> str:
    lo, hi = r.near_best_bytes
    lines = [r.title,
             f"  best threshold {units.format_bytes(r.best_threshold_bytes)}: {r.best_buckets} buckets, iteration "
             f"{units.format_time(r.best_iteration_time_s)} (within 1 % from {units.format_bytes(lo)} to "
             f"{units.format_bytes(hi)})",
             f"  {'policy':<18} {'iteration':>10} {'vs best':>9}"]
    for row in r.table().itertuples():
        lines.append(f"  {row.policy:<18} {units.format_time(row.iteration_time_s):>10} "
                     f"{100 * row.slower_than_best:>+8.1f}%")
    return "\n".join(lines)


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
    from simfog import plot
    from simfog.cli import print_json
    from simfog.errors import ConfigError
    from simfog.files import atomic_open, check_output, new_run_dir, refuse_existing
    from simfog.tune import tune
    from simfog.tune_sharded import ALGORITHMS, tune_sharded

    for name in ("merge", "threshold"):
        if getattr(args, name) is not None:
            raise ConfigError(f"--{name}", getattr(args, name),
                              "not used by tune: it searches merge = threshold and compares fixed baselines")
    if args.output is not None:
        check_output(f"{args.output}.png")
        check_output(f"{args.output}.csv")
        refuse_existing([f"{args.output}.png", f"{args.output}.csv"], force=args.force)
    exp = load_with_overrides(args)
    sharded = exp.comm.algorithm in ALGORITHMS
    own, other = (("sizes", "max_prefetch"), ("lo", "hi", "points", "refine")) if sharded else \
        (("lo", "hi", "points", "refine"), ("sizes", "max_prefetch"))
    for name in other:
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(flag, getattr(args, name), f"not used when tuning algorithm = {exp.comm.algorithm} "
                              f"(use {', '.join('--' + n.replace('_', '-') for n in own)})")
    try:
        if sharded:
            searched = {k: getattr(args, k) for k in own if getattr(args, k) is not None}
            result = tune_sharded(exp, samples=args.samples, **searched)
        else:
            bounds = {k: units.nbytes(getattr(args, k), field=f"--{k}") if getattr(args, k) else None
                      for k in ("lo", "hi")}
            result = tune(exp, points=25 if args.points is None else args.points,
                          refine=10 if args.refine is None else args.refine, samples=args.samples, **bounds)
    except ConfigError as e:
        if e.field in own:  # the library's names for these options
            raise ConfigError("--" + e.field.replace("_", "-"), e.value, e.allowed) from None
        raise

    def write(prefix) -> None:
        with atomic_open(f"{prefix}.csv") as f:
            (result.settings if sharded else result.curve).to_csv(f, index=False)
        plot.save(plot.sharded_tune_figure(result) if sharded else plot.tune_figure(result), f"{prefix}.png")

    if args.output is not None:
        prefix = args.output
        write(prefix)
    else:
        with new_run_dir("tune") as out:
            write(out.path / "tune")
        prefix = out.final / "tune"
    png, csv = f"{prefix}.png", f"{prefix}.csv"
    if sharded:
        if args.json:
            print_json({"algorithm": result.algorithm, "knobs": list(result.knobs), "best": _plain(result.best),
                        "defaults": _plain(result.default), "infeasible": result.infeasible,
                        "infeasible_reasons": result.reasons, **result.info, "plot": png, "csv": csv})
        else:
            print(format_sharded(result))
            print(f"wrote {png}, {csv}")
        return 0
    if args.json:
        print_json({"best_threshold_bytes": result.best_threshold_bytes,
                    "best_iteration_time_s": result.best_iteration_time_s, "best_buckets": result.best_buckets,
                    "near_best_bytes": list(result.near_best_bytes), "baselines_iteration_time_s": result.baselines,
                    "compute_mode": result.compute, **result.info, "plot": png, "csv": csv})
    else:
        print(format_result(result))
        print(f"wrote {png}, {csv}")
    return 0


def _plain(row: dict) -> dict:
    """A settings row as JSON values (numpy scalars to Python; NaN times of infeasible rows to None)."""
    out = {}
    for k, v in row.items():
        v = v.item() if hasattr(v, "item") else v
        out[k] = None if isinstance(v, float) and v != v else v
    return out
