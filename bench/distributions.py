"""Distributions bench (issue 39): are the measured per-iteration times distributed as simfog predicts, and what
per-call variation costs at scale.

1. The rows of the last validate bench CSV (`simfog validate --bench` writes bench-validation/bench-validation.csv
   by default; --csv picks another), or, with --run, the bench's long rows run here (validate.bench.LONG: one MLP
   configuration per family, 4 ranks of one per node at 200 Mbit/s, 120 measured iterations, on the emulated
   cluster; CSV written to --out): per family the median KS distance of the per-iteration times against the floor
   of two samples of those sizes from one distribution, the share of rows differing at the 5 % level and the p99
   (validate.comparison.distributions.lines), over the rows the rig can emulate (not host-limited).
2. straggler_2048: the embedded default experiment (simfog.api.load()) at 2,048 ranks, its links given the
   measured per-call spread (the median nic_spread of the long rows, else of every row; the validator's calibration
   fits it from the microbenchmark's repetitions, simfog.variation), every call at its expected slowest
   (comm.variation = "expected"), its mean iteration over the same without the spread.
3. With --compute: how ranks' compute varies together, measured on real compute (validate mode "model": the MLP
   computed for real by every rank, 1 Gbit/s, 120 measured iterations, on 2 and on 4 ranks of one per node): per
   row the share of the per-(iteration, rank) compute variance the ranks of an iteration share (intraclass
   correlation, validate.comparison.distributions.shared_share) with a 90 % bootstrap interval, and which of
   independent (0 in the interval), shared (1 in it) or the fitted mix holds; fitted on the 2-rank row, judged on
   the 4-rank row: what its synchronous steps pay for their slowest rank's compute (the mean slowest over the mean),
   measured, against the same for 4 ranks drawing that row's own values under each choice (a judge that does not
   depend on the compute's level, which a host-limited model-mode run shifts).

Last line: long_rows=<n> ks_median=<x> ks_floor=<x> differ5=<pct> straggler_2048=<ratio> ks_shape_median=<x>
shape_differ5=<pct> (the last two: each sample over its own median, validate.comparison.distributions)

Usage: python bench/distributions.py [--csv PATH | --run [--out DIR]] [--compute]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simfog import api  # noqa: E402
from simfog.simulation import simulate  # noqa: E402
from validate.comparison import compare, distributions  # noqa: E402

DEFAULT_CSV = Path("bench-validation") / "bench-validation.csv"
RANKS = 2048


def bench_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_long_rows(out: Path) -> list[dict]:
    """The bench's long rows, run on their emulated cluster here; the CSV written to out/long-rows.csv."""
    from simfog import units
    from simfog.cluster import Cluster, Link
    from simfog.trace import load_model_trace
    from validate.bench import LONG_SHAPE, UNUSED_INTRA, long_rows, trace_path
    from validate.run import Options, run_group

    n, rpn, bw = LONG_SHAPE
    path = trace_path("mlp", 1024, out)
    trace = load_model_trace(path)
    cluster = Cluster(n // rpn, rpn, UNUSED_INTRA, Link(0.0, units.bandwidth(bw)))
    ids, exps = zip(*long_rows(trace, str(path), cluster), strict=True)
    run = run_group(list(exps), Options(mode="replay", warmup=3), ids=list(ids), log=print)
    out.mkdir(parents=True, exist_ok=True)
    compare.write_csv(run.rows, out / "long-rows.csv")
    print(f"wrote {out / 'long-rows.csv'}")
    return run.rows


def measured_spread(rows: list[dict]) -> float:
    """The median per-call spread of the NIC class fitted on the allreduce microbenchmark (the collective the
    default experiment runs), over the long rows, else every row (host-limited ones too: the spread is the
    calibration's, measured before the rows); 0 without any."""
    allreduce = [r for r in rows if r.get("calibration") == "gloo allreduce"]
    for pick in (distributions.is_long, lambda r: True):
        values = [compare._number(r.get("nic_spread")) for r in allreduce if pick(r)]
        values = [v for v in values if compare._finite(v)]
        if values:
            return statistics.median(values)
    return 0.0


def straggler_ratio(spread: float, ranks: int = RANKS) -> float:
    """The default experiment's mean iteration at `ranks` with every link's per-call spread `spread` (expected
    slowest per call) over the same without it."""
    exp = api.load(ranks=ranks)
    c = exp.cluster
    varied = replace(exp.with_comm(variation="expected"),
                     cluster=replace(c, nic=replace(c.nic, spread=spread), intra=replace(c.intra, spread=spread)))
    return simulate(varied).summary()["iteration_time_s"] / simulate(exp).summary()["iteration_time_s"]


def compute_draws() -> None:
    """Part 3: the shared share of real compute, fitted on 2 ranks and judged on 4 (module docstring)."""
    from simfog import units
    from simfog.cluster import Cluster, Link
    from simfog.experiment import Comm, Experiment, Workload
    from simfog.trace import load_model_trace
    from validate.bench import LONG_ITERATIONS, SEED, UNUSED_INTRA, trace_path
    from validate.run import Options, run_group

    path = trace_path("mlp", 1024, Path("bench-validation"))
    trace = load_model_trace(path)
    fitted = None
    for n in (2, 4):
        cluster = Cluster(n, 1, UNUSED_INTRA, Link(0.0, units.bandwidth("1Gbit/s")))
        exp = Experiment(SEED, LONG_ITERATIONS, Workload(trace, str(path), "samples"), cluster, Comm(merge="wfbp"))
        run = run_group([exp], Options(mode="model", warmup=3), ids=[f"mlp-wfbp-{n}r-model"], log=print)
        v = run.validations[0]
        if v.measured is None:
            print(f"{n} ranks: failed ({v.row.get('error')})")
            continue
        frame = v.measured.iterations()
        table = (frame.assign(c=frame.forward_s + frame.backward_s).pivot(index="iteration", columns="rank",
                                                                           values="c").to_numpy()[1:])
        share, lo, hi = distributions.shared_interval(table)
        holds = "independent" if lo <= 0.0 else "shared" if hi >= 1.0 else f"a mix, {share:.2f}"
        print(f"{n} ranks, {len(table)} iterations: compute shared share {share:.3f} (90 % interval {lo:.3f} to "
              f"{hi:.3f}): {holds}{' (host-limited row)' if compare.host_limited(v.row) else ''}")
        if fitted is None:
            fitted = 0.0 if lo <= 0.0 else 1.0 if hi >= 1.0 else round(share, 2)
            continue
        measured = distributions.slowest_over_mean(table)
        print(f"  judged on {n} ranks: the slowest rank's compute over the mean, measured {measured:.4f}; drawing "
              f"this row's own values with")
        off = {}
        for label, w in (("independent", 0.0), ("shared", 1.0), (f"fitted on 2 ranks ({fitted})", fitted)):
            got = distributions.predicted_slowest_over_mean(table, n, w)
            off[(label, w)] = abs(got - measured)
            print(f"    {label:28s} {got:.4f} ({got - measured:+.4f})")
        label, w = min(off, key=off.get)
        print(f"compute_draws: {label} holds best on the held-out row: compute_draws = {w}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help=f"a validate bench CSV (default {DEFAULT_CSV})")
    parser.add_argument("--run", action="store_true", help="run the long rows here instead of reading a CSV")
    parser.add_argument("--out", default="bench-distributions", help="with --run: folder of its CSV and traces")
    parser.add_argument("--compute", action="store_true", help="also measure how ranks' compute varies together")
    args = parser.parse_args(argv)
    if args.run:
        rows = run_long_rows(Path(args.out))
    elif Path(args.csv).is_file():
        rows = bench_rows(Path(args.csv))
        print(f"{len(rows)} rows of {args.csv}")
    else:
        rows = []
        print(f"no bench CSV at {args.csv} (run `simfog validate --bench`, or this with --run)")
    emulable = [r for r in rows if not compare.host_limited(r)]
    if len(emulable) < len(rows):
        print(f"{len(rows) - len(emulable)} host-limited row(s) set aside (validate.cluster.hostload)")
    for line in distributions.lines(emulable):
        print(line)
    if args.compute:
        compute_draws()
    long = distributions.summary([r for r in emulable if distributions.is_long(r)])
    spread = measured_spread(rows)
    ratio = straggler_ratio(spread) if spread > 0 else 1.0
    print(f"measured per-call spread (NIC class, median): {spread:.2%}; the default experiment at {RANKS} ranks, "
          f"every call at its expected slowest: {ratio:.4f} x the iteration without it")
    fmt = (lambda x: "nan" if not math.isfinite(x) else f"{x:.3f}")
    differ = "nan" if not math.isfinite(long["differ5"]) else f"{long['differ5']:.1%}"
    shape_differ = "nan" if not math.isfinite(long["shape_differ5"]) else f"{long['shape_differ5']:.1%}"
    print(f"long_rows={long['rows']} ks_median={fmt(long['ks_median'])} ks_floor={fmt(long['ks_floor'])} "
          f"differ5={differ} straggler_2048={ratio:.4f} ks_shape_median={fmt(long['shape_median'])} "
          f"shape_differ5={shape_differ}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
