"""Rail-optimized fabrics: one rail switch per NIC index, NIC i of every node of a group on rail switch i.

A group (a scalable unit) of `nodes_per_group` nodes has `nics_per_node` rail switches; rail switch i of group g
connects NIC i of each of the group's nodes. Traffic between NICs of one rail in one group crosses that rail switch
only (rail-local). Above the rails, a spine: each rail switch has `rail_uplinks` uplinks of `rail_uplink_Bps`,
routed as a two-tier Clos whose leaves are the rail switches (simfog.fabric.clos), so cross-rail and cross-group
traffic crosses the spine and shares the rail switches' uplinks.

Rail-only (`rail_uplinks` = 0): no spine, one group. A flow between NICs on different rails then leaves its node
through the NIC on the destination's rail, as NCCL's PXN sends it over NVLink to the GPU next to that NIC first
(the hop inside the node is not a fabric link).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simfog.errors import ConfigError
from simfog.fabric.base import MOST_NODES, check_int, check_rate
from simfog.fabric.clos import Clos


@dataclass(frozen=True, kw_only=True)
class RailOptimized(Clos):
    """`groups` groups of `nodes_per_group` nodes on their rail switches, joined by a spine unless rail-only
    (module docstring). `oversubscription` is what a rail switch's NICs send over what its uplinks carry."""

    nodes_per_group: int
    groups: int = 1
    rail_uplinks: int = 0
    rail_uplink_Bps: float | None = None

    def __post_init__(self):
        super().__post_init__()
        check_int("nodes_per_group", self.nodes_per_group, most=MOST_NODES)
        check_int("groups", self.groups, most=MOST_NODES)
        if self.nodes_per_group * self.groups > MOST_NODES:
            raise ConfigError("fabric.groups", self.groups, f"at most {MOST_NODES:,} nodes in all")
        check_int("rail_uplinks", self.rail_uplinks, least=0, most=4096)
        if self.rail_only:
            if self.rail_uplink_Bps is not None:
                raise ConfigError("fabric.rail_uplink_bandwidth", self.rail_uplink_Bps,
                                  "none on a rail-only fabric (rail_uplinks = 0: no spine)")
            if self.groups != 1:
                raise ConfigError("fabric.groups", self.groups, "1 on a rail-only fabric: without a spine nothing "
                                  "joins two groups")
        else:
            check_rate("rail_uplink_bandwidth", self.rail_uplink_Bps)

    @property
    def rail_only(self) -> bool:
        return self.rail_uplinks == 0

    @property
    def nodes(self) -> int:
        return self.nodes_per_group * self.groups

    @property
    def oversubscription(self) -> float | None:
        """What a rail switch's NICs can send over what its uplinks carry (None: rail-only)."""
        if self.rail_only:
            return None
        return self.nodes_per_group * self.nic_Bps / (self.rail_uplinks * self.rail_uplink_Bps)

    def leaf_of(self, node, nic):
        return node // self.nodes_per_group * self.nics_per_node + nic

    def egress_nic(self, src_nic: np.ndarray, dst_nic: np.ndarray) -> np.ndarray:
        return dst_nic if self.rail_only else src_nic  # PXN on a rail-only fabric

    # -- what Clos routes by: the rail switches are the leaves, two tiers ------------------------------------
    @property
    def leaf_count(self) -> int:
        return self.groups * self.nics_per_node

    @property
    def pod_leaves(self) -> int:
        return self.leaf_count

    @property
    def leaf_uplinks(self) -> int:
        return self.rail_uplinks

    @property
    def leaf_uplink_Bps(self) -> float:
        return self.rail_uplink_Bps or 0.0

    pod_spines = 1
    core_uplinks = 0
    core_uplink_Bps = 0.0
