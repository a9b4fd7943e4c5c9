"""Held-out fidelity of simfog's NCCL model on public nccl-tests logs of every cluster the project holds.

Each cluster (bench/nccl_corpus.py: every folder of bench/data/nccl-tests, and the two reference clusters of
bench/data/ref/nccl-tests with their facts in bench/data/nccl-tests-ref-facts) is calibrated as `simfog calibrate` does
(simfog.nccl.fit) on its single-node and 2-node logs, with the facts its provenance states, then every larger log
(3+ nodes, or more GPUs per node than any calibration log) is predicted at every size and collective and compared
with the measured time (the least of out-of-place and in-place). Disturbed points are set aside by one fixed rule
(nccl_corpus.DISTURBED_RULE) and counted.

Logs of at most 2 nodes cannot identify two of simfog's terms: the tree's pipeline fill (it grows with the tree's
depth) and the bandwidth a 2-node tree delivers relative to the ring of 3+ nodes. Their values where the logs cannot
tell are learned across clusters, leave-one-cluster-out: cluster k is predicted with the grid values (GRID) that
give the least mean of the per-cluster median errors over the held-out points of the OTHER clusters; the figures
printed are those. simfog's shipped defaults (simfog.nccl.fit.UNIDENTIFIED) are the values learned from all
clusters; the bench says whether they still are.

Scale-out from the fabric (simfog.nccl.scale_out): where a cluster's facts give its fabric (`scale_out`, stated or
inferred with the reason), the calibration divides out what the fabric takes from its logs' patterns and the
prediction at 3+ nodes multiplies in what it takes there (hashing collisions of send/recv across rails, an
oversubscribed core); nothing of it is fitted or learned.

Intervals (simfog.bands, simfog.nccl.bands): each cluster's 90 % interval is fitted WITHOUT that cluster,
as its point predictions are: the conformal half-width per message-size regime and extrapolation distance (nodes
predicted / the most nodes calibrated on: x2, x4-8, x16-64, x128+, simfog.nccl.bands.DISTANCES) of the OTHER
clusters' held-out scores |ln(measured / predicted)|, as simfog.nccl.bands.bench_width takes them; the bench reports
the share of the cluster's held-out points inside it (coverage) and the median relative half-width, per cluster,
per distance and overall. `--write-intervals FILE` writes the half-widths of every cluster's held-out points
together, pooled and per distance (simfog/data/nccl_bands.toml, the table simfog ships), with provenance.

Prints a table per cluster (per held-out log and collective: points, median and worst error, the worst row), a line
saying why where a cluster misses the targets (median <= 8 %, worst <= 25 %), a summary over the clusters, the
coverage and half-width per distance, and last `clusters=<n> points=<n> coverage90=<pct> median=<pct> worst=<pct>
halfwidth90=<pct>` over every held-out point (issue 38's targets: median <= 10 %, every cluster <= 15 %, worst <=
100 %, coverage 85-95 % at a median half-width <= 35 %, <= 15 % at x2).

`--in-sample` measures how far this model family can go on these logs at all: each cluster calibrated on EVERY
log, its held-out ones included (simfog's shipped values for the unidentified terms), and its held-out points
predicted from that; the 90 % half-width is each size regime's 90th percentile of those in-sample scores over all
clusters. No prediction of simfog is made this way (it sees what it predicts): a floor, not a result. Last line
`in_sample clusters=<n> points=<n> median=<pct> worst=<pct> clusters_over15=<n> halfwidth90=<pct>`.

Run: python bench/collectives.py [--points] [--fit-only] [--shipped] [--in-sample] [--only CLUSTER] [--jobs N]
                                 [--ref DIR] [--write-intervals FILE]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nccl_corpus  # noqa: E402  (bench/ is not a package)

from simfog import units  # noqa: E402
from simfog.bands import SIZE_REGIMES, UNMEASURED_HALF_WIDTH, HalfWidths, size_regime  # noqa: E402
from simfog.errors import SimfogError  # noqa: E402
from simfog.nccl import bands as nccl_bands
from simfog.nccl import fit as nccl_fit

ROOT = Path(__file__).resolve().parents[1]
TARGET_MEDIAN, TARGET_WORST = 0.08, 0.25
LEVEL = 0.9  # the level whose coverage is reported (coverage90)
GRID = tuple({"tree_fill_B": f, "two_node_tree_gain": g}
             for f, g in itertools.product((0.0, 8192.0, 32768.0, 131072.0, 524288.0), (1.0, 1.25, 1.5, 1.75, 2.0)))
# Why a cluster stays off the targets, as found by looking at its figures (printed only; no computation reads them).
OFF_REASONS = {
    "abci-a100": "half its points are broadcasts, timed by nccl-tests at the root: 4-16-node broadcasts of 256 KiB-32 "
                 "MiB run 2-11x slower than the 2-node rate (2 MiB: 171 us at 2 nodes, 807 us at 8) and the 8-node "
                 "32 MiB allreduce at half of it, a fabric effect logs of <= 2 nodes cannot show; its allreduces alone "
                 "are 7.7 % median",
    "alps-gh200-ofi": "the Slingshot / aws-ofi-nccl fabric: from 4 KiB every tree hop costs ~7 us more than below "
                      "(4 KiB at 2 nodes +12 us, at 16 nodes +65 us), 64 KiB-1 MiB run 3-7x slower (set aside where "
                      "non-monotone); and the NIC rate is not stated (the inferred 200 Gb/s is not given), so the "
                      "2-node rate, a tree at 158 GB/s busbw above the 4 NICs' 100 GB/s, is taken for the 3+-node "
                      "ring (>= 32 MiB 35 % fast); with 200 Gb/s given: 12.6 % median",
    "polaris-a100-ofi": "the same fabric: 256 KiB-8 MiB run 3-7x slower than both neighbours at 8 and 256 nodes (set "
                        "aside only where non-monotone); at 256 nodes the ring allgather costs 7.8 us per step (2.3 us "
                        "from the 2-node fit); its 256-node alltoall is set aside (139 network timeouts)",
    "polaris-a100-socket": "NCCL over TCP sockets with one 2-node log per collective and no one-node log: per-step "
                           "costs at 8-128 nodes the 2-node logs cannot fix (alltoall 25-40 % slow, the 128-node "
                           "512 MiB allreduce at 0.4x the 2-node rate)",
    "together-b200-ib": "sendrecv only; its 64 MiB rate falls from 43 GB/s (2-4 nodes) to 26 (8) and 14.5 (16), which "
                        "the source attributes to InfiniBand fabric contention; the inferred rail fabric's hashing of "
                        "the cross-rail flows onto 32 uplinks (simfog.nccl.scale_out) leaves 0.82, 0.61, 0.46 of the "
                        "2-node rate at 4, 8, 16 nodes: 4 nodes 17 % slow (more collisions than measured), 8 nodes "
                        "5 %, 16 nodes 20 % fast (less than measured)",
    "xxrjun-cluster01-h100": "sendrecv at 10 nodes with 1 and 8 GPUs per node runs 37-46 % slower than predicted: with "
                             "one GPU a node every flow stays on its rail in the inferred rail fabric (no collision "
                             "modelled) yet ran 1.8x slower than between 2 nodes; with 2 and 4 GPUs within 7 %; "
                             "allreduce, allgather, reduce-scatter have no 2-node log (10 x 8 at 32 MiB 54 % off)",
    "abci-v100": "tree/LL128 allreduces of 64 KiB-1 MiB at 8-32 nodes take 2-3x NCCL's estimate (the tree's "
                 "pipelining across levels, which 2-node logs do not show: the fill learned from the other "
                 "clusters covers part); its median is on target, its worst is not",
    "echo-a100-azure": "tree/LL at 16-64 KiB on 4-16 nodes 27-30 % fast (the measured time jumps at 16 KiB), >= 1 GiB "
                       "10-16 % fast (the 2-node tree's rate taken for the 3+-node ring); its NCCL release is not "
                       "recorded (2.30's tables assumed) and its one-node logs drive 2-8 GPUs from one thread",
}


@dataclass
class Prepared:
    """A cluster's logs, read once: calibration traces and held-out (log, trace, points set aside) without the
    disturbed points."""

    cluster: nccl_corpus.Cluster
    fit_args: dict
    calibration: list
    held: list
    aside_calibration: int = 0
    off: str = ""
    cal_nodes: int = 1  # the most nodes of a calibration log: a held-out point's distance is its nodes / this


@dataclass
class Outcome:
    """One cluster under one setting of the unidentified terms."""

    calibration: nccl_fit.NcclCalibration | None = None
    rows: list = field(default_factory=list)  # (log, op, points, set aside)
    off: str = ""

    @property
    def points(self) -> list:
        return [p for _, _, pts, _ in self.rows for p in pts]

    def median(self) -> float:
        pts = self.points
        return float(np.median([abs(p.rel_error) for p in pts])) if pts else np.nan


def prepare(cluster: nccl_corpus.Cluster) -> Prepared:
    cal_logs, held_logs = cluster.split()
    out = Prepared(cluster, nccl_corpus.fit_arguments(cluster.facts)[0], [], [],
                   cal_nodes=max((log.nodes for log in cal_logs), default=1))
    if not held_logs:
        out.off = "no log of 3 or more nodes"
        return out
    for log in cal_logs:
        trace = nccl_corpus.read(cluster, log)
        drop = nccl_corpus.disturbed(trace, log)
        out.aside_calibration += len(drop)
        out.calibration.append(nccl_corpus.without(trace, drop))
    for log in held_logs:
        trace = nccl_corpus.read(cluster, log)
        drop = nccl_corpus.disturbed(trace, log)
        out.held.append((log, trace, drop))
    return out


def evaluate(prep: Prepared, unidentified: dict, *, predict: bool = True) -> Outcome:
    if prep.off:
        return Outcome(off=prep.off)
    try:
        cal = nccl_fit.fit(prep.calibration, source=prep.cluster.name, unidentified=unidentified, **prep.fit_args)
    except SimfogError as e:
        return Outcome(off=f"calibration failed: {e}")
    out = Outcome(cal)
    for log, trace, drop in prep.held if predict else ():
        points = nccl_fit.predict(cal.network, [nccl_corpus.without(trace, drop)])
        for op in sorted({m.collective for m in trace.measurements}):
            aside = sum(1 for i in drop if trace.measurements[i].collective == op)
            out.rows.append((log, op, [p for p in points if p.op == op], aside))
    if predict and not out.points:
        out.off = "every held-out point set aside"
    return out


def _row(p) -> str:
    return (f"{units.format_bytes(p.bytes)} {p.op} measured {units.format_time(p.measured_s)} predicted "
            f"{units.format_time(p.predicted_s)} ({p.rel_error:+.1%}, {p.algorithm}/{p.protocol})")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _setting(u: dict) -> str:
    return f"tree fill {units.format_bytes(u['tree_fill_B'])}, 2-node tree gain {u['two_node_tree_gain']:g}"


def show(prep: Prepared, out: Outcome, setting: str, *, show_points: bool, fit_only: bool) -> None:
    """Print one cluster's table."""
    c = prep.cluster
    _, given, used, left = nccl_corpus.fit_arguments(c.facts)
    cal_logs, held_logs = c.split()
    print(f"\n== {c.name}{' (reference set)' if c.reference else ''}: {len(cal_logs)} calibration logs, "
          f"{len(held_logs)} held out")
    print(f"   facts given: {', '.join(given) or 'none'}")
    if used:
        print(f"   inferred, used (simfog would otherwise take its default): {', '.join(used)}")
    if left:
        print(f"   inferred, not used (simfog calibrates without them): {', '.join(left)}")
    if out.calibration is None:
        print(f"   off: {out.off}")
        return
    cal, n = out.calibration, out.calibration.network
    e = cal.errors()
    print(f"   calibration: {len(e)} points ({prep.aside_calibration} set aside), fit median {_pct(np.median(e))}, "
          f"worst {_pct(e.max())}; NCCL {n.version}, channels "
          f"{n.channels if n.channels is not None else str(n.graph_channels(64, 2)) + ' (hardware)'}, bus bw one node "
          f"{n.intra_bus_Bps / 1e9:.4g} GB/s, between nodes {n.inter_bus_Bps / 1e9:.4g} GB/s, latencyInter "
          f"{n.latency_inter_s * 1e6:.3g} us, launch {n.launch_s * 1e6:.3g} us")
    print(f"   fitted: {'; '.join(cal.fitted)}")
    if cal.assumed:
        print(f"   assumed: {'; '.join(cal.assumed)}")
    for w in cal.warnings:
        print(f"   warning: {w}")
    if fit_only:
        print("\n".join("   | " + line for line in cal.report().splitlines()[3:]))
        return
    print(f"   unidentified terms: {setting}")
    print(f"   {'held-out log':44s} {'op':14s} {'layout':>7s} {'points':>6s} {'aside':>5s} {'median':>7s} "
          f"{'worst':>7s}  worst row")
    for log, op, pts, aside in out.rows:
        lay = f"{log.nodes:>4d}x{log.gpus_per_node:<2d}"
        if not pts:
            print(f"   {log.path[-44:]:44s} {op:14s} {lay} {0:6d} {aside:5d}")
            continue
        err = np.array([abs(p.rel_error) for p in pts])
        worst = max(pts, key=lambda p: abs(p.rel_error))
        print(f"   {log.path[-44:]:44s} {op:14s} {lay} {len(pts):6d} {aside:5d} {_pct(np.median(err)):>7s} "
              f"{worst.rel_error:+7.1%}  {_row(worst)}")
        for p in pts if show_points else ():
            print(f"      {units.format_bytes(p.bytes):>10s} {units.format_time(p.measured_s):>10s} "
                  f"{units.format_time(p.predicted_s):>10s} {p.rel_error:+7.1%}  {p.algorithm}/{p.protocol}")
    pts = out.points
    if not pts:
        print(f"   off: {out.off}")
        return
    err = np.array([abs(p.rel_error) for p in pts])
    worst = max(pts, key=lambda p: abs(p.rel_error))
    aside = sum(a for *_, a in out.rows)
    print(f"   {c.name}: {len(pts)} held-out points ({aside} set aside), median {_pct(np.median(err))}, worst "
          f"{_pct(err.max())}: {worst.nodes}x{worst.ranks // worst.nodes} {_row(worst)}")
    if np.median(err) > TARGET_MEDIAN or err.max() > TARGET_WORST:
        out.off = OFF_REASONS.get(c.name, "no reason recorded")
        print(f"   off target (median <= {_pct(TARGET_MEDIAN)}, worst <= {_pct(TARGET_WORST)}): {out.off}")


