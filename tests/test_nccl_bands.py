"""The network part of an interval: leave-a-scale-out on a cluster's own logs, the network file's [calibrated]
interval keys, the shipped bench table, and `simfog collective`'s bounds."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from simfog import network_file
from simfog.bands import LEVELS, UNMEASURED_HALF_WIDTH, HalfWidths, conformal_quantile, size_regime
from simfog.errors import ConfigError
from simfog.importers import import_file
from simfog.nccl import fit as nccl_fit
from simfog.nccl.bands import bench_table, bench_tables, inside_table, leave_a_scale_out, network_part, subset
from simfog.nccl.calibrated import Calibrated

from .conftest import REPO

ABCI = REPO / "bench" / "data" / "nccl-tests" / "abci-a100" / "allreduce"
LOGS = ("intra_anode-job08.sh.7280517.nccl", "inter_anode-job02.sh.7194279.nccl", "inter_anode-job04.sh.7194285.nccl")


@pytest.fixture(scope="module")
def abci():
    return [import_file("nccl-tests", ABCI / name) for name in LOGS]


def test_leave_a_scale_out_holds_out_each_larger_scale(abci):
    """1 node -> 2 nodes, then <= 2 -> 4: the half-widths are the conformal quantiles of exactly those
    predictions' scores (each fit sees only the smaller logs)."""
    got = leave_a_scale_out(abci, gpu_arch="ampere")
    scores = {"small": [], "medium": [], "large": []}
    for smaller, held in ((abci[:1], abci[1]), (abci[:2], abci[2])):
        net = nccl_fit.fit(smaller, gpu_arch="ampere").network
        for p in nccl_fit.predict(net, [held]):
            scores[size_regime(p.bytes)].append(abs(math.log(p.measured_s / p.predicted_s)))
    assert got.points == {r: len(v) for r, v in scores.items()}
    assert sum(got.points.values()) == 48  # 24 sizes at 2 nodes, 24 at 4
    for r, row in got.by_regime.items():
        assert row == tuple(conformal_quantile(scores[r], lv) for lv in LEVELS)
    assert "<= 1 -> 2 nodes: 24 points; <= 2 -> 4 nodes: 24 points" in got.source
    assert leave_a_scale_out(abci[:1], gpu_arch="ampere") is None  # one node count: nothing to leave out


def test_leave_a_scale_in_predicts_each_middle_scale_from_every_other(abci):
    """1, 2, 4 and 8 nodes: 2 nodes is predicted from a fit on the 1-, 4- and 8-node logs, 4 from the 1-, 2- and
    8-node ones, and the half-widths are the conformal quantiles of exactly those predictions' scores; the smallest
    and largest scale are never held in, and one scale between them is too few (MIN_SCALES_IN)."""
    from simfog.nccl.bands import leave_a_scale_in

    logs = [*abci, import_file("nccl-tests", ABCI / "inter_anode-job08.sh.7194286.nccl")]
    got = leave_a_scale_in(logs, gpu_arch="ampere")
    scores = {"small": [], "medium": [], "large": []}
    for held in (1, 2):
        net = nccl_fit.fit([t for i, t in enumerate(logs) if i != held], gpu_arch="ampere").network
        for p in nccl_fit.predict(net, [logs[held]]):
            scores[size_regime(p.bytes)].append(abs(math.log(p.measured_s / p.predicted_s)))
    assert got.points == {r: len(v) for r, v in scores.items() if v}
    for r, row in got.by_regime.items():
        assert row == tuple(conformal_quantile(scores[r], lv) for lv in LEVELS)
    assert got.source == ("leave-a-scale-in on the calibration's logs: 2 nodes from the others: 24 points; "
                          "4 nodes from the others: 24 points")
    assert leave_a_scale_in(abci, gpu_arch="ampere") is None  # 1, 2, 4: one scale between


