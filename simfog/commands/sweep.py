"""`simfog sweep FILE.toml --ranks 4,8,16 --merge ddp,wfbp --collective ring,tree -o sweep.csv`."""

from __future__ import annotations

import os

from simfog import units
from simfog.errors import ConfigError
from simfog.files import check_output


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _option_list(text: str, option: str) -> list[str]:
    """The comma-separated values of `option`; an option given with nothing in it (`--ranks ''`) is an error
    rather than a silent fall back to the file's value."""
    values = _list(text)
    if not values:
        raise ConfigError(option, text, "one or more comma-separated values")
    return values


def add_arguments(parser) -> None:
    parser.add_argument("file", nargs="?", help="experiment TOML (default: the embedded example)")
    parser.add_argument("--ranks", default=None, help="comma-separated rank counts (default: the file's)")
    parser.add_argument("--merge", default=None, help="comma-separated merge policies (default: the file's)")
    parser.add_argument("--collective", default=None, help="comma-separated collectives (default: the file's)")
    parser.add_argument("--threshold", default=None, help='comma-separated thresholds, e.g. "1MiB,25MiB"')
    parser.add_argument("-o", "--output", default="sweep.csv", help="CSV to append to (resumes if it exists)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="local worker processes")
    parser.add_argument("--scheduler", default=None, help="Dask scheduler address (tcp://host:port)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from simfog import experiment, sweep
    from simfog.cli import DEFAULT_EXPERIMENT
    from simfog.errors import ConfigError

    check_output(args.output)
    check_jobs(args.jobs)
    exp = experiment.load(args.file or DEFAULT_EXPERIMENT)
    try:
        ranks = [int(r) for r in _option_list(args.ranks, "--ranks")] if args.ranks is not None else [exp.ranks]
    except ValueError:
        raise ConfigError("--ranks", args.ranks, "comma-separated integers, e.g. 4,8,16") from None
    thresholds = ([units.nbytes(t, field="--threshold") for t in _option_list(args.threshold, "--threshold")]
                  if args.threshold is not None else [exp.comm.threshold_bytes])
    points = checked_grid(exp, ranks, args.merge, args.collective, thresholds)
    rows = sweep.run(exp, points, args.output, jobs=args.jobs, scheduler=args.scheduler,
                     progress=not args.no_progress)
    print(format_table(rows))
    print(f"wrote {args.output}")
    return 0


def check_jobs(jobs: int) -> None:
    if jobs < 1:
        raise ConfigError("--jobs", jobs, "an integer >= 1 (local worker processes)")


def checked_grid(exp, ranks: list[int], merge_text: str | None, collective_text: str | None,
                 thresholds: list) -> list:
    """The sweep points for comma-separated --merge/--collective (default: the file's), every name and rank count
    validated before anything runs (ConfigError naming the option)."""
    from simfog import collectives, merge, sweep

    merges = _option_list(merge_text, "--merge") if merge_text is not None else [exp.comm.merge]
    colls = _option_list(collective_text, "--collective") if collective_text is not None else [exp.comm.collective]
    for m in merges:
        merge.POLICIES.get(m, field="--merge")
    for c in colls:
        collectives.ALGORITHMS.get(c, field="--collective")
    for r in ranks:
        try:
            exp.with_ranks(r)  # the rank count's own checks and the experiment's ranks x iterations bound
        except ConfigError as e:
            raise ConfigError("--ranks", r, e.allowed) if e.field == "ranks" else e from None
    return sweep.grid(ranks, merges, colls, thresholds)


def format_table(rows: list[dict]) -> str:
    head = f"{'ranks':>6} {'merge':<10} {'collective':<12} {'iter time':>10} {'samples/s':>11} {'efficiency':>10}"
    lines = [head]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['ranks']:>6} {r['merge']:<10} {r['collective']:<12} error: {r['error']}")
            continue
        lines.append(f"{r['ranks']:>6} {r['merge']:<10} {r['collective']:<12} "
                     f"{units.format_time(float(r['iteration_time_s'])):>10} {float(r['samples_per_s']):>11.1f} "
                     f"{100 * float(r['scaling_efficiency']):>9.1f}%")
    return "\n".join(lines)
