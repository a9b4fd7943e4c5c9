"""`simfog collect network`: the command-line edge of validate.collect.collect_network.

    simfog collect network --backend gloo --ranks 2 --max-size 256MiB --repeats 5 -o traces/net-gloo.json.gz
"""

from __future__ import annotations

import argparse
import shlex

from simfog import units
from simfog.errors import ConfigError
from validate.collect.collect_network import BACKENDS, COLLECTIVES, collect_network, default_sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `simfog collect network` to `parser`."""
    parser.add_argument("--backend", choices=BACKENDS, default="gloo",
                        help="gloo (CPU, TCP), nccl (one GPU per rank) or mpi (mpi4py, Open MPI over TCP)")
    parser.add_argument("--ranks", type=int, default=2, help="number of processes (default 2)")
    parser.add_argument("--min-size", default="4B", help="smallest message, with unit (default 4B)")
    parser.add_argument("--max-size", default="256MiB", help="largest message, with unit (default 256MiB)")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES),
                        help=f"comma-separated, from {', '.join(COLLECTIVES)} (default all)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per size (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls before each size (default 1)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="spread the repeats over this many passes through all sizes (default 1; more on a "
                             "shared machine, so bursts of other work spoil few samples of each size)")
    parser.add_argument("--timeout", default="30min", help="time limit for the whole run, with unit (default 30min)")
    parser.add_argument("-o", "--output", required=True, help="NetworkTrace to write (.json or .json.gz)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")


def run(args: argparse.Namespace) -> int:
    """Collect, write the trace atomically, print one line per collective. Returns the exit status (0).
    Raises ConfigError for bad options and the errors of collect_network."""
    from simfog.files import refuse_existing

    refuse_existing([args.output], force=args.force)  # before minutes of measuring, not after
    lo = units.nbytes(args.min_size, field="--min-size")
    hi = units.nbytes(args.max_size, field="--max-size")
    if lo != int(lo) or hi != int(hi):
        raise ConfigError("--min-size/--max-size", f"{args.min_size}/{args.max_size}", "whole numbers of bytes")
    collectives = tuple(c.strip() for c in args.collectives.split(",") if c.strip())
    trace = collect_network(args.backend, args.ranks, sizes=default_sizes(int(hi), int(lo)),
                            collectives=collectives, repeats=args.repeats, warmup=args.warmup, rounds=args.rounds,
                            timeout_s=units.seconds(args.timeout, field="--timeout"),
                            command=_command(args))
    trace.save(args.output)
    for coll in dict.fromkeys(m.collective for m in trace.measurements):
        ms = [m for m in trace.measurements if m.collective == coll]
        first, last = ms[0], ms[-1]
        print(f"{coll:15s} {units.format_bytes(first.bytes):>10s} {units.format_time(min(first.time_s)):>10s}"
              f"   {units.format_bytes(last.bytes):>10s} {units.format_time(min(last.time_s)):>10s}")
    print(f"wrote {args.output} ({len(trace.measurements)} measurements)")
    return 0


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (for the trace's provenance)."""
    return "simfog collect network " + shlex.join([
        "--backend", args.backend, "--ranks", str(args.ranks), "--min-size", args.min_size, "--max-size",
        args.max_size, "--collectives", args.collectives, "--repeats", str(args.repeats), "--warmup",
        str(args.warmup), "--rounds", str(args.rounds), "--timeout", args.timeout, "-o", args.output])
