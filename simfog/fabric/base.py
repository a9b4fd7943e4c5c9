"""What every fabric shares: NICs, their links into the first switch, routing of a step's flows, and the checks.

Every node has `nics_per_node` NICs of `nic_Bps` each (bytes/s, each direction); NIC k of node u has an up link
(NIC to its switch) and a down link (switch to NIC). A flow between two nodes leaves through its source NIC's up
link and arrives through its destination NIC's down link, and crosses the switch links the fabric's kind adds in
between (`_core`). A flow between NICs of one node crosses no fabric link (it stays on the node's own links).
Switches are non-blocking inside; `switch_latency_s` is added per switch a flow crosses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simfog.errors import ConfigError
from simfog.fabric.links import ECMP, LinkTable, RouteBuilder, Routes, Segment, ecmp_hash

MOST_NODES = 1 << 22  # 4M nodes: far beyond any cluster, small enough that link indices stay int64-safe
MOST_NICS = 64


def check_int(name: str, v: object, least: int = 1, most: int = MOST_NODES) -> None:
    """ConfigError naming fabric.`name` unless `v` is an integer in least..most."""
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or not least <= v <= most:
        raise ConfigError(f"fabric.{name}", v, f"an integer in {least}..{most:,}")


def check_rate(name: str, v: object) -> None:
    """ConfigError naming fabric.`name` unless `v` is a finite bandwidth > 0 (B/s)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not (0 < v < math.inf):
        raise ConfigError(f"fabric.{name}", v, "a finite bandwidth > 0 (B/s)")


def nic_of_gpu(gpu, nics_per_node: int):
    """The NIC (rail) GPU `gpu` of a node sends through: gpu mod nics_per_node, as NCCL's rails map them (a node of
    G GPUs then uses min(G, nics_per_node) NICs). Works on arrays."""
    return gpu % nics_per_node


@dataclass(frozen=True, kw_only=True)
class Fabric:
    """Base of the fabric kinds (module docstring). `ecmp` is how flows use equal-cost paths: "split" (each flow
    spread evenly over them: adaptive routing, packet spraying) or "hash" (each flow on one path chosen by a
    deterministic hash of its source and destination NICs, as static ECMP does; paths may then collide)."""

    nic_Bps: float
    nics_per_node: int = 1
    switch_latency_s: float = 0.0
    ecmp: str = "split"

    def __post_init__(self):
        check_rate("nic_bandwidth", self.nic_Bps)
        check_int("nics_per_node", self.nics_per_node, most=MOST_NICS)
        s = self.switch_latency_s
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s < 1.0:
            raise ConfigError("fabric.switch_latency", s, "a time in seconds, 0 <= t < 1 s")
        if self.ecmp not in ECMP:
            raise ConfigError("fabric.ecmp", self.ecmp, f"one of {', '.join(ECMP)}")

    # -- what a kind provides: `nodes` (a field or a property: how many nodes the fabric holds) and these -----
    def _segments(self, ecmp: str) -> list[Segment]:
        """The links beyond the NICs' own (their segments, in any order)."""
        raise NotImplementedError

    def _core(self, out: RouteBuilder, table: LinkTable, idx: np.ndarray, src: np.ndarray, s_nic: np.ndarray,
              dst: np.ndarray, d_nic: np.ndarray, ecmp: str) -> np.ndarray:
        """Adds the switch links of flows idx (from node src NIC s_nic to node dst NIC d_nic, different nodes);
        returns the switches each crosses."""
        raise NotImplementedError

    def egress_nic(self, src_nic: np.ndarray, dst_nic: np.ndarray) -> np.ndarray:
        """The NIC a flow leaves its node through (its own, but where a fabric moves it to another rail)."""
        return src_nic

    # -- shared ------------------------------------------------------------------------------------------------
    def nic_segments(self, capacity_Bps: float | None = None) -> list[Segment]:
        shape, dims = (self.nodes, self.nics_per_node), ("node", "nic")
        cap = self.nic_Bps if capacity_Bps is None else capacity_Bps
        return [Segment("nic up", shape, dims, cap), Segment("nic down", shape, dims, cap)]

    def link_table(self, ecmp: str | None = None) -> LinkTable:
        """Every directed link of this fabric as routed under `ecmp` (default the fabric's): under "split", the
        parallel uplinks that every flow spreads over evenly are one bundle of their summed capacity (exact: each
        member then carries 1/n of the bundle's traffic)."""
        return _table(self, self._ecmp(ecmp))

    def route(self, flows, ecmp: str | None = None) -> Routes:
        """The links each of `flows` (simfog.fabric.flows.Flows) crosses, under `ecmp` (default the fabric's).
        Raises ConfigError when a flow names a node or NIC the fabric does not have."""
        ecmp = self._ecmp(ecmp)
        for name, arr, limit in (("src_node", flows.src_node, self.nodes), ("dst_node", flows.dst_node, self.nodes),
                                 ("src_nic", flows.src_nic, self.nics_per_node),
                                 ("dst_nic", flows.dst_nic, self.nics_per_node)):
            bad = (arr < 0) | (arr >= limit)
            if bad.any():
                raise ConfigError(f"flows.{name}", int(arr[bad][0]), f"an index in 0..{limit - 1} (this fabric's)")
        table = self.link_table(ecmp)
        out = RouteBuilder()
        hops = np.zeros(len(flows), dtype=np.int64)
        idx = np.flatnonzero(flows.src_node != flows.dst_node)
        if len(idx):
            src, dst = flows.src_node[idx], flows.dst_node[idx]
            s_nic = self.egress_nic(flows.src_nic[idx], flows.dst_nic[idx])
            d_nic = flows.dst_nic[idx]
            out.add(idx, table.ids("nic up", src, s_nic))
            out.add(idx, table.ids("nic down", dst, d_nic))
            hops[idx] = self._core(out, table, idx, src, s_nic, dst, d_nic, ecmp)
        return out.build(len(flows), hops, table, ecmp)

    def flow_hash(self, src, s_nic, dst, d_nic) -> np.ndarray:
        """The ECMP hash of flows from (src, s_nic) to (dst, d_nic)."""
        return ecmp_hash(src, s_nic, dst, d_nic)

    def _ecmp(self, ecmp: str | None) -> str:
        ecmp = self.ecmp if ecmp is None else ecmp
        if ecmp not in ECMP:
            raise ConfigError("ecmp", ecmp, f"one of {', '.join(ECMP)}")
        return ecmp


@lru_cache(maxsize=32)
def _table(fabric: Fabric, ecmp: str) -> LinkTable:
    return LinkTable(fabric.nic_segments() + fabric._segments(ecmp))
