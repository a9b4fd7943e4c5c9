"""simfog.nccl per release: every table checked against numbers worked by hand from that release's tuning.cc
(tags named in simfog/nccl/releases.py), each test holding the release where a constant changed against the one
before it, and NCCL 2.22's own printed Tree/LL time (3 x 8 H100, 256 B: 25.23 us)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simfog import nccl
from simfog.errors import ConfigError
from simfog.nccl import model, releases

US = 1e-6
MIB = 2**20


def net(version, **kw):
    kw.setdefault("intra_bus_Bps", 230e9)
    kw.setdefault("inter_bus_Bps", 100e9)
    kw.setdefault("channels", 8)
    return nccl.NcclNetwork(version=version, **kw)


def t(version, op, nbytes, ranks, nodes, algo, proto, **kw):
    return nccl.time_s(op, nbytes, ranks, nodes, net(version, **kw), algo, proto)


def est(version, op, nbytes, ranks, nodes, algo, proto, **kw):
    """NCCL's own estimate (every channel): at 4 KiB the delivered time runs on fewer (test_nccl.py)."""
    return nccl.estimate_s(op, nbytes, ranks, nodes, net(version, **kw), algo, proto)


def test_a_release_maps_to_the_newest_table_at_or_before_it():
    assert releases.tables("2.8").tag == releases.tables("2.8.3").tag == "v2.8.4-1"
    assert releases.tables("2.13").tag == "v2.12.12-1"  # 2.13's tuning.cc is 2.12's
    assert releases.tables("2.18.2").tag == "v2.18.1-1" and releases.tables("2.18").tag == "v2.18.3-1"
    assert releases.tables("2.27.3").tag == "v2.27.3-1" and releases.tables("2.27").tag == "v2.27.5-1"
    assert releases.tables("2.31.1").tag == releases.tables("2.30").tag  # newer: the newest table
    assert releases.parse_release("2.21") == (2, 21, 5)
    assert releases.parse_release("2.50") == (2, 50, 99)  # a future 2.x: the newest table, said so where used
    for bad in ("2.7.8", "2", "2.x", "v2.21", 2.21, None, "9.99", "3.0", "2.51"):
        with pytest.raises(ConfigError, match="nccl.version"):
            releases.parse_release(bad)


def test_2_8_collnet_had_ll_2_9_only_simple():
    # v2.8.4: CollNet LL busBw = bus x 0.9 / 6; 16 ranks on 2 nodes (8 per node), Ampere: the collnet graph reads
    # bwIntra, delivered at the inter-node 100 GB/s; 100 x 0.9 / 6 = 15, algBw 7.5.
    # lat = baseLat 4.4 + 2 x (8-1) x (hwLat[NVLink][CollNet][LL] 0.5 x 1.8 on several nodes) + hwLat[NET] 5.0 = 22.0
    assert t("2.8", "allreduce", MIB, 16, 2, "collnet_direct", "LL", collnet=True) == pytest.approx(
        (22.0 + MIB / (1000 * 7.5)) * US)
    assert t("2.9", "allreduce", MIB, 16, 2, "collnet_direct", "LL", collnet=True) is None


def test_2_10_one_ll128_cap_and_ampere_tree_caps():
    # reduce, 8 Volta ranks on one node, 2 channels, bus 100: Ring LL128 = min(0.92 x 100, 2 x cap); cap 12.0 for
    # reduce in 2.9 (ll128MaxBwPerCh by collective), 20 for everything from 2.10. ratio n/nsteps = 8/8.
    # lat = 10.0 + one hwLat[NVLink][Ring][LL128] 1.9 (sameChannels) = 11.9.
    kw = dict(gpu_arch="volta", intra_bus_Bps=100e9, channels=2)
    assert t("2.9", "reduce", MIB, 8, 1, "ring", "LL128", **kw) == pytest.approx((11.9 + MIB / 24e3) * US)
    assert t("2.10", "reduce", MIB, 8, 1, "ring", "LL128", **kw) == pytest.approx((11.9 + MIB / 40e3) * US)
    # Ampere Tree on 3+ nodes: perChMaxTreeBw 16.0 (2.8-2.9), 17.8 (2.10+); 32 ranks on 4 nodes, 4 channels:
    # busBw = min(0.92 x 100, 4 x cap); algBw = 0.5 x that x 0.9 (Simple, 256 MiB: index 22).
    # lat = 0 + 2 x ((8-1) x 28 + log2(4) x 28) = 504 us.
    for version, cap in (("2.9", 16.0), ("2.10", 17.8)):
        assert t(version, "allreduce", 2**28, 32, 4, "tree", "Simple", channels=4) == pytest.approx(
            (504 + 2**28 / (1000 * 0.5 * 4 * cap * 0.9)) * US)


