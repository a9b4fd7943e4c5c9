"""How well the leave-a-scale-in widths (simfog.nccl.bands.leave_a_scale_in) hold for predictions inside a
cluster's logs: on every corpus cluster whose logs hold at least two node counts between the fewest and the most,
each such count is held in turn, its points predicted from a calibration on every other count (as the widths
themselves are made), and judged against the 90 % widths of the OTHER held-in counts; a size regime without a
90 % width there takes the cluster's leave-a-scale-out width, as `network_part` does. Beside it the leave-a-scale-out
widths (what a prediction inside the logs took before) on the same points.

Pessimistic for a cluster with exactly two such counts: each is judged against the one other's widths, where the
shipped widths pool both.

Per cluster and held count: points, inside the 90 % band, median relative half-width; last line
`scales=<n> points=<n> coverage90=<pct> halfwidth90=<pct> out_coverage90=<pct> out_halfwidth90=<pct>`.

Run: python bench/inside_bands.py   (~1 min)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import nccl_corpus  # noqa: E402  (bench/ is not a package)

from simfog.bands import HalfWidths, log_scores  # noqa: E402
from simfog.nccl import bands as nccl_bands  # noqa: E402

LEVEL = 0.9


def judged(points, widths: HalfWidths, fallback: HalfWidths | None) -> tuple[int, list[float]]:
    """(how many of `points` lie inside their 90 % band, each band's relative half-width)."""
    inside, half = 0, []
    for p in points:
        w = widths.half_width(p.bytes, LEVEL)
        if w is None and fallback is not None:
            w = fallback.half_width(p.bytes, LEVEL)
        w = math.inf if w is None else w
        inside += float(log_scores([p.predicted_s], [p.measured_s])[0]) <= w
        half.append(math.sinh(w))
    return inside, half


def main() -> int:
    clusters = nccl_corpus.discover(ROOT / "bench" / "data" / "nccl-tests",
                                    ROOT / "bench" / "data" / "nccl-tests-ref-facts", nccl_corpus.reference_logs(ROOT))
    totals = {"in": [0, 0, []], "out": [0, 0, []]}
    scales = 0
    for c in clusters:
        traces, _ = nccl_corpus.every_log(c)
        kwargs = nccl_corpus.fit_arguments(c.facts)[0]
        held_in, _ = nccl_bands.scale_in_points(traces, **kwargs)
        by_scale: dict[int, list] = {}
        for p, scale in held_in:
            by_scale.setdefault(scale, []).append(p)
        if len(by_scale) < 2:
            print(f"{c.name}: {len(by_scale)} node count(s) between its fewest and most: not judged")
            continue
        out = nccl_bands.leave_a_scale_out(traces, **kwargs)
        for scale, points in sorted(by_scale.items()):
            others = [p for s, ps in by_scale.items() if s != scale for p in ps]
            widths = HalfWidths.from_scores(nccl_bands.scores_by_regime(others), "scale in")
            row = []
            for key, (w, fb) in (("in", (widths, out)), ("out", (out, None))):
                k, half = judged(points, w, fb)
                totals[key][0] += k
                totals[key][1] += len(points)
                totals[key][2] += half
                row.append(f"{key} {k}/{len(points)} inside, half-width {100 * np.median(half):.0f}%")
            scales += 1
            print(f"{c.name:24s} {scale:4d} nodes  " + "  |  ".join(row))
    (ki, ni, hi), (ko, no, ho) = totals["in"], totals["out"]
    print(f"scales={scales} points={ni} coverage90={100 * ki / ni:.1f} halfwidth90={100 * np.median(hi):.1f} "
          f"out_coverage90={100 * ko / no:.1f} out_halfwidth90={100 * np.median(ho):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
