"""NCCL's tuning constants, release by release, read from github.com/NVIDIA/nccl at the tags named below
(src/graph/tuning.cc for the tables, enqueue.cc for how they are read, search.cc / topo.h / connect.cc where noted).

One table per release in which a modelled constant or rule changed. The 2.8 table is the base; each later entry
holds only what that release changed, so a release maps to the newest table at or before it
(`tables("2.21.5")`), and a minor alone ("2.21") means the latest patch of that minor (LATEST_PATCH). Numbers are
NCCL's units: µs and GB/s. Algorithm, protocol, GPU generation and GPU-NIC path names are simfog's (ALGOS, PROTOS,
ARCHS, PATHS); 2.8-2.13's single CollNet algorithm is "collnet_direct" here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType as Frozen

from simfog.errors import ConfigError

ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOS = ("LL", "LL128", "Simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")
PATHS = ("pix", "pxb", "pxn", "phb", "sys")  # how a GPU reaches its NIC, nearest first (NCCL's PATH_* order)
# Latest patch of every minor release with a public tag (git tag at HEAD 5067397c, June 2026).
LATEST_PATCH = {8: 4, 9: 9, 10: 3, 11: 4, 12: 12, 13: 4, 14: 3, 15: 5, 16: 5, 17: 1, 18: 6, 19: 4, 20: 5, 21: 5,
                22: 3, 23: 4, 24: 3, 25: 1, 26: 6, 27: 7, 28: 9, 29: 7, 30: 7}
OLDEST, NEWEST = (2, 8, 0), (2, 30, LATEST_PATCH[30])
NEWER_MINORS = 20  # how far past NEWEST a 2.x release is still taken as NCCL 2 (with the newest table)
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_Z = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Tables:
    """One release's tuning facts. Rows "per arch" follow `arch_rows`; triples are (1 node, 2 nodes, 3+ nodes)
    unless named (LL, LL128, Simple)."""

    tag: str                      # the tag the values were read at
    base_lat: Frozen              # baseLat[algo] = (LL, LL128, Simple) µs
    hw_lat: Frozen                # hwLat["nvlink" | "pci" | "net"][algo] = (LL, LL128, Simple) µs
    arch_rows: tuple              # GPU generations with their own row in the per-arch tables
    arch_at_least: bool           # True: a newer GPU takes the newest row (minCompCap >= ...); False: only exact
    #                               matches have a row, any other GPU takes row 0 (Volta) as `compCap80 ? 1 : 0` did
    ll_max_bw: tuple              # llMaxBws: per arch (row) on one node; rows 0/1 = Intel/AMD hosts on several
    ll128_by_op: Frozen | None    # 2.8-2.9: LL128 cap per channel by collective (Ring and Tree alike)
    ring_ll128_per_ch: tuple      # per arch (N1, N2, N4)
    tree_ll128_per_ch: tuple      # per arch (N1, N2, N4)
    tree_per_ch: tuple            # perChMaxTreeBws per arch (N1, N2, N4)
    nvls_tree_per_ch: tuple | None  # perChMaxNVLSTreeBws (2.28+)
    bus_cap: Frozen               # busBw = min(busBw, cap) by GPU generation (sm80: 235, sm90 in 2.17: 370)
    tree_correction: tuple        # treeCorrectionFactor[proto][log2(nBytes/64)]; Tree reads indices < 23
    ring_ll_factor: float | None  # Ring LL busBw factor; None: 1/4 (several nodes, allreduce, reduce) else 1/3
    ring_ll128_ppn1: float | None  # Ring LL128 factor at < 2 GPUs per node (0.7), else 0.92; None: always 0.92
    tree_ll128_multinode: float   # Tree LL128 factor on several nodes (7/9 on one)
    ll_intra_multinode: float     # intraLat *= this for LL on several nodes
    net_overhead: bool            # inter-node rings: intraLat = max(intraLat, 1 us Intel / 2 us AMD, x3 Simple)
    inter_steps_2m: bool          # allreduce ring nInterSteps = 2·nNodes (else 2·(nNodes-1))
    latency_inter: str            # graph latencyInter: "none" | "replace" (replaces hwLat NET) | "add" (x2 Simple)
    ppn1_tree_net: bool           # at 1 GPU per node every algorithm takes the Tree NET latency
    plateau_per_channel: bool     # ring plateau test: nBytes/(comm->nChannels·nRanks) >= 64, else >= nRanks/16·64K
    plateau_factor: Frozen        # ring Simple plateau factor by GPU generation
    runtime_hopper: str           # connect.cc's second doubling of comm->nChannels on Hopper (see model)
    max_channels: int             # MAXCHANNELS
    collnet: str                  # which CollNet formulas (model.py)
    nvls: str                     # which NVLS formulas ("" = no NVLS)
    nvls_efficiency: Frozen       # NVLS NVLink efficiency by GPU generation (2.28+)
    pat_bw: float | None          # PAT busBw factor; None: no PAT
    ll128_archs: tuple            # GPU generations LL128 is enabled on by default
    ll128_path: str               # farthest GPU-NIC path with LL128 (before Hopper)
    ll128_path_hopper: str        # farthest GPU-NIC path with LL128 on Hopper and later
    ll128_intra_nvb: bool         # LL128 allowed when GPUs reach each other through another GPU's NVLink (NVB)
    speeds_intra: Frozen          # search.cc speed arrays per channel (GB/s), by "sm<90" | "sm90" | "sm100"
    speeds_inter: Frozen
    nvlink_bw: Frozen             # topo.h SMxx_NVLINK_BW per link, by GPU generation
    dup_rule: str                 # search.cc channel duplication: "25" | "25_50" | "25_nch"

    def arch_row(self, arch: str) -> int:
        """Row of the per-arch tables that `arch` reads in this release."""
        if arch in self.arch_rows:
            return self.arch_rows.index(arch)
        if self.arch_at_least:
            return len(self.arch_rows) - 1 if ARCHS.index(arch) > ARCHS.index(self.arch_rows[-1]) else 0
        return 0


def _f(**kw) -> Frozen:
    return Frozen(dict(kw))


def _hw(**rows) -> Frozen:
    return Frozen({k: Frozen(dict(v)) for k, v in rows.items()})


_TREE_CORRECTION_2_8 = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, .92, .92),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9))
_TREE_CORRECTION_2_10 = (_TREE_CORRECTION_2_8[0],
                         (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
                          1.0), _TREE_CORRECTION_2_8[2])
_SPEEDS_2_8 = (42.0, 30.0, 24.0, 21.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12)
_TAIL = (12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)
_INTER_2_18 = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12)
_SM90_INTER_2_19 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0) + _TAIL

# v2.8.3-1 = v2.8.4-1 (tuning.cc identical; ABCI ran 2.8.4). search.cc / topo.h at v2.8.4-1.
BASE = Tables(
    tag="v2.8.4-1",
    base_lat=_f(tree=(4.4, 4.4, 0.0), ring=(3.6, 10.0, 8.4), collnet_direct=(4.4, 4.4, 0.0)),
    hw_lat=_hw(nvlink=dict(tree=(.52, 1.25, 28), ring=(.47, 1.9, 3.4), collnet_direct=(.5, 1.2, 4.0)),
               pci=dict(tree=(1.0, 1.9, 28), ring=(1.0, 2.5, 5.7), collnet_direct=(1.0, 1.9, 5.5)),
               net=dict(tree=(5.0, 8.5, 28), ring=(2.7, 4.0, 9.6), collnet_direct=(5.0, 5.0, 10.7))),
    arch_rows=("volta", "ampere"), arch_at_least=False,
    ll_max_bw=((39.0, 39.0, 20.4), (87.7, 22.5, 19.0)),
    ll128_by_op=_f(broadcast=18.8, reduce=12.0, allgather=18.3, reduce_scatter=15.2, allreduce=16.9),
    ring_ll128_per_ch=(), tree_ll128_per_ch=(),
    tree_per_ch=((26.5, 18.5, 10.0), (24.0, 22.5, 16.0)), nvls_tree_per_ch=None,
    bus_cap=_f(ampere=235.0), tree_correction=_TREE_CORRECTION_2_8,
    ring_ll_factor=None, ring_ll128_ppn1=0.7, tree_ll128_multinode=0.915, ll_intra_multinode=1.8,
    net_overhead=False, inter_steps_2m=False, latency_inter="none", ppn1_tree_net=False,
    plateau_per_channel=False, plateau_factor=_f(volta=1.9, ampere=1.9, hopper=1.9, blackwell=1.9),
    runtime_hopper="", max_channels=32, collnet="2.8", nvls="", nvls_efficiency=_f(), pat_bw=None,
    ll128_archs=("volta", "ampere"), ll128_path="pxb", ll128_path_hopper="pxb", ll128_intra_nvb=False,
    speeds_intra=_f(generic=_SPEEDS_2_8), speeds_inter=_f(generic=_SPEEDS_2_8),
    nvlink_bw=_f(volta=21.0, ampere=21.0, hopper=21.0, blackwell=21.0), dup_rule="25")


def _with_hw(t: Tables, **changes: dict) -> Frozen:
    """t.hw_lat with some algorithms' rows replaced: _with_hw(t, net={"ring": (...)})."""
    return _hw(**{hw: {**t.hw_lat[hw], **changes.get(hw, {})} for hw in t.hw_lat})


