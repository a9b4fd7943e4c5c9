"""`simfog sweep FILE.toml --ranks 4,8,16 --merge ddp,wfbp --collective ring,tree -o sweep.csv`."""

from __future__ import annotations

import os

from simfog import units
from simfog.commands.simulate import add_cluster_overrides, cluster_overrides
from simfog.errors import ConfigError
from simfog.files import check_output, new_run_dir
from simfog.sweeps import NO_INTERVAL, check_jobs, checked_grid, count_list, option_list


def add_arguments(parser) -> None:
    parser.add_argument("file", nargs="?", help="experiment TOML (default: the embedded example)")
    parser.add_argument("--ranks", default=None, help="comma-separated rank counts (default: the file's)")
    parser.add_argument("--nodes", default=None, help="comma-separated node counts, each of gpus_per_node ranks "
                        "(not with --ranks)")
    add_cluster_overrides(parser)
    parser.add_argument("--merge", default=None, help="comma-separated merge policies (default: the file's)")
    parser.add_argument("--collective", default=None, help="comma-separated collectives (default: the file's)")
    parser.add_argument("--threshold", default=None, help='comma-separated thresholds, e.g. "1MiB,25MiB"')
    parser.add_argument("-o", "--output", metavar="FILE", default=None,
                        help="the one file sweep writes: a CSV to append to; an existing one is resumed (its "
                        "finished points are not rerun, and a line says how many) (default: a new folder "
                        "simfog-out/sweep-<UTC time>/ holding sweep.csv)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="local worker processes")
    parser.add_argument("--scheduler", default=None, help="Dask scheduler address (tcp://host:port)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (shown only on a terminal)")
    parser.add_argument("--json", action="store_true", help="print {\"rows\": [...]} (the table's rows, full "
                        "precision, typed) instead of the table")
    add_cost_arguments(parser)
    add_level_argument(parser)


def add_level_argument(parser) -> None:
    """--level: each row's prediction interval (shared with curve)."""
    parser.add_argument("--level", type=float, default=None,
                        help="add each row's prediction interval at this level, e.g. 0.9 (columns "
                             "iteration_time_lo_s ... interval_unmeasured; 5 simulations a row instead of 1)")


def level_from_args(args) -> float | None:
    from simfog.bands import check_level

    return None if args.level is None else check_level(args.level, "--level")


def add_cost_arguments(parser) -> None:
    """--catalogue, --option, --epoch-samples: cost columns in the table and JSON (shared with curve)."""
    parser.add_argument("--catalogue", default=None, help="a price catalogue (as simfog plan reads): adds "
                        "cost_per_hour (ranks x the option's price per GPU-hour) to the table and JSON; the "
                        "experiment's own cluster is simulated, priced as the option")
    parser.add_argument("--option", default=None, help="the catalogue's option whose price applies (default: its "
                        "only option)")
    parser.add_argument("--epoch-samples", type=float, default=None,
                        help="with --catalogue: also epoch_time_s and cost_per_epoch for an epoch of N samples")


def pricing_from_args(args):
    """(option, epoch samples) from --catalogue/--option/--epoch-samples, or None without --catalogue. Raises
    ConfigError for --option or --epoch-samples without a catalogue, or a bad one."""
    from simfog.commands.plan import epoch_from_args
    from simfog.plan import load_catalogue
    from simfog.pricing import option_named

    if args.catalogue is None:
        for flag, value in (("--option", args.option), ("--epoch-samples", args.epoch_samples)):
            if value is not None:
                raise ConfigError(flag, value, "used with --catalogue FILE (the prices)")
        return None
    catalogue = load_catalogue(args.catalogue)
    return option_named(catalogue, args.option), epoch_from_args(args), catalogue.currency


def with_costs(rows: list[dict], pricing) -> list[dict]:
    """`rows` with cost columns when `pricing` (from pricing_from_args) is given."""
    from simfog.pricing import priced

    return rows if pricing is None else priced(rows, pricing[0], pricing[1])


def load_cluster(args):
    """The experiment of args.file (or the embedded default) on the cluster the command line's --gpus-per-node,
    --nic-bandwidth and --network describe (simfog.overrides; shared with curve)."""
    from simfog.overrides import load_with_overrides

    return load_with_overrides(args.file, **{k: v for k, v in cluster_overrides(args).items() if k != "nodes"})


def ranks_of_nodes(nodes: list[int], exp, text: str) -> list[int]:
    """Rank counts of node counts (each checked as [cluster] nodes: an integer >= 1), gpus_per_node each."""
    for n in nodes:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError("--nodes", text, "comma-separated integers >= 1, e.g. 2,8,32")
    return [n * exp.cluster.ranks_per_node for n in nodes]


def run(args) -> int:
    from simfog import experiment, sweeps

    if args.output is not None:
        check_output(args.output, field="-o")
    check_jobs(args.jobs)
    if args.ranks is not None and args.nodes is not None:
        raise ConfigError("--nodes", args.nodes, "either --ranks or --nodes, not both")
    pricing = pricing_from_args(args)
    exp = load_cluster(args)
    if args.nodes is not None:
        ranks = ranks_of_nodes(count_list(args.nodes, "--nodes"), exp, args.nodes)
    else:
        ranks = count_list(args.ranks, "--ranks") if args.ranks is not None else [exp.ranks]
    thresholds = ([experiment.comm_value("threshold", t, field="--threshold")
                   for t in option_list(args.threshold, "--threshold")]
                  if args.threshold is not None else [exp.comm.threshold_bytes])
    points = checked_grid(exp, ranks, args.merge, args.collective, thresholds)
    level = level_from_args(args)

    def run_sweep(csv):
        announce_resume(exp, points, csv, level)
        return sweeps.run(exp, points, csv, jobs=args.jobs, scheduler=args.scheduler, progress=not args.no_progress,
                          level=level)

    if args.output is not None:
        csv = args.output
        rows = run_sweep(csv)
    else:
        with new_run_dir("sweep") as out:
            rows = run_sweep(out.path / "sweep.csv")
        csv = out.final / "sweep.csv"
    if level is not None:
        rows = sweeps.against_fastest(exp, rows, level)
    report(with_costs(rows, pricing), args.json, {"csv": str(csv)}, [f"wrote {csv}"],
           currency=pricing[2] if pricing else None)
    return 0


def announce_resume(exp, points, csv, level: float | None = None) -> None:
    """One line on stderr when `csv` already holds some of the points: the sweep resumes, reusing them."""
    import sys

    from simfog.sweeps import reused_rows

    reused = reused_rows(exp, points, csv, level)
    if reused:
        print(f"resuming {csv}: {reused} of {len(points)} rows reused from it, {len(points) - reused} to run",
              file=sys.stderr)


def report(rows: list[dict], as_json: bool, files: dict, wrote: list[str], currency: str | None = None) -> None:
    """The table (and the files written) on stdout, or with --json one object {"rows": [...], **files} on stdout
    and the files written on stderr, so that stdout parses as JSON. `currency`: the rows carry cost columns."""
    import sys

    from simfog.cli import print_json

    if as_json:
        print_json({"rows": [typed_row(r) for r in rows], "estimated": any(_true(r.get("estimated")) for r in rows),
                    **({"currency": currency} if currency else {}), **files})
        for line in wrote:
            print(line, file=sys.stderr)
        return
    print(format_table(rows, currency))
    for line in wrote:
        print(line)


INT_COLUMNS = ("ranks", "buckets", "seed")
FLOAT_COLUMNS = ("threshold_bytes", "iteration_time_s", "samples_per_s", "scaling_efficiency", "compute_s", "comm_s",
                 "comm_exposed_s", "idle_s", "overlap_fraction", "memory_peak_B", "price_per_gpu_hour",
                 "cost_per_hour", "epoch_time_s", "cost_per_epoch", "iteration_time_lo_s", "iteration_time_hi_s",
                 "samples_per_s_lo", "samples_per_s_hi", "scaling_efficiency_lo", "scaling_efficiency_hi",
                 "vs_fastest")


def typed_row(row: dict) -> dict:
    """A sweep CSV row (all strings) with numbers as numbers, booleans as booleans and empty cells as null."""
    import math

    out = {}
    for k, v in row.items():
        if k in INT_COLUMNS + FLOAT_COLUMNS:
            # "" in a CSV, NaN in a DataFrame: a point that could not run (JSON has no NaN)
            v = None if v in ("", None) or (isinstance(v, float) and math.isnan(v)) else float(v)
            if v is not None and k in INT_COLUMNS:
                v = int(v)
        elif k in ("estimated", "memory_complete"):
            v = _true(v)
        elif k == "within_uncertainty":
            v = None if v == "" else bool(v)
        elif k == "interval_level":
            v = None if v in ("", None, NO_INTERVAL) else float(v)
        elif k == "interval_unmeasured":
            v = [p for p in (v or "").split(",") if p]
        out[k] = v
    return out


def _true(v) -> bool:
    return v is True or v == "True"


def format_table(rows: list[dict], currency: str | None = None) -> str:
    """The rows as a table; with `currency`, their cost columns too (simfog.plan.priced)."""
    from simfog.commands.plan import duration

    epoch = currency is not None and any("cost_per_epoch" in r for r in rows)
    levels = {r.get("interval_level") for r in rows if r.get("interval_level") not in (None, "", NO_INTERVAL)}
    head = f"{'ranks':>6} {'merge':<10} {'collective':<12} {'iter time':>10}"
    if levels:
        head += f" {f'{100 * float(levels.pop()):g} % interval':>21}"
    head += f" {'samples/s':>11} {'efficiency':>10}"
    weighed = any("vs_fastest" in r for r in rows)
    if weighed:
        head += f" {'vs fastest':>11}  "
    if currency:
        head += f" {currency + '/h':>10}" + (f" {'epoch':>10} {currency + '/epoch':>12}" if epoch else "")
    lines = [head]
    if any(_true(r.get("estimated")) for r in rows):
        # The table is often all a reader sees: say so before the numbers, as simulate's summary does.
        lines.insert(0, "ESTIMATED: these rows come from estimated compute times (see the trace's provenance)")
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['ranks']:>6} {r['merge']:<10} {r['collective']:<12} error: {r['error']}")
            continue
        line = (f"{r['ranks']:>6} {r['merge']:<10} {r['collective']:<12} "
                f"{units.format_time(float(r['iteration_time_s'])):>10}")
        if "interval" in head:
            bounds = (f"{units.format_time(float(r['iteration_time_lo_s']))}–"
                      f"{units.format_time(float(r['iteration_time_hi_s']))}"
                      + ("*" if r.get("interval_unmeasured") else "")) if r.get("iteration_time_lo_s") else ""
            line += f" {bounds:>21}"
        line += f" {float(r['samples_per_s']):>11.1f} {100 * float(r['scaling_efficiency']):>9.1f}%"
        if weighed:
            vs = r.get("vs_fastest", "")
            line += f" {'' if vs == '' else 'fastest' if vs == 0 else f'{100 * vs:+.1f}%':>11}"
            line += " ≈" if r.get("within_uncertainty") is True else "  "
        if currency:
            line += f" {float(r['cost_per_hour']):>10,.2f}"
            if epoch:
                line += f" {duration(float(r['epoch_time_s'])):>10} {float(r['cost_per_epoch']):>12,.2f}"
        lines.append(line + (f"  {r['warnings']}" if r.get("warnings") else ""))
    if any(r.get("interval_unmeasured") for r in rows):
        lines.append("* the interval holds parts nothing measured (a stated width; interval_unmeasured names them)")
    if any(r.get("within_uncertainty") is True for r in rows):
        lines.append("≈ the model cannot tell this row from the fastest at its rank count (the interval of their "
                     "ratio, the same model error in both, reaches 1)")
    return "\n".join(lines)