def test_2_12_inter_steps_net_simple_and_latency_inter():
    # Ring Simple allreduce, 16 ranks on 2 nodes, 4 KiB (below 2.8-2.17's plateau threshold 16/16 x 64 KiB).
    # 2.10: 8.4 + (30 - 2(2-1)) x 3.4 + 2 x hwLat[NET][Ring][Simple] 9.6 = 122.8
    # 2.12: nInterSteps = 2 x nNodes = 4, NET Simple 28: 8.4 + 26 x 3.4 + 4 x 28 = 208.8
    # 2.12 with a plugin latency of 40 us: it replaces hwLat[NET] (taken as max(28, 40)): 8.4 + 88.4 + 160 = 256.8
    bw = 1000 * 100 * 16 / 30
    assert est("2.10", "allreduce", 4096, 16, 2, "ring", "Simple") == pytest.approx((122.8 + 4096 / bw) * US)
    assert est("2.12", "allreduce", 4096, 16, 2, "ring", "Simple") == pytest.approx((208.8 + 4096 / bw) * US)
    assert est("2.12", "allreduce", 4096, 16, 2, "ring", "Simple", latency_inter_s=40 * US) == pytest.approx(
        (256.8 + 4096 / bw) * US)


def test_2_14_hopper_row_and_ring_net_simple_back():
    # 8 H100 on one node, Ring LL: before 2.14 Hopper reads the Volta row (llMaxBw 39.0), from 2.14 its own (87.7);
    # busBw = min(llMaxBw, 900 / 4); lat = 3.6 + 14 x 0.47 = 10.18.
    for version, ll in (("2.12", 39.0), ("2.14", 87.7)):
        assert t(version, "allreduce", MIB, 8, 1, "ring", "LL", gpu_arch="hopper", intra_bus_Bps=900e9) == \
            pytest.approx((10.18 + MIB / (1000 * ll * 8 / 14)) * US)
    # Ring NET Simple 9.6 again (nInterSteps still 2 x nNodes): 8.4 + 26 x 3.4 + 4 x 9.6 = 135.2
    assert est("2.14", "allreduce", 4096, 16, 2, "ring", "Simple") == pytest.approx(
        (135.2 + 4096 / (1000 * 100 * 16 / 30)) * US)


def test_2_17_hopper_caps_plateau_and_nvls():
    # 8 H100, one node, 4 channels: bus capped at 370 (sm90, 2.17 only); Ring LL128 = min(0.92 x 370, 4 x 36.7) =
    # 146.8 (2.16: 4 x 20 = 80); lat = 10.0 + 14 x 1.9 = 36.6.
    kw = dict(gpu_arch="hopper", intra_bus_Bps=900e9, channels=4)
    for version, bus in (("2.16", 80.0), ("2.17", 146.8)):
        assert t(version, "allreduce", MIB, 8, 1, "ring", "LL128", **kw) == pytest.approx(
            (36.6 + MIB / (1000 * bus * 8 / 14)) * US)
    # NVLS (2.17, one node): baseLat 40 alone; bus = the ring graph's (capped 370) x 0.75
    assert t("2.17", "allreduce", 2**26, 8, 1, "nvls", "Simple", nvls=True, **kw) == pytest.approx(
        (40 + 2**26 / (1000 * 370 * 0.75)) * US)
    assert t("2.16", "allreduce", 2**26, 8, 1, "nvls", "Simple", nvls=True, **kw) is None
    # Ring Simple plateau above nRanks/16 x 64 KiB: x1.5 on Hopper in 2.17 (x1.9 before). 16 H100 on 2 nodes,
    # bus 400 (under the 370 cap: 370): lat = 8.4 + 26 x 3.4 + 4 x 9.6 = 135.2.
    kw = dict(gpu_arch="hopper", intra_bus_Bps=900e9, inter_bus_Bps=400e9)
    for version, f in (("2.16", 1.9), ("2.17", 1.5)):
        bus = 400 if version == "2.16" else 370
        assert t(version, "allreduce", 2**20, 16, 2, "ring", "Simple", **kw) == pytest.approx(
            (135.2 * f + 2**20 / (1000 * bus * 16 / 30)) * US)


