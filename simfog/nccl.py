"""NCCL's own cost model (src/graph/tuning.cc), as pure functions: time of one collective per algorithm and
protocol, and the choice NCCL makes (the least predicted time, or what NCCL_ALGO / NCCL_PROTO force).

    time = lat · plateau + nBytes / algBw   (+ launch_s, simfog's fitted per-operation overhead)

Every formula follows `ncclTopoTuneModel` and `ncclTopoGetAlgoTime`; the constant tables are those of the release
the network names (`NcclNetwork.version`): "2.30" (NCCL 2.30, tag v2.30.7-1) or "2.8" (v2.8.4-1, the one ABCI
ran). shared/NCCL_MODEL.md summarises them. What NCCL reads from its topology search and simfog cannot know is a
parameter of `NcclNetwork`, fitted by `simfog calibrate` from nccl-tests logs:

- `intra_bus_Bps`: nChannels · bwIntra of the single-node graph (bus bandwidth on one node);
- `inter_bus_Bps`: nChannels · bw of the multi-node graph (NCCL takes bwIntra on ≤ 2 nodes, bwInter beyond; the
  search makes them equal whenever the NICs are the bottleneck, so simfog keeps one);
- `channels`: the graph's nChannels (the per-channel caps of LL128 and Tree use it; 2.30's ring plateau test reads the
  run-time comm->nChannels instead, at least twice this: `runtime_channels`);
- `latency_inter_s`: the graph's latencyInter (added once per inter-node step, twice for Simple: "flush"); 2.8
  had no such term, so there it is simfog's fitted addition (0 gives 2.8's tables exactly);
- `launch_s`: time per operation that NCCL's model leaves out (kernel launch, the benchmark's loop), fitted;
- `tree_fill_B`: simfog's one addition to NCCL's formulas, 0 = off. A pipelined tree moves a message through
  2·log2(m) inter-node levels; while the message is no bigger than a few chunks, each level adds its transfer
  time instead of hiding it (pipeline fill): time += 2·log2(m)·S/algBw with S = nBytes·F/(nBytes + F), a smooth
  min(nBytes, F) for F = tree_fill_B (smooth, so that it can be fitted by gradient). NCCL's model
  has no such term, and without it the 16 KiB-1 MiB allreduces on 4-32 nodes come out 20-50 % fast.

Units: the tables are NCCL's (µs, GB/s); everything crossing this module's boundary is SI (s, B/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simfog.errors import ConfigError, Infeasible

ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree")
PROTOS = ("LL", "LL128", "Simple")
OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce")
VERSIONS = ("2.30", "2.8")
ARCHS = ("volta", "ampere", "hopper", "blackwell")
CPU_VENDORS = ("intel", "amd")
TRANSPORTS = ("nvlink", "pci")

_A = {a: i for i, a in enumerate(ALGOS)}
_P = {p: i for i, p in enumerate(PROTOS)}


@dataclass(frozen=True)
class _Constants:
    """One release's tuning tables, indexed [algorithm][protocol] (µs, GB/s), as in tuning.cc."""

    base_lat: tuple            # baseLat[algo][proto]
    hw_lat: dict               # hwLat[nvlink|pci|net][algo][proto]
    ll_max_bw: tuple           # llMaxBws[index1][index2]: row 0..3 = arch on 1 node; rows 0/1 = intel/amd beyond
    ring_ll128_per_ch: tuple | None  # perChMaxRingLL128Bws[arch][index2]; None where the cap is by collective
    tree_ll128_per_ch: tuple | None  # perChMaxTreeLL128Bws[arch][index2]; None where the cap is by collective
    tree_per_ch: tuple         # perChMaxTreeBws[arch][index2]
    tree_correction: tuple     # treeCorrectionFactor[proto][log2(nBytes/64)] (Tree reads indices < 23)
    ring_ll_factor: float      # Ring LL busBw factor (0.5 since 2.19; 1/4 before)
    net_overhead: bool         # "inter-node rings still have to launch nsteps * net overhead" (2.19+)
    ll_intra_multinode: float  # 2.8: intraLat *= 1.8 for LL on several nodes
    tree_ll128_factor: float   # Tree LL128 busBw factor on several nodes (7/9 on one): 120/128 (2.30), 0.915 (2.8)
    ll128_per_ch_by_op: dict | None = None  # 2.8: ll128MaxBwPerCh[coll], Ring and Tree LL128 (replaces the two above)