def test_a_prediction_within_the_logs_takes_the_leave_a_scale_in_widths():
    out_ = HalfWidths({"small": (0.1, 0.2, 0.3, 0.4, 0.5)}, {"small": 100}, "scale out")
    in_ = HalfWidths({"small": (0.01, 0.02, 0.03, 0.04, 0.05)}, {"small": 100}, "scale in")
    covered = Calibrated("", ((1, 8), (2, 8), (8, 8)), 8, 2**30, ("allreduce",), out_, inside=in_)
    assert covered.within(4) and covered.within(8) and not covered.within(16)
    assert network_part(covered, [1024], 0.9, within=True).below == 0.03
    assert network_part(covered, [1024], 0.9, within=False).below == 0.3
    # a regime the leave-a-scale-in has no points for: the leave-a-scale-out's
    assert network_part(covered, [2**30], 0.9, within=True).source != "scale in"
    # beyond what the logs covered (another size, GPU count, collective): never the leave-a-scale-in
    assert network_part(covered, [1024], 0.9, within=True, extrapolated=True).below >= 0.3


def test_within_logs_of_three_node_counts_without_their_own_leave_a_scale_in_the_public_one_where_narrower():
    """A calibration of three node counts has one count between its fewest and most, too few for its own
    leave-a-scale-in: a prediction within its counts takes the public leave-a-scale-in (other clusters'
    interpolations) per size where that is narrower than its own leave-a-scale-out; never with two node counts,
    beyond the logs, or where the calibration has its own leave-a-scale-in."""
    public = inside_table()
    small, large = public.half_width(1024, 0.9), public.half_width(2**30, 0.9)
    out_ = HalfWidths({"small": (small,) * 5, "large": (large / 2,) * 5}, {"small": 100, "large": 100}, "scale out")
    three = Calibrated("", ((1, 8), (2, 8), (8, 8)), 8, 2**30, ("allreduce",), out_)
    wide = replace(three, intervals=HalfWidths({"small": (2 * small,) * 5}, {"small": 100}, "wide out"))
    assert network_part(wide, [1024], 0.9, within=True).below == small
    assert "public leave-a-scale-in" in network_part(wide, [1024], 0.9, within=True).source
    assert network_part(three, [2**30], 0.9, within=True).below == large / 2          # its own is narrower
    assert network_part(three, [1024], 0.9, within=True).source == "scale out"        # a tie keeps its own
    assert network_part(wide, [1024], 0.9, within=False).below == 2 * small            # not within the counts
    assert network_part(wide, [1024], 0.9, within=True, extrapolated=True).below >= 2 * small
    two = replace(wide, layouts=((1, 8), (2, 8)))
    assert network_part(two, [1024], 0.9, within=True).below == 2 * small              # nothing to interpolate
    own_in = replace(wide, inside=HalfWidths({"small": (3 * small,) * 5}, {"small": 100}, "own in"))
    assert network_part(own_in, [1024], 0.9, within=True).below == 3 * small


def test_the_public_leave_a_scale_in_table_pools_every_corpus_cluster(tmp_path):
    """The shipped table (bench/inside_bands.py --write) names every cluster of the corpus, and a missing or
    empty table is refused naming the file."""
    import tomllib

    from simfog.nccl import bands as nccl_bands

    doc = tomllib.loads(nccl_bands.INSIDE_TABLE.read_text())
    corpus = {p.name for p in (REPO / "bench" / "data" / "nccl-tests").iterdir() if p.is_dir()}
    corpus |= {p.name for p in (REPO / "bench" / "data" / "nccl-tests-ref-facts").iterdir() if p.is_dir()}
    assert set(doc["provenance"]["clusters"]) == corpus
    assert sum(inside_table().points.values()) > 500
    (tmp_path / "empty.toml").write_text("[provenance]\n")
    for path in (tmp_path / "missing.toml", tmp_path / "empty.toml"):
        with pytest.raises(ConfigError, match=path.name):
            nccl_bands.inside_table.__wrapped__(path)


def test_subset_renumbers_run_spans(abci):
    t = abci[1]
    kept = subset(t, [0, 5, 7])
    assert [m.bytes for m in kept.measurements] == [t.measurements[i].bytes for i in (0, 5, 7)]
    assert kept.extra["nccl_tests"][0]["measurements"] == [0, 3]