def _build() -> list[tuple[tuple[int, int, int], Tables]]:
    out = [(OLDEST, BASE)]

    def step(release, tag, **changes):
        prev = out[-1][1]
        changes = {k: (v(prev) if callable(v) else v) for k, v in changes.items()}
        out.append((release, replace(prev, tag=tag, **changes)))

    # 2.9: CollNet only with Simple (LL was busBw/6).
    step((2, 9, 0), "v2.9.6-1", collnet="2.9")
    # 2.10: one LL128 cap per channel (20) for every collective; Ampere tree caps 23.6/17.8; Tree LL128 x120/128;
    # CollNet Simple latency 8 us on NVLink/PCI, no x0.9, +0.5 us arity; tree correction's LL128 row; search speeds.
    step((2, 10, 0), "v2.10.3-1", ll128_by_op=None, ring_ll128_per_ch=((20.0,) * 3,) * 2,
         tree_ll128_per_ch=((20.0,) * 3,) * 2, tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8)),
         tree_ll128_multinode=120.0 / 128.0, collnet="2.10", tree_correction=_TREE_CORRECTION_2_10,
         hw_lat=lambda t: _with_hw(t, nvlink={"collnet_direct": (.5, 1.2, 8.0)},
                                   pci={"collnet_direct": (1.0, 1.9, 8.0)}),
         speeds_intra=_f(generic=(44.0, 30.0, 22.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)),
         speeds_inter=_f(generic=(48.0, 30.0, 24.0, 22.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4,
                                  1.2, 0.24, 0.12)),
         nvlink_bw=_f(volta=22.0, ampere=22.0, hopper=22.0, blackwell=22.0))
    # 2.12 (= 2.13): Ring NET Simple 28 us; allreduce nInterSteps = 2·nNodes; the graph's latencyInter replaces
    # hwLat[NET] when the network plugin reports one.
    step((2, 12, 0), "v2.12.12-1", hw_lat=lambda t: _with_hw(t, net={"ring": (2.7, 4.0, 28)}), inter_steps_2m=True,
         latency_inter="replace")
    # 2.14: Hopper row (Ampere's values), LL128 on Hopper; Ring NET Simple back to 9.6; CollNet split into
    # Direct and Chain (0.75 busBw, no NET latency).
    step((2, 14, 0), "v2.14.3-1", arch_rows=("volta", "ampere", "hopper"),
         ll_max_bw=((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0)),
         ring_ll128_per_ch=((20.0,) * 3,) * 3, tree_ll128_per_ch=((20.0,) * 3,) * 3,
         tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (24.0, 23.6, 17.8)),
         ll128_archs=("volta", "ampere", "hopper"), collnet="2.14",
         base_lat=lambda t: _f(**t.base_lat, collnet_chain=(4.4, 4.4, 0.0)),
         hw_lat=lambda t: _hw(nvlink={**t.hw_lat["nvlink"], "collnet_direct": _Z[:2] + (8.0,),
                                      "collnet_chain": _Z[:2] + (8.0,)},
                              pci={**t.hw_lat["pci"], "collnet_direct": _Z[:2] + (8.0,),
                                   "collnet_chain": _Z[:2] + (8.0,)},
                              net={**t.hw_lat["net"], "ring": (2.7, 4.0, 9.6), "collnet_direct": _Z[:2] + (10.7,),
                                   "collnet_chain": _Z[:2] + (10.7,)}))
    # 2.15: search speeds (inter 28 GB/s added).
    step((2, 15, 0), "v2.15.5-1", speeds_inter=_f(generic=(48.0, 30.0, 28.0, 24.0, 22.0, 18.0, 15.0, 12.0, 10.0, 9.0,
                                                           7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12)))
    # 2.16: Hopper search speeds; channel duplication at 25 GB/s (<= sm80) or 50 GB/s (sm90).
    step((2, 16, 0), "v2.16.5-1", dup_rule="25_50",
         speeds_intra=lambda t: _f(**t.speeds_intra, sm90=(66.0, 33.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0)),
         speeds_inter=lambda t: _f(**t.speeds_inter, sm90=(48.0, 45.0, 30.0, 24.0, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24,
                                                         0.12)))
    # 2.17: NVLS (one node), Hopper LL128 cap 36.7 and tree caps, sm90 bus cap 370, plateau x1.5 on Hopper,
    # newer GPUs read the newest row, LL128 on Hopper also through PXN.
    step((2, 17, 0), "v2.17.1-1", arch_at_least=True, ring_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7,) * 3),
         tree_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7,) * 3),
         tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 33.0)),
         bus_cap=_f(ampere=235.0, hopper=370.0, blackwell=370.0),
         plateau_factor=_f(volta=1.9, ampere=1.9, hopper=1.5, blackwell=1.5), ll128_path_hopper="pxn", nvls="2.17",
         base_lat=lambda t: _f(**t.base_lat, nvls=(0.0, 0.0, 40.0)),
         hw_lat=lambda t: _with_hw(t, nvlink={"nvls": _Z}, pci={"nvls": _Z}, net={"nvls": _Z}))
    # 2.18: new base latencies, NVLink LL 0.6, Ring NET Simple 14, NVLS tree, net overhead on inter-node rings, no
    # x1.8 for LL, latencyInter added (twice for Simple: flush), no bus caps, plateau per channel (x1.9 < sm80,
    # x1.4), CollNet Direct x0.85 on Hopper, Chain with NET latency, second channel doubling on Hopper.
    step((2, 18, 0), "v2.18.1-1",
         base_lat=_f(tree=(6.8, 14.0, 0.0), ring=(6.6, 14.0, 8.4), collnet_direct=(6.8, 14.0, 0.0),
                     collnet_chain=(6.8, 14.0, 0.0), nvls=(0.0, 0.0, 23.0), nvls_tree=(0.0, 0.0, 23.0)),
         hw_lat=_hw(nvlink=dict(tree=(.6, 1.25, 28), ring=(.6, 1.9, 3.4), collnet_direct=_Z[:2] + (8.0,),
                                collnet_chain=_Z[:2] + (4.75,), nvls=_Z, nvls_tree=_Z),
                    pci=dict(tree=(1.0, 1.9, 28), ring=(1.0, 2.5, 5.7), collnet_direct=_Z[:2] + (8.0,),
                             collnet_chain=_Z[:2] + (8.0,), nvls=_Z, nvls_tree=_Z),
                    net=dict(tree=(5.0, 8.5, 28), ring=(2.7, 4.0, 14.0), collnet_direct=_Z[:2] + (10.7,),
                             collnet_chain=_Z[:2] + (14.0,), nvls=_Z[:2] + (18.0,), nvls_tree=_Z[:2] + (19.0,))),
         net_overhead=True, ll_intra_multinode=1.0, latency_inter="add", bus_cap=_f(), plateau_per_channel=True,
         plateau_factor=_f(volta=1.9, ampere=1.4, hopper=1.4, blackwell=1.4), collnet="2.18", nvls="2.18",
         runtime_hopper="eq90_le_max",
         speeds_intra=_f(generic=(40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                         sm90=(60.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0)),
         speeds_inter=_f(generic=_INTER_2_18,
                         sm90=(48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 20.0, 17.5, 15.0) + _TAIL),
         nvlink_bw=_f(volta=20.0, ampere=20.0, hopper=20.0, blackwell=20.0))
    # 2.18.3: Tree Simple latency 4/6/14 us; per-arch Ring and Tree LL128 caps; Hopper tree N4 36; NVLS x5/6;
    # LL128 also through NVB; duplication unless Hopper+ with < 50 GB/s and > 4 channels.
    step((2, 18, 3), "v2.18.3-1",
         hw_lat=lambda t: _with_hw(t, nvlink={"tree": (.6, 1.25, 4)}, pci={"tree": (1.0, 1.9, 6)},
                                   net={"tree": (5.0, 8.5, 14)}),
         ring_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7,) * 3),
         tree_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0)),
         tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0)), nvls="2.18.3",
         ll128_intra_nvb=True, dup_rule="25_nch")
    # 2.19: Tree Simple latency back to 28; CollNet/NVLS base latencies 0 and new hwLat; CollNet arity 0.4;
    # NVLS latency = intraLat (+ interLat), NVLS allgather/reduce-scatter, NVLS tree log2 latency.
    step((2, 19, 0), "v2.19.1-1",
         base_lat=lambda t: _f(**{**t.base_lat, "collnet_direct": _Z, "collnet_chain": _Z, "nvls": _Z,
                                  "nvls_tree": _Z}),
         hw_lat=lambda t: _with_hw(
             t, nvlink={"tree": (.6, 1.25, 28), "collnet_direct": _Z[:2] + (3.7,), "collnet_chain": _Z[:2] + (2.8,),
                        "nvls": _Z[:2] + (23.0,), "nvls_tree": _Z[:2] + (23.0,)},
             pci={"tree": (1.0, 1.9, 28), "collnet_direct": _Z[:2] + (3.7,), "collnet_chain": _Z[:2] + (2.8,)},
             net={"tree": (5.0, 8.5, 28), "collnet_direct": _Z[:2] + (31.0,), "collnet_chain": _Z[:2] + (30.0,),
                  "nvls_tree": _Z[:2] + (14.0,)}),
         collnet="2.19", nvls="2.19",
         speeds_intra=lambda t: _f(**{**t.speeds_intra, "sm90": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0,
                                                                 3.0)}),
         speeds_inter=lambda t: _f(**{**t.speeds_inter, "sm90": _SM90_INTER_2_19}))
    # 2.20: comm->nChannels doubled on Hopper below 16; SM90 NVLink 20.6 GB/s.
    step((2, 20, 0), "v2.20.3-1", runtime_hopper="eq90_lt16",
         nvlink_bw=_f(volta=20.0, ampere=20.0, hopper=20.6, blackwell=20.6))
    # 2.21: NVLS NVLink latency 25; Hopper LL caps 141/45/35; Ring LL busBw x0.5.
    step((2, 21, 0), "v2.21.5-1", ring_ll_factor=0.5,
         ll_max_bw=((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0)),
         hw_lat=lambda t: _with_hw(t, nvlink={"nvls": _Z[:2] + (25.0,), "nvls_tree": _Z[:2] + (25.0,)}),
         speeds_intra=lambda t: _f(**{**t.speeds_intra, "sm90": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0,
                                                                 6.0, 3.0)}))
    # 2.23: Tree Simple base 8.4 and latency 4/4/14; allreduce nInterSteps 2·(nNodes-1) again; Tree NET latency at
    # 1 GPU per node; no x0.7 for Ring LL128 at 1 GPU per node; PAT (x0.85); non-ring allgather/reduce-scatter keep
    # their bus bandwidth.
    step((2, 23, 0), "v2.23.4-1", inter_steps_2m=False, ppn1_tree_net=True, ring_ll128_ppn1=None, pat_bw=0.85,
         nvls="2.23",
         base_lat=lambda t: _f(**{**t.base_lat, "tree": (6.8, 14.0, 8.4), "pat": (8.0, 8.0, 8.0)}),
         hw_lat=lambda t: _with_hw(t, nvlink={"tree": (.6, 1.25, 4.0), "pat": _Z}, pci={"tree": (1.0, 1.9, 4.0),
                                   "pat": _Z}, net={"tree": (5.0, 8.5, 14), "pat": _Z}))
    # 2.24: PAT x0.75.
    step((2, 24, 0), "v2.24.3-1", pat_bw=0.75)
    # 2.25: Blackwell row (twice Hopper's), LL128 on Blackwell, MAXCHANNELS 64, doubling from sm90 on.
    step((2, 25, 0), "v2.25.1-1", arch_rows=ARCHS,
         ll_max_bw=((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0)),
         ring_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (73.4,) * 3),
         tree_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (73.4, 73.4, 58.0)),
         tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (77.4, 82.8, 72.0)),
         ll128_archs=ARCHS, runtime_hopper="ge90_lt16", max_channels=64,
         speeds_intra=lambda t: _f(**t.speeds_intra, sm100=(90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0,
                                                            19.0)),
         speeds_inter=lambda t: _f(**t.speeds_inter, sm100=_SM90_INTER_2_19),
         nvlink_bw=_f(volta=20.0, ampere=20.0, hopper=20.6, blackwell=40.0))
    # 2.27: NVLS allgather/reduce-scatter bandwidth; LL128 on Hopper+ only up to PXB (P2C) in 2.27.3.
    step((2, 27, 0), "v2.27.3-1", nvls="2.27", ll128_path_hopper="pxb",
         speeds_intra=lambda t: _f(**{**t.speeds_intra, "sm100": (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0,
                                                                  19.0, 18.0)}),
         speeds_inter=lambda t: _f(**{**t.speeds_inter, "sm100": (96.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0,
                                                                  17.5, 15.0) + _TAIL}),
         nvlink_bw=_f(volta=20.0, ampere=20.0, hopper=20.6, blackwell=40.1))
    # 2.27.5: LL128 on Hopper+ up to PXN again (NCCL_LL128_C2C=1 default).
    step((2, 27, 5), "v2.27.5-1", ll128_path_hopper="pxn")
    # 2.28: tuner constants struct; NVLS efficiency 0.85 Hopper / 0.74 Blackwell, NVLS ratio n/nsteps, NVLS tree
    # per-channel caps; Blackwell Tree / Tree LL128 caps.
    step((2, 28, 0), "v2.28.3-1", nvls="2.28", nvls_efficiency=_f(hopper=0.85, blackwell=0.74),
         nvls_tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 43.1)),
         tree_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0)),
         tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0)),
         hw_lat=lambda t: _with_hw(t, nvlink={"pat": _Z[:2] + (4.0,)}, pci={"pat": _Z[:2] + (4.0,)},
                                   net={"pat": _Z[:2] + (14.0,)}))
    step((2, 28, 7), "v2.28.7-1", ring_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (73.4, 34.6, 73.4)))
    step((2, 28, 9), "v2.28.9-1", hw_lat=lambda t: _with_hw(t, net={"nvls_tree": _Z[:2] + (20.9,)}),
         nvls_tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 43.8)))
    # 2.29: Blackwell Ring LL128 caps; treeCorrectionFactor gets a 24th column (read by NVLS tree on Blackwell).
    step((2, 29, 0), "v2.29.2-1", ring_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (34.5, 34.6, 34.5)),
         tree_correction=tuple(row + (row[-1],) for row in _TREE_CORRECTION_2_10),
         speeds_intra=lambda t: _f(**{**t.speeds_intra, "sm100": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0,
                                                                  20.0, 19.0, 18.0)}),
         speeds_inter=lambda t: _f(**{**t.speeds_inter, "sm100": (96.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0,
                                                                  20.0, 17.5, 15.0) + _TAIL}))
    step((2, 29, 7), "v2.29.7-1", ring_ll128_per_ch=((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3))
    # 2.30: Blackwell NVLS tree N4 cap 80.
    step((2, 30, 0), "v2.30.3-1",
         nvls_tree_per_ch=((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0)),
         speeds_inter=lambda t: _f(**{**t.speeds_inter, "sm100": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0,
                                                                  22.0, 20.0, 17.5, 15.0) + _TAIL}))
    return out


