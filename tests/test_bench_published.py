"""bench/published.py reads the seed papers' published points and simfog's predictions from the notebooks' RESULT
records: every point the notebooks predicted, none twice, the pinning inputs left out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import published  # noqa: E402  (bench/ is not a package)


def test_every_published_point_of_the_committed_notebooks_is_read_once():
    counts = {}
    for paper, name in published.NOTEBOOKS.items():
        pts = published.points(paper, published.records(published.run(name, committed=True)))
        assert all(p > 0 and q > 0 for p, q, _ in pts)
        counts[paper] = len(pts)
    # MG-WFBP 3 systems x 2 models x 4 node counts; BlueFog 37 bars; BAGUA 36 rows less the 3 pinning inputs;
    # WAGMA-SGD's 24 ResNet-50 points of the modelled systems
    if counts["mgwfbp"]:  # notebook 01's section needs the reference data where it was executed
        assert counts["mgwfbp"] == 24
    assert (counts["bluefog"], counts["bagua"], counts["wagma"]) == (37, 33, 24)


def test_the_bench_prints_one_line_per_paper_and_the_summary_last():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "published.py"), "--committed"], capture_output=True,
                         text=True, check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines[:4]] == ["mgwfbp", "bluefog", "bagua", "wagma"]
    assert all("points=" in line and " inside=" in line and " median=" in line and " worst=" in line
               and " floor=" in line for line in lines[:4])
    assert lines[-1].startswith("papers=4 points=118 inside=")


def test_one_factor_floor_is_the_least_median_error_any_single_scale_leaves():
    # equal ratios: one factor removes every error
    c, floor = published.one_factor_floor([0.8, 0.8, 0.8])
    assert c == pytest.approx(0.8, rel=1e-3) and floor == pytest.approx(0.0, abs=1e-3)
    # 0.9 and 1.1: for c in [0.9, 1.1] the two errors sum to 0.2 / c, least at c = 1.1: median 0.1 / 1.1
    c, floor = published.one_factor_floor([0.9, 1.1])
    assert c == pytest.approx(1.1, rel=1e-3) and floor == pytest.approx(0.1 / 1.1, rel=1e-3)
    # never above the unscaled median (c = 1 is on the grid)
    ratios = [0.63, 0.9, 1.2, 1.52, 0.75]
    assert published.one_factor_floor(ratios)[1] <= float(np.median(np.abs(np.array(ratios) - 1))) + 1e-12