def test_calibrated_interval_keys_round_trip(tmp_path, abci):
    cal = nccl_fit.fit(abci, gpu_arch="ampere")
    widths = HalfWidths({"small": (0.1, 0.2, 0.25, None, None), "large": (0.05, 0.1, 0.2, 0.3, 0.4)},
                        {"small": 12, "large": 400}, "test")
    covered = Calibrated(cal.calibrated.release, cal.calibrated.layouts, 8, 2**30, ("allreduce",), widths)
    path = tmp_path / "net.toml"
    network_file.save(path, cal.network, calibrated=covered)
    back = network_file.load(path).calibrated
    assert back == covered
    inside = replace(covered, inside=HalfWidths({"medium": (0.01, 0.02, 0.03, None, None)}, {"medium": 30}, "in"))
    network_file.save(path, cal.network, calibrated=inside)
    assert network_file.load(path).calibrated == inside
    assert back.intervals.half_width(1024, 0.9) == 0.25
    assert back.intervals.half_width(1024, 0.85) == 0.25       # the next stored level up, never down
    assert back.intervals.half_width(1024, 0.95) is None       # too few points: unmeasured
    assert back.intervals.half_width(2**20, 0.9) is None       # no medium points
    text = path.read_text().replace("interval_small = [0.1", "interval_small = [-0.1")
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"net.toml.*calibrated.interval_small"):
        network_file.load(path)


def test_bench_table_is_the_shipped_one():
    t = bench_table()
    assert set(t.by_regime) == {"small", "medium", "large"} and sum(t.points.values()) == 960
    for row in t.by_regime.values():  # a quantile grows with the level
        assert list(row) == sorted(row)


def test_network_part_sources():
    widths = HalfWidths({"small": (0.01, 0.02, 0.03, 0.04, 0.05)}, {"small": 100}, "own logs")
    covered = Calibrated("", ((1, 8), (2, 8)), 8, 2**30, ("allreduce",), widths)
    inside = network_part(covered, [1024], 0.9)
    assert (inside.below, inside.source) == (0.03, "own logs")
    # extrapolated: the wider of own and bench
    beyond = network_part(covered, [1024], 0.9, extrapolated=True)
    assert beyond.below == bench_table().half_width(1024, 0.9) and "bench" in beyond.source
    # a size the own logs have no regime for: the bench's; the widest over the sizes a run sends
    mixed = network_part(covered, [1024, 2**30], 0.9)
    assert mixed.below == max(0.03, bench_table().half_width(2**30, 0.9))
    # a level no table reaches: unmeasured, never narrower than the widest level measured (the bench's 99 %)
    assert network_part(None, [1024], 0.995).below == max(UNMEASURED_HALF_WIDTH, bench_table().widest(1024)) \
        == bench_table().half_width(1024, 0.99)
    assert not network_part(None, [1024], 0.995).measured


