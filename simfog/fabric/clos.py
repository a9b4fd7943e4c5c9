"""Folded-Clos fabrics: leaf switches under spines, in two or three tiers, and the routing they share.

NICs hang off leaves (`leaf_of`: by node for a fat tree, by node group and NIC index for a rail-optimized fabric).
Each leaf has U1 uplinks of one rate; uplink j goes to spine j mod S of its pod (U1 a multiple of S: U1/S parallel
links to each). Two tiers are one pod. With three tiers, each spine has U2 uplinks to the core: uplink m of spine s
goes to core s·U2 + m, the same core for spine s of every pod, so pods meet at every core (the k-ary fat tree's
wiring). Switches are non-blocking; the links are what flows share.

Paths between NICs on different leaves: up leaf uplink j, (three tiers, another pod:) up spine uplink m of spine
j mod S, down the same spine index's uplink m in the destination pod, down the destination leaf's uplink j. Under
ECMP "hash" each flow takes one (j, m) from a hash of its NICs (two independent picks, one per tier); under "split"
it spreads evenly over all of them, so every leaf's uplinks (and every pod's spine uplinks) act as one bundle of
their summed capacity. Switches crossed: 1 on one leaf, 3 within a pod, 5 across pods.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simfog.errors import ConfigError, Infeasible
from simfog.fabric.base import MOST_NODES, Fabric, check_int, check_rate
from simfog.fabric.links import Segment, pick


@dataclass(frozen=True, kw_only=True)
class Clos(Fabric):
    """The routing of a Clos (module docstring). A kind provides leaf_of(node, nic), leaf_count, pod_leaves (leaves
    per pod: all of them with two tiers), leaf_uplinks (U1; 0: no uplinks), leaf_uplink_Bps, pod_spines (S),
    core_uplinks (U2 per spine; 0 with two tiers) and core_uplink_Bps."""

    def leaf_of(self, node: np.ndarray, nic: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @property
    def pods(self) -> int:
        return self.leaf_count // self.pod_leaves

    @property
    def tiers(self) -> int:
        return 3 if self.core_uplinks else 2

    def _segments(self, ecmp: str) -> list[Segment]:
        if not self.leaf_uplinks:
            return []
        if ecmp == "split":
            segs = [Segment(f"leaf {d}", (self.leaf_count,), ("leaf",), self.leaf_uplinks * self.leaf_uplink_Bps)
                    for d in ("up", "down")]
            if self.tiers == 3:
                cap = self.pod_spines * self.core_uplinks * self.core_uplink_Bps
                segs += [Segment(f"pod {d}", (self.pods,), ("pod",), cap) for d in ("up", "down")]
            return segs
        segs = [Segment(f"leaf {d}", (self.leaf_count, self.leaf_uplinks), ("leaf", "uplink"), self.leaf_uplink_Bps)
                for d in ("up", "down")]
        if self.tiers == 3:
            shape = (self.pods, self.pod_spines, self.core_uplinks)
            segs += [Segment(f"spine {d}", shape, ("pod", "spine", "uplink"), self.core_uplink_Bps)
                     for d in ("up", "down")]
        return segs

    def _core(self, out, table, idx, src, s_nic, dst, d_nic, ecmp) -> np.ndarray:
        ls, ld = self.leaf_of(src, s_nic), self.leaf_of(dst, d_nic)
        cross = ls != ld
        if not cross.any():
            return np.ones(len(idx), dtype=np.int64)
        if not self.leaf_uplinks:
            raise Infeasible("no path between leaves of a fabric without uplinks")  # RailOptimized rules it out
        ps, pd = ls // self.pod_leaves, ld // self.pod_leaves
        far = cross & (ps != pd)
        if ecmp == "split":
            out.add(idx, table.ids("leaf up", ls), present=cross)
            out.add(idx, table.ids("leaf down", ld), present=cross)
            if far.any():
                out.add(idx, table.ids("pod up", ps), present=far)
                out.add(idx, table.ids("pod down", pd), present=far)
        else:
            h = self.flow_hash(src, s_nic, dst, d_nic)
            j = pick(h, self.leaf_uplinks)
            out.add(idx, table.ids("leaf up", ls, j), present=cross)
            out.add(idx, table.ids("leaf down", ld, j), present=cross)
            if far.any():
                s, m = j % self.pod_spines, pick(h, self.core_uplinks, salt=1)
                out.add(idx, table.ids("spine up", ps, s, m), present=far)
                out.add(idx, table.ids("spine down", pd, s, m), present=far)
        return np.where(far, 5, np.where(cross, 3, 1))


@dataclass(frozen=True, kw_only=True)
class FatTree(Clos):
    """A two- or three-tier fat tree: `nodes_per_leaf` nodes (all their NICs) on each of `leaves` leaves, each leaf
    with `leaf_uplinks` uplinks of `leaf_uplink_Bps`. Three tiers when `leaves_per_pod` is set: pods of that many
    leaves and `spines_per_pod` spines, each spine with `spine_uplinks` uplinks of `spine_uplink_Bps` to the core
    (these three are required with three tiers and refused with two). Oversubscription per tier is what the counts
    and rates give (`leaf_oversubscription`, `spine_oversubscription`); simfog.fabric.config derives rates from it."""

    nodes_per_leaf: int
    leaves: int
    leaf_uplinks: int
    leaf_uplink_Bps: float
    leaves_per_pod: int | None = None
    spines_per_pod: int | None = None
    spine_uplinks: int | None = None
    spine_uplink_Bps: float | None = None

    def __post_init__(self):
        super().__post_init__()
        check_int("nodes_per_leaf", self.nodes_per_leaf, most=MOST_NODES)
        check_int("leaves", self.leaves, most=MOST_NODES)
        if self.nodes_per_leaf * self.leaves > MOST_NODES:
            raise ConfigError("fabric.leaves", self.leaves, f"at most {MOST_NODES:,} nodes in all")
        check_int("leaf_uplinks", self.leaf_uplinks, most=4096)
        check_rate("leaf_uplink_bandwidth", self.leaf_uplink_Bps)
        three = {"spines_per_pod": self.spines_per_pod, "spine_uplinks": self.spine_uplinks,
                 "spine_uplink_bandwidth": self.spine_uplink_Bps}
        if self.leaves_per_pod is None:
            for name, v in three.items():
                if v is not None:
                    raise ConfigError(f"fabric.{name}", v, "only with three tiers (leaves_per_pod set)")
            return
        check_int("leaves_per_pod", self.leaves_per_pod, most=self.leaves)
        if self.leaves % self.leaves_per_pod:
            raise ConfigError("fabric.leaves", self.leaves, f"a multiple of leaves_per_pod ({self.leaves_per_pod})")
        check_int("spines_per_pod", self.spines_per_pod, most=4096)
        if self.leaf_uplinks % self.spines_per_pod:
            raise ConfigError("fabric.leaf_uplinks", self.leaf_uplinks,
                              f"a multiple of spines_per_pod ({self.spines_per_pod}): as many links to each spine")
        check_int("spine_uplinks", self.spine_uplinks, most=4096)
        check_rate("spine_uplink_bandwidth", self.spine_uplink_Bps)

    @property
    def nodes(self) -> int:
        return self.nodes_per_leaf * self.leaves

    @property
    def leaf_count(self) -> int:
        return self.leaves

    def leaf_of(self, node, nic):
        return node // self.nodes_per_leaf

    @property
    def leaf_oversubscription(self) -> float:
        """What a leaf's NICs can send, over what its uplinks carry."""
        return self.nodes_per_leaf * self.nics_per_node * self.nic_Bps / (self.leaf_uplinks * self.leaf_uplink_Bps)

    @property
    def spine_oversubscription(self) -> float | None:
        """What a pod's leaves send up, over what its spines' uplinks carry (None with two tiers)."""
        if self.tiers == 2:
            return None
        down = self.leaves_per_pod * self.leaf_uplinks * self.leaf_uplink_Bps
        return down / (self.spines_per_pod * self.spine_uplinks * self.spine_uplink_Bps)

    # -- what Clos routes by ----------------------------------------------------------------------------------
    @property
    def pod_leaves(self) -> int:
        return self.leaves if self.leaves_per_pod is None else self.leaves_per_pod

    @property
    def pod_spines(self) -> int:
        return self.spines_per_pod or 1

    @property
    def core_uplinks(self) -> int:
        return self.spine_uplinks or 0

    @property
    def core_uplink_Bps(self) -> float:
        return self.spine_uplink_Bps or 0.0
