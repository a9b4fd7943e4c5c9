"""Real runs of decentralized averaging in the validator: the schedules taken from the simulator (hand-checked),
what cannot be validated, measured records with per-rank peers, and one small emulated run of one-peer exp2 and
WAGMA (root and tc only) whose ranks must send exactly the scheduled messages and average exactly the right
parameters."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from simfog.errors import ConfigError
from simfog.experiment import Heterogeneity
from simfog.simulation import new_simulation
from validate.comparison import compare
from validate.ranks import decentralized
from validate.run import Options, check_experiment

from ..conftest import make_experiment, make_trace
from .conftest import emulation_available, skip_timing_if_host_limited


def _sim(algorithm, ranks, per_node=1, iterations=4, **comm):
    trace = make_trace([1e-3] * 3, [2e-3] * 3, [1000] * 3)
    exp = make_experiment(trace, nodes=ranks // per_node, gpus_per_node=per_node, iterations=iterations,
                          algorithm=algorithm, **comm)
    return new_simulation(exp)


def test_one_peer_exp2_schedule_is_the_topologys():
    fields = decentralized.worker_fields(_sim("neighbor", 4, topology="one_peer_exp2"), warmup=2)
    # n = 4: D = 2; phase 0 sends to i + 1 and receives from i - 1, phase 1 to/from i + 2; ½/½.
    assert fields["exchanges"] == [
        [[[1], [3], 0.5, [0.5]], [[2], [0], 0.5, [0.5]], [[3], [1], 0.5, [0.5]], [[0], [2], 0.5, [0.5]]],
        [[[2], [2], 0.5, [0.5]], [[3], [3], 0.5, [0.5]], [[0], [0], 0.5, [0.5]], [[1], [1], 0.5, [0.5]]]]
    # run iterations are warm-up (simulator iterations -2, -1) then 0..3: phase k mod 2
    assert fields["schedule"] == [0, 1, 0, 1, 0, 1]
    cfg = {**fields, "warmup": 2, "iterations": 4}
    assert decentralized.expected_messages(cfg, 3, 2, 4000) == {"sends": [[0, 4000]], "recvs": [[0, 4000]]}


@pytest.mark.parametrize(("size", "groups"), [
    (2, [[[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2], [1, 3], [4, 6], [5, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]]),
    (4, [[[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]]),
])
def test_wagma_groups_are_the_simulators(size, groups):
    """8 ranks: groups of S consecutive ranks, then stride-S groups (docs/ALGORITHMS.md §4.4); with S = 4 the 3 bits
    leave a last layout of one bit (groups of 2)."""
    sim = _sim("wagma", 8, iterations=6, group_size=size, global_every=3)
    fields = decentralized.worker_fields(sim, warmup=1)
    assert fields["groups"] == groups
    # simulator iterations -1..5; global when (k + 1) % 3 == 0: k = -1, 2, 5
    layouts = len(groups)
    assert fields["schedule"] == [-1 if (k + 1) % 3 == 0 else k % layouts for k in range(-1, 6)]
    assert fields["schedule"][0] == -1 and fields["schedule"][1] == 0
    cfg = {**fields, "warmup": 1, "iterations": 6}
    assert decentralized.group_of(cfg, 0, 5) == list(range(8))
    assert decentralized.group_of(cfg, 2, 5) == groups[1][3 if size == 2 else 1]


def _sendrecv_calibration(alpha_s, flow_Bps):
    """A Calibration of the sendrecv microbenchmark (T = α + M/flow) on 4 nodes x 2 ranks and on one node."""
    from simfog.trace import Measurement, NetworkTrace, Provenance
    from validate.run import calibration_of

    sizes = (1_000, 100_000, 1_000_000, 3_000_000)
    ms = [Measurement("sendrecv", 8, 4, b, (alpha_s + b / flow_Bps,) * 3) for b in sizes]
    ms += [Measurement("sendrecv", 2, 1, b, (1e-4 + b / 1e9,) * 3) for b in sizes]
    return calibration_of(NetworkTrace("gloo", "tcp", Provenance("synthetic", "2026-11-25", "test"), tuple(ms)),
                          "sendrecv")


@pytest.mark.parametrize(("flow_Bps", "capacity_Bps"), [(107e6, 119.5e6), (21.6e6, 23.9e6), (126e6, 119.5e6)])
def test_sendrecv_fit_is_a_per_flow_cap_of_the_declared_nic(flow_Bps, capacity_Bps):
    """The ring-shift microbenchmark puts one flow on each NIC, so its fit is a per-flow rate: the simulated NIC
    gets the declared capacity and the fit as cap. One-peer exp2 on 4 nodes x 2: shift 1 puts one flow on each
    NIC (α + M/cap, as measured), shifts 2 and 4 two (α + max(M/cap, 2M/capacity), not α + 2M/cap); a fit above
    the capacity keeps the old numbers (capacity = fit)."""
    from validate.run import simulated_experiment

    cal = _sendrecv_calibration(1e-3, flow_Bps)
    exp = _sim("neighbor", 8, per_node=2, topology="one_peer_exp2").experiment
    sim_exp = simulated_experiment(exp, cal, None, capacity_Bps)
    # the interval's network part comes from the calibration's own residuals (exact fits: all 0)
    assert sim_exp.link_scores == cal.link_scores() and len(sim_exp.link_scores) == len(cal.rows)
    assert max(score for _, score in sim_exp.link_scores) < 1e-6
    nic = sim_exp.cluster.nic
    assert nic.flow_bandwidth_Bps == pytest.approx(flow_Bps, rel=1e-9)
    assert nic.bandwidth_Bps == max(capacity_Bps, nic.flow_bandwidth_Bps)
    assert nic.latency_s == pytest.approx(1e-3, rel=1e-6)
    from simfog.p2p import Message, exchange_times

    M = 1e6
    for shift, flows in ((1, 1), (2, 2), (4, 2)):
        t = exchange_times(sim_exp.cluster, [Message(r, (r + shift) % 8, M) for r in range(8)])
        inter = [x for r, x in enumerate(t) if r // 2 != ((r + shift) % 8) // 2]
        want = nic.latency_s + max(M / nic.flow_bandwidth_Bps, flows * M / nic.bandwidth_Bps)
        assert inter == [pytest.approx(want, rel=1e-12)] * len(inter)
    # without a capacity (loopback, a real cluster): the fit is the NIC, flows divide it as before
    old = simulated_experiment(exp, cal, None).cluster.nic
    assert old.flow_bandwidth_Bps is None and old.bandwidth_Bps == pytest.approx(flow_Bps, rel=1e-9)


def test_sendrecv_is_fitted_on_its_medians_as_measured_and_allreduce_keeps_its_spread():
    """The flow-level model draws no per-call spread, so the sendrecv fit must give back the microbenchmark's
    medians as they are (T = alpha + M/flow at the measured median), not the medians without an expected slowest
    rank, which would fit a link faster than the one measured. The allreduce class keeps its spread and its
    slowest-rank correction (the ring's calls draw it)."""
    from simfog.trace import Measurement, NetworkTrace, Provenance
    from simfog.variation import median_factor
    from validate.run import calibration_of

    alpha, flow = 1e-3, 25e6
    sizes = (1_000, 100_000, 1_000_000, 3_000_000)
    spread_samples = (0.80, 0.90, 1.0, 1.0, 1.0, 1.10, 1.35)  # median 1, IQR 0.1 + a stalled repetition
    ms = []
    for coll in ("sendrecv", "allreduce"):
        ms += [Measurement(coll, 8, 8, b, tuple((alpha + b / flow) * f for f in spread_samples)) for b in sizes]
    net = NetworkTrace("gloo", "tcp", Provenance("synthetic", "2026-12-07", "test"), tuple(ms))
    p2p = calibration_of(net, "sendrecv").fits["nic"]
    assert p2p.spread == 0.0
    assert p2p.latency_s == pytest.approx(alpha, rel=1e-6)
    assert p2p.bandwidth_Bps == pytest.approx(flow, rel=1e-6)
    ring_cal = calibration_of(net, "allreduce")
    ring = ring_cal.fits["nic"]
    assert ring.spread > 0.05 and ring.link.spread == ring.spread
    # the ring's link is fitted without the expected slowest of 8, which the model puts back: medians reproduced
    for row in ring_cal.rows:
        assert row.link_s == pytest.approx(row.measured_s, rel=1e-6)
        assert row.link_s / median_factor(ring.spread, 8) < row.measured_s / 1.05


def test_nic_capacity_is_the_tbf_rates_tcp_payload_on_emulated_clusters_only():
    from simfog.cluster import Cluster, Link
    from validate.run import nic_capacity

    shape = Cluster(4, 2, Link(0.0, 1e9), Link(0.0, 125e6))
    assert nic_capacity(shape, True) == pytest.approx(125e6 * 8948 / 9014, rel=1e-12)
    assert nic_capacity(shape, False) is None


def test_what_cannot_be_validated_is_refused():
    neighbor = _sim("neighbor", 4, topology="one_peer_exp2").experiment
    check_experiment(neighbor, "replay")
    with pytest.raises(ConfigError, match="replay"):
        check_experiment(neighbor, "model")
    with pytest.raises(ConfigError, match="awc"):
        check_experiment(neighbor.with_comm(combine="atc"), "replay")
    with pytest.raises(ConfigError, match="intra-node"):
        check_experiment(_sim("neighbor", 4, per_node=2, topology="machine_one_peer_exp2").experiment, "replay")
    wagma = _sim("wagma", 4, group_size=2).experiment
    check_experiment(wagma, "replay")
    with pytest.raises(ConfigError, match="waits for its members"):
        check_experiment(replace(wagma, heterogeneity=Heterogeneity(rank_slowdown=((1, 1.5),))), "replay")
    with pytest.raises(ConfigError, match="comm.algorithm"):
        check_experiment(wagma.with_comm(algorithm="decentralized"), "replay")


def _it(start, launch, done, end, peers, **extra):
    return {"start": start, "forward_end": start + 0.1, "backward_end": start + 0.3, "optimizer_start": done,
            "end": end, "launch": [launch], "done": [done], "launch_order": [0], "peers": [peers],
            "names": ["neighbor"], **extra}


def test_measured_exchange_waits_for_its_own_peers_only():
    """3 ranks, one iteration: rank 0 exchanges with rank 2 only, so its message starts at the later of their
    launches (1.15), not at rank 1's (1.3)."""
    exp = _sim("neighbor", 3, topology="ring").experiment
    ranks = [{"buckets": [["l0.weight"]], "iterations": [_it(1.0, 1.1, 1.4, 1.5, [0, 2])]},
             {"buckets": [["l0.weight"]], "iterations": [_it(1.0, 1.3, 1.5, 1.6, [1])]},
             {"buckets": [["l0.weight"]], "iterations": [_it(1.05, 1.15, 1.45, 1.55, [0, 2])]}]
    df = compare.measured_result(exp, ranks, bucket_bytes=[4000]).intervals().round(9)
    got = {(r.rank, r.kind): (r.name, r.start_s, r.end_s) for r in df.itertuples() if r.kind in ("wait", "comm")}
    assert got[(0, "wait")] == ("neighbor", pytest.approx(0.1), pytest.approx(0.15))
    assert got[(0, "comm")] == ("neighbor", pytest.approx(0.15), pytest.approx(0.4))
    assert (2, "wait") not in got and got[(2, "comm")][1:] == (pytest.approx(0.15), pytest.approx(0.45))
    assert (1, "wait") not in got and got[(1, "comm")][1:] == (pytest.approx(0.3), pytest.approx(0.5))


def test_communication_check_catches_a_wrong_peer():
    fields = decentralized.worker_fields(_sim("neighbor", 2, topology="one_peer_exp2", iterations=1), warmup=1)
    cfg = {**fields, "warmup": 1, "iterations": 1}
    good = [{"iterations": [{"sends": [[1, 12]], "recvs": [[1, 12]]}]},
            {"iterations": [{"sends": [[0, 12]], "recvs": [[0, 12]]}]}]
    assert decentralized.communication_matches(cfg, good, 12)
    assert not decentralized.communication_matches(cfg, good, 16)  # not model-sized
    bad = [good[0], {"iterations": [{"sends": [[0, 12], [0, 12]], "recvs": [[0, 12]]}]}]
    assert not decentralized.communication_matches(cfg, bad, 12)


# ---- real runs: 4 ranks on 2 emulated nodes ----

@pytest.mark.root
def test_neighbor_and_wagma_on_an_emulated_cluster(tmp_path):
    """2 nodes x 2 ranks at 1 Gbit/s, replay of a 4-layer trace (1 MB of parameters): one-peer exp2 and WAGMA with
    groups of 2 (global every 3 iterations) in one launch. Every rank must send one model-sized message per
    iteration to i + 2^(k mod 2) and receive one from i - 2^(k mod 2); the averaged markers must be the right
    mixtures; times positive, errors finite and bounded by 50 % (a broken exchange or calibration is off by far
    more; see test_validate_run for the bound's reasoning)."""
    ok, why = emulation_available()
    if not ok:
        pytest.skip(f"no emulated cluster here: {why}")
    from validate.run import run_group

    trace = make_trace([2e-3] * 4, [5e-3] * 4, [65536] * 4, samples=[([2e-3] * 4, [5e-3] * 4),
                                                                      ([2.5e-3] * 4, [4.5e-3] * 4)])
    trace.save(tmp_path / "trace.json")
    from simfog.cluster import Link

    # 1 Gbit/s, not the helper's 10 Gbit/s: there a 1 MB message fits in the shaper's 1 ms bucket and crosses at
    # veth speed, so the calibration's two sizes differ by noise alone and the fit finds no bandwidth.
    base = make_experiment(trace, nodes=2, gpus_per_node=2, iterations=4, compute="samples", seed=2,
                           nic=Link(10e-6, 125e6))
    base = replace(base, workload=replace(base.workload, trace_path=str(tmp_path / "trace.json")))
    exps = [base.with_comm(algorithm="neighbor", topology="one_peer_exp2"),
            base.with_comm(algorithm="wagma", group_size=2, global_every=3)]
    warmup = 2
    options = Options(warmup=warmup, emulate=True, workdir=str(tmp_path / "work"),
                      calibration_sizes=(10_000, 1_000_000), calibration_repeats=3)
    run = run_group(exps, options, ids=["neighbor", "wagma"])
    rows = {r["id"]: r for r in run.rows}
    for r in rows.values():
        assert r["error"] == ""
        assert r["emulated"] is True and r["calibration"] == "gloo sendrecv"
        assert r["buckets_match"] is True
        assert r["measured_iteration_s"] > 0 and r["predicted_iteration_s"] > 0
        assert math.isfinite(r["rel_error"])
        assert r["overheads_source"].startswith(f"host probe: {r['id']}-100kB, {r['id']}-1000kB on this cluster")
    assert rows["neighbor"]["algorithm"] == "neighbor:one_peer_exp2"
    assert rows["wagma"]["algorithm"] == "wagma:S2:every3"
    skip_timing_if_host_limited(*rows.values())
    assert all(abs(r["rel_error"]) < 0.5 for r in rows.values()), {k: r["rel_error"] for k, r in rows.items()}

    n, nbytes = 4, 4 * 65536 * 4
    records = [json.loads((tmp_path / "work" / "ranks" / f"rank{r}.json").read_text())["configs"] for r in range(n)]
    for rank in range(n):
        neighbor, wagma = records[rank]
        assert len(neighbor["iterations"]) == 4
        for k, d in enumerate(neighbor["iterations"]):
            d_k = 2 ** (k % 2)
            assert d["sends"] == [[(rank + d_k) % n, nbytes]]
            assert d["recvs"] == [[(rank - d_k) % n, nbytes]]
            assert d["done"][0] >= d["launch"][0] > d["start"]
        # markers: rank r's average with r - 2^(k mod 2), warm-up (k = -2, -1) included
        for i, value in enumerate(neighbor["values"]):
            k = i - warmup
            assert value == [(rank + (rank - 2 ** (k % 2)) % n) / 2] * 2
        for i, value in enumerate(wagma["values"]):
            k = i - warmup
            if (k + 1) % 3 == 0:
                members = range(n)
            else:
                members = [rank, rank ^ (1 << (k % 2))]
            assert value == [float(np.mean(list(members)))] * 2
            if k >= 0:
                assert sorted(wagma["iterations"][k]["group"]) == sorted(members)


@pytest.mark.root
def test_the_sendrecv_calibration_runs_a_two_rank_exchange_at_the_one_way_rate(tmp_path):
    """The point-to-point families' calibration (the sendrecv ring shift) between 2 emulated nodes: each rank sends
    1 MB to the other and receives 1 MB from it at once, each direction through its own shaper, so a call takes
    about one direction's time, as the neighbour exchange's does (it posts its receives first). Gloo runs the two
    directions of a pair one after the other when the send is posted first (79 ms against 40 ms at 200 Mbit/s,
    and the slowest rank of a 4-node ring ~15 % slow), which had made every neighbour row's fitted links slow."""
    ok, why = emulation_available()
    if not ok:
        pytest.skip(f"no emulated cluster here: {why}")
    from validate.calibration import measure_network
    from validate.cluster.netemu import TCP_GOODPUT, EmulatedCluster

    rate_Bps, nbytes = 50e6 / 8, 1_000_000
    options = Options(emulate=True, calibration_sizes=(nbytes,), calibration_repeats=5, calibration_rounds=1)
    with EmulatedCluster(2, rate_Bps, prefix="sfs") as cluster:
        trace = measure_network(cluster, 1, options, tmp_path, collectives=("sendrecv",))
    (m,) = [m for m in trace.measurements if m.collective == "sendrecv"]
    one_way_s = nbytes / (TCP_GOODPUT * rate_Bps)  # 161 ms; both directions one after the other: twice that
    assert 0.9 * one_way_s < float(np.median(m.time_s)) < 1.4 * one_way_s, (m.time_s, one_way_s)
