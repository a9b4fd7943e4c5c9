"""What NCCL's tuner sees of a cluster: the hardware a user knows (NICs, their rate, how a GPU reaches its NIC,
NVLink / NVSwitch / PCIe, NVLS, CPU vendor, NCCL release) and what NCCL reads from its topology search, which
`simfog calibrate` fits from nccl-tests logs (bus bandwidths, channels, latencies).

Rails: GPU i of a node sends through NIC i mod K (K NICs per node), so a layout of G GPUs per node uses min(G, K)
NICs. Its inter-node bus bandwidth is inter_bus_Bps · min(G, K) / K (inter_bus_Bps is the whole node's, every NIC
in use), at most the node's own ring bandwidth (intra_bus_Bps) when G > 1; its graph has channels · min(G, K) / K
channels (at least 1). Without `nics_per_node` every layout gets inter_bus_Bps and `channels` as they are.

Where a value is not given, it is derived from the hardware as NCCL's search (search.cc) would find it: see
`derived_channels` and `derived_bus_Bps`. SI units; frozen and hashable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simfog.errors import ConfigError, one_of
from simfog.nccl.releases import ARCHS, PATHS, PROTOS, parse_release, tables
from simfog.nccl.scale_out import FabricSpec

CPU_VENDORS = ("intel", "amd", "arm")  # NCCL treats every host but AMD as Intel's row and overhead
TRANSPORTS = ("nvlink", "nvswitch", "pci")
# NVLink links per GPU (V100 SXM2 6, A100 12, H100 18, B200 18) and the PCIe bandwidth NCCL computes for a Gen3 /
# Gen4 / Gen5 x16 GPU (topo.cc: width · GT/s-per-lane / 80: 12, 24, 48 GB/s). Blackwell's Gen6 is taken as Gen5.
NVLINKS = {"volta": 6, "ampere": 12, "hopper": 18, "blackwell": 18}
PCIE_GBPS = {"volta": 12.0, "ampere": 24.0, "hopper": 48.0, "blackwell": 48.0}


def _positive(name: str, v: object, allow_none: bool = False, zero: bool = False) -> None:
    if v is None and allow_none:
        return
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and (v >= 0 if zero else v > 0)
    if not ok:
        what = "a finite value >= 0 (s or B)" if zero else "a finite bandwidth > 0 (B/s)"
        raise ConfigError(f"nccl.{name}", v, what + (", or none" if allow_none else ""))


@dataclass(frozen=True)
class NcclNetwork:
    """A cluster as NCCL's tuner sees it (module docstring). Raises ConfigError on bad values.

    Fitted (or given): intra_bus_Bps (nChannels · bwIntra of one node's graph), inter_bus_Bps (the multi-node ring
    graph's nChannels · bw with every NIC in use), latency_inter_s (the graph's latencyInter: a network plugin's
    latency), launch_s (per operation, outside NCCL's model), channels (the multi-node graph's nChannels with every
    NIC in use; None: derived from the hardware per layout), tree_fill_B and net_latency_s (simfog's additions,
    0 = off: a tree's pipeline fill, and extra µs per inter-node step for LL / LL128 / Simple where a fabric's plugin
    makes a protocol costlier than NCCL's tables), two_node_tree_gain (simfog's: the bus bandwidth a tree graph on two
    nodes delivers, in units of the inter-node one; NCCL's search assumes up to 2 and chooses with that, measured
    2-node trees run nearer 1), and the point-to-point path of alltoall and send/recv (p2p_*,
    None: derived, see simfog.nccl.p2p). With a `fabric`, the inter-node bandwidths are those of a non-blocking
    fabric, and each layout's pattern gets what the fabric leaves of them (simfog.nccl.scale_out).

    Hardware: version (NCCL release "X.Y" or "X.Y.Z"), gpu_arch, cpu_vendor, intra_transport (nvlink: GPUs linked
    directly; nvswitch; pci), nvls (NVLink SHARP on NVSwitch), collnet (SHARP in the fabric), nics_per_node and
    nic_Bps (one NIC's line rate), gpu_nic_path (pix / pxb: PCIe switches only; pxn: through another GPU's NVLink;
    phb: through the CPU; sys: across CPU sockets)."""

    intra_bus_Bps: float
    inter_bus_Bps: float
    latency_inter_s: float = 0.0
    launch_s: float = 0.0
    channels: int | None = 16
    version: str = "2.30"
    gpu_arch: str = "ampere"
    cpu_vendor: str = "intel"
    intra_transport: str = "nvlink"
    nvls: bool = False
    collnet: bool = False
    tree_fill_B: float = 0.0
    nics_per_node: int | None = None
    nic_Bps: float | None = None
    gpu_nic_path: str = "pxb"
    net_latency_s: tuple = (0.0, 0.0, 0.0)
    p2p_latency_s: float | None = None
    p2p_nic_Bps: float | None = None
    p2p_intra_Bps: float | None = None
    two_node_tree_gain: float = 1.0
    fabric: FabricSpec | None = None  # the switches between nodes (simfog.nccl.scale_out; None: non-blocking)

    def __post_init__(self):
        for name in ("intra_bus_Bps", "inter_bus_Bps"):
            _positive(name, getattr(self, name))
        for name in ("latency_inter_s", "launch_s", "tree_fill_B"):
            _positive(name, getattr(self, name), zero=True)
        for name in ("nic_Bps", "p2p_nic_Bps", "p2p_intra_Bps"):
            _positive(name, getattr(self, name), allow_none=True)
        _positive("p2p_latency_s", self.p2p_latency_s, allow_none=True, zero=True)
        for name, most in (("channels", 64), ("nics_per_node", 64)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most):
                raise ConfigError(f"nccl.{name}", v, f"an integer in 1..{most}, or none (from the hardware)")
        g = self.two_node_tree_gain
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 1.0 <= g <= 2.0:
            raise ConfigError("nccl.two_node_tree_gain", g, "a number in 1..2 (2: what NCCL's search assumes)")
        parse_release(self.version)
        for name, allowed in (("gpu_arch", ARCHS), ("cpu_vendor", CPU_VENDORS), ("intra_transport", TRANSPORTS),
                              ("gpu_nic_path", PATHS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"nccl.{name}", getattr(self, name), one_of(getattr(self, name), allowed))
        lat = self.net_latency_s
        if not (isinstance(lat, tuple) and len(lat) == len(PROTOS)):
            raise ConfigError("nccl.net_latency", lat, f"three times >= 0, for {', '.join(PROTOS)}")
        for v in lat:
            _positive("net_latency", v, zero=True)

    @property
    def nvlink(self) -> bool:
        """GPUs of a node reach each other over NVLink (directly or through NVSwitches)."""
        return self.intra_transport != "pci"

    def nics_used(self, gpus_per_node: int) -> int | None:
        """NICs a layout of `gpus_per_node` GPUs per node sends through (rails: min(G, K)); None when unknown."""
        return None if self.nics_per_node is None else max(1, min(gpus_per_node, self.nics_per_node))

    def inter_Bps(self, gpus_per_node: int) -> float:
        """Inter-node bus bandwidth of a layout (module docstring: rails)."""
        k = self.nics_used(gpus_per_node)
        if k is None:
            return self.inter_bus_Bps
        bw = self.inter_bus_Bps * k / self.nics_per_node
        return min(bw, self.intra_bus_Bps) if gpus_per_node > 1 else bw

    def graph_channels(self, gpus_per_node: int, nodes: int) -> int:
        """The graph's nChannels for a layout: `channels` (scaled by the NICs used, rails) or derived."""
        if self.channels is None:
            return derived_channels(self, gpus_per_node, nodes)
        k = self.nics_used(gpus_per_node)
        if k is None or nodes == 1:
            return self.channels
        return max(1, round(self.channels * k / self.nics_per_node))


