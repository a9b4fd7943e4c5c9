"""`simfog validate FILE.toml` and `simfog validate --bench`: run experiments for real, simulate them, compare.

Real runs use an emulated cluster (network namespaces, tbf-shaped links; root, `ip` and `tc` needed, else plain
loopback and every row says `emulated = False`); the simulated side uses the cluster calibrated from gloo
allreduce microbenchmarks on that same network and collective "gloo_ring" (for the decentralized
algorithms "neighbor" and "wagma", replay mode only: from gloo sendrecv microbenchmarks; see validate.run).
Sharded algorithms, replay mode only: "fsdp" runs FSDP2 itself per unit (validate.ranks.fsdp), "zero2" a hand-written
DeepSpeed stage 2 (validate.ranks.zero); fsdp rows also compare the measured memory peak with simfog's.
Prints measured and predicted iteration time and the relative error per configuration, writes a CSV, optionally
both timelines and an HTML report: all in the folder -o DIR (output_paths; the older --csv, --out, --report and
--timeline-dir name each path themselves). torch is imported only when the command runs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("file", nargs="?", help="experiment TOML (not with --bench)")
    parser.add_argument("--bench", action="store_true",
                        help="run the fixed validation matrix (replay; 2 models x 5 policies x 2/4/8 ranks x "
                             "2 NIC rates x 2 layouts, plus one-peer exp2 neighbour averaging and WAGMA on 4/8 "
                             "ranks, and FSDP2 with 2 unit sizes, with and without reshard_after_forward, on "
                             "2/4/8 ranks) and print the median and worst error")
    parser.add_argument("--quick", action="store_true", help="with --bench: a small matrix (smoke test)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="with --bench: run the matrix this many times (CSV per run) and report each "
                             "configuration's errors and the spread of its measured time")
    parser.add_argument("--mode", choices=("replay", "model"), default="replay",
                        help="replay: each layer waits its traced time (default); model: real forward and backward "
                             "of the zoo model the trace was measured on")
    parser.add_argument("--merge", help="comma-separated merge policies to validate in one launch "
                                        "(default: the file's comm.merge)")
    parser.add_argument("--iterations", type=int, help="override the measured iteration count")
    parser.add_argument("--warmup", type=int, default=2, help="iterations run first and dropped (default 2)")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="a folder (made if missing) for the files validate writes: DIR/validation.csv (with "
                        "--bench: DIR/bench-validation.csv and the collected traces), and DIR/validation.html and "
                        "DIR/timelines/ when --report or --timeline-dir is given without a path. The older options "
                        "--csv, --out, --report FILE and --timeline-dir DIR still name each path (and win over -o). "
                        "Default: a new folder simfog-out/validate-<UTC time>/ holding validation.csv (with --bench: "
                        "bench-validation/)")
    parser.add_argument("--csv", metavar="CSV", help="where to write the comparison (a file: the older spelling, "
                        "kept for scripts; default DIR/validation.csv of -o, else a new folder "
                        "simfog-out/validate-<UTC time>/ holding validation.csv, or OUT/bench-validation.csv)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --csv file (or -o's "
                        "DIR/validation.csv)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="with --bench: directory for the CSV and collected traces (the older spelling of -o, "
                        "kept for scripts; default bench-validation)")
    parser.add_argument("--timeline-dir", metavar="DIR", nargs="?", const="",
                        help="write measured and predicted intervals (CSV, Result.intervals() schema) and Chrome "
                             "traces per configuration, into DIR (without DIR: -o's DIR/timelines/)")
    net = parser.add_mutually_exclusive_group()
    net.add_argument("--loopback", action="store_true", help="plain loopback, no emulated network")
    net.add_argument("--emulate", action="store_true", help="fail unless the emulated network can be built")
    parser.add_argument("--workdir", metavar="DIR", help="keep the run spec and per-rank records here (with "
                                                           "--launcher slurm: a folder every node sees)")
    parser.add_argument("--launcher", choices=("local", "torchrun", "slurm"), default="local",
                        help="who starts the ranks: local (simfog, in the emulated node namespaces), torchrun (one "
                             "agent per node, c10d rendezvous), slurm (srun inside an allocation: one torchrun "
                             "agent per node of the experiment's cluster)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="the ranks' process group: gloo on CPUs (default), or nccl with one GPU per rank (CUDA "
                             "events time compute and each bucket; calibrated with simfog's NCCL model on the same "
                             "GPUs, and simulated with collective nccl)")
    parser.add_argument("--print-commands", action="store_true",
                        help="with --launcher torchrun --hosts: print the node-agent command to start on each host "
                             "of a real cluster and exit")
    parser.add_argument("--hosts", help="with --launcher torchrun: the real cluster's host names, comma-separated, "
                                        "in node order (the first hosts the rendezvous); one node agent runs on "
                                        "each (simfog prints their commands) and --workdir must be a folder every "
                                        "host sees")
    parser.add_argument("--rdzv-port", type=int, default=29400,
                        help="with --hosts: the rendezvous port on the first host (default 29400)")
    parser.add_argument("--secret-file", metavar="FILE",
                        help="with --hosts: the secret the node agents and the validator share (a file only you can "
                             "read, the same on every host; make one with `python -m validate.launch.shared_dir "
                             "--new-secret FILE`): every request is signed with it")
    parser.add_argument("--show-calibration", action="store_true", help="print the calibration fit and residuals")
    parser.add_argument("--report", metavar="OUT.html", nargs="?", const="",
                        help="also write one self-contained HTML page: the table, measured vs predicted with error "
                             "bars, both timelines side by side and the calibration residuals (without OUT.html: "
                             "-o's DIR/validation.html, with --bench OUT/validation.html)")


@dataclass(frozen=True)
class OutputPaths:
    """Where validate writes: the comparison CSV (None: a new folder simfog-out/validate-<UTC time>/, or with
    --bench OUT/bench-validation.csv), the bench's folder, the HTML report and the timelines' folder (None: not
    written)."""

    csv: str | None
    bench_dir: str
    report: str | None
    timelines: str | None


def output_paths(args) -> OutputPaths:
    """The paths -o DIR and the older --csv, --out, --report and --timeline-dir name (simfog.commands.outputs'
    convention: -o is a folder, since validate writes several files; each older option still names its own path
    and wins over -o). Raises ConfigError for -o naming a file, or --report / --timeline-dir without a path and no
    folder to put them in."""
    from simfog.commands.outputs import folder_prefix
    from simfog.errors import ConfigError

    prefix = folder_prefix(args.output, "validation") if args.output is not None else None
    bench_dir = args.out or args.output or "bench-validation"
    folder = args.output if args.output is not None else (bench_dir if args.bench else None)
    csv = args.csv or (f"{prefix}.csv" if prefix is not None and not args.bench else None)

    def in_folder(option: str, value: str | None, name: str) -> str | None:
        if value is None or value != "":
            return value
        if folder is None:
            raise ConfigError(option, "(no path)", f"a path, or -o DIR to write DIR/{name}")
        return str(Path(folder) / name)

    return OutputPaths(csv, bench_dir, in_folder("--report", args.report, "validation.html"),
                       in_folder("--timeline-dir", args.timeline_dir, "timelines"))


def run(args) -> int:
    from simfog import experiment
    from simfog.errors import ConfigError
    from simfog.files import refuse_existing
    from validate.comparison import compare
    from validate.run import Options, export_timelines, validate_experiment

    paths = output_paths(args)
    refuse_existing([paths.csv], force=args.force, option="--csv" if args.csv else "-o")  # before the real runs
    emulate = False if args.loopback else (True if args.emulate else None)
    if args.warmup is None or args.warmup < 1:
        raise ConfigError("--warmup", args.warmup, "an integer >= 1")
    if args.launcher == "slurm" and not args.workdir:
        raise ConfigError("--workdir", "(missing)", "a folder on a filesystem every node of the allocation sees "
                          "(the ranks read the run spec and write their records there)")
    if args.print_commands:
        return _print_commands(args)
    hosts = _hosts(args)
    if hosts is not None and not args.workdir:
        raise ConfigError("--workdir", "(missing)", "with --hosts: a folder every host sees (the node agents read "
                          "the launch requests there and the ranks write their records there)")
    if hosts is not None and not args.secret_file:
        raise ConfigError("--secret-file", "(missing)", "with --hosts: the node agents' secret (make one with "
                          "`python -m validate.launch.shared_dir --new-secret FILE`)")
    if args.secret_file and hosts is None:
        raise ConfigError("--secret-file", args.secret_file, "only with --launcher torchrun --hosts")
    options = Options(mode=args.mode, warmup=args.warmup, emulate=emulate, workdir=args.workdir,
                      launcher=args.launcher, srun=os.environ.get("SIMFOG_SRUN", "srun"), backend=args.backend,
                      hosts=hosts, rdzv_port=args.rdzv_port, secret_file=args.secret_file)
    log = lambda s: print(s, file=sys.stderr, flush=True)
    if args.bench:
        if args.file:
            raise ConfigError("file", args.file, "no experiment file with --bench (the matrix is fixed)")
        if args.mode != "replay":
            raise ConfigError("--mode", args.mode, "replay with --bench")
        if args.backend != "gloo":
            raise ConfigError("--backend", args.backend, "gloo with --bench (its matrix is the emulated CPU cluster)")
        from validate.bench import run_bench

        if isinstance(args.repeat, bool) or args.repeat < 1:
            raise ConfigError("--repeat", args.repeat, "an integer >= 1")
        from validate.bench import repeat_summary

        runs: list | None = [] if paths.report else None
        all_rows = []
        for k in range(args.repeat):
            whole = Path(paths.csv or Path(paths.bench_dir) / "bench-validation.csv")
            csv_path = paths.csv if args.repeat == 1 else str(whole.with_suffix(f".run{k + 1}.csv"))
            if args.repeat > 1:
                print(f"== bench run {k + 1} of {args.repeat}")
            all_rows.append(run_bench(paths.bench_dir, quick=args.quick, options=options, log=print,
                                      csv_path=csv_path, runs=runs))
        if args.repeat > 1:
            print(repeat_summary(all_rows))
        if paths.report:
            _report(paths.report, runs, "simfog validate --bench" + (" --quick" if args.quick else ""), log)
        return 1 if any(r.get("error") for rows in all_rows for r in rows) else 0
    if not args.file:
        raise ConfigError("file", "(missing)", "an experiment TOML file, or --bench")
    if args.iterations is not None and args.iterations < 1:
        raise ConfigError("--iterations", args.iterations, "an integer >= 1")
    from simfog import jobs

    if jobs.is_jobs_file(args.file):
        return _validate_jobs(args, paths, options, log)
    exp = experiment.load(args.file)
    if args.iterations is not None:
        exp = replace(exp, iterations=args.iterations)
    if exp.comm.algorithm == "allreduce" and exp.comm.collective not in ("ring", "gloo_ring"):
        log(f"note: comm.collective = {exp.comm.collective!r} is simulated as 'gloo_ring' here (what gloo runs)")
    merges = [m.strip() for m in args.merge.split(",") if m.strip()] if args.merge else None
    group = validate_experiment(exp, options, merges=merges, log=log)
    if group.note:
        log(group.note)
    if args.show_calibration and group.calibration is not None:
        print(group.calibration.report())
    print(compare.format_table(group.rows))
    _write_rows(group.rows, paths.csv, log)
    if paths.timelines:
        for v in group.validations:
            for p in export_timelines(v, paths.timelines):
                log(f"wrote {p}")
    if paths.report:
        _report(paths.report, [group], f"simfog validate {args.file}", log)
    return 1 if any(r.get("error") for r in group.rows) else 0


def _validate_jobs(args, paths: OutputPaths, options, log) -> int:
    """A jobs file: every job alone and all together on one emulated fabric (validate.jobs)."""
    from simfog import jobs
    from simfog.errors import ConfigError
    from validate.comparison import compare
    from validate.jobs import format_slowdowns, validate_jobs

    for flag, value in (("--merge", args.merge), ("--timeline-dir", paths.timelines), ("--report", paths.report)):
        if value:
            raise ConfigError(flag, value, f"left out for a jobs file ({args.file}: each job's [comm] says its "
                              "merge; timelines and reports are of single experiments)")
    loaded = jobs.load(args.file)
    if args.iterations is not None:
        loaded = [replace(j, experiment=replace(j.experiment, iterations=args.iterations)) for j in loaded]
    run = validate_jobs(loaded, options, source=args.file, log=log)
    print(compare.format_table(run.rows))
    print(format_slowdowns(run.rows))
    _write_rows(run.rows, paths.csv, log)
    return 1 if any(r.get("error") for r in run.rows) else 0


def _write_rows(rows, csv: str | None, log) -> None:
    """The comparison to `csv`, or to validation.csv in a new folder simfog-out/validate-<UTC time>/."""
    from simfog.files import new_run_dir
    from validate.comparison import compare

    if csv:
        path = Path(csv)
        compare.write_csv(rows, path)
    else:
        with new_run_dir("validate") as out:
            compare.write_csv(rows, out.path / "validation.csv")
        path = out.final / "validation.csv"
    log(f"wrote {path}")


def _report(path, groups, title: str, log) -> None:
    from validate.comparison.report import write_report

    log(f"wrote {write_report(path, groups, title=title)}")


def _hosts(args) -> tuple[str, ...] | None:
    """--hosts as a tuple (None when not given); ConfigError when given without --launcher torchrun."""
    from simfog.errors import ConfigError

    if args.hosts is None:
        return None
    hosts = tuple(h.strip() for h in args.hosts.split(",") if h.strip())
    if args.launcher != "torchrun" or not hosts:
        raise ConfigError("--hosts", args.hosts, "host names, comma-separated, with --launcher torchrun")
    return hosts


def _print_commands(args) -> int:
    """The node-agent command for each host of a real cluster (validate.launch.shared_dir), for a user to start
    before or while `simfog validate --launcher torchrun --hosts ... --workdir DIR` runs."""
    from simfog import experiment
    from simfog.errors import ConfigError
    from validate.launch.agent_request import load_secret
    from validate.launch.shared_dir import agent_commands

    hosts = _hosts(args)
    if args.launcher != "torchrun" or not args.file or hosts is None:
        raise ConfigError("--print-commands", True, "with --launcher torchrun, --hosts and an experiment file")
    exp = experiment.load(args.file)
    if len(hosts) != exp.cluster.nodes:
        raise ConfigError("--hosts", args.hosts, f"{exp.cluster.nodes} host names (cluster.nodes), the first "
                          "hosting the rendezvous")
    work = str(Path(args.workdir).resolve()) if args.workdir else "SHARED_DIR"
    if args.secret_file:
        load_secret(args.secret_file)  # refused now (missing, readable by others) rather than by every agent
    secret = str(Path(args.secret_file).resolve()) if args.secret_file else "SECRET_FILE"
    for host, command in zip(hosts, agent_commands(list(hosts), work, secret_file=secret, port=args.rdzv_port),
                             strict=True):
        print(f"# on {host}:\n{command}")
    if not args.secret_file:
        print("make SECRET_FILE once with: python -m validate.launch.shared_dir --new-secret SECRET_FILE (the same "
              "file on every host)", file=sys.stderr)
    print(f"then, on any host: simfog validate {args.file} --launcher torchrun --hosts {','.join(hosts)} "
          f"--workdir {work} --secret-file {secret}", file=sys.stderr)
    return 0