def test_2_18_net_overhead_latency_inter_and_plateau_per_channel():
    # Ring LL, 16 ranks on 2 nodes, latencyInter 1 us. 2.18.1: no x1.8; intraLat = max(0.6, net overhead 1 us
    # Intel); nInterSteps 4, interLat = 2.7 + 1: 6.6 + 26 x 1.0 + 4 x 3.7 = 47.4 (AMD: overhead 2: 6.6 + 52 + 14.8)
    # 2.17: intraLat = 0.47 x 1.8 = 0.846; interLat = max(2.7, 1) = 2.7: 3.6 + 26 x 0.846 + 4 x 2.7 = 36.396
    # busBw (2.17, Ring LL, several nodes) = min(llMaxBw[Intel][N2] 39, 100/4 = 25); algBw x 16/30.
    bw = 1000 * 25 * 16 / 30
    lat1 = 1 * US
    assert est("2.18.1", "allreduce", 4096, 16, 2, "ring", "LL", latency_inter_s=lat1) == pytest.approx(
        (47.4 + 4096 / bw) * US)
    assert est("2.18.1", "allreduce", 4096, 16, 2, "ring", "LL", latency_inter_s=lat1, cpu_vendor="amd") == \
        pytest.approx((73.4 + 4096 / (1000 * 22.5 * 16 / 30)) * US)  # llMaxBw[AMD][N2] 22.5
    assert est("2.17", "allreduce", 4096, 16, 2, "ring", "LL", latency_inter_s=lat1) == pytest.approx(
        (36.396 + 4096 / bw) * US)
    # Ring Simple: overhead x3 = 3 < 3.4; interLat = 14 + 1 + 1 (flush) = 16: 8.4 + 26 x 3.4 + 4 x 16 = 160.8;
    # plateau x1.4 on Ampere once nBytes / (comm->nChannels 16 x 16 ranks) >= 64, i.e. from 16 KiB.
    bw = 1000 * 100 * 16 / 30
    for nbytes, f in ((16383, 1.0), (16384, 1.4)):
        assert est("2.18.1", "allreduce", nbytes, 16, 2, "ring", "Simple", latency_inter_s=lat1) == pytest.approx(
            (160.8 * f + nbytes / bw) * US)


def test_2_18_3_tree_simple_and_hopper_tree_ll128():
    # Tree Simple, 16 ranks on 2 nodes: 2 x ((8-1) x intra + 1 x NET). 2.18.1 and 2.19: 28/28 -> 448;
    # 2.18.3: 4/14 -> 84. Bus 100 x 0.92 (under 8 x 23.6); 1 MiB: treeCorrectionFactor[Simple][14] 0.5.
    bw = 1000 * 0.5 * 92 * 0.5
    for version, lat in (("2.18.1", 448), ("2.18.3", 84), ("2.19", 448)):
        assert t(version, "allreduce", MIB, 16, 2, "tree", "Simple") == pytest.approx((lat + MIB / bw) * US)
    # Hopper Tree LL128 on 3+ nodes, 2 channels, bus 400: 2.18.1: min(min(368, 2 x 33) x 120/128, 2 x 36.7) =
    # 61.875; 2.18.3: min(min(368, 2 x 36) x 120/128 = 67.5, 2 x 29) = 58. lat = 14 + 2 x (7 x 1.25 + 2 x 8.5) = 65.5
    kw = dict(gpu_arch="hopper", intra_bus_Bps=900e9, inter_bus_Bps=400e9, channels=2)
    for version, bus in (("2.18.1", 61.875), ("2.18.3", 58.0)):
        assert t(version, "allreduce", 2**30, 32, 4, "tree", "LL128", **kw) == pytest.approx(
            (65.5 + 2**30 / (1000 * 0.5 * bus)) * US)