_TREE_CORRECTION_2_30 = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
_TREE_CORRECTION_2_8 = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, .92, .92),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)

CONSTANTS = {
    # NCCL 2.30 (v2.30.7-1, ncclTunerConstantsDefaults). Algorithms: tree, ring, collnet direct/chain, nvls,
    # nvls tree (PAT is for 1 GPU per node allgather/reduce-scatter, not modelled).
    "2.30": _Constants(
        base_lat=((6.8, 14.0, 8.4), (6.6, 14.0, 8.4), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0)),
        hw_lat={"nvlink": ((.6, 1.25, 4.0), (.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 25), (0, 0, 25)),
                "pci": ((1.0, 1.9, 4.0), (1.0, 2.5, 5.7), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 0), (0, 0, 0)),
                "net": ((5.0, 8.5, 14), (2.7, 4.0, 14.0), (0, 0, 31), (0, 0, 30), (0, 0, 18), (0, 0, 20.9))},
        ll_max_bw=((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0)),
        ring_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3),
        tree_ll128_per_ch=((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0)),
        tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0)),
        tree_correction=_TREE_CORRECTION_2_30, ring_ll_factor=0.5, net_overhead=True,
        ll_intra_multinode=1.0, tree_ll128_factor=120.0 / 128.0),
    # NCCL 2.8 (v2.8.4-1): tree, ring, collnet only; Volta/Ampere tables; no net overhead, no graph latency.
    "2.8": _Constants(
        base_lat=((4.4, 4.4, 0), (3.6, 10.0, 8.4), (4.4, 4.4, 0), (4.4, 4.4, 0), (0, 0, 0), (0, 0, 0)),
        hw_lat={"nvlink": ((.52, 1.25, 28), (.47, 1.9, 3.4), (.5, 1.2, 4.0), (.5, 1.2, 4.0), (0,) * 3, (0,) * 3),
                "pci": ((1.0, 1.9, 28), (1.0, 2.5, 5.7), (1.0, 1.9, 5.5), (1.0, 1.9, 5.5), (0,) * 3, (0,) * 3),
                "net": ((5.0, 8.5, 28), (2.7, 4.0, 9.6), (5.0, 5.0, 10.7), (5.0, 5.0, 10.7), (0,) * 3, (0,) * 3)},
        ll_max_bw=((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0)),
        # 2.8 caps LL128 per channel by collective, the same for Ring and Tree and every arch (tuning.cc:74,
        # ll128MaxBwPerCh = {Broadcast 18.8, Reduce 12.0, AllGather 18.3, ReduceScatter 15.2, AllReduce 16.9}).
        ring_ll128_per_ch=None, tree_ll128_per_ch=None,
        ll128_per_ch_by_op={"broadcast": 18.8, "reduce": 12.0, "allgather": 18.3, "reduce_scatter": 15.2,
                            "allreduce": 16.9},
        tree_per_ch=((26.5, 18.5, 10.0), (24.0, 22.5, 16.0), (24.0, 22.5, 16.0), (24.0, 22.5, 16.0)),
        tree_correction=_TREE_CORRECTION_2_8, ring_ll_factor=0.25, net_overhead=False,
        ll_intra_multinode=1.8, tree_ll128_factor=0.915),  # tuning.cc:129: 0.915 /*120.0/128.0*/
}


