"""bench/distributions.py on a synthetic bench CSV: its per-family lines and its last line, whose KS figures are
the long rows' (hand-set here) and whose straggler ratio is the default experiment's at 2,048 ranks with the
allreduce calibrations' median spread, checked against simfog itself; host-limited rows set aside."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from validate.comparison import compare

from .conftest import REPO

_spec = importlib.util.spec_from_file_location("simfog_bench_distributions", REPO / "bench" / "distributions.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)


def _row(vid, algorithm, iterations, ks, p, calibration="gloo allreduce", spread=0.02, limited=False):
    return {"id": vid, "algorithm": algorithm, "iterations": iterations, "ks_distance": ks, "ks_p_value": p,
            "ks_same_median": 0.11 if iterations >= 100 else 0.22, "calibration": calibration, "nic_spread": spread,
            "measured_p99_iteration_s": 0.1, "predicted_p99_iteration_s": 0.105, "host_cpu_busy": 1.0 if limited
            else 0.5, "host_oversubscribed": 1.0 if limited else 0.0, "measured_iteration_s": 0.1, "error": ""}


def test_last_line_from_a_bench_csv(tmp_path, capsys):
    rows = [_row("a-long", "allreduce", 120, 0.15, 0.2, spread=0.02),
            _row("n-long", "neighbor:one_peer_exp2", 120, 0.25, 0.01, "gloo sendrecv", 0.15),
            _row("w-long", "wagma:S2:every5", 120, 0.20, 0.3, "gloo sendrecv", 0.15),
            _row("f-long", "fsdp:300kB:reshard:k1", 120, 0.12, 0.5, spread=0.04),
            _row("a", "allreduce", 30, 0.30, 0.02, spread=0.01),
            _row("limited-long", "allreduce", 120, 0.9, 0.001, limited=True)]
    path = tmp_path / "bench.csv"
    compare.write_csv(rows, path)
    assert bench.main(["--csv", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "1 host-limited row(s) set aside (validate.cluster.hostload)" in out
    assert any(line.startswith("distribution allreduce: 2 rows, median KS 22.5%") for line in out)
    # long rows the rig can emulate: KS 0.15, 0.25, 0.20, 0.12 -> median 0.175; 1 of 4 differs at 5 %. The spread:
    # the median over the allreduce calibrations' long rows, 0.02, 0.04 and the limited row's 0.02 (the spread is
    # the calibration's, measured before the rows): 0.02
    assert bench.measured_spread(bench.bench_rows(path)) == pytest.approx(0.02)
    ratio = bench.straggler_ratio(0.02)
    assert ratio > 1
    # rows without levels-matched distances (a CSV of before they were kept): nan, not a made-up figure
    assert out[-1] == (f"long_rows=4 ks_median=0.175 ks_floor=0.110 differ5=25.0% straggler_2048={ratio:.4f} "
                       "ks_shape_median=nan shape_differ5=nan")


def test_last_line_carries_the_levels_matched_distances(tmp_path, capsys):
    rows = [{**_row(f"r{k}", "allreduce", 120, 0.6, 0.001), "ks_shape_distance": d, "ks_shape_p_value": p}
            for k, (d, p) in enumerate([(0.10, 0.4), (0.30, 0.01), (0.12, 0.3)])]
    path = tmp_path / "bench.csv"
    compare.write_csv(rows, path)
    assert bench.main(["--csv", str(path)]) == 0
    # levels matched: distances 0.10, 0.30, 0.12 -> median 0.12; 1 of 3 differs at 5 %
    assert capsys.readouterr().out.splitlines()[-1].endswith(" ks_shape_median=0.120 shape_differ5=33.3%")


def test_straggler_ratio_is_the_expected_slowest_where_communication_is_exposed():
    """No spread: 1. With one, the default experiment's mean iteration grows, and at 8 ranks less than at 2,048."""
    assert bench.straggler_ratio(0.0) == 1.0
    assert 1 < bench.straggler_ratio(0.03, ranks=8) < bench.straggler_ratio(0.03)