def test_2_19_nvls_tree_latency_and_2_20_channels():
    # NVLS tree, 32 H100 on 4 nodes: 2.18.3: baseLat 23 + 2 x (4-1) x hwLat[NET][NVLSTree] 19 = 137;
    # 2.19: 0 + intraLat 23 + 2 x log2(4) x hwLat[NET][NVLSTree] 14 = 79.
    kw = dict(gpu_arch="hopper", nvls=True, intra_bus_Bps=900e9, inter_bus_Bps=400e9)
    for version, lat in (("2.18.3", 137.0), ("2.19", 79.0)):
        assert nccl.latency_s("allreduce", "nvls_tree", "Simple", 32, 4, net(version, **kw)) == pytest.approx(lat * US)
    # comm->nChannels on Hopper, 2 nodes, 8 graph channels at 50 GB/s each: doubled to 16, then doubled again while
    # twice fits MAXCHANNELS 32 (2.19) or only below 16 (2.20)
    assert nccl.runtime_channels(net("2.19", **kw), 16, 2) == 32
    assert nccl.runtime_channels(net("2.20", **kw), 16, 2) == 16


def test_2_21_ring_ll_half_and_hopper_ll_caps():
    # 8 H100 on one node, Ring LL: 2.20 min(87.7, 900/4); 2.21 min(141, 900 x 0.5). lat = 6.6 + 14 x 0.6 = 15.0
    kw = dict(gpu_arch="hopper", intra_bus_Bps=900e9)
    for version, ll in (("2.20", 87.7), ("2.21", 141.0)):
        assert t(version, "allreduce", MIB, 8, 1, "ring", "LL", **kw) == pytest.approx(
            (15.0 + MIB / (1000 * ll * 8 / 14)) * US)


def test_nccl_2_22_printed_tree_ll_time():
    """NCCL 2.22.3 printed Tree/LL 25.23 us for a 256 B allreduce on 3 x 8 H100 (github.com/NVIDIA/nccl issue 1453;
    bench/data/ref/nccl-choices-h100-2.22): 6.8 + 2 x ((8-1) x 0.6 + log2i(3) x 5.0) = 25.2 plus 256 B."""
    h100 = nccl.NcclNetwork(900e9, 400e9, channels=16, version="2.22.3", gpu_arch="hopper")
    assert nccl.latency_s("allreduce", "tree", "LL", 24, 3, h100) == pytest.approx(25.2 * US)
    c = nccl.choose("allreduce", 256, 24, 3, h100)
    assert (c.algorithm, c.protocol) == ("tree", "LL")
    assert nccl.estimate_s("allreduce", 256, 24, 3, h100, "tree", "LL") == pytest.approx(25.229528 * US, rel=0.02)
    assert c.time_s > nccl.estimate_s("allreduce", 256, 24, 3, h100, "tree", "LL")  # delivered on one channel


def test_2_23_ppn1_pat_and_ll128():
    # Ring LL allreduce at 1 GPU per node, 4 nodes: 2.22 nInterSteps 2 x 4 = 8 > nsteps 6 (NCCL's arithmetic:
    # 6.6 + (6 - 8) x 1.0 + 8 x 2.7 = 26.2); 2.23: 2(4-1) = 6 steps, Tree NET latency 5.0: 6.6 + 6 x 5.0 = 36.6
    for version, lat in (("2.22", 26.2), ("2.23", 36.6)):
        assert nccl.latency_s("allreduce", "ring", "LL", 4, 4, net(version)) == pytest.approx(lat * US)
    # PAT allgather at 1 GPU per node, 4 nodes: 8 + log2(4) x 14 / 3.5 + 2.8 x 4 = 27.2 us; busBw = 100 x 0.85
    # (2.23) or x 0.75 (2.24), not converted to algorithm bandwidth
    for version, f in (("2.23", 0.85), ("2.24", 0.75)):
        assert t(version, "allgather", MIB, 4, 4, "pat", "Simple") == pytest.approx(
            (27.2 + MIB / (1000 * 100 * f)) * US)
    assert t("2.22", "allgather", MIB, 4, 4, "pat", "Simple") is None
    assert t("2.23", "allgather", MIB, 8, 4, "pat", "Simple") is None  # 2 GPUs per node
    # Ring LL128 at 1 GPU per node: x0.7 until 2.22, x0.92 from 2.23 (under 8 x 20)
    for version, f in (("2.22", 0.7), ("2.23", 0.92)):
        assert nccl.bandwidth_Bps("allreduce", "ring", "LL128", 4, 4, net(version)) == pytest.approx(
            100e9 * f * 4 / 6)


