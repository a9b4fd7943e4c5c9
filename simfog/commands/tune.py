"""`simfog tune FILE.toml`: the merge threshold with the least iteration time, against the frameworks' defaults."""

from __future__ import annotations

from simfog import units
from simfog.commands.simulate import add_overrides, load_with_overrides


def add_arguments(parser) -> None:
    parser.add_argument("file", nargs="?", help="experiment TOML (default: the embedded example)")
    add_overrides(parser)
    parser.add_argument("--lo", help='smallest threshold searched, e.g. "64KiB" (default: the smallest gradient)')
    parser.add_argument("--hi", help='largest threshold searched, e.g. "1GiB" (default: the whole model)')
    parser.add_argument("--points", type=int, default=25, help="log-spaced thresholds in the first pass")
    parser.add_argument("--refine", type=int, default=10, help="thresholds between the best one's neighbours")
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


def run(args) -> int:
    from simfog import plot
    from simfog.cli import print_json
    from simfog.errors import ConfigError
    from simfog.files import atomic_open, check_output, new_run_dir, refuse_existing
    from simfog.tune import tune

    for name in ("merge", "threshold"):
        if getattr(args, name) is not None:
            raise ConfigError(f"--{name}", getattr(args, name),
                              "not used by tune: it searches merge = threshold and compares fixed baselines")
    if args.output is not None:
        check_output(f"{args.output}.png")
        check_output(f"{args.output}.csv")
        refuse_existing([f"{args.output}.png", f"{args.output}.csv"], force=args.force)
    exp = load_with_overrides(args)
    bounds = {k: units.nbytes(getattr(args, k), field=f"--{k}") if getattr(args, k) else None for k in ("lo", "hi")}
    try:
        result = tune(exp, points=args.points, refine=args.refine, samples=args.samples, **bounds)
    except ConfigError as e:
        if e.field in ("points", "refine", "lo", "hi"):  # the library's names for these options
            raise ConfigError(f"--{e.field}", e.value, e.allowed) from None
        raise

    def write(prefix) -> None:
        with atomic_open(f"{prefix}.csv") as f:
            result.curve.to_csv(f, index=False)
        plot.save(plot.tune_figure(result), f"{prefix}.png")

    if args.output is not None:
        prefix = args.output
        write(prefix)
    else:
        with new_run_dir("tune") as out:
            write(out.path / "tune")
        prefix = out.final / "tune"
    png, csv = f"{prefix}.png", f"{prefix}.csv"
    if args.json:
        print_json({"best_threshold_bytes": result.best_threshold_bytes,
                    "best_iteration_time_s": result.best_iteration_time_s, "best_buckets": result.best_buckets,
                    "near_best_bytes": list(result.near_best_bytes), "baselines_iteration_time_s": result.baselines,
                    "compute_mode": result.compute, **result.info, "plot": png, "csv": csv})
    else:
        print(format_result(result))
        print(f"wrote {png}, {csv}")
    return 0