RELEASES = tuple(_build())


def parse_release(text: object, field: str = "nccl.version") -> tuple[int, int, int]:
    """'2.21' (the latest 2.21 patch) or '2.21.5' -> (2, 21, 5). Raises ConfigError for anything else, or a release
    before 2.8 (the oldest whose tables simfog has). A release newer than NEWEST is accepted (it takes the newest
    table; simfog.nccl.calibrated says so where a prediction uses it)."""
    allowed = (f"an NCCL release X.Y or X.Y.Z from 2.8 to 2.{NEWEST[1] + NEWER_MINORS}, e.g. 2.21 or 2.21.5 "
               f"(tables up to {'.'.join(map(str, NEWEST))}; a newer 2.x takes those)")
    m = _RELEASE.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise ConfigError(field, text, allowed)
    major, minor = int(m.group(1)), int(m.group(2))
    patch = int(m.group(3)) if m.group(3) is not None else LATEST_PATCH.get(minor, 99) if major == 2 else 99
    release = (major, minor, patch)
    # A newer 2.x takes the newest table (and says so); another major, or a minor far past any release, is no
    # NCCL whose cost model this is.
    if release < OLDEST or major != OLDEST[0] or minor > NEWEST[1] + NEWER_MINORS:
        raise ConfigError(field, text, allowed)
    return release


@lru_cache(maxsize=256)
def tables(version: str) -> Tables:
    """The tables of NCCL release `version` ("X.Y" or "X.Y.Z"): the newest at or before it."""
    release = parse_release(version)
    return next(t for r, t in reversed(RELEASES) if r <= release)