def _evaluate_task(task: tuple) -> Outcome:
    return evaluate(*task)


def leave_one_out(preps: list[Prepared], jobs: int = 1) -> tuple[dict[str, int], int, dict]:
    """Every cluster under every GRID setting (in `jobs` processes; each fit is deterministic, so the results are
    the same whatever their number); (cluster -> index of the setting learned from the others, index learned from
    all, outcomes by (cluster, index))."""
    keys = [(p.cluster.name, i) for p in preps for i in range(len(GRID))]
    tasks = [(p, u) for p in preps for u in GRID]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_evaluate_task, tasks, chunksize=4))
    else:
        results = [_evaluate_task(t) for t in tasks]
    outcomes = dict(zip(keys, results, strict=True))
    scored = [p.cluster.name for p in preps if not p.off]
    median = {(name, i): outcomes[name, i].median() for name in scored for i in range(len(GRID))}

    def best(names: list[str]) -> int:  # ties: the first in GRID (the smaller values)
        return min(range(len(GRID)), key=lambda i: (float(np.nanmean([median[n, i] for n in names])), i))

    learned = {name: best([n for n in scored if n != name]) for name in scored}
    return learned, best(scored), outcomes


def held_out(preps: list[Prepared], *, jobs: int = 1, learn: bool = True,
             predict: bool = True) -> tuple[dict[str, tuple[Outcome, dict, str]], int | None]:
    """Every cluster's outcome, with the setting of the unidentified terms it was predicted with (GRID's values)
    and that setting in words: learned from the other clusters (`learn`, leave_one_out), else simfog's shipped
    defaults for every cluster; and the index in GRID of the setting learned from all clusters (None unless
    `learn`)."""
    if not learn:
        shipped = dict(nccl_fit.UNIDENTIFIED)
        return {p.cluster.name: (evaluate(p, shipped, predict=predict), shipped,
                                 _setting(shipped) + " (simfog's shipped defaults)") for p in preps}, None
    learned, learned_all, outcomes = leave_one_out(preps, jobs)
    chosen = {}
    for p in preps:
        i = learned.get(p.cluster.name, 0)
        chosen[p.cluster.name] = (outcomes[p.cluster.name, i], GRID[i],
                                  _setting(GRID[i]) + " (learned from the other clusters' held-out points)")
    return chosen, learned_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default=str(ROOT / "bench" / "data" / "ref" / "nccl-tests"),
                        help="the nccl-tests folder of the reference set")
    parser.add_argument("--corpus", default=str(ROOT / "bench" / "data" / "nccl-tests"))
    parser.add_argument("--ref-facts", default=str(ROOT / "bench" / "data" / "nccl-tests-ref-facts"))
    parser.add_argument("--only", action="append", help="run only this cluster (repeatable; with --shipped)")
    parser.add_argument("--points", action="store_true", help="print every held-out point")
    parser.add_argument("--fit-only", action="store_true", help="calibrate and print the fit; predict nothing")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes for the grid of fits")
    parser.add_argument("--shipped", action="store_true",
                        help="simfog's shipped defaults for every cluster instead of leave-one-cluster-out")
    parser.add_argument("--in-sample", action="store_true",
                        help="calibrate each cluster on all its logs, held-out ones included: the model's floor")
    parser.add_argument("--write-intervals", metavar="FILE",
                        help="write the half-widths of every cluster's held-out points "
                        "(simfog/data/nccl_bands.toml)")
    args = parser.parse_args()
    if args.write_intervals and (args.only or args.shipped or args.fit_only):
        parser.error("--write-intervals needs the whole leave-one-cluster-out run (no --only, --shipped, --fit-only)")
    started = time.perf_counter()
    clusters = nccl_corpus.discover(Path(args.corpus), Path(args.ref_facts), Path(args.ref))
    if args.only:
        clusters = [c for c in clusters if c.name in args.only]
    print(f"{len(clusters)} clusters; disturbed points set aside: {nccl_corpus.DISTURBED_RULE}")
    preps = [prepare(c) for c in clusters]
    if args.in_sample:
        in_sample(preps)
        return
    shipped = dict(nccl_fit.UNIDENTIFIED)
    chosen, learned_all = held_out(preps, jobs=args.jobs, learn=not (args.fit_only or args.shipped or args.only),
                                   predict=not args.fit_only)
    for p in preps:
        out, _, setting = chosen[p.cluster.name]
        show(p, out, setting, show_points=args.points, fit_only=args.fit_only)
    if args.fit_only:
        return
    scores = {name: nccl_bands.scores_by_regime(out.points) for name, (out, *_) in chosen.items() if out.points}
    cal_nodes = {p.cluster.name: p.cal_nodes for p in preps}
    by_distance = {name: scores_by_distance(out.points, cal_nodes[name]) for name, (out, *_) in chosen.items()
                   if out.points}
    print(f"\n{'cluster':24s} {'points':>6s} {'aside':>5s} {'median':>7s} {'worst':>7s} {'cov90':>6s} {'hw90':>6s}"
          f"  status   (cov90: share inside the 90 % interval fitted on the other clusters; hw90: its median "
          "relative half-width)")
    everything, aside, inside, widths, buckets = [], 0, [], [], []
    for p in preps:
        out = chosen[p.cluster.name][0]
        aside += sum(a for *_, a in out.rows)
        if out.points:
            err = np.array([abs(q.rel_error) for q in out.points])
            everything += list(err)
            ins, wid = coverage(out.points, scores, p.cluster.name, by_distance=by_distance, cal_nodes=p.cal_nodes)
            inside += ins
            widths += wid
            buckets += [nccl_bands.distance_bucket(q.nodes / p.cal_nodes) for q in out.points]
            print(f"{p.cluster.name:24s} {len(err):6d} {sum(a for *_, a in out.rows):5d} {_pct(np.median(err)):>7s} "
                  f"{_pct(err.max()):>7s} {_pct(np.mean(ins)):>6s} {_pct(np.median(wid)):>6s}  "
                  f"{'off: ' + out.off if out.off else 'on target'}")
        else:
            print(f"{p.cluster.name:24s} {0:6d} {0:5d} {'':>7s} {'':>7s} {'':>6s} {'':>6s}  off: {out.off}")
    if inside:
        per_regime = "; ".join(
            f"{r} {_pct(np.mean([i for i, q in zip(inside, pts, strict=True) if size_regime(q.bytes) == r]))}"
            for r, _ in SIZE_REGIMES
            for pts in [[q for p in preps for q in chosen[p.cluster.name][0].points]]
            if any(size_regime(q.bytes) == r for q in pts))
        print(f"# {LEVEL:.0%} intervals, each cluster's fitted without it, by extrapolation distance (nodes "
              f"predicted / calibrated): coverage {_pct(np.mean(inside))} ({per_regime}), median relative half-width "
              f"{_pct(np.median(widths))} (targets: coverage 85-95 %, half-width <= 35 %, <= 15 % at x2)")
        for name, _ in nccl_bands.DISTANCES:
            at = [i for i, b in enumerate(buckets) if b == name]
            if at:
                print(f"#   distance {name:7s} points={len(at):4d} coverage90={_pct(np.mean([inside[i] for i in at]))} "
                      f"halfwidth90={_pct(np.median([widths[i] for i in at]))} median="
                      f"{_pct(np.median([everything[i] for i in at]))}")
    if args.write_intervals:
        write_intervals(Path(args.write_intervals), scores, by_distance)
    if learned_all is not None:
        u = GRID[learned_all]
        same = all(shipped[k] == u[k] for k in u)
        print(f"# learned from every cluster: {_setting(u)}; simfog ships {_setting(shipped)}"
              + ("" if same else " -- NOT the learned values: update simfog.nccl.fit.UNIDENTIFIED"))
    counted = sum(1 for p in preps if chosen[p.cluster.name][0].points)
    e = np.array(everything) if everything else np.array([np.nan])
    print(f"# {len(everything)} held-out points of {counted} clusters, {aside} set aside as disturbed "
          f"(+ {sum(p.aside_calibration for p in preps)} in calibration logs); {time.perf_counter() - started:.1f} s")
    cov = 100 * np.mean(inside) if inside else np.nan
    hw = 100 * np.median(widths) if widths else np.nan
    print(f"clusters={counted} points={len(everything)} coverage90={cov:.1f} median={100 * np.median(e):.1f} "
          f"worst={100 * np.max(e):.1f} halfwidth90={hw:.1f}")


