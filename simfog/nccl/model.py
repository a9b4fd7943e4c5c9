"""NCCL's cost model for collectives (src/graph/tuning.cc ncclTopoTuneModel and ncclTopoGetAlgoTime), as pure
functions of a NcclNetwork and the tables of its release (simfog.nccl.releases):

    time = lat · plateau + nBytes / algBw   (+ launch_s, + tree fill: simfog's, see below)

with NCCL's choice the least time over the algorithms and protocols it allows. Where the formula changed between
releases, the table's flags say which form applies (comments name the release). Inputs NCCL takes from its
topology search come from the network (simfog.nccl.network): the graph's bus bandwidth on one node, on several
(rails), its channels, the graph's latencyInter.

Graph bandwidth per algorithm: the ring graph's (bwIntra = bwInter) on several nodes; a tree graph (Tree, PAT,
CollNet) on two nodes reads bwIntra, which search.cc raises up to twice bwInter ("increase bwIntra for trees
(2 nodes or collnet)"), at most what NVLink carries (one node's bus bandwidth; no cap at 1 GPU per node); on 3+
nodes bwInter. NVLS graphs: NVLink per channel = one node's bus bandwidth / channels.

Approximations, said once: the ring graph is taken to keep sameChannels (search.cc tries it first; broadcast and
reduce then pay one hardware latency, not one per step); trees are balanced (no x0.85 of the plain TREE pattern);
latencyInter in 2.12-2.17, which replaces hwLat[NET] when a network plugin reports one, is max(hwLat, latencyInter)
so that it stays continuous for fitting; releases without latencyInter (2.8-2.11) add it as the later ones do
(simfog's addition there, 0 = NCCL exactly). simfog's additions, 0 = off: `tree_fill_B` (a pipelined tree on
m nodes pays 2·log2(m)·S/algBw with S = nBytes·F/(nBytes + F), a smooth min(nBytes, F): pipeline fill; algBw before
treeCorrectionFactor, which is NCCL's own measured mid-size shortfall of the tree: a chunk crosses a level at the
link's rate, and dividing the fill by the corrected rate charged that shortfall twice) and
`net_latency_s` (µs added per inter-node latency term, by protocol).
"""

from __future__ import annotations

import math

from simfog.nccl.network import NcclNetwork
from simfog.nccl.releases import PATHS, PROTOS, Tables, tables
from simfog.nccl.scale_out import pattern_of, rate_factor

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce")
_NEWER = frozenset(("hopper", "blackwell"))


def nsteps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "allreduce" else n - 1 if op in ("allgather", "reduce_scatter") else n


def log2i(n: int) -> int:
    """NCCL's log2i: floor(log2 n), -1 for n <= 0."""
    return int(n).bit_length() - 1 if n > 0 else -1


def layout(ranks: int, nodes: int) -> tuple[int, float, int]:
    """(ranks per node as NCCL's integer division, as a float, the most on one node)."""
    return ranks // nodes, ranks / nodes, -(-ranks // nodes)


def allowed(op: str, algo: str, proto: str, ranks: int, nodes: int, net: NcclNetwork, t: Tables | None = None) -> bool:
    """Which (algorithm, protocol) NCCL considers for `op` on this layout in the network's release (tuning.cc's
    skip, enable and LL128 rules; CollNet and NVLS only where the network has them)."""
    t = t or tables(net.version)
    if algo in ("nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat") and proto != "Simple" and not (
            algo == "collnet_direct" and proto == "LL" and t.collnet == "2.8"):
        return False  # 2.8's CollNet also had LL (busBw / 6)
    if op in ("broadcast", "reduce"):
        if algo != "ring":
            return False
    elif op in ("allgather", "reduce_scatter"):
        # 2.17 / 2.19+: NVLS on one node (several need the CollNet plugin's in-network allgather, not modelled);
        # 2.23+: PAT at one GPU per node.
        ok = algo == "ring" or (algo == "nvls" and t.nvls in ("2.17", "2.19", "2.23", "2.27", "2.28") and nodes == 1) \
            or (algo == "pat" and t.pat_bw is not None and ranks == nodes)
        if not ok:
            return False
    elif algo == "pat":
        return False
    if algo.startswith("collnet") and (not net.collnet or nodes == 1 or (algo == "collnet_chain"
                                                                        and t.collnet in ("2.8", "2.9", "2.10"))):
        return False
    if algo == "collnet_direct" and net.collnet and t.collnet not in ("2.8", "2.9", "2.10") and \
            net.intra_transport != "nvswitch":
        return False  # 2.14+: CollNet Direct needs NVSwitches
    if algo == "nvls" and (not net.nvls or not t.nvls or net.gpu_arch not in _NEWER
                           or (nodes > 1 and (t.nvls == "2.17" or not net.collnet))):
        return False
    if algo == "nvls_tree" and (not net.nvls or t.nvls in ("", "2.17") or net.gpu_arch not in _NEWER or nodes == 1):
        return False
    if algo in ("nvls", "nvls_tree") and t.nvls == "2.28" and net.graph_channels(layout(ranks, nodes)[2], nodes) < 2:
        return False
    if proto == "LL128":
        return ll128_enabled(net, nodes, t)
    return True