@dataclass(frozen=True)
class NcclNetwork:
    """What NCCL's tuner sees of a cluster (see the module docstring). SI units; frozen and hashable.

    `nvls` / `collnet`: the cluster has NVLink SHARP (NVSwitch multicast) / in-network reduction (SHARP on
    the fabric); without them those algorithms are disabled, as NCCL does. Raises ConfigError on bad values."""

    intra_bus_Bps: float
    inter_bus_Bps: float
    latency_inter_s: float = 0.0
    launch_s: float = 0.0
    channels: int = 16
    version: str = "2.30"
    gpu_arch: str = "ampere"
    cpu_vendor: str = "intel"
    intra_transport: str = "nvlink"
    nvls: bool = False
    collnet: bool = False
    tree_fill_B: float = 0.0

    def __post_init__(self):
        for name in ("intra_bus_Bps", "inter_bus_Bps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ConfigError(f"nccl.{name}", v, "a finite bandwidth > 0 (B/s)")
        for name in ("latency_inter_s", "launch_s", "tree_fill_B"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"nccl.{name}", v, "a finite value >= 0 (s or B)")
        if isinstance(self.channels, bool) or not isinstance(self.channels, int) or not 1 <= self.channels <= 64:
            raise ConfigError("nccl.channels", self.channels, "an integer in 1..64")
        for name, allowed in (("version", VERSIONS), ("gpu_arch", ARCHS), ("cpu_vendor", CPU_VENDORS),
                              ("intra_transport", TRANSPORTS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"nccl.{name}", getattr(self, name), f"one of {', '.join(allowed)}")


@dataclass(frozen=True)
class Choice:
    """NCCL's pick for one collective: seconds, algorithm and protocol."""

    time_s: float
    algorithm: str
    protocol: str


def _nsteps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "allreduce" else n - 1 if op in ("allgather", "reduce_scatter") else n


def _allowed(op: str, algo: str, proto: str, net: NcclNetwork, nodes: int) -> bool:
    """Which (algorithm, protocol) NCCL considers for `op` on this network (tuning.cc's skip and disable rules)."""
    if net.version == "2.8" and algo in ("nvls", "nvls_tree", "collnet_chain"):
        return False
    if algo in ("nvls", "nvls_tree", "collnet_direct", "collnet_chain") and proto != "Simple":
        return False
    if op in ("broadcast", "reduce") and algo != "ring":
        return False
    if op in ("allgather", "reduce_scatter") and algo not in ("ring", "nvls", "collnet_direct"):
        return False
    if algo.startswith("collnet") and (not net.collnet or nodes == 1):
        return False
    if algo == "nvls" and (not net.nvls or nodes > 1 and not net.collnet):
        return False
    if algo == "nvls_tree" and (not net.nvls or nodes == 1):
        return False
    if op in ("allgather", "reduce_scatter") and algo != "ring" and nodes > 1:
        return False  # needs in-network allgather/reduce-scatter support, not declared
    if proto == "LL128":  # enabled by default only on NVLink within a node, on Volta or later
        return net.intra_transport == "nvlink"
    return True


def _arch_index(net: NcclNetwork) -> int:
    return ARCHS.index(net.gpu_arch)


def runtime_channels(net: NcclNetwork, nodes: int) -> int:
    """comm->nChannels, the run-time channel count, as 2.30's ncclTopoPostset (connect.cc) sets it from the graph's
    nChannels (`net.channels`): doubled ("Duplication should be complete now", capped at MAXCHANNELS 64), and doubled
    again below 16 on Hopper and later over several nodes when the ring graph's bwIntra per channel exceeds 45 GB/s
    (simfog's multi-node bwIntra is inter_bus_Bps / channels). NCCL's other changes are left out: CollNet's x1.5
    needs the chain graph's bwIntra > bwInter (simfog keeps one bandwidth), unpack networks (GPUDirect TCPX) and
    NCCL_MIN/MAX_NCHANNELS / CTA limits are not modelled. Only 2.30's ring plateau test reads it."""
    n = min(64, 2 * net.channels)
    if (nodes > 1 and net.gpu_arch in ("hopper", "blackwell") and net.inter_bus_Bps / 1e9 / net.channels > 45.0
            and n < 16):
        n = 2 * n
    return n


def bandwidth_Bps(op: str, algo: str, proto: str, ranks: int, nodes: int, net: NcclNetwork) -> float:
    """NCCL's algorithm bandwidth (B/s) for `op` before the size-dependent tree correction: busBw from the graph,
    the protocol and algorithm caps, then bus -> algorithm bandwidth (ring n/nsteps, tree 1/2)."""
    c = CONSTANTS[net.version]
    arch, idx2 = _arch_index(net), min(nodes, 3) - 1
    idx1 = arch if nodes == 1 else CPU_VENDORS.index(net.cpu_vendor)
    ll_max = c.ll_max_bw[idx1][idx2]
    nch = net.channels
    by_op = c.ll128_per_ch_by_op
    ring_ll128_cap = by_op[op] if by_op else c.ring_ll128_per_ch[arch][idx2]
    tree_ll128_cap = by_op[op] if by_op else c.tree_ll128_per_ch[arch][idx2]
    ppn = ranks / nodes
    bus = (net.intra_bus_Bps if nodes == 1 else net.inter_bus_Bps) / 1e9  # GB/s, as NCCL computes
    per_ch = bus / nch
    if algo in ("nvls", "nvls_tree"):
        eff = {"hopper": 0.85, "blackwell": 0.74}.get(net.gpu_arch, 0.0)
        intra = (net.intra_bus_Bps / 1e9 / nch) * eff * (nch - 1) / nch
        intra *= 2.0 if op == "allreduce" else (ppn - 1) / ppn
        inter = per_ch * (2 if nodes <= 2 and algo == "nvls_tree" else 1) if nodes > 1 else math.inf
        bus = nch * min(intra, inter)
    if algo == "ring" and proto == "LL":
        bus = min(ll_max, bus * c.ring_ll_factor)
    if algo == "ring" and proto == "LL128":
        bus = min(bus * (0.7 if net.version == "2.8" and ppn < 2 else 0.92), nch * ring_ll128_cap)
    if algo == "tree" and op == "allreduce":
        bus = min(bus * 0.92, nch * c.tree_per_ch[arch][idx2])
    if algo == "tree" and proto == "LL":
        bus = min(bus / 3.8, ll_max)
    if algo == "tree" and proto == "LL128":
        bus = min(bus * (7.0 / 9.0 if nodes == 1 else c.tree_ll128_factor), nch * tree_ll128_cap)
    if algo == "collnet_direct":
        factor = ppn / nch
        bus /= factor - (factor - 1) / 2
        if net.gpu_arch in ("hopper", "blackwell"):
            bus *= 0.85
    if algo in ("ring", "nvls", "nvls_tree"):
        bus *= ranks / _nsteps(op, ranks)
    else:
        bus *= 0.5
    return bus * 1e9


def latency_s(op: str, algo: str, proto: str, ranks: int, nodes: int, net: NcclNetwork) -> float:
    """NCCL's latency (s) for `op` before the ring plateau: base + per-step hardware latencies, intra- and
    inter-node, as ncclTopoTuneModel sums them for each algorithm."""
    c = CONSTANTS[net.version]
    a, p = _A[algo], _P[proto]
    intra_hw = net.intra_transport
    hw = intra_hw if nodes == 1 else "net"
    ppn = ranks // nodes
    lat = c.base_lat[a][p]
    intra = c.hw_lat[intra_hw][a][p]
    if nodes > 1 and proto == "LL":
        intra *= c.ll_intra_multinode
    graph = net.latency_inter_s * 1e6
    inter = c.hw_lat["net"][_A["tree"] if ppn == 1 and net.version != "2.8" else a][p]
    inter += graph * (2 if proto == "Simple" else 1)
    nsteps = _nsteps(op, ranks)
    if algo == "ring":
        if op in ("broadcast", "reduce"):  # graphs without sameChannels: "some chunk latency" per step
            lat += nsteps * c.hw_lat[hw][_A["tree"] if proto == "Simple" else a][p]
        else:
            if nodes > 1 and c.net_overhead:
                intra = max(intra, (2.0 if net.cpu_vendor == "amd" else 1.0) * (3 if proto == "Simple" else 1))
            inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if op == "allreduce" else nodes - 1
            lat += (nsteps - inter_steps) * intra + inter_steps * inter
    elif algo == "tree":
        lat += 2 * ((ppn - 1) * intra + int(math.log2(nodes)) * inter)
    elif algo == "collnet_direct":
        lat += 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
    elif algo == "collnet_chain":
        lat += 2 * (ppn - 1) * intra + inter
    elif algo == "nvls":
        lat = intra + (inter if nodes > 1 else 0.0)
    elif algo == "nvls_tree":
        lat += intra + 2 * int(math.log2(nodes)) * inter
    return lat * 1e-6


def time_s(op: str, nbytes: float, ranks: int, nodes: int, net: NcclNetwork, algo: str, proto: str) -> float | None:
    """Seconds for one `op` of `nbytes` (nccl-tests' size) on `ranks` ranks over `nodes` nodes with the given
    algorithm and protocol, as ncclTopoGetAlgoTime predicts it, plus `net.launch_s`; None where NCCL would not
    use that pair. A single rank costs 0. Raises ConfigError for an unknown op, algorithm or protocol."""
    _check(op, algo, proto)
    if ranks <= 1:
        return 0.0
    if not _allowed(op, algo, proto, net, nodes):
        return None
    bw = bandwidth_Bps(op, algo, proto, ranks, nodes, net)
    if not bw > 0:
        return None
    log_size = int(nbytes) >> 6
    log_size = log_size.bit_length() - 1 if log_size > 0 else -1
    table = CONSTANTS[net.version].tree_correction
    # Tree: indices 0..22 (64 B to 256 MiB) in both releases (2.30 tuning.cc:640, v2.8.4 tuning.cc:278); 2.30's
    # 24th entry is read only by NVLS tree on Blackwell (tuning.cc:643), not by Tree: 512 MiB and up are uncorrected.
    if algo == "tree" and op == "allreduce" and 0 <= log_size < 23:
        bw *= table[_P[proto]][log_size]
    lat = latency_s(op, algo, proto, ranks, nodes, net)
    if algo == "ring" and proto == "Simple" and nodes > 1 and op == "allreduce":
        if net.version == "2.8":
            if nbytes >= ranks / 16.0 * 65536:
                lat *= 1.9
        elif int(nbytes) // (runtime_channels(net, nodes) * ranks) >= 64:  # comm->nChannels (tuning.cc:648)
            lat *= 1.9 if net.gpu_arch == "volta" else 1.4
    fill = 0.0
    if algo == "tree" and nodes > 1 and net.tree_fill_B > 0:
        fill = 2 * math.log2(nodes) * (nbytes * net.tree_fill_B / (nbytes + net.tree_fill_B)) / bw
    return lat + nbytes / bw + fill + net.launch_s


def choose(op: str, nbytes: float, ranks: int, nodes: int, net: NcclNetwork, *,
           algorithms: tuple[str, ...] | None = None, protocols: tuple[str, ...] | None = None) -> Choice:
    """NCCL's choice: the (algorithm, protocol) with the least predicted time among those allowed (and among
    `algorithms` / `protocols` when given, as NCCL_ALGO / NCCL_PROTO restrict them). Ties keep NCCL's loop
    order (algorithms as in ALGOS, then protocols LL, LL128, Simple). Raises Infeasible when nothing is left."""
    if op not in OPS:
        raise ConfigError("op", op, f"one of {', '.join(OPS)}")
    if ranks <= 1:
        return Choice(0.0, "none", "none")
    best: Choice | None = None
    for algo in algorithms or ALGOS:
        for proto in protocols or PROTOS:
            t = time_s(op, nbytes, ranks, nodes, net, algo, proto)
            if t is not None and (best is None or t < best.time_s):
                best = Choice(t, algo, proto)
    if best is None:
        raise Infeasible(f"NCCL has no algorithm for {op} on {ranks} ranks over {nodes} nodes among "
                         f"algorithms {', '.join(algorithms or ALGOS)} and protocols {', '.join(protocols or PROTOS)}")
    return best


def _check(op: str, algo: str, proto: str) -> None:
    if op not in OPS:
        raise ConfigError("op", op, f"one of {', '.join(OPS)}")
    if algo not in ALGOS:
        raise ConfigError("nccl.algorithm", algo, f"one of {', '.join(ALGOS)}")
    if proto not in PROTOS:
        raise ConfigError("nccl.protocol", proto, f"one of {', '.join(PROTOS)}")