def in_sample(preps: list[Prepared]) -> None:
    """The model family's floor on these logs (see the module docstring: --in-sample)."""
    print(f"{'cluster':24s} {'points':>6s} {'median':>7s} {'p90':>7s} {'worst':>7s}  (calibrated on every log, "
          "the held-out ones included)")
    everything, medians = [], []
    for p in preps:
        held = [nccl_corpus.without(trace, drop) for _, trace, drop in p.held]
        points = evaluate(replace(p, calibration=p.calibration + held), dict(nccl_fit.UNIDENTIFIED)).points
        if not points:
            continue
        err = np.array([abs(q.rel_error) for q in points])
        everything += points
        medians.append(float(np.median(err)))
        print(f"{p.cluster.name:24s} {len(err):6d} {_pct(np.median(err)):>7s} {_pct(np.quantile(err, 0.9)):>7s} "
              f"{_pct(err.max()):>7s}")
    scores = nccl_bands.scores_by_regime(everything)
    width = {r: float(np.quantile(v, LEVEL)) for r, v in scores.items() if v}
    print("# 90 % half-width each size regime would need in-sample: " + "; ".join(
        f"{r} {_pct(nccl_bands.relative_half_width(w))} ({len(scores[r])} points)" for r, w in width.items()))
    err = np.array([abs(q.rel_error) for q in everything])
    hw = np.median([nccl_bands.relative_half_width(width[size_regime(q.bytes)]) for q in everything])
    print(f"in_sample clusters={len(medians)} points={len(err)} median={100 * np.median(err):.1f} "
          f"worst={100 * err.max():.1f} clusters_over15={sum(m > 0.15 for m in medians)} halfwidth90={100 * hw:.1f}")


