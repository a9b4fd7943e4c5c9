"""The flat fabric, simfog's default: every NIC straight into one non-blocking core switch.

`oversubscription` s >= 1 means what simfog.cluster.Cluster.oversubscription means: the core carries less than all
NICs at once, and a flow leaving a node sees the NIC slowed by s. Here that is each NIC's link into the core and
out of it carrying nic_Bps / s, the same division Cluster.inter makes, so one flow per NIC gets exactly the rate
today's model gives it (bit for bit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simfog.errors import ConfigError
from simfog.fabric.base import MOST_NODES, Fabric, check_int
from simfog.fabric.links import Segment


@dataclass(frozen=True, kw_only=True)
class Flat(Fabric):
    """`nodes` nodes on one non-blocking core (module docstring)."""

    nodes: int
    oversubscription: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check_int("nodes", self.nodes, most=MOST_NODES)
        s = self.oversubscription
        if isinstance(s, bool) or not isinstance(s, int | float) or not 1.0 <= s < math.inf:
            raise ConfigError("fabric.oversubscription", s, "a finite number >= 1 (1 = full bisection)")

    def nic_segments(self, capacity_Bps: float | None = None) -> list[Segment]:
        return super().nic_segments(self.nic_Bps / self.oversubscription)  # Cluster.inter's division

    def _segments(self, ecmp: str) -> list[Segment]:
        return []

    def _core(self, out, table, idx, src, s_nic, dst, d_nic, ecmp) -> np.ndarray:
        return np.ones(len(idx), dtype=np.int64)  # the core switch
