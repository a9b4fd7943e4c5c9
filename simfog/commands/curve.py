"""`simfog curve FILE.toml --ranks 4,8,...,2048 --merge ddp,wfbp,mgwfbp -o DIR`: throughput and scaling
efficiency against ranks for several merge policies or collectives: DIR/curve.png, DIR/curve.svg and DIR/curve.csv.

The runs go through simfog.sweeps, so DIR/curve.csv is a sweep CSV: an interrupted curve resumes where it stopped.
Each row records the experiment, trace (path and content hash), compute mode and seed it came from. Without -o
every run gets a new folder simfog-out/curve-<UTC time>/.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from simfog.errors import ConfigError
from simfog.experiment import MAX_RANK_ITERATIONS

if TYPE_CHECKING:
    import pandas as pd

MAX_POINTS = 1000  # rank counts one curve may have: each is a simulation


def parse_ranks(text: str, option: str = "--ranks") -> list[int]:
    """"4,8,16" as given; "4,8,...,2048" expands geometrically (ratio 8/4) or arithmetically ("8,16,...,64") when
    the second step is not a whole ratio. Raises ConfigError naming `option` for anything else."""
    try:
        return _series(text)
    except ConfigError as e:
        raise ConfigError(option, e.value, e.allowed) from None


def _series(text: str) -> list[int]:
    from simfog.sweeps import option_list

    bad = ConfigError("--ranks", text, 'comma-separated integers, e.g. 4,8,16 or 4,8,...,2048')
    try:
        parts = option_list(text, "--ranks")
    except ConfigError:
        raise bad from None
    if not all(p == "..." or (p.isascii() and p.isdigit()) for p in parts):  # int() reads "4_0", "٤"
        raise bad
    if "..." not in parts:
        try:
            return [int(p) for p in parts]
        except ValueError:
            raise bad from None
    if len(parts) != 4 or parts[2] != "...":
        raise bad
    try:
        a, b, z = int(parts[0]), int(parts[1]), int(parts[3])
    except ValueError:
        raise bad from None
    if not 0 < a < b <= z:
        raise bad
    if z > MAX_RANK_ITERATIONS or (b % a and (z - a) // (b - a) >= MAX_POINTS):  # before building the series
        raise ConfigError("--ranks", text, f"a series of at most {MAX_POINTS} rank counts up to "
                          f"{MAX_RANK_ITERATIONS:,} ranks")
    out = [a]
    if b % a == 0 and b // a > 1:
        while out[-1] * (b // a) <= z:
            out.append(out[-1] * (b // a))
    else:
        out = list(range(a, z + 1, b - a))
    if out[-1] != z:
        raise ConfigError("--ranks", text, f"a last value the series reaches ({out[-1]} is followed by "
                          f"{out[-1] * (b // a) if b % a == 0 else out[-1] + b - a})")
    return out


def add_arguments(parser) -> None:
    parser.add_argument("file", nargs="?", help="experiment TOML (default: the embedded example)")
    parser.add_argument("--ranks", help="rank counts: 4,8,16 or 4,8,...,2048 (this or --nodes)")
    parser.add_argument("--nodes", help="node counts, each of gpus_per_node ranks: 2,4,8 or 1,2,...,256")
    from simfog.commands.simulate import add_cluster_overrides

    add_cluster_overrides(parser)
    parser.add_argument("--merge", help="comma-separated merge policies (default: the file's)")
    parser.add_argument("--collective", help="comma-separated collectives (default: the file's)")
    parser.add_argument("--compute", choices=("mean", "samples"),
                        help="layer times: means (fast symmetric path for thousands of ranks) or samples "
                             "(default: the file's)")
    parser.add_argument("-o", "--output", metavar="DIR", default=None,
                        help="a folder (made if missing): writes DIR/curve.png, DIR/curve.svg, DIR/curve.csv; an "
                        "existing DIR/curve.csv is resumed and its plots redrawn (default: a new folder "
                        "simfog-out/curve-<UTC time>/)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing DIR/curve.png or DIR/curve.svg "
                        "that has no DIR/curve.csv beside it")
    parser.add_argument("--json", action="store_true", help="print {\"rows\": [...]} (the table's rows, full "
                        "precision, typed) instead of the table")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="local worker processes")
    parser.add_argument("--scheduler", default=None, help="Dask scheduler address (tcp://host:port)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    from simfog.commands.sweep import add_cost_arguments, add_level_argument

    add_cost_arguments(parser)
    add_level_argument(parser)


def curve_frame(rows: list[dict], points) -> pd.DataFrame:
    """The sweep rows of `points` (a CSV may hold others from earlier runs) with numeric columns as numbers."""
    from simfog.sweeps import key_of_row

    wanted = {p.key() for p in points}
    import pandas as pd  # here, not at the top: every command's start-up would pay for it

    df = pd.DataFrame([r for r in rows if key_of_row(r) in wanted])
    for c in ("ranks", "iteration_time_s", "samples_per_s", "scaling_efficiency", "comm_s", "comm_exposed_s"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df["error"] = df["error"].fillna("")
    return df.sort_values(["merge", "collective", "ranks"], kind="stable").reset_index(drop=True)


def run(args) -> int:
    from simfog.commands.outputs import folder_prefix
    from simfog.commands.sweep import (
        level_from_args,
        load_cluster,
        pricing_from_args,
        ranks_of_nodes,
        report,
        with_costs,
    )
    from simfog.files import check_output, new_run_dir, refuse_existing
    from simfog.sweeps import check_jobs, checked_grid

    if args.output is not None:
        args.output = folder_prefix(args.output, "curve")  # -o DIR: DIR/curve.* from here on

    if (args.ranks is None) == (args.nodes is None):
        raise ConfigError("--ranks", "(missing)" if args.ranks is None else args.ranks,
                          "rank counts (4,8,...,2048) or --nodes node counts (1,2,...,256), one of the two")
    exp = load_cluster(args)
    if args.compute:
        exp = replace(exp, workload=replace(exp.workload, compute=args.compute))
    ranks = (parse_ranks(args.ranks) if args.nodes is None
             else ranks_of_nodes(parse_ranks(args.nodes, "--nodes"), exp, args.nodes))
    check_jobs(args.jobs)
    pricing = pricing_from_args(args)
    args.level = level_from_args(args)  # checked before anything is written
    for suffix in ("csv", "png", "svg") if args.output is not None else ():
        check_output(f"{args.output}.{suffix}", field="-o")
    points = checked_grid(exp, ranks, args.merge, args.collective, [exp.comm.threshold_bytes])
    if args.output is not None:
        if not Path(f"{args.output}.csv").exists():  # resuming redraws the plots of that CSV; else never overwrite
            refuse_existing([f"{args.output}.png", f"{args.output}.svg"], force=args.force)
        df = _run(exp, points, args, args.output)
        prefix = args.output
    else:
        with new_run_dir("curve") as out:
            df = _run(exp, points, args, out.path / "curve")
        prefix = out.final / "curve"
    rows = df.astype({"ranks": int}).to_dict("records")
    level = args.level
    if level is not None:
        from simfog.sweeps import against_fastest

        rows = against_fastest(exp, rows, level)
    written = f"wrote {prefix}.png, {prefix}.svg, {prefix}.csv"
    errors = df[df.error != ""]
    note = [f"{len(errors)} point(s) could not run and are not plotted (see the error column)"] if len(errors) else []
    report(with_costs(rows, pricing), args.json, {"csv": f"{prefix}.csv", "png": f"{prefix}.png",
                                                  "svg": f"{prefix}.svg"}, note + [written],
           currency=pricing[2] if pricing else None)
    return 0


def _run(exp, points, args, prefix) -> pd.DataFrame:
    """Run (or resume) the sweep into PREFIX.csv and draw PREFIX.png and PREFIX.svg (PREFIX: DIR/curve); the
    curve's rows."""
    from simfog import plot, sweeps
    from simfog.commands.sweep import announce_resume

    level = args.level
    announce_resume(exp, points, f"{prefix}.csv", level)
    rows = sweeps.run(exp, points, f"{prefix}.csv", jobs=args.jobs, scheduler=args.scheduler,
                     progress=not args.no_progress, level=level)
    df = curve_frame(rows, points)
    from simfog.titles import run_title

    title = run_title(exp, collective=", ".join(dict.fromkeys(p.collective for p in points)), ranks=False)
    fig = plot.curve_figure(df, title)
    for suffix in ("png", "svg"):
        plot.save(fig, f"{prefix}.{suffix}")
    return df