def test_2_25_blackwell_row():
    # Blackwell on one node, Tree Simple, 8 channels, bus 1800: 2.24 reads Hopper's row (38.7 per channel), 2.25
    # its own (77.4), 2.28 (70.0). busBw = min(0.92 x 1800, 8 x cap); algBw x 0.5 x 0.9 (256 MiB Simple)
    kw = dict(gpu_arch="blackwell", intra_bus_Bps=1800e9)
    for version, cap in (("2.24", 38.7), ("2.25", 77.4), ("2.28", 70.0)):
        assert nccl.bandwidth_Bps("allreduce", "tree", "Simple", 8, 1, net(version, **kw)) == pytest.approx(
            0.5 * 8 * cap * 1e9)


@pytest.mark.parametrize("version,arch,path,on", [
    ("2.8", "volta", "pxb", True), ("2.8", "volta", "phb", False), ("2.8", "hopper", "pix", False),
    ("2.14", "hopper", "pxb", True), ("2.14", "hopper", "pxn", False), ("2.17", "hopper", "pxn", True),
    ("2.26", "hopper", "pxn", True), ("2.27.3", "hopper", "pxn", False), ("2.27.5", "hopper", "pxn", True),
    ("2.30", "ampere", "pxn", False), ("2.30", "blackwell", "sys", False), ("2.24", "blackwell", "pxb", False),
    ("2.25", "blackwell", "pxb", True)])
def test_ll128_enablement_by_release_and_path(version, arch, path, on):
    n = net(version, gpu_arch=arch, gpu_nic_path=path)
    assert nccl.ll128_enabled(n, 2) is on
    assert nccl.ll128_enabled(n, 1) is (arch in releases.tables(version).ll128_archs)  # no NIC on one node
    assert nccl.ll128_enabled(net(version, gpu_arch=arch, intra_transport="pci"), 1) is False


def test_2_28_nvls_efficiency_and_2_28_9_nvls_tree_latency():
    # 8 H100 on one node, NVLS allreduce, 16 channels, bus 900: 2.27: min(bwIntra, bwInter) = 900 x 5/6;
    # 2.28: per channel 900/16 x 0.85 x 15/16 x 2 (allreduce pipelines two) = 89.6484375, x 16 channels, x 8/14.
    # lat = hwLat[NVLink][NVLS] 25.
    kw = dict(gpu_arch="hopper", nvls=True, intra_bus_Bps=900e9, channels=16)
    assert t("2.27", "allreduce", 2**30, 8, 1, "nvls", "Simple", **kw) == pytest.approx(
        (25 + 2**30 / (1000 * 900 * 5 / 6)) * US)
    assert t("2.28", "allreduce", 2**30, 8, 1, "nvls", "Simple", **kw) == pytest.approx(
        (25 + 2**30 / (1000 * 16 * 89.6484375 * 8 / 14)) * US)
    # NVLS tree NET latency 14 -> 20.9 in 2.28.9: 32 ranks on 4 nodes: 25 + 2 x 2 x interLat
    kw = dict(gpu_arch="hopper", nvls=True, intra_bus_Bps=900e9, inter_bus_Bps=400e9)
    for version, lat in (("2.28.7", 81.0), ("2.28.9", 108.6)):
        assert nccl.latency_s("allreduce", "nvls_tree", "Simple", 32, 4, net(version, **kw)) == pytest.approx(lat * US)


@pytest.mark.parametrize("version,cap", [("2.28.3", 73.4), ("2.28.7", 34.6), ("2.29.2", 34.6), ("2.29.7", 40.0),
                                         ("2.30", 40.0)])
