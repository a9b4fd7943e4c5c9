"""simfog.nccl: NCCL's tuning model, checked against numbers worked out by hand from tuning.cc's constants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog import nccl
from simfog.cluster import Cluster, Link
from simfog.collectives import CostModel
from simfog.errors import ConfigError, Infeasible

US = 1e-6
A100 = nccl.NcclNetwork(intra_bus_Bps=320e9, inter_bus_Bps=100e9, latency_inter_s=4 * US, channels=8)


def test_ring_ll_one_node_by_hand():
    # 2.30, Ampere, NVLink, 8 ranks: lat = baseLat 6.6 + nsteps 14 x hwLat[NVLink][Ring][LL] 0.6 = 15.0 us;
    # busBw = min(llMaxBw[Ampere][N1] 87.7, 0.5 x 320) = 87.7 GB/s; algBw = 87.7 x 8/14.
    net = nccl.NcclNetwork(320e9, 100e9, channels=16)
    t = nccl.time_s("allreduce", 2**20, 8, 1, net, "ring", "LL")
    assert t == pytest.approx((15.0 + 2**20 / (1000 * 87.7 * 8 / 14)) * US, rel=1e-9)


def test_tree_ll128_four_nodes_by_hand():
    # busBw = min(0.92 x 100, 8 ch x perChMaxTreeBw[Ampere][N4] 17.8) = 92; LL128: min(92 x 120/128, 8 x 20) = 86.25;
    # algBw = 0.5 x 86.25; 1 MiB: log2(2^20 >> 6) = 14 -> treeCorrectionFactor[LL128][14] = 0.6.
    # lat = 14.0 + 2 x ((8-1) x 1.25 + log2(4) x (hwLat[NET][Tree][LL128] 8.5 + latencyInter 4)) = 81.5 us.
    t = nccl.time_s("allreduce", 2**20, 32, 4, A100, "tree", "LL128")
    assert t == pytest.approx((81.5 + 2**20 / (1000 * 43.125 * 0.6)) * US, rel=1e-9)


def test_tree_fill_is_charged_at_the_uncorrected_rate():
    # The same 1 MiB tree/LL128 allreduce on 32 ranks over 4 nodes as above (algBw 43.125 GB/s before
    # treeCorrectionFactor 0.6) with simfog's fill F = 128 KiB: + 2 log2(4) x S / 43.125 GB/s, S = 1 MiB x F / (1 MiB
    # + F) = 116508.4 B: the chunk crosses each level at the link's rate; the 0.6 is NCCL's own mid-size shortfall
    # and is charged once, on the transfer (dividing the fill by it too charged it twice).
    net = nccl.NcclNetwork(320e9, 100e9, latency_inter_s=4 * US, channels=8, tree_fill_B=131072.0)
    t = nccl.time_s("allreduce", 2**20, 32, 4, net, "tree", "LL128")
    s = 2**20 * 131072 / (2**20 + 131072)
    assert s == pytest.approx(116508.44, rel=1e-6)
    assert t == pytest.approx((81.5 + 2**20 / (1000 * 43.125 * 0.6) + 4 * s / (1000 * 43.125)) * US, rel=1e-9)


def test_tree_correction_stops_below_index_23():
    # 2.30 tuning.cc:640: Tree's correction applies for logSize = log2(nBytes >> 6) < 23, so up to 256 MiB (index 22,
    # Simple 0.9) and not at 512 MiB (index 23, whose 0.9 only NVLS tree reads). 32 ranks on 4 nodes, tree Simple:
    # busBw = min(0.92 x 100, 8 x perChMaxTreeBw[Ampere][N4] 17.8 = 142.4) = 92; algBw = 46;
    # lat = 8.4 + 2 x ((8-1) x 4.0 + log2(4) x (14 + 4 + 4 flush)) = 152.4 us.
    assert nccl.time_s("allreduce", 2**28, 32, 4, A100, "tree", "Simple") == pytest.approx(
        (152.4 + 2**28 / (1000 * 46 * 0.9)) * US, rel=1e-9)
    assert nccl.time_s("allreduce", 2**29, 32, 4, A100, "tree", "Simple") == pytest.approx(
        (152.4 + 2**29 / (1000 * 46)) * US, rel=1e-9)


def test_ring_simple_multi_node_plateau_by_hand():
    # 16 ranks on 2 nodes: intraLat = max(3.4, netOverhead 1 x 3) = 3.4; interLat = 14 + 4 + 4 (flush) = 22;
    # lat = 8.4 + (30 - 2) x 3.4 + 2 x 22 = 147.6 us, x 1.4 (plateau on Ampere: 64 MiB / (comm->nChannels 16 x 16)
    # >= 64); algBw = 100 x 16/30 GB/s.
    t = nccl.time_s("allreduce", 2**26, 16, 2, A100, "ring", "Simple")
    assert t == pytest.approx((147.6 * 1.4 + 2**26 / (1000 * 100 * 16 / 30)) * US, rel=1e-9)


def test_ring_plateau_counts_run_time_channels():
    # 2.30 tuning.cc:648 tests nBytes / (comm->nChannels x nRanks) >= 64 with the run-time count, which
    # ncclTopoPostset (connect.cc) makes twice the graph's 8: 16 x 16 ranks x 64 = 16 KiB, not 8 KiB. (NCCL's
    # estimate: the time it delivers at these sizes runs on fewer channels, test_delivered_time_...)
    assert nccl.runtime_channels(A100, 16, 2) == 16
    bw = 1000 * 100 * 16 / 30
    assert nccl.estimate_s("allreduce", 8192, 16, 2, A100, "ring", "Simple") == pytest.approx(
        (147.6 + 8192 / bw) * US, rel=1e-9)
    assert nccl.estimate_s("allreduce", 16383, 16, 2, A100, "ring", "Simple") == pytest.approx(
        (147.6 + 16383 / bw) * US, rel=1e-9)
    assert nccl.estimate_s("allreduce", 16384, 16, 2, A100, "ring", "Simple") == pytest.approx(
        (147.6 * 1.4 + 16384 / bw) * US, rel=1e-9)


def test_ring_plateau_hopper_doubles_channels_again():
    # connect.cc: on Hopper over several nodes, a ring graph with bwIntra > 45 GB/s per channel and fewer than 16
    # run-time channels gets twice as many again: graph 4 -> 8 -> 16 at 200 GB/s (50 per channel), only 8 at
    # 160 GB/s (40 per channel). 16 ranks on 2 nodes, no latencyInter: lat = 8.4 + 28 x max(3.4, 3) + 2 x 14 =
    # 131.6 us, x 1.4 above the plateau threshold, 64 x 16 ranks x comm->nChannels: 16 KiB or 8 KiB.
    fast = nccl.NcclNetwork(900e9, 200e9, channels=4, gpu_arch="hopper")
    slow = nccl.NcclNetwork(900e9, 160e9, channels=4, gpu_arch="hopper")
    assert [nccl.runtime_channels(n, r, k) for n, r, k in ((fast, 16, 2), (slow, 16, 2), (fast, 8, 1))] == [16, 8, 8]
    assert nccl.estimate_s("allreduce", 8192, 16, 2, fast, "ring", "Simple") == pytest.approx(
        (131.6 + 8192 / (1000 * 200 * 16 / 30)) * US, rel=1e-9)
    assert nccl.estimate_s("allreduce", 8192, 16, 2, slow, "ring", "Simple") == pytest.approx(
        (131.6 * 1.4 + 8192 / (1000 * 160 * 16 / 30)) * US, rel=1e-9)


def test_nccl_2_8_tables_by_hand():
    # 2.8: Ring LL busBw x 1/4, intraLat x 1.8 for LL on several nodes, no net overhead (latencyInter, simfog's
    # fitted addition there, adds once per inter step: 2 x 7 us).
    # 8 ranks on 2 nodes, Volta: lat = 3.6 + (14 - 2) x 0.47 x 1.8 + 2 x 2.7 = 19.152 us;
    # busBw = min(llMaxBw[Intel][N2] 39.0, 20 x 1/4) = 5 GB/s; algBw = 5 x 8/14.
    net = nccl.NcclNetwork(100e9, 20e9, latency_inter_s=7 * US, channels=2, version="2.8", gpu_arch="volta")
    t = nccl.estimate_s("allreduce", 4096, 8, 2, net, "ring", "LL")
    assert t == pytest.approx((19.152 + 2 * 7 + 4096 / (1000 * 5 * 8 / 14)) * US, rel=1e-9)


def test_delivered_time_runs_on_the_channels_nccl_launches():
    # enqueue.cc (2.8-2.30): after the choice, nc = comm->nChannels (16 here: twice the graph's 8) is cut while
    # nBytes < nc x nThreads x threadThreshold. Ring Simple: 512 threads x 64 B = 32 KiB per channel; Ring LL:
    # 512 x 8 B x nRanks 16 = 64 KiB; Tree LL128: 640 x 8 B = 5 KiB. The bytes move at nc/16 of the bandwidth.
    # Ring Simple, 16 ranks on 2 nodes, 64 KiB: nc = 2; lat 147.6 x 1.4 (plateau: 64 KiB / (16 x 16) >= 64).
    bw = 1000 * 100 * 16 / 30
    assert nccl.time_s("allreduce", 2**16, 16, 2, A100, "ring", "Simple") == pytest.approx(
        (147.6 * 1.4 + 2**16 / (bw * 2 / 16)) * US, rel=1e-9)
    assert nccl.time_s("allreduce", 8192, 16, 2, A100, "ring", "Simple") == pytest.approx(
        (147.6 + 8192 / (bw / 16)) * US, rel=1e-9)  # one channel
    assert nccl.time_s("allreduce", 2**19, 16, 2, A100, "ring", "Simple") == pytest.approx(
        (147.6 * 1.4 + 2**19 / bw) * US, rel=1e-9)  # 16 x 32 KiB: every channel
    # Ring LL, 256 KiB: nc = 4 of 16. lat = 6.6 + 28 x max(0.6, 1) + 2 x (2.7 + 4) = 48.0; busBw = min(llMaxBw
    # [Intel][N2] 39, 0.5 x 100) = 39.
    assert nccl.time_s("allreduce", 2**18, 16, 2, A100, "ring", "LL") == pytest.approx(
        (48.0 + 2**18 / (1000 * 39 * 16 / 30 * 4 / 16)) * US, rel=1e-9)
    # Tree LL128 at 4 nodes (test_tree_ll128_four_nodes_by_hand), 20 KiB: nc = 4 of 16; correction[LL128][8] 0.8.
    assert nccl.time_s("allreduce", 20480, 32, 4, A100, "tree", "LL128") == pytest.approx(
        (81.5 + 20480 / (1000 * 43.125 * 0.8 * 4 / 16)) * US, rel=1e-9)
    # NCCL chooses with every channel (its estimate), and NVLS keeps its channels.
    assert nccl.estimate_s("allreduce", 8192, 16, 2, A100, "ring", "Simple") == pytest.approx(
        (147.6 + 8192 / bw) * US, rel=1e-9)
    # A PCIe node whose ring carries <= 12 GB/s runs Ring Simple on 256 threads: 16 KiB per channel. 8 ranks, one
    # node, 2 graph channels -> 4: 32 KiB on 2 of them. lat = 8.4 + 14 x hwLat[PCI][Ring][Simple] 5.7 = 88.2.
    pci = nccl.NcclNetwork(10e9, 10e9, channels=2, intra_transport="pci")
    assert nccl.time_s("allreduce", 2**15, 8, 1, pci, "ring", "Simple") == pytest.approx(
        (88.2 + 2**15 / (1000 * 10 * 8 / 14 * 2 / 4)) * US, rel=1e-9)


@pytest.mark.parametrize("op,cap,nsteps", [("broadcast", 18.8, 8), ("reduce", 12.0, 8), ("allgather", 18.3, 7),
                                            ("reduce_scatter", 15.2, 7), ("allreduce", 16.9, 14)])
def test_nccl_2_8_ll128_cap_is_per_collective(op, cap, nsteps):
    # 2.8 (v2.8.4 tuning.cc:74): ll128MaxBwPerCh = {Broadcast 18.8, Reduce 12.0, AllGather 18.3, ReduceScatter 15.2,
    # AllReduce 16.9} GB/s per channel. 8 ranks on 1 node, Volta, NVLink, 2 channels, bus 100 GB/s:
    # Ring LL128 busBw = min(0.92 x 100 = 92, 2 x cap) = 2 x cap; algBw = 2 x cap x 8/nsteps.
    # lat = baseLat[Ring][LL128] 10.0 + nsteps x hwLat[NVLink][Ring][LL128] 1.9; broadcast/reduce on a ring graph
    # with sameChannels (search.cc's first try, kept unless a graph of different channels is strictly faster) add
    # one hwLat, not nsteps of them (v2.8.4 tuning.cc: `if (ringGraph->sameChannels) latencies += lat`).
    net = nccl.NcclNetwork(100e9, 20e9, channels=2, version="2.8", gpu_arch="volta")
    t = nccl.time_s(op, 2**20, 8, 1, net, "ring", "LL128")
    lat = 10.0 + (1.9 if op in ("broadcast", "reduce") else nsteps * 1.9)
    assert t == pytest.approx((lat + 2**20 / (1000 * 2 * cap * 8 / nsteps)) * US, rel=1e-9)


def test_nccl_2_8_tree_ll128_cap_is_allreduce_cap():
    # 16 ranks on 2 nodes, Volta, 2 channels, bus 100 GB/s: Tree busBw = min(0.92 x 100, 2 x perChMaxTreeBw[Volta][N2]
    # 18.5) = 37; LL128: min(37 x 0.915 = 33.855, 2 x ll128MaxBwPerCh[AllReduce] 16.9 = 33.8) = 33.8 (tuning.cc:129);
    # algBw = 0.5 x 33.8; 1 MiB: treeCorrectionFactor[LL128][14] = 0.6 (2.8's table).
    # lat = baseLat[Tree][LL128] 4.4 + 2 x ((8-1) x 1.25 + log2(2) x hwLat[NET][Tree][LL128] 8.5) = 38.9 us.
    net = nccl.NcclNetwork(100e9, 100e9, channels=2, version="2.8", gpu_arch="volta")
    t = nccl.time_s("allreduce", 2**20, 16, 2, net, "tree", "LL128")
    assert t == pytest.approx((38.9 + 2**20 / (1000 * 0.5 * 33.8 * 0.6)) * US, rel=1e-9)


def test_nccl_2_8_tree_ll128_factor_by_hand():
    # 2.8 (v2.8.4 tuning.cc:129): Tree LL128 busBw x 0.915 on several nodes (2.30: 120/128). 16 ranks on 2 nodes,
    # Volta, 2 channels, bus 20 GB/s: Tree busBw = min(0.92 x 20 = 18.4, 2 x 18.5) = 18.4; LL128: min(18.4 x 0.915
    # = 16.836, 2 x 16.9) = 16.836; algBw = 0.5 x 16.836; 1 MiB: treeCorrectionFactor[LL128][14] = 0.6.
    # lat = 4.4 + 2 x ((8-1) x 1.25 + 1 x 8.5) = 38.9 us.
    net = nccl.NcclNetwork(100e9, 20e9, channels=2, version="2.8", gpu_arch="volta")
    t = nccl.time_s("allreduce", 2**20, 16, 2, net, "tree", "LL128")
    assert t == pytest.approx((38.9 + 2**20 / (1000 * 0.5 * 16.836 * 0.6)) * US, rel=1e-9)
    # NCCL's own estimate, which it chooses with, reads the 2-node tree graph's bwIntra, which search.cc raises
    # up to twice bwInter (v2.8.4 search.cc:778): 40 GB/s (under one node's 100). Tree busBw = min(0.92 x 40 =
    # 36.8, 2 x 18.5) = 36.8; LL128: min(36.8 x 0.915 = 33.672, 2 x 16.9 = 33.8) = 33.672.
    view = nccl.model.time_s("allreduce", 2**20, 16, 2, net, "tree", "LL128", nccl_view=True)
    assert view == pytest.approx((38.9 + 2**20 / (1000 * 0.5 * 33.672 * 0.6)) * US, rel=1e-9)


def test_steps_of_other_collectives():
    # allgather on 1 node, ring Simple: nsteps = n - 1; algBw = busBw x n/(n-1).
    t = nccl.time_s("allgather", 2**24, 4, 1, A100, "ring", "Simple")
    assert t == pytest.approx((8.4 + 3 * 3.4 + 2**24 / (1000 * 320 * 4 / 3)) * US, rel=1e-9)
    # broadcast has no tree; allgather has no tree
    assert nccl.time_s("broadcast", 1024, 8, 1, A100, "tree", "LL") is None
    assert nccl.time_s("allgather", 1024, 8, 1, A100, "tree", "Simple") is None


def test_launch_is_added_once():
    net = nccl.NcclNetwork(320e9, 100e9, launch_s=5 * US)
    base = nccl.NcclNetwork(320e9, 100e9)
    assert nccl.time_s("allreduce", 4096, 8, 1, net, "ring", "LL") == pytest.approx(
        nccl.time_s("allreduce", 4096, 8, 1, base, "ring", "LL") + 5 * US)


def test_choice_small_tree_large_ring_at_scale():
    small = nccl.choose("allreduce", 1024, 128, 16, A100)
    large = nccl.choose("allreduce", 2**32, 128, 16, A100)
    assert small.algorithm == "tree" and small.protocol == "LL"
    assert large.algorithm == "ring"


def test_forced_algorithm_and_protocol():
    forced = nccl.choose("allreduce", 1024, 128, 16, A100, algorithms=("ring",), protocols=("Simple",))
    assert (forced.algorithm, forced.protocol) == ("ring", "Simple")
    assert forced.time_s == nccl.time_s("allreduce", 1024, 128, 16, A100, "ring", "Simple")
    with pytest.raises(Infeasible, match="nvls"):
        nccl.choose("allreduce", 1024, 8, 1, A100, algorithms=("nvls",))


def test_nvls_only_where_declared():
    h100 = nccl.NcclNetwork(900e9, 400e9, gpu_arch="hopper", nvls=True, channels=16)
    assert nccl.time_s("allreduce", 2**26, 8, 1, h100, "nvls", "Simple") is not None
    assert nccl.time_s("allreduce", 2**26, 8, 1, A100, "nvls", "Simple") is None
    # NVLS on Hopper: bus = 900/16 x 0.85 x 15/16 x 2 per channel x 16 channels; algBw = bus x 8/14; lat = 25 us
    bus = 16 * (900 / 16) * 0.85 * 15 / 16 * 2
    assert nccl.time_s("allreduce", 2**26, 8, 1, h100, "nvls", "Simple") == pytest.approx(
        (25 + 2**26 / (1000 * bus * 8 / 14)) * US, rel=1e-9)


def test_single_rank_costs_nothing():
    assert nccl.time_s("allreduce", 2**20, 1, 1, A100, "ring", "LL") == 0.0
    assert nccl.choose("allreduce", 2**20, 1, 1, A100).time_s == 0.0


@pytest.mark.parametrize("field,value", [("intra_bus_Bps", 0), ("inter_bus_Bps", math.inf), ("channels", 0),
                                         ("version", "2.7"), ("gpu_arch", "kepler"), ("launch_s", -1.0)])
def test_bad_network_is_refused(field, value):
    kwargs = dict(intra_bus_Bps=1e9, inter_bus_Bps=1e9)
    kwargs[field] = value
    with pytest.raises(ConfigError, match=f"nccl.{field}"):
        nccl.NcclNetwork(**kwargs)


@settings(max_examples=200, deadline=None)
@given(op=st.sampled_from(nccl.model.COLLECTIVES), log_bytes=st.integers(0, 34), nodes=st.sampled_from([1, 2, 4, 16]),
       ppn=st.sampled_from([1, 2, 8]), version=st.sampled_from(["2.8", "2.12", "2.18.1", "2.19", "2.23", "2.30"]))
def test_choice_is_the_least_allowed_time(op, log_bytes, nodes, ppn, version):
    net = nccl.NcclNetwork(320e9, 100e9, latency_inter_s=3 * US, version=version)
    ranks, nbytes = nodes * ppn, 2**log_bytes
    if ranks < 2:
        return
    c = nccl.choose(op, nbytes, ranks, nodes, net)
    # NCCL picks the least of its own estimates; the time is that pair's as the network delivers it
    views = {(a, p): t for a in nccl.ALGOS for p in nccl.PROTOS
             if (t := nccl.model.time_s(op, nbytes, ranks, nodes, net, a, p, nccl_view=True)) is not None}
    assert views[(c.algorithm, c.protocol)] == min(views.values())
    assert c.time_s == nccl.time_s(op, nbytes, ranks, nodes, net, c.algorithm, c.protocol) > 0
    # nothing beats the bus bandwidth of the layout (no NVLS here); on 2 nodes a tree reads its graph's bwIntra,
    # up to twice the inter-node one (search.cc), which is how 2-node busbw exceeds the NICs' rate
    bus = net.intra_bus_Bps if nodes == 1 else min(2 * net.inter_bus_Bps, net.intra_bus_Bps) if nodes == 2 else \
        net.inter_bus_Bps
    factor = {"allreduce": 2 * (ranks - 1) / ranks}.get(op, (ranks - 1) / ranks if op != "broadcast" and
                                                         op != "reduce" else 1.0)
    assert nbytes / c.time_s * factor <= bus * (1 + 1e-9)


def test_cost_model_nccl_uses_the_network_or_the_cluster():
    cluster = Cluster(4, 8, Link(0, 320e9), Link(4 * US, 100e9))
    derived = CostModel(cluster, "nccl")
    given_net = CostModel(cluster, "nccl", nccl=A100)
    assert derived.allreduce(2**20) == pytest.approx(nccl.choose("allreduce", 2**20, 32, 4, nccl.NcclNetwork(
        320e9, 100e9, latency_inter_s=4 * US)).time_s)
    assert given_net.allreduce(2**20) == nccl.choose("allreduce", 2**20, 32, 4, A100).time_s
    forced = CostModel(cluster, "nccl", nccl=A100, nccl_algorithms=("ring",), nccl_protocols=("Simple",))
    assert forced.allreduce(2**20) == nccl.time_s("allreduce", 2**20, 32, 4, A100, "ring", "Simple")
    # a subgroup on one node is costed at its own layout
    assert given_net.time("allreduce", 2**20, members=range(8)) == nccl.choose("allreduce", 2**20, 8, 1,
                                                                                 A100).time_s