def _speed(speeds: dict, arch: str, limit: float) -> float:
    """search.cc: the first per-channel speed of the release's array for this GPU that fits under `limit`."""
    key = "sm100" if arch == "blackwell" and "sm100" in speeds else (
        "sm90" if arch in ("hopper", "blackwell") and "sm90" in speeds else "generic")
    arr = speeds[key]
    return next((s for s in arr if s <= limit), arr[-1])


def _dup(t, arch: str, speed: float, nch: int) -> tuple[int, float]:
    """search.cc's channel duplication (ncclTopoDupChannels, and its ancestor at the end of ncclTopoCompute)."""
    newer = ARCHS.index(arch) >= ARCHS.index("hopper")
    if t.dup_rule == "25":
        dup = speed >= 25.0
    elif t.dup_rule == "25_50":
        dup = (not newer and speed >= 25.0) or (arch == "hopper" and speed >= 50.0)
    else:
        dup = speed >= 25.0 and not (newer and speed < 50.0 and nch > 4)
    if not dup:
        return nch, speed
    n2 = min(2 * nch, t.max_channels // 2)
    return n2, speed / math.ceil(n2 / nch)


def _gpu_total(net: NcclNetwork) -> float:
    """GB/s a GPU has towards its node (search.cc getTotalBw: its NVLinks, else its PCIe link)."""
    t = tables(net.version)
    return NVLINKS[net.gpu_arch] * t.nvlink_bw[net.gpu_arch] if net.nvlink else PCIE_GBPS[net.gpu_arch]


def _ring_graph(net: NcclNetwork, gpus_per_node: int, nodes: int) -> tuple[int, float]:
    """(nChannels, GB/s per channel) of the ring graph NCCL's search would find, simplified: each channel leaves
    and enters the node through a NIC at the first speed of the release's array that fits the NIC and the GPU's
    PCIe link; a NIC carries as many channels as fit its rate, and the GPUs' NVLink total caps the sum. One node:
    channels at the first intra speed under the GPU's link total until that total is used. Then duplication."""
    t = tables(net.version)
    total = _gpu_total(net)
    if nodes == 1 or net.nics_per_node is None or net.nic_Bps is None:
        link = total if net.intra_transport != "nvlink" else min(total, 2 * t.nvlink_bw[net.gpu_arch])
        speed = _speed(t.speeds_intra, net.gpu_arch, link if gpus_per_node > 1 else total)
        nch = max(1, min(t.max_channels // 2, int(total / speed + 1e-9)))
    else:
        nic = net.nic_Bps / 1e9
        speed = _speed(t.speeds_inter, net.gpu_arch, min(nic, PCIE_GBPS[net.gpu_arch]))
        nch = net.nics_used(gpus_per_node) * max(1, int(nic / speed + 1e-9))
        if gpus_per_node > 1:
            nch = min(nch, max(1, int(total / speed + 1e-9)))
        nch = max(1, min(t.max_channels // 2, nch))
    return _dup(t, net.gpu_arch, speed, nch)


def derived_channels(net: NcclNetwork, gpus_per_node: int, nodes: int) -> int:
    """NCCL's graph nChannels for this layout as derived from the hardware (_ring_graph)."""
    return _ring_graph(net, gpus_per_node, nodes)[0]


def derived_bus_Bps(net: NcclNetwork, *, nodes: int) -> float | None:
    """Bus bandwidth (B/s) of the whole node's graph on one node (nodes=1) or several, as derived from the hardware;
    None on several nodes when the NICs are not given."""
    if nodes > 1 and (net.nics_per_node is None or net.nic_Bps is None):
        return None
    gpus = 8 if net.nics_per_node is None else max(8, net.nics_per_node)
    nch, speed = _ring_graph(net, gpus, nodes)
    return nch * speed * 1e9