def scores_by_distance(points: list, cal_nodes: int) -> dict[str, dict[str, list[float]]]:
    """|ln(measured / predicted)| of a cluster's held-out points per extrapolation distance (nodes / `cal_nodes`,
    simfog.nccl.bands.DISTANCES) and size regime."""
    out: dict[str, list] = {}
    for q in points:
        out.setdefault(nccl_bands.distance_bucket(q.nodes / cal_nodes), []).append(q)
    return {b: nccl_bands.scores_by_regime(pts) for b, pts in out.items() if b is not None}


def coverage(points: list, scores: dict[str, dict[str, list[float]]], name: str, level: float = LEVEL, *,
             by_distance: dict | None = None, cal_nodes: int | None = None) -> tuple[list[bool], list[float]]:
    """For each of cluster `name`'s held-out points: inside its `level` interval fitted on the other clusters'
    scores, and that interval's relative half-width. With `by_distance` (scores_by_distance of every cluster) and
    the cluster's `cal_nodes`: the other clusters' scores at the point's extrapolation distance, as simfog takes
    them (simfog.nccl.bands.bench_width: too few there, unmeasured and never narrower than what was seen); without:
    every distance pooled (a regime none of them has, or too few points for the level, is unmeasured: the default,
    or what a lower level measured where that is wider)."""
    tables = cross_cluster_tables(scores, by_distance or {}, name)
    inside, widths = [], []
    for q in points:
        if by_distance is not None and cal_nodes:
            w = nccl_bands.bench_width(tables, q.bytes, level, q.nodes / cal_nodes)[0]
        else:
            w = tables[nccl_bands.POOLED].half_width(q.bytes, level)
            w = max(UNMEASURED_HALF_WIDTH, tables[nccl_bands.POOLED].widest(q.bytes)) if w is None else w
        inside.append(bool(abs(np.log(q.measured_s / q.predicted_s)) <= w))
        widths.append(nccl_bands.relative_half_width(w))
    return inside, widths