def ll128_enabled(net: NcclNetwork, nodes: int, t: Tables | None = None) -> bool:
    """LL128 by default (tuning.cc): on the release's GPU generations, GPUs linked by NVLink, and on several nodes
    a GPU-NIC path no farther than PXB (Hopper+ from 2.17: PXN; 2.27.3: PXB again; 2.27.5+: PXN)."""
    t = t or tables(net.version)
    if net.gpu_arch not in t.ll128_archs or not net.nvlink:
        return False
    if nodes == 1:
        return True
    limit = t.ll128_path_hopper if net.gpu_arch in _NEWER else t.ll128_path
    return PATHS.index(net.gpu_nic_path) <= PATHS.index(limit)


def _idx2(nodes: int) -> int:
    return min(nodes, 3) - 1


def graph_bus_GBps(algo: str, ranks: int, nodes: int, net: NcclNetwork, nccl_view: bool = False) -> float:
    """nChannels · bw of the graph `algo` reads (module docstring), GB/s. A tree graph's bwIntra on two nodes (and
    CollNet's) is what NCCL's search assumes, up to 2 x bwInter, when `nccl_view` (NCCL's choice), else what the
    network delivers: net.two_node_tree_gain x bwInter (simfog's, fitted; 1 = the inter-node rate)."""
    one = net.intra_bus_Bps / 1e9
    if nodes == 1:
        return one
    g = layout(ranks, nodes)[2]
    inter = net.inter_Bps(g) / 1e9
    if net.fabric is not None and not nccl_view:  # what the switches leave of it (NCCL's tuner does not know)
        inter *= rate_factor(net.fabric, pattern_of("", algo), nodes, g, net.nics_used(g) or 1)
    if (nodes == 2 and algo in ("tree", "pat")) or algo.startswith("collnet"):
        gain = 2.0 if nccl_view else net.two_node_tree_gain
        return min(gain * inter, one) if g > 1 else gain * inter
    return inter


def runtime_channels(net: NcclNetwork, ranks: int, nodes: int, t: Tables | None = None) -> int:
    """comm->nChannels (connect.cc ncclTopoPostset): the graph's channels doubled (at most MAXCHANNELS), doubled
    again on Hopper over several nodes while the ring graph carries > 45 GB/s per channel (2.18: sm90 only while
    twice fits MAXCHANNELS; 2.20: below 16; 2.25: sm90 and later). Read by the ring plateau test from 2.18."""
    t = t or tables(net.version)
    nch = net.graph_channels(layout(ranks, nodes)[2], nodes)
    n = min(t.max_channels, 2 * nch)
    arch_ok = net.gpu_arch == "hopper" if t.runtime_hopper.startswith("eq90") else net.gpu_arch in _NEWER
    if t.runtime_hopper and arch_ok and nodes > 1 and graph_bus_GBps("ring", ranks, nodes, net) / nch > 45.0:
        if (2 * n <= t.max_channels) if t.runtime_hopper == "eq90_le_max" else n < 16:
            n *= 2
    return n


# enqueue.cc's channel cut (2.8-2.30 alike): bytes per thread before another channel is used (comm.h
# NCCL_*_THREAD_THRESHOLD; Ring LL's is multiplied by nRanks in tuning.cc) and threads per channel (device.h
# NCCL_*_MAX_NTHREADS; Ring Simple takes 256 where the ring graph carries at most PCI_BW = 12 GB/s).
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
PCI_BW_GBPS = 12.0


