"""simfog.calibrate: α-β fits per link class, breakpoints, residuals, apply() and the CLI."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog.calibrate import cluster_from_network_trace, coefficients, fit, link_class
from simfog.cluster import Cluster, Link
from simfog.commands import calibrate as calibrate_cli
from simfog.errors import ConfigError, Infeasible
from simfog.trace import Measurement, NetworkTrace, Provenance

from .conftest import REF

COLLS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "sendrecv")
SIZES = tuple(2**k for k in range(2, 27))  # 4 B .. 64 MiB
BASE = Cluster(2, 4, Link(1e-6, 1e11), Link(10e-6, 1.25e9), oversubscription=2.0)


def ring_time(coll, n, nbytes, alpha, beta):
    """Closed forms written out (docs/ALGORITHMS.md §3), independent of calibrate.coefficients."""
    return {"allreduce": 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta,
            "allgather": (n - 1) * alpha + (n - 1) / n * nbytes * beta,
            "reduce_scatter": (n - 1) * alpha + (n - 1) / n * nbytes * beta,
            "broadcast": (n - 1) * alpha + nbytes * beta,
            "sendrecv": alpha + nbytes * beta}[coll]


def make_trace(curves, *, ranks=(2, 4, 8), sizes=SIZES, samples=1, noise=0.0, seed=0):
    """curves: {"intra" | "nic": f(coll, n, nbytes) -> seconds}. intra: n ranks on 1 node; nic: n ranks on n."""
    rng = np.random.default_rng(seed)
    ms = []
    for cls, f in curves.items():
        for n in ranks:
            for coll in COLLS:
                for m in sizes:
                    t = f(coll, n, m)
                    ts = t * np.exp(rng.normal(0, noise, samples)) if noise else [t] * samples
                    ms.append(Measurement(coll, n, 1 if cls == "intra" else n, m, tuple(float(x) for x in ts)))
    return NetworkTrace("synthetic", "none", Provenance("test", "2026-11-21", "test", "estimated", True), tuple(ms))


def line(alpha, beta):
    return lambda coll, n, m: ring_time(coll, n, m, alpha, beta)


def two_regime(bp, small, large):
    return lambda coll, n, m: ring_time(coll, n, m, *(small if m < bp else large))


def test_coefficients_closed_forms():
    assert coefficients("allreduce", 4) == (6.0, 1.5)
    assert coefficients("allgather", 4) == (3.0, 0.75)
    assert coefficients("reduce_scatter", 8) == (7.0, 0.875)
    assert coefficients("broadcast", 8) == (7.0, 1.0)
    assert coefficients("sendrecv", 8, "tree") == (1.0, 1.0)
    assert coefficients("allreduce", 8, "rhd") == (6.0, 1.75)
    assert coefficients("allreduce", 8, "tree") == (6.0, 2.0)
    assert coefficients("allreduce", 6, "tree") == (6.0, 2.0)  # ⌈log2 6⌉ = 3
    with pytest.raises(ConfigError, match="algorithm"):
        coefficients("allreduce", 4, "butterfly")


def test_link_class():
    assert [link_class(r, n) for r, n in ((1, 1), (2, 1), (4, 4), (4, 2))] == [None, "intra", "nic", "mixed"]


def test_one_line_per_class_is_fitted_back_exactly():
    intra, nic = (2e-6, 1 / 5e9), (15e-6, 1 / 1.25e9)
    cal = fit(make_trace({"intra": line(*intra), "nic": line(*nic)}))
    assert cal.fitted_classes == ("intra", "nic")
    for cls, (alpha, beta) in (("intra", intra), ("nic", nic)):
        f = cal.fits[cls]
        assert f.breakpoint_bytes is None
        assert f.latency_s == pytest.approx(alpha, rel=1e-9)
        assert f.bandwidth_Bps == pytest.approx(1 / beta, rel=1e-9)
        assert f.small == f.large
        assert f.points == 3 * len(COLLS) * len(SIZES)
    res = cal.residuals
    assert len(res) == 2 * 3 * len(COLLS) * len(SIZES)
    assert res.rel_error.abs().max() < 1e-9 and res.link_rel_error.abs().max() < 1e-9


def test_two_regimes_recover_breakpoint_and_both_segments():
    small, large = (3e-6, 1 / 1e9), (40e-6, 1 / 8e9)  # eager: low latency; rendezvous: high latency, fast
    cal = fit(make_trace({"intra": two_regime(65536, small, large)}))
    f = cal.fits["intra"]
    assert f.breakpoint_bytes == 65536
    assert f.small == pytest.approx(small, rel=1e-9)
    assert f.large == pytest.approx(large, rel=1e-9)
    # The cluster's Link: latency from small messages, bandwidth from large ones.
    assert f.latency_s == pytest.approx(3e-6, rel=1e-9) and f.bandwidth_Bps == pytest.approx(8e9, rel=1e-9)
    assert f.rms_rel_error < 1e-9 < 0.1 < f.line_rms_rel_error
    assert cal.residuals.rel_error.abs().max() < 1e-9


def test_noisy_line_is_fitted_within_a_few_percent_without_a_breakpoint():
    alpha, beta = 20e-6, 1 / 2e9
    cal = fit(make_trace({"nic": line(alpha, beta)}, samples=5, noise=0.05, seed=7))
    f = cal.fits["nic"]
    assert f.breakpoint_bytes is None
    assert f.latency_s == pytest.approx(alpha, rel=0.03)
    assert f.bandwidth_Bps == pytest.approx(1 / beta, rel=0.03)


def test_noisy_two_regimes_still_find_the_breakpoint():
    cal = fit(make_trace({"intra": two_regime(2**20, (5e-6, 1 / 2e9), (300e-6, 1 / 6e9))}, samples=5, noise=0.05,
                         seed=3))
    f = cal.fits["intra"]
    assert f.breakpoint_bytes == 2**20
    assert f.latency_s == pytest.approx(5e-6, rel=0.05) and f.bandwidth_Bps == pytest.approx(6e9, rel=0.05)


@settings(max_examples=25, deadline=None)
@given(alpha=st.floats(1e-7, 1e-3), bandwidth=st.floats(1e7, 1e11))
def test_any_exact_line_is_recovered(alpha, bandwidth):
    f = fit(make_trace({"intra": line(alpha, 1 / bandwidth)}, ranks=(2, 4), sizes=SIZES[::3])).fits["intra"]
    assert f.latency_s == pytest.approx(alpha, rel=1e-7)
    assert f.bandwidth_Bps == pytest.approx(bandwidth, rel=1e-7)


def test_apply_replaces_only_fitted_classes():
    cal = fit(make_trace({"intra": line(2e-6, 1 / 5e9)}))
    assert cal.fitted_classes == ("intra",)
    out = cal.apply(BASE)
    assert out.intra.latency_s == pytest.approx(2e-6, rel=1e-9)
    assert out.intra.bandwidth_Bps == pytest.approx(5e9, rel=1e-9)
    assert out.nic == BASE.nic
    assert (out.nodes, out.ranks_per_node, out.oversubscription) == (2, 4, 2.0)
    out = fit(make_trace({"nic": line(30e-6, 1 / 1e9)})).apply(BASE)
    assert out.intra == BASE.intra and out.nic.bandwidth_Bps == pytest.approx(1e9, rel=1e-9)


def test_mixed_layouts_only_get_residuals_on_the_slower_link():
    trace = make_trace({"intra": line(1e-6, 1 / 1e10), "nic": line(20e-6, 1 / 1e9)}, ranks=(2, 4))
    # 4 ranks on 2 nodes, ring allreduce bottlenecked by the NIC: 6·20 us + 1.5·M/1e9.
    mixed = Measurement("allreduce", 4, 2, 2**20, (6 * 20e-6 + 1.5 * 2**20 / 1e9,))
    cal = fit(NetworkTrace("t", "t", trace.provenance, (*trace.measurements, mixed)))
    row = cal.residuals[cal.residuals.link_class == "mixed"]
    assert len(row) == 1 and abs(row.rel_error.iloc[0]) < 1e-9
    assert cal.fits["nic"].latency_s == pytest.approx(20e-6, rel=1e-9)  # the mixed point did not move the fit


def test_report_and_json_name_every_class_and_collective():
    cal = fit(make_trace({"intra": two_regime(65536, (3e-6, 1e-9), (40e-6, 1.25e-10)), "nic": line(2e-5, 1e-9)}))
    text = cal.report(rows=True)
    for word in ("intra", "nic", "64 KiB", "median", "worst", *COLLS):
        assert word in text
    d = json.loads(json.dumps(cal.to_dict()))
    assert d["fits"]["intra"]["breakpoint_bytes"] == 65536 and d["fits"]["nic"]["breakpoint_bytes"] is None
    assert len(d["residuals"]) == len(cal.rows)


def test_bad_input_gives_clear_errors():
    prov = Provenance("t", "d", "h")
    with pytest.raises(ConfigError, match="measurements"):
        fit(NetworkTrace("t", "t", prov, ()))
    one_size = tuple(Measurement("allreduce", n, 1, 1024, (1e-5 * n,)) for n in (2, 4, 8))
    with pytest.raises(Infeasible, match="1 distinct message size"):
        fit(NetworkTrace("t", "t", prov, one_size))
    with pytest.raises(Infeasible, match="no measurement calibrates"):
        fit(NetworkTrace("t", "t", prov, (Measurement("allreduce", 4, 2, 1024, (1e-5,)),
                                          Measurement("allreduce", 1, 1, 2048, (1e-6,)))))
    flat = tuple(Measurement("allreduce", 2, 1, m, (1e-5,)) for m in (4, 64, 1024))
    with pytest.raises(Infeasible, match="grow with message size"):
        fit(NetworkTrace("t", "t", prov, flat))
    zero = (Measurement("allreduce", 2, 1, 4, (0.0, 0.0, 1e-6)), Measurement("allreduce", 2, 1, 8, (1e-6,)))
    with pytest.raises(ConfigError, match=r"measurements\[0\]\.time_s"):
        fit(NetworkTrace("t", "t", prov, zero))
    with pytest.raises(ConfigError, match="algorithm"):
        fit(make_trace({"intra": line(1e-6, 1e-9)}), algorithm="butterfly")
    with pytest.raises(ConfigError, match="statistic"):
        fit(make_trace({"intra": line(1e-6, 1e-9)}), statistic="mode")


def test_statistic_picks_what_of_the_samples_is_fitted():
    # Every measurement: two clean samples and one 10x slower (a preempted repetition).
    clean = make_trace({"intra": line(5e-6, 1 / 2e9)}, ranks=(2,))
    slow = NetworkTrace("t", "t", clean.provenance, tuple(
        Measurement(m.collective, m.ranks, m.nodes, m.bytes, (m.time_s[0], 10 * m.time_s[0], m.time_s[0]))
        for m in clean.measurements))
    for statistic in ("median", "min"):
        f = fit(slow, statistic=statistic).fits["intra"]
        assert f.latency_s == pytest.approx(5e-6, rel=1e-9) and f.bandwidth_Bps == pytest.approx(2e9, rel=1e-9)
    mean = fit(slow, statistic="mean")
    assert mean.statistic == "mean"
    assert mean.fits["intra"].latency_s == pytest.approx(4 * 5e-6, rel=1e-9)  # (1 + 10 + 1) / 3 = 4x


def test_cluster_from_network_trace_file(tmp_path):
    path = tmp_path / "net.json.gz"
    make_trace({"nic": line(25e-6, 1 / 1.1e9)}).save(path)
    out = cluster_from_network_trace(path, BASE)
    assert out.nic.latency_s == pytest.approx(25e-6, rel=1e-9) and out.intra == BASE.intra
    bad = tmp_path / "zero.json"
    bad_trace = NetworkTrace("t", "t", Provenance("t", "d", "h"),
                             (Measurement("sendrecv", 2, 2, 4, (0.0,)), Measurement("sendrecv", 2, 2, 8, (1e-6,))))
    bad.write_text(json.dumps(bad_trace.to_dict()))  # as another tool might write it (simfog's save refuses it)
    with pytest.raises(ConfigError) as e:
        cluster_from_network_trace(bad, BASE)
    assert e.value.source == str(bad)


def test_cli_prints_table_and_json(tmp_path, capsys):
    path = tmp_path / "net.json"
    make_trace({"intra": line(2e-6, 1 / 5e9)}).save(path)
    parser = argparse.ArgumentParser()
    calibrate_cli.add_arguments(parser)
    assert calibrate_cli.run(parser.parse_args([str(path)])) == 0
    assert "intra" in capsys.readouterr().out
    assert calibrate_cli.run(parser.parse_args([str(path), "--json"])) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fitted_classes"] == ["intra"] and d["fits"]["intra"]["latency_s"] == pytest.approx(2e-6, rel=1e-9)
    assert parser.parse_args([str(path), "--json", "--algorithm", "rhd"]).algorithm == "rhd"


def osu_trace(path: Path, procs: int) -> NetworkTrace:
    """The OSU allreduce log: '<procs>,<bytes>  <avg µs>' rows (the prefix is optional, PROVENANCE.md quirk 7)."""
    ms = []
    for row in path.read_text().splitlines():
        m = re.fullmatch(r"\s*(?:\d+,)?(\d+)\s+([\d.]+)\s*", row)
        if m:
            ms.append(Measurement("allreduce", procs, procs, int(m[1]), (float(m[2]) * 1e-6,)))
    return NetworkTrace("mpi", "10GbE", Provenance("osu_allreduce", "2018-02-22", "B-Caffe", "imported"), tuple(ms))


def test_osu_allreduce_8_nodes_has_its_protocol_breakpoint():
    path = REF / "mgwfbp-googlenet" / "allreduce8.log"
    trace = osu_trace(path, 8)
    assert len(trace.measurements) == 266
    f = fit(trace).fits["nic"]
    # Quirk 8: latency jumps between 8192 B (182 us) and 12288 B (792 us), eager -> rendezvous.
    assert 8192 < f.breakpoint_bytes <= 12288
    assert f.rms_rel_error**2 * 4 < f.line_rms_rel_error**2  # two segments: > 4x less squared error
    assert f.rms_rel_error < 0.15
    assert 1e8 < f.bandwidth_Bps <= 1.25e9  # a 10GbE link cannot carry more than 1.25 GB/s
    assert math.isfinite(f.latency_s) and 0 <= f.latency_s < 82.28e-6 / 14  # 4 B allreduce = 14 ring steps


def test_mixed_layout_fits_as_nic_when_asked():
    """A node-by-node ring of 4 nodes x 2 waits for its NIC hops: with mixed_as_nic its times calibrate the nic
    class exactly (ring coefficients over all 8 ranks); without, mixed measurements only get residuals."""
    alpha, bw, n = 300e-6, 22e6, 8
    sizes = (1_000, 10_000, 100_000, 1_000_000, 3_000_000)
    ms = tuple(Measurement("allreduce", n, 4, b, (2 * (n - 1) * alpha + 2 * (n - 1) / n * b / bw,)) for b in sizes)
    trace = NetworkTrace("gloo", "tcp", Provenance("test", "2026-11-21", "here", "measured"), ms)
    cal = fit(trace, mixed_as_nic=True)
    assert cal.fitted_classes == ("nic",)
    assert cal.fits["nic"].latency_s == pytest.approx(alpha, rel=1e-6)
    assert cal.fits["nic"].bandwidth_Bps == pytest.approx(bw, rel=1e-6)
    with pytest.raises(Infeasible):
        fit(trace)
