"""simfog against the seed papers' own published points (bench/data/published): per paper, how many of its points lie
inside simfog's 90 % band and how far the prediction is from them.

The predictions are the notebooks' (01 MG-WFBP, 02 BlueFog, 03 BAGUA, 08 WAGMA-SGD: their published-points
sections), made from each paper's inputs.toml only (one node's or one GPU's throughput, the stated links, the
frameworks' settings; nothing learned from the points themselves): each notebook prints a `RESULT {json}` record
per group of points with the published value, simfog's prediction and its band. This script runs the four
notebooks with full settings in a fresh kernel each (notebooks/execute.py; minutes) and reads those records, or
with --committed reads the records in the committed notebooks' outputs (their code hashes say which code made
them: tests/test_notebooks.py).

Per paper: `points= inside= median= worst= floor=` (inside: the share of its points in their 90 % band; median and
worst: |published / predicted - 1|; floor: the median |error| left once every prediction of the paper is scaled by the
one factor that fits its own points best, `one_factor_floor`: what no calibration of a single input, the network's
efficiency say, could go below; chosen on the points, so a floor, never a result); last line `papers=4 points=<n>
inside=<pct> median=<pct>` over every point.
Targets (issue 38): every paper 85-95 % inside and median <= 10 %.

Run: python bench/published.py [--committed] [--only PAPER]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {"mgwfbp": "01-mgwfbp-scaling", "bluefog": "02-bluefog-neighbour-averaging",
             "bagua": "03-bagua-algorithms", "wagma": "08-wagma-sgd"}


def records(nb) -> list[dict]:
    """The `RESULT {json}` records of an executed notebook's outputs."""
    out = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            text = o.get("text", "")
            for line in ("".join(text) if isinstance(text, list) else text).splitlines():
                if line.startswith("RESULT "):
                    out.append(json.loads(line[len("RESULT "):]))
    return out


def points(paper: str, recs: list[dict]) -> list[tuple[float, float, bool]]:
    """(published, predicted, inside its band) of every published point the notebook predicted."""
    if paper in ("mgwfbp", "bluefog"):
        groups = [r for r in recs if r.get("study") == f"{paper}-published"]
        return [(p, q, bool(i)) for r in groups for p, q, i in zip(r["published"], r["predicted"], r["inside"],
                                                                    strict=True)]
    (r,) = [r for r in recs if r.get("study") == f"{paper}-published"]
    rows = [row for row in r["rows"] if row.get("held_out", True)]  # bagua: the pinning point is not held out
    return [(row["published"], row["predicted"], bool(row["inside"])) for row in rows]


def one_factor_floor(ratios) -> tuple[float, float]:
    """(factor c, median |r / c - 1|) for the c that makes that median least, over the published / predicted
    `ratios` (a grid of 0.1 % steps in ln c over [1/e^2, e^2]: the median is piecewise smooth in c)."""
    r = np.asarray(ratios, dtype=float)
    grid = np.exp(np.arange(-2.0, 2.0 + 5e-4, 1e-3))
    medians = np.median(np.abs(r[None, :] / grid[:, None] - 1), axis=1)
    best = int(np.argmin(medians))
    return float(grid[best]), float(medians[best])


def run(name: str, committed: bool):
    """The notebook `name` executed with full settings (or as committed)."""
    if committed:
        return json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    sys.path.insert(0, str(ROOT / "notebooks"))
    import tempfile

    from execute import execute  # noqa: PLC0415  (notebooks/ is not a package)

    with tempfile.TemporaryDirectory() as figures:
        nb = execute(f"{name}.ipynb", small=False, figures=Path(figures))
    return json.loads(json.dumps(nb))  # nbformat's node -> plain dicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--committed", action="store_true", help="read the committed notebooks' outputs")
    parser.add_argument("--only", action="append", choices=list(NOTEBOOKS), help="this paper only (repeatable)")
    args = parser.parse_args()
    started = time.perf_counter()
    every = []
    papers = 0
    for paper, name in NOTEBOOKS.items():
        if args.only and paper not in args.only:
            continue
        pts = points(paper, records(run(name, args.committed)))
        if not pts:
            print(f"{paper:8s} points=0 (the notebook printed no published points: reference data missing?)")
            continue
        papers += 1
        every += pts
        err = np.array([abs(p / q - 1) for p, q, _ in pts])
        inside = sum(i for *_, i in pts)
        factor, floor = one_factor_floor([p / q for p, q, _ in pts])
        print(f"{paper:8s} points={len(pts)} inside={inside} ({100 * inside / len(pts):.1f}%) "
              f"median={100 * np.median(err):.1f}% worst={100 * err.max():.1f}% "
              f"floor={100 * floor:.1f}% (x{factor:.2f})")
    source = "committed notebook outputs" if args.committed else "notebooks executed now, full settings"
    print(f"# {source}; {time.perf_counter() - started:.0f} s")
    err = np.array([abs(p / q - 1) for p, q, _ in every]) if every else np.array([np.nan])
    inside = 100 * np.mean([i for *_, i in every]) if every else float("nan")
    print(f"papers={papers} points={len(every)} inside={inside:.1f} median={100 * np.median(err):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