def channel_cut(algo: str, proto: str, ranks: int, nodes: int, net: NcclNetwork,
                t: Tables | None = None) -> tuple[int, int] | None:
    """(comm->nChannels, bytes per channel) of enqueue.cc's channel cut for a Ring, Tree or PAT operation: after
    the choice, while nBytes < nc · nThreads · threadThreshold, nc-- down to 1, so nc = clip(nBytes // bytes per
    channel, 1, comm->nChannels). None for NVLS and CollNet (they keep their channels)."""
    if algo.startswith("nvls") or algo.startswith("collnet"):
        return None
    t = t or tables(net.version)
    threads = MAX_THREADS[proto]
    if algo == "ring" and proto == "Simple" and net.intra_bus_Bps / 1e9 <= PCI_BW_GBPS:
        threads = 256
    per_channel = threads * THREAD_THRESHOLD[proto] * (ranks if algo == "ring" and proto == "LL" else 1)
    return runtime_channels(net, ranks, nodes, t), per_channel


def launched_fraction(algo: str, proto: str, nbytes: float, ranks: int, nodes: int, net: NcclNetwork,
                      t: Tables | None = None) -> float:
    """nc / comm->nChannels of the channel cut (channel_cut): the share of the algorithm bandwidth one operation of
    `nbytes` gets, each channel carrying an equal part. NCCL chooses with every channel; the cut changes only the
    time it delivers."""
    cut = channel_cut(algo, proto, ranks, nodes, net, t)
    if cut is None:
        return 1.0
    n, per_channel = cut
    return min(n, max(1, int(nbytes) // per_channel)) / n


def bandwidth_GBps(op: str, algo: str, proto: str, ranks: int, nodes: int, net: NcclNetwork,
                   t: Tables | None = None, nccl_view: bool = False) -> float:
    """NCCL's algorithm bandwidth (GB/s) before the size-dependent corrections: the graph's bus bandwidth, the
    protocol and algorithm caps of the release, then bus -> algorithm bandwidth (`nccl_view`: graph_bus_GBps)."""
    t = t or tables(net.version)
    row, idx2 = t.arch_row(net.gpu_arch), _idx2(nodes)
    _, ppn, g = layout(ranks, nodes)
    nch = net.graph_channels(g, nodes)
    ll_max = t.ll_max_bw[row if nodes == 1 else int(net.cpu_vendor == "amd")][idx2]
    bus = graph_bus_GBps(algo, ranks, nodes, net, nccl_view)
    if algo in ("nvls", "nvls_tree"):
        bus = _nvls_bus(op, algo, ranks, nodes, net, t, nch, nccl_view)
    cap = t.bus_cap.get(net.gpu_arch)
    if cap is not None and algo not in ("nvls", "nvls_tree"):
        bus = min(bus, cap)
    by_op = t.ll128_by_op
    if algo == "ring" and proto == "LL":
        factor = t.ring_ll_factor or (0.25 if nodes > 1 or op in ("allreduce", "reduce") else 1.0 / 3.0)
        bus = min(ll_max, bus * factor)
    elif algo == "ring" and proto == "LL128":
        factor = t.ring_ll128_ppn1 if t.ring_ll128_ppn1 is not None and ppn < 2 else 0.92
        bus = min(bus * factor, nch * (by_op[op] if by_op else t.ring_ll128_per_ch[row][idx2]))
    elif algo == "tree":
        bus = min(bus * 0.92, nch * t.tree_per_ch[row][idx2])
        if proto == "LL":
            bus = min(bus / 3.8, ll_max)
        elif proto == "LL128":
            bus = min(bus * (7.0 / 9.0 if nodes == 1 else t.tree_ll128_multinode),
                      nch * (by_op[op] if by_op else t.tree_ll128_per_ch[row][idx2]))
    elif algo == "pat":
        bus *= t.pat_bw
    elif algo.startswith("collnet"):
        bus = _collnet_bus(algo, proto, ppn, nch, net, t, bus)
    return bus * _ratio(op, algo, ranks, nodes, t)


def _collnet_bus(algo: str, proto: str, ppn: float, nch: int, net: NcclNetwork, t: Tables, bus: float) -> float:
    if t.collnet in ("2.8", "2.9"):
        return bus * 0.9 / (6.0 if proto == "LL" else 1.0)  # "GDR read is disabled on both sides" for LL
    if t.collnet == "2.10":
        return bus
    if algo == "collnet_chain":
        return bus * 0.75 if t.collnet == "2.14" else bus
    factor = ppn / nch  # "Collnet+Direct requires all GPUs to have a local NIC to work at full speed"
    bus /= factor - (factor - 1) / 2
    return bus * 0.85 if t.collnet != "2.14" and net.gpu_arch in _NEWER else bus


def _nvls_bus(op: str, algo: str, ranks: int, nodes: int, net: NcclNetwork, t: Tables, nch: int,
              nccl_view: bool) -> float:
    """NVLS / NVLS tree bus bandwidth (GB/s) by release; NVLink per channel = one node's bus bandwidth / nch. A
    2-node NVLS tree's doubled bwInter (2.28+) is NCCL's view; delivered, it is net.two_node_tree_gain x bwInter."""
    _, ppn, g = layout(ranks, nodes)
    intra = net.intra_bus_Bps / 1e9
    inter = net.inter_Bps(g) / 1e9 if nodes > 1 else math.inf
    if t.nvls == "2.28":  # per channel, NVLink efficiency, allreduce pipelines two operations
        ch_intra = intra / nch * t.nvls_efficiency.get(net.gpu_arch, 0.0) * (nch - 1) / nch
        ch_intra *= 2.0 if op == "allreduce" else (ppn - 1) / ppn
        gain = (2.0 if nccl_view else net.two_node_tree_gain) if nodes <= 2 and algo == "nvls_tree" else 1.0
        ch_inter = inter / nch * gain
        cap = t.nvls_tree_per_ch[t.arch_row(net.gpu_arch)][_idx2(nodes)] if algo == "nvls_tree" else math.inf
        return nch * min(ch_intra, ch_inter, cap)
    if t.nvls in ("2.17", "2.18", "2.18.3"):
        bus = intra if nodes <= 2 else inter
        return min(bus, t.bus_cap.get(net.gpu_arch, math.inf))
    if op != "allreduce" and t.nvls == "2.27":
        return min(intra * (ppn - 1) / ppn, inter * 0.9)
    if algo == "nvls":
        return min(intra, inter)
    return min(intra, inter if nodes <= 2 else inter / 2)


def _ratio(op: str, algo: str, ranks: int, nodes: int, t: Tables) -> float:
    """Bus -> algorithm bandwidth: Ring n/nsteps, Tree and CollNet 1/2, NVLS by release; none for a non-ring
    allgather / reduce-scatter from 2.23 (their busBw is already per byte)."""
    if algo == "ring":
        return ranks / nsteps(op, ranks)
    if op in ("allgather", "reduce_scatter") and t.nvls in ("2.23", "2.27", "2.28"):
        return 1.0
    if algo == "nvls":
        return {"2.17": 0.75, "2.18": 0.75, "2.28": ranks / nsteps(op, ranks)}.get(t.nvls, 5.0 / 6.0)
    if algo == "nvls_tree":
        if t.nvls in ("2.18", "2.18.3"):
            return 0.70 * nodes / (2 * (nodes - 1))
        return ranks / nsteps(op, ranks) if t.nvls == "2.28" else 5.0 / 6.0
    return 0.5


def latency_us(op: str, algo: str, proto: str, ranks: int, nodes: int, net: NcclNetwork,
               t: Tables | None = None, nccl_view: bool = False) -> float:
    """NCCL's latency (µs) before the ring plateau, as ncclTopoTuneModel sums it for the release, with simfog's
    extra inter-node latency per protocol (net.net_latency_s) unless `nccl_view` (NCCL does not know of it)."""
    t = t or tables(net.version)
    p = PROTOS.index(proto)
    ppn_int, ppn, _ = layout(ranks, nodes)
    intra_hw = "nvlink" if net.nvlink else "pci"
    zero = (0.0, 0.0, 0.0)
    lat = t.base_lat.get(algo, zero)[p]
    intra = t.hw_lat[intra_hw].get(algo, zero)[p]
    inter = t.hw_lat["net"].get("tree" if t.ppn1_tree_net and ppn == 1 else algo, zero)[p]
    graph = net.latency_inter_s * 1e6
    if t.latency_inter == "replace":
        inter = max(inter, graph)
    else:
        inter += graph * (2 if proto == "Simple" else 1)
    if not nccl_view:
        inter += net.net_latency_s[p] * 1e6
    if nodes > 1 and proto == "LL":
        intra *= t.ll_intra_multinode
    steps = nsteps(op, ranks)
    if algo == "ring":
        if op in ("broadcast", "reduce"):
            return lat + t.hw_lat[intra_hw if nodes == 1 else "net"]["ring"][p]  # sameChannels: one step
        if nodes > 1 and t.net_overhead:
            intra = max(intra, (2.0 if net.cpu_vendor == "amd" else 1.0) * (3 if proto == "Simple" else 1))
        inter_steps = 0 if nodes == 1 else (
            (2 * nodes if t.inter_steps_2m else 2 * (nodes - 1)) if op == "allreduce" else nodes - 1)
        return lat + (steps - inter_steps) * intra + inter_steps * inter
    if algo == "tree":
        return lat + 2 * ((ppn_int - 1) * intra + log2i(nodes) * inter)
    if algo == "collnet_direct":
        if t.collnet in ("2.8", "2.9"):
            return lat + 2 * (ppn_int - 1) * intra + inter
        arity = 0.4 if t.collnet == "2.19" else 0.5
        return lat + 2 * (min(1, ppn_int - 1) * intra + (ppn_int - 1) * arity) + inter
    if algo == "collnet_chain":
        return lat + 2 * (ppn_int - 1) * intra + (inter if t.collnet != "2.14" else 0.0)
    if algo == "nvls":
        if t.nvls == "2.17":
            return lat
        if t.nvls in ("2.18", "2.18.3"):
            return lat + (t.hw_lat["net"]["nvls"][p] if nodes > 1 else 0.0)
        return intra + (inter if nodes > 1 else 0.0)
    if algo == "nvls_tree":
        if t.nvls in ("2.18", "2.18.3"):
            return lat + 2 * (nodes - 1) * t.hw_lat["net"]["nvls_tree"][p]
        return lat + intra + 2 * log2i(nodes) * inter
    if algo == "pat":
        return lat + log2i(nodes) * inter / 3.5 + 2.8 * ranks
    raise ValueError(algo)


def plateau(op: str, algo: str, proto: str, nbytes: float, ranks: int, nodes: int, net: NcclNetwork,
            t: Tables | None = None) -> float:
    """Ring/Simple allreduce on several nodes: the latency factor of the "plateau effect of ring" (1 below the
    release's threshold): nBytes >= nRanks/16 · 64 KiB (2.8-2.17), nBytes/(comm->nChannels · nRanks) >= 64 (2.18+)."""
    if not (algo == "ring" and proto == "Simple" and nodes > 1 and op == "allreduce"):
        return 1.0
    t = t or tables(net.version)
    if t.plateau_per_channel:
        hit = int(nbytes) // (runtime_channels(net, ranks, nodes, t) * ranks) >= 64
    else:
        hit = nbytes >= ranks / 16.0 * 65536
    return t.plateau_factor[net.gpu_arch] if hit else 1.0


def correction(op: str, algo: str, proto: str, nbytes: float, net: NcclNetwork, t: Tables | None = None) -> float:
    """treeCorrectionFactor for Tree allreduce, 64 B .. 256 MiB (index log2(nBytes/64) < 23); from 2.29 also NVLS
    tree on Blackwell (< 24; NCCL checks an x86 host, taken as given)."""
    t = t or tables(net.version)
    k = log2i(int(nbytes) >> 6)
    if op == "allreduce" and algo == "tree" and 0 <= k < 23:
        return t.tree_correction[PROTOS.index(proto)][k]
    if op == "allreduce" and algo == "nvls_tree" and net.gpu_arch == "blackwell" and 0 <= k < 24 and \
            len(t.tree_correction[0]) == 24:
        return t.tree_correction[PROTOS.index(proto)][k]
    return 1.0


def time_s(op: str, nbytes: float, ranks: int, nodes: int, net: NcclNetwork, algo: str, proto: str,
           nccl_view: bool = False) -> float | None:
    """Seconds for one `op` of `nbytes` (nccl-tests' size) on `ranks` ranks over `nodes` nodes with the given
    algorithm and protocol, as ncclTopoGetAlgoTime predicts it, plus net.launch_s and the tree fill; None where
    NCCL would not use that pair. A single rank costs 0. `nccl_view`: NCCL's own estimate, which it chooses with
    (graph_bus_GBps: 2-node trees; no launch, no fill)."""
    if ranks <= 1:
        return 0.0
    t = tables(net.version)
    if not allowed(op, algo, proto, ranks, nodes, net, t):
        return None
    bw = bandwidth_GBps(op, algo, proto, ranks, nodes, net, t, nccl_view)
    if not bw > 0:
        return None
    link_Bps = bw * 1e9
    bw *= correction(op, algo, proto, nbytes, net, t) * 1e9
    lat = latency_us(op, algo, proto, ranks, nodes, net, t, nccl_view) * plateau(op, algo, proto, nbytes, ranks,
                                                                                 nodes, net, t)
    if nccl_view:  # what NCCL compares: its own terms only
        return lat * 1e-6 + nbytes / bw
    fill = 0.0
    if algo == "tree" and nodes > 1 and net.tree_fill_B > 0:
        fill = 2 * math.log2(nodes) * (nbytes * net.tree_fill_B / (nbytes + net.tree_fill_B)) / link_Bps
    return lat * 1e-6 + nbytes / (bw * launched_fraction(algo, proto, nbytes, ranks, nodes, net, t)) + fill \
        + net.launch_s