def cross_cluster_tables(scores: dict, by_distance: dict, name: str) -> dict[str, HalfWidths]:
    """simfog.nccl.bands.bench_tables' form for cluster `name`, from the other clusters' scores: pooled
    (cross_cluster_table) and per extrapolation distance (`by_distance`: scores_by_distance of every cluster)."""
    tables = {nccl_bands.POOLED: cross_cluster_table(scores, name)}
    for b, _ in nccl_bands.DISTANCES:
        others = {n: by[b] for n, by in by_distance.items() if b in by}
        if any(n != name for n in others):
            tables[b] = cross_cluster_table(others, name)
    return tables


def cross_cluster_table(scores: dict[str, dict[str, list[float]]], name: str) -> HalfWidths:
    """The half-widths for cluster `name`: conformal over the other clusters' held-out scores, per size regime."""
    others = {r: [x for n, by in scores.items() if n != name for x in by.get(r, ())] for r, _ in SIZE_REGIMES}
    return HalfWidths.from_scores(others, f"clusters other than {name}")


def write_intervals(path: Path, scores: dict[str, dict[str, list[float]]], by_distance: dict) -> None:
    """The table simfog ships (simfog.nccl.bands.bench_tables): half-widths of every cluster's held-out points,
    pooled ([intervals]) and per extrapolation distance ([distance.<name>])."""
    import json
    import subprocess
    from datetime import UTC, datetime

    value = nccl_corpus.toml_value

    def section(by: dict[str, dict[str, list[float]]], what: str) -> list[str]:
        everything = {r: [x for one in by.values() for x in one.get(r, ())] for r, _ in SIZE_REGIMES}
        n = sum(len(v) for v in everything.values())
        table = HalfWidths.from_scores(everything, f"the public held-out NCCL bench{what}: {n} points of {len(by)} "
                                                   "clusters, each calibrated on its 1-2-node logs, predicted at 3+ "
                                                   "nodes")
        return [f"{k} = {value(v)}" for k, v in table.to_toml().items()]

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    lines = ["# Conformal half-widths (ln(measured / predicted)) of simfog's NCCL model on the held-out points of",
             "# bench/collectives.py (every cluster under the unidentified terms learned from the others), every",
             "# distance pooled ([intervals]) and per extrapolation distance, nodes predicted / calibrated",
             "# ([distance.<name>], simfog.nccl.bands.DISTANCES).",
             "# Generated; do not edit. Regenerate: python bench/collectives.py --write-intervals "
             "simfog/data/nccl_bands.toml", "[intervals]", *section(scores, "")]
    for b, _ in nccl_bands.DISTANCES:
        at = {n: by[b] for n, by in by_distance.items() if b in by}
        if at:
            lines += ["", f"[distance.{json.dumps(b)}]", *section(at, f" at distance {b}")]
    lines += ["", "[provenance]", f"generated = {value(datetime.now(UTC).strftime('%Y-%m-%d'))}",
              f"commit = {value(commit.strip())}", f"clusters = {json.dumps(sorted(scores))}",
              f"corpus = {value('bench/data/nccl-tests and the reference set (bench/data/ref/nccl-tests)')}",
              f"disturbed_rule = {value(nccl_corpus.DISTURBED_RULE)}"]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
