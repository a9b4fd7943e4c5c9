"""How well bands for predictions inside a cluster's logs hold, on the corpus clusters (bench/nccl_corpus.py):

1. the cluster's own leave-a-scale-in (simfog.nccl.bands.leave_a_scale_in): on every cluster whose logs hold at
   least two node counts between the fewest and the most, each such count is held in turn, its points predicted
   from a calibration on every other count (as the widths themselves are made), and judged against the 90 % widths
   of the OTHER held-in counts; a size regime without a 90 % width there takes the cluster's leave-a-scale-out
   width, as `network_part` does. Beside it the leave-a-scale-out widths on the same points. Pessimistic for a
   cluster with exactly two such counts: each is judged against the one other's widths, where the shipped widths
   pool both.
2. the public leave-a-scale-in (what a calibration without its own takes, simfog.nccl.bands.inside_table): every
   cluster's held-in points (each count between its fewest and most, predicted from its other counts) judged
   against the widths of every OTHER cluster's held-in points, taken per size regime as network_part takes them:
   the narrower of those and the cluster's own leave-a-scale-out. Beside it the leave-a-scale-out alone.

Per cluster and held count (1) and per cluster (2): points, inside the 90 % band, median relative half-width; last
line `scales=<n> points=<n> coverage90=<pct> halfwidth90=<pct> out_coverage90=<pct> out_halfwidth90=<pct>
public_points=<n> public_coverage90=<pct> public_halfwidth90=<pct> public_out_coverage90=<pct>
public_out_halfwidth90=<pct>`. `--write FILE` writes the public table from every cluster's held-in points
(simfog/data/nccl_inside_bands.toml, the table simfog ships).

Run: python bench/inside_bands.py [--write FILE]   (~1 min)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import nccl_corpus  # noqa: E402  (bench/ is not a package)

from simfog.bands import HalfWidths, log_scores  # noqa: E402
from simfog.nccl import bands as nccl_bands  # noqa: E402

LEVEL = 0.9


def judged(points, width) -> tuple[int, list[float]]:
    """(how many of `points` lie inside their 90 % band, each band's relative half-width); `width(nbytes)` is the
    half-width (ln) for a message of that size, None where nothing gives one (unbounded: covered)."""
    inside, half = 0, []
    for p in points:
        w = width(p.bytes)
        w = math.inf if w is None else w
        inside += float(log_scores([p.predicted_s], [p.measured_s])[0]) <= w
        half.append(math.sinh(w))
    return inside, half


def first(*tables: HalfWidths | None):
    """The half-width of the first table that has one at LEVEL (network_part's fallback)."""
    def width(nbytes):
        return next((w for t in tables if t is not None and (w := t.half_width(nbytes, LEVEL)) is not None), None)
    return width


def narrower(public: HalfWidths, own_out: HalfWidths | None):
    """The narrower of the public leave-a-scale-in's and the own leave-a-scale-out's half-widths, as network_part
    takes them for a calibration without its own leave-a-scale-in."""
    def width(nbytes):
        ws = [w for t in (public, own_out) if t is not None and (w := t.half_width(nbytes, LEVEL)) is not None]
        return min(ws, default=None)
    return width


class Tally:
    def __init__(self):
        self.inside, self.points, self.half = 0, 0, []

    def add(self, points, width) -> str:
        k, half = judged(points, width)
        self.inside += k
        self.points += len(points)
        self.half += half
        return f"{k}/{len(points)} inside, half-width {100 * np.median(half):.0f}%"

    def figures(self) -> tuple[float, float]:
        return 100 * self.inside / self.points, 100 * float(np.median(self.half))


def public_table(held: dict[str, list]) -> HalfWidths:
    points = [p for pts in held.values() for p in pts]
    return HalfWidths.from_scores(nccl_bands.scores_by_regime(points),
                                  f"the public leave-a-scale-in: {len(points)} points of {len(held)} clusters' "
                                  "logs, each node count between a cluster's fewest and most predicted from its "
                                  "other counts")


def write(path: Path, table: HalfWidths, clusters: list[str]) -> None:
    value = nccl_corpus.toml_value
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    lines = ["# Conformal half-widths (ln(measured / predicted)) of simfog's NCCL model when it interpolates between",
             "# the node counts of a cluster's logs: every count between a corpus cluster's fewest and most, predicted",
             "# from a calibration on its other counts (simfog.nccl.bands.scale_in_points), every cluster pooled.",
             "# Taken by a prediction inside a calibration's node counts that has no leave-a-scale-in of its own",
             "# (simfog.nccl.bands.network_part). Generated; do not edit. Regenerate:",
             "# python bench/inside_bands.py --write simfog/data/nccl_inside_bands.toml",
             "[inside]", *(f"{k} = {value(v)}" for k, v in table.to_toml("inside").items()),
             "", "[provenance]", f"generated = {value(datetime.now(UTC).strftime('%Y-%m-%d'))}",
             f"commit = {value(commit.strip())}", f"clusters = {json.dumps(sorted(clusters))}",
             f"corpus = {value('bench/data/nccl-tests and the reference set (bench/data/ref/nccl-tests)')}"]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", metavar="FILE", help="write the public leave-a-scale-in table here")
    args = parser.parse_args(argv)
    clusters = nccl_corpus.discover(ROOT / "bench" / "data" / "nccl-tests",
                                    ROOT / "bench" / "data" / "nccl-tests-ref-facts", nccl_corpus.reference_logs(ROOT))
    held: dict[str, list] = {}      # cluster -> its held-in points
    by_scale: dict[str, dict] = {}  # cluster -> node count -> its points
    outs: dict[str, HalfWidths | None] = {}
    for c in clusters:
        traces, _ = nccl_corpus.every_log(c)
        kwargs = nccl_corpus.fit_arguments(c.facts)[0]
        points, _ = nccl_bands.scale_in_points(traces, **kwargs)
        if points:
            held[c.name] = [p for p, _ in points]
            by_scale[c.name] = {}
            for p, scale in points:
                by_scale[c.name].setdefault(scale, []).append(p)
            outs[c.name] = nccl_bands.leave_a_scale_out(traces, **kwargs)

    print("1. the cluster's own leave-a-scale-in (each held-in count against the others' widths) | the "
          "leave-a-scale-out")
    own, own_out, scales = Tally(), Tally(), 0
    for name, counts in by_scale.items():
        if len(counts) < 2:
            print(f"{name}: {len(counts)} node count(s) between its fewest and most: not judged")
            continue
        for scale, points in sorted(counts.items()):
            others = [p for s, ps in counts.items() if s != scale for p in ps]
            widths = HalfWidths.from_scores(nccl_bands.scores_by_regime(others), "scale in")
            scales += 1
            print(f"{name:24s} {scale:4d} nodes  in {own.add(points, first(widths, outs[name]))}  |  "
                  f"out {own_out.add(points, first(outs[name]))}")

    print("\n2. the public leave-a-scale-in (every other cluster's held-in points; the narrower of it and the "
          "cluster's leave-a-scale-out) | the leave-a-scale-out")
    public, public_out = Tally(), Tally()
    for name, points in held.items():
        table = public_table({n: v for n, v in held.items() if n != name})
        print(f"{name:24s} {len(by_scale[name])} count(s)  public {public.add(points, narrower(table, outs[name]))}"
              f"  |  out {public_out.add(points, first(outs[name]))}")

    (c1, h1), (c2, h2) = own.figures(), own_out.figures()
    (c3, h3), (c4, h4) = public.figures(), public_out.figures()
    print(f"scales={scales} points={own.points} coverage90={c1:.1f} halfwidth90={h1:.1f} out_coverage90={c2:.1f} "
          f"out_halfwidth90={h2:.1f} public_points={public.points} public_coverage90={c3:.1f} "
          f"public_halfwidth90={h3:.1f} public_out_coverage90={c4:.1f} public_out_halfwidth90={h4:.1f}")
    if args.write:
        write(Path(args.write), public_table(held), list(held))
    return 0


if __name__ == "__main__":
    sys.exit(main())