def test_collective_json_rows_carry_bounds(tmp_path, abci, capsys):
    from simfog.cli import main

    cal = nccl_fit.fit(abci, gpu_arch="ampere")
    path = tmp_path / "net.toml"
    network_file.save(path, cal.network, calibrated=cal.calibrated)  # no interval keys
    # 4 nodes lies within the logs' 1, 2, 4: the public leave-a-scale-in; 8 nodes leaves them: the bench's (x2)
    for nodes, table in ((4, inside_table()), (8, bench_tables()["x2"])):
        assert main(["collective", "allreduce", "--network", str(path), "--nodes", str(nodes), "--gpus-per-node",
                     "8", "--sizes", "1KiB,1MiB,16MiB", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["interval_level"] == 0.9
        for r in out["rows"]:
            w = table.half_width(r["bytes"], 0.9)
            assert r["time_lo_s"] == pytest.approx(r["time_s"] * math.exp(-w))
            assert r["time_hi_s"] == pytest.approx(r["time_s"] * math.exp(w))
    assert main(["collective", "allreduce", "--network", str(path), "--nodes", "4", "--gpus-per-node", "8",
                 "--sizes", "1KiB", "--level", "0.5", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["rows"][0]
    assert np.log(r["time_hi_s"] / r["time_s"]) == pytest.approx(inside_table().half_width(1024, 0.5))


def test_calibrate_writes_the_leave_a_scale_out_and_collective_uses_it(tmp_path, abci, capsys):
    from simfog.cli import main

    paths = []
    for i, t in enumerate(abci):
        paths.append(str(tmp_path / f"t{i}.json.gz"))
        t.save(paths[-1])
    net = tmp_path / "net.toml"
    assert main(["calibrate", *paths, "--gpu-arch", "ampere", "-o", str(net), "--json"]) == 0

    def no_nan(c):
        raise AssertionError(f"JSON has {c}")

    out = json.loads(capsys.readouterr().out, parse_constant=no_nan)
    assert out["calibrated"]["interval_points"] == [28, 16, 4]       # 48 points: 2 and 4 nodes, 24 sizes each
    # the report names the widths predictions within the logs' three node counts may take
    assert main(["calibrate", *paths, "--gpu-arch", "ampere"]) == 0
    report = capsys.readouterr().out
    assert "leave-a-scale-out on the calibration's logs" in report and "the public leave-a-scale-in" in report
    assert out["calibrated"]["interval_large"][2] is None            # 4 large points cannot bound 90 %
    covered = network_file.load(net).calibrated
    direct = leave_a_scale_out(abci, gpu_arch="ampere")  # the file keeps 6 decimals
    for r, row in direct.by_regime.items():
        assert covered.intervals.by_regime[r] == pytest.approx(row, abs=5e-7)
    # 1, 2 and 4 nodes: one scale between the others is too few for a leave-a-scale-in (MIN_SCALES_IN)
    assert covered.inside is None
    # inside the logs (4 x 8, sizes they hold): the narrower of the logs' own half-width and the public
    # leave-a-scale-in's (three node counts, none of its own); 32 MiB has too few of its own: the public one's
    assert main(["collective", "allreduce", "--network", str(net), "--nodes", "4", "--gpus-per-node", "8",
                 "--sizes", "1KiB,32MiB", "--json"]) == 0
    small, large = json.loads(capsys.readouterr().out)["rows"]
    own, public = covered.intervals.half_width(1024, 0.9), inside_table().half_width(1024, 0.9)
    assert small["extrapolated"] == [] and math.log(small["time_hi_s"] / small["time_s"]) == \
        pytest.approx(min(own, public), abs=1e-9)
    assert ("public leave-a-scale-in" in small["interval_source"]) == (public < own)
    assert math.log(large["time_hi_s"] / large["time_s"]) == pytest.approx(inside_table().half_width(2**25, 0.9))
    assert "public leave-a-scale-in" in large["interval_source"]


def test_a_level_too_high_for_its_points_is_never_narrower_than_a_lower_one(monkeypatch):
    """A regime whose points bound 50 % and 80 % but not 90 %: at 90 % the part is unmeasured, at least as wide as
    the 80 % width where that is wider than the default (ln 2), and the default otherwise."""
    from simfog.bands import LEVELS, UNMEASURED_HALF_WIDTH, HalfWidths
    from simfog.nccl import bands as nccl_bands

    def table(w80: float) -> HalfWidths:
        row = tuple(w80 / 2 if lv == 0.5 else w80 if lv == 0.8 else None for lv in LEVELS)
        return HalfWidths({"small": row}, {"small": 5}, "hand-made")

    wide = table(1.5)
    assert wide.widest(1024) == 1.5 and wide.widest(2**30) == 0.0  # no large points at all
    monkeypatch.setattr(nccl_bands, "bench_tables", lambda: {nccl_bands.POOLED: wide})
    part = nccl_bands.network_part(None, [1024], 0.9)
    assert not part.measured and part.below == 1.5 and "too few held-out points" in part.source
    monkeypatch.setattr(nccl_bands, "bench_tables", lambda: {nccl_bands.POOLED: table(0.3)})
    assert nccl_bands.network_part(None, [1024], 0.9).below == UNMEASURED_HALF_WIDTH
    assert nccl_bands.network_part(None, [1024], 0.8).below == 0.3 and \
        nccl_bands.network_part(None, [1024], 0.8).measured
