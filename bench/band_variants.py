"""Would a network band conditioned on more than the extrapolation distance be narrower at equal coverage? The held-out
NCCL bench's 90 % bands (bench/collectives.py) under other groupings of the other clusters' scores, each cluster's
band fitted without it, as the bench's own.

The bench's points are bench/collectives.py's: every cluster calibrated on its logs of at most 2 nodes, its larger
logs predicted with the unidentified terms learned from the other clusters. A variant groups the scores
|ln(measured / predicted)| by a key of the point and, optionally, divides each cluster's scores by a scale its own
calibration shows (the fit's residuals on its 1-2-node logs, nothing held out), the band of a point of cluster k
then being the conformal quantile of the other clusters' scaled scores in its group times k's own scale (locally
adaptive conformal prediction: valid when the scaled scores are exchangeable across clusters). A group with too few
scores for the level falls back to the shipped grouping (distance x size regime), then to what it saw, at least
x/2 (simfog.bands.UNMEASURED_HALF_WIDTH), as simfog.nccl.bands.bench_width does.

Keys: distance (simfog.nccl.bands.DISTANCES), size regime (simfog.bands.SIZE_REGIMES), collective family (allreduce;
broadcast and reduce; allgather and reduce-scatter; alltoall and sendrecv), NCCL's algorithm. Scales: none, the
90th percentile, the mean of the calibration's |ln| residuals.

Prints one line per variant: `variant=<keys>/<scale> coverage90=<pct> halfwidth90=<pct>` and coverage / median
half-width per distance. The first line is the bench's own (bench/collectives.py: simfog.nccl.bands.bench_width);
the variants' last fallback is simpler than bench_width's, so the shipped grouping's line may differ from it by a few
points; compare the variants with that line.

Run: python bench/band_variants.py [--jobs N]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import collectives  # noqa: E402  (bench/ is not a package)
import nccl_corpus  # noqa: E402

from simfog.bands import UNMEASURED_HALF_WIDTH, conformal_quantile, size_regime  # noqa: E402
from simfog.nccl import bands as nccl_bands  # noqa: E402

FAMILY = {"allreduce": "allreduce", "broadcast": "rooted", "reduce": "rooted", "allgather": "gather",
          "reduce_scatter": "gather", "alltoall": "p2p", "sendrecv": "p2p"}
KEYS = {"distance": lambda q, d: (d,), "distance+regime": lambda q, d: (d, size_regime(q.bytes)),
        "distance+family": lambda q, d: (d, FAMILY.get(q.op, q.op)),
        "distance+regime+family": lambda q, d: (d, size_regime(q.bytes), FAMILY.get(q.op, q.op)),
        "distance+algorithm": lambda q, d: (d, q.algorithm),
        "distance+regime+algorithm": lambda q, d: (d, size_regime(q.bytes), q.algorithm)}
SCALES = {"none": lambda r: 1.0, "fit-p90": lambda r: float(np.quantile(r, 0.9)), "fit-mean": lambda r: float(r.mean())}
SHIPPED = ("distance+regime", "none")


def score(q) -> float:
    return abs(math.log(q.measured_s / q.predicted_s))


def evaluate(clusters: dict, keys: str, scale: str, level: float = collectives.LEVEL) -> tuple[list, list, list]:
    """(inside, relative half-width, distance) of every held-out point under one variant. `clusters`: name ->
    (held-out points, the most nodes calibrated on, the calibration's |ln| residuals)."""
    key, fallback = KEYS[keys], KEYS[SHIPPED[0]]
    s = {n: SCALES[scale](res) for n, (_, _, res) in clusters.items()}
    rows = {n: [(q, nccl_bands.distance_bucket(q.nodes / cal)) for q in pts] for n, (pts, cal, _) in clusters.items()}
    inside, widths, where = [], [], []
    for name, own in rows.items():
        pools: dict = {}
        for other, pts in rows.items():
            for q, d in pts if other != name else ():
                for group in ((keys, key(q, d)), (SHIPPED[0], fallback(q, d))):
                    pools.setdefault(group, []).append(score(q) / s[other])
        for q, d in own:
            candidates = [pools.get((keys, key(q, d)), []), pools.get((SHIPPED[0], fallback(q, d)), [])]
            w = next((x for c in candidates if c and (x := conformal_quantile(c, level)) is not None), None)
            if w is None:
                w = max(UNMEASURED_HALF_WIDTH, max((x for c in candidates for x in c), default=0.0))
            w *= s[name]
            inside.append(score(q) <= w)
            widths.append(nccl_bands.relative_half_width(w))
            where.append(d)
    return inside, widths, where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes for the grid of fits")
    args = parser.parse_args()
    root = collectives.ROOT / "bench" / "data"
    preps = [collectives.prepare(c) for c in nccl_corpus.discover(root / "nccl-tests", root / "nccl-tests-ref-facts",
                                                                  root / "ref" / "nccl-tests")]
    chosen, _ = collectives.held_out(preps, jobs=args.jobs)
    clusters = {p.cluster.name: (out.points, p.cal_nodes, np.array([score(q) for q in out.calibration.points]))
                for p in preps for out in [chosen[p.cluster.name][0]] if out.points}
    print(f"{sum(len(v[0]) for v in clusters.values())} held-out points of {len(clusters)} clusters "
          f"(bench/collectives.py's); 90 % bands, each cluster's fitted without it")
    inside, widths = [], []
    scores = {n: nccl_bands.scores_by_regime(v[0]) for n, v in clusters.items()}
    by_distance = {n: collectives.scores_by_distance(v[0], v[1]) for n, v in clusters.items()}
    for name, (pts, cal, _) in clusters.items():
        ins, wid = collectives.coverage(pts, scores, name, by_distance=by_distance, cal_nodes=cal)
        inside, widths = inside + ins, widths + wid
    print(f"bench (bench/collectives.py) coverage90={100 * np.mean(inside):.1f} "
          f"halfwidth90={100 * np.median(widths):.1f}")
    variants = [SHIPPED] + [(k, s) for k in KEYS for s in SCALES if (k, s) != SHIPPED]
    for keys, scale in variants:
        inside, widths, where = (np.array(x) for x in evaluate(clusters, keys, scale))
        per = " ".join(f"{b}={100 * inside[where == b].mean():.1f}/{100 * np.median(widths[where == b]):.1f}"
                       for b, _ in nccl_bands.DISTANCES if (where == b).any())
        print(f"variant={keys}/{scale} coverage90={100 * inside.mean():.1f} halfwidth90={100 * np.median(widths):.1f}"
              f"  per distance coverage/half-width: {per}")


if __name__ == "__main__":
    main()