def test_blackwell_ring_ll128_caps_by_release(version, cap):
    # 16 Blackwell ranks on 2 nodes, 2 channels, bus 800: Ring LL128 = min(0.92 x 800, 2 x perChMaxRingLL128Bw[N2])
    n = net(version, gpu_arch="blackwell", intra_bus_Bps=1800e9, inter_bus_Bps=800e9, channels=2)
    assert nccl.bandwidth_Bps("allreduce", "ring", "LL128", 16, 2, n) == pytest.approx(2 * cap * 1e9 * 16 / 30)


def test_tree_levels_and_two_node_bandwidth():
    # the tree's inter-node latency counts log2i(nNodes) levels: 3 nodes 1, 4-7 2, 8-15 3 (2.30 Tree LL:
    # 6.8 + 2 x ((ppn-1) x 0.6 + levels x 5.0), 8 ranks per node)
    for nodes, levels in ((3, 1), (4, 2), (7, 2), (8, 3), (16, 4)):
        assert nccl.latency_s("allreduce", "tree", "LL", 8 * nodes, nodes, net("2.30")) == pytest.approx(
            (6.8 + 2 * (7 * 0.6 + levels * 5.0)) * US)
    # on 2 nodes NCCL's own view of a tree reads bwIntra, up to 2 x bwInter and at most one node's bus bandwidth;
    # the time uses what the network delivers (two_node_tree_gain x bwInter)
    n = net("2.30", intra_bus_Bps=150e9)
    view = model.bandwidth_GBps("allreduce", "tree", "Simple", 16, 2, n, nccl_view=True)
    assert view == pytest.approx(0.5 * min(0.92 * 150, 8 * 23.6))
    assert model.bandwidth_GBps("allreduce", "tree", "Simple", 16, 2, n) == pytest.approx(0.5 * 0.92 * 100)
    gained = net("2.30", intra_bus_Bps=150e9, two_node_tree_gain=1.2)
    assert model.bandwidth_GBps("allreduce", "tree", "Simple", 16, 2, gained) == pytest.approx(0.5 * 0.92 * 120)
    assert model.bandwidth_GBps("allreduce", "tree", "Simple", 24, 3, gained) == pytest.approx(0.5 * 0.92 * 100)


def test_channels_derived_from_the_node_by_hand():
    # search.cc (simplified): per-channel speed = the release's first speed <= min(NIC rate, GPU's PCIe link);
    # each NIC carries floor(NIC / speed) channels, the GPUs' NVLink total caps the sum; then duplication.
    # DGX A100, 8 x 200 Gb/s (25 GB/s) NICs, 2.22: min(25, PCIe Gen4 24) -> 24; 8 NICs x 1; NVLink 12 x 20 = 240
    # allows 10; 24 < 25: no duplication -> 8.
    a100 = nccl.NcclNetwork(230e9, 190e9, channels=None, version="2.22", nics_per_node=8, nic_Bps=25e9,
                            intra_transport="nvswitch")
    assert nccl.derived_channels(a100, 8, 2) == 8
    # DGX H100, 8 x 400 Gb/s (50 GB/s), 2.22: min(50, Gen5 48) -> 48 (sm90 array); NVLink 18 x 20.6 = 370.8 allows
    # 7; Hopper below 50 GB/s with more than 4 channels is not duplicated -> 7. One GPU per node: its one NIC, 1
    # channel at 48, duplicated (only 1 channel) -> 2.
    h100 = replace(a100, gpu_arch="hopper", nic_Bps=50e9)
    assert (nccl.derived_channels(h100, 8, 2), nccl.derived_channels(h100, 1, 2)) == (7, 2)
    # ABCI A100, 4 x 200 Gb/s, NCCL 2.8.4 (one speed array: 42, 30, 24, ...): 24 -> 4 NICs x 1 -> 4.
    abci = replace(a100, version="2.8.4", nics_per_node=4)
    assert nccl.derived_channels(abci, 8, 2) == 4
    # one A100 node, 2.8.4: NVLink 12 x 21 = 252; speed 42 -> 6 channels, 42 >= 25: duplicated -> 12 x 21
    assert nccl.derived_channels(abci, 8, 1) == 12
    assert nccl.derived_bus_Bps(abci, nodes=1) == pytest.approx(252e9)
