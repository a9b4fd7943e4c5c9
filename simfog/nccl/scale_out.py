"""Scale-out from the fabric: what the switches between a cluster's nodes leave of its NICs' rate to the flows NCCL's
ring, tree and send/recv patterns make, by node count, so that a calibration on a few nodes carries to many.

A cluster's fabric (`FabricSpec`, the network file's [scale_out] section; the corpus's facts say it as its
documentation states it, or infer it with the reason) is a two-tier fat tree (`fat_tree`: `nodes_per_leaf` nodes
per leaf switch) or a rail-optimized one (`rail`: NIC i of every node on rail switch i, as NVIDIA's reference
clusters wire them), each leaf with `uplinks` uplinks at `oversubscription` (NIC traffic over uplink capacity), and
its multipath routing (`ecmp`): "hash" (every flow keeps one path chosen by a hash of its ends, as ECMP switches
and static InfiniBand routing spread flows; two flows on one uplink share it) or "split" (adaptive routing, e.g.
Slingshot's: every flow spread over the paths). The fabric itself is simfog.fabric's (simfog.fabric.FatTree,
RailOptimized), its flows routed and shared max-min there.

`rate_factor(spec, pattern, nodes, gpus_per_node, nics)` is the pattern's slowest flow on that fabric over its slowest
on the NICs alone (a non-blocking fabric: what the algorithm's own sharing of a NIC leaves; <= 1), averaged (as 1 /
rate: a step lasts as long as its slowest flow) over PLACEMENTS placements of the job's nodes drawn at random on a
fabric of twice their number (or of one full group of leaves); NCCL's step pattern is that of simfog.fabric.schedules
(ring: channel c from NIC c to NIC c of the next node; tree: NCCL's double binary tree) and, for send/recv, nccl-tests'
ring of ranks: the last GPU of node k sends to the first of node k+1, NIC (G-1) mod K to NIC 0, which on a
rail-optimized fabric crosses rails. The calibrated inter-node bus bandwidth is then that of a non-blocking fabric (the
logs' factor divided out, simfog.nccl.fit), and a prediction on n nodes multiplies it by the factor at n: more nodes,
more flows on the same uplinks, more collisions. Without a [scale_out] section every factor is 1 (the fabric takes
nothing, as before).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simfog.errors import ConfigError

KINDS = ("fat_tree", "rail")
PATTERNS = ("ring", "tree", "sendrecv")
ECMP = ("hash", "split")
PLACEMENTS = 32
_KEYS = {"kind", "nodes_per_leaf", "uplinks", "oversubscription", "ecmp", "source"}


@dataclass(frozen=True)
class FabricSpec:
    """A cluster's fabric as its documentation states it (module docstring); `source`: where that is said, or why
    it is inferred."""

    kind: str
    nodes_per_leaf: int
    uplinks: int
    oversubscription: float = 1.0
    ecmp: str = "hash"
    source: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError("scale_out.kind", self.kind, f"one of {', '.join(KINDS)}")
        if self.ecmp not in ECMP:
            raise ConfigError("scale_out.ecmp", self.ecmp, f"one of {', '.join(ECMP)}")
        for name, most in (("nodes_per_leaf", 4096), ("uplinks", 4096)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
                raise ConfigError(f"scale_out.{name}", v, f"an integer in 1..{most}")
        o = self.oversubscription
        if isinstance(o, bool) or not isinstance(o, int | float) or not 1 <= o < math.inf:
            raise ConfigError("scale_out.oversubscription", o, "a number >= 1 (1: non-blocking)")

    @staticmethod
    def from_toml(d: object, source: str | None = None) -> FabricSpec:
        """The [scale_out] section of a network file (or a facts.toml value). Raises ConfigError naming the key."""
        if not isinstance(d, dict) or set(d) - _KEYS or not {"kind", "nodes_per_leaf", "uplinks"} <= set(d):
            raise ConfigError("scale_out", d, f"a table of kind, nodes_per_leaf, uplinks (and oversubscription, ecmp, "
                              f"source); kind one of {', '.join(KINDS)}", source=source)
        try:
            return FabricSpec(d["kind"], d["nodes_per_leaf"], d["uplinks"], float(d.get("oversubscription", 1.0)),
                              d.get("ecmp", "hash"), str(d.get("source", "")))
        except ConfigError as e:
            raise e.in_file(source) if source else e from None

    def __str__(self) -> str:
        over = f", {self.oversubscription:g}:1 oversubscribed" if self.oversubscription != 1 else ""
        return f"{self.kind}, {self.nodes_per_leaf} nodes per leaf, {self.uplinks} uplinks{over}, ecmp {self.ecmp}"

    def to_toml(self) -> dict:
        return {"kind": self.kind, "nodes_per_leaf": self.nodes_per_leaf, "uplinks": self.uplinks,
                "oversubscription": self.oversubscription, "ecmp": self.ecmp, "source": self.source}


def pattern_of(op: str, algo: str) -> str | None:
    """The step pattern of NCCL's `algo` for `op` on the fabric (None: none modelled, factor 1: NVLS, CollNet,
    alltoall, whose many flows spread over the uplinks)."""
    if op == "sendrecv":
        return "sendrecv"
    if algo in ("tree", "pat"):
        return "tree"
    return "ring" if algo == "ring" else None


def rate_factor(spec: FabricSpec | None, pattern: str | None, nodes: int, gpus_per_node: int, nics: int) -> float:
    """The pattern's slowest flow over the NIC's rate on `spec` at `nodes` nodes (module docstring): 1 without a
    fabric, a pattern, or more than one node."""
    if spec is None or pattern is None or nodes < 2:
        return 1.0
    return _factor(spec, pattern, int(nodes), int(gpus_per_node), max(1, int(nics)))


@lru_cache(maxsize=4096)
def _factor(spec: FabricSpec, pattern: str, nodes: int, gpus: int, nics: int) -> float:
    from simfog.fabric import FatTree, Flat, RailOptimized
    from simfog.fabric.placement import Placement
    from simfog.fabric.schedules import ring_pattern, tree_pattern
    from simfog.fabric.sharing import slowest_rate

    pool = max(2 * nodes, spec.nodes_per_leaf)
    # NIC rate 1; a leaf's uplinks carry what its NICs send / oversubscription (a rail switch holds one NIC a node)
    down = spec.nodes_per_leaf * (1 if spec.kind == "rail" else nics)
    up_Bps = down / (spec.uplinks * spec.oversubscription)
    if spec.kind == "rail":
        fabric = RailOptimized(nic_Bps=1.0, nics_per_node=nics, nodes_per_group=spec.nodes_per_leaf,
                               groups=-(-pool // spec.nodes_per_leaf), rail_uplinks=spec.uplinks,
                               rail_uplink_Bps=up_Bps, ecmp=spec.ecmp)
    else:
        fabric = FatTree(nic_Bps=1.0, nics_per_node=nics, nodes_per_leaf=spec.nodes_per_leaf,
                         leaves=-(-pool // spec.nodes_per_leaf), leaf_uplinks=spec.uplinks, leaf_uplink_Bps=up_Bps,
                         ecmp=spec.ecmp)
    flat = Flat(nodes=fabric.nodes, nic_Bps=1.0, nics_per_node=nics)  # the NICs alone: the pattern's own sharing
    slow = []
    for seed in range(PLACEMENTS):
        order = list(Placement.scattered(nodes, fabric.nodes, seed=seed).nodes)
        if pattern == "ring":
            flows = ring_pattern(order, 1.0, ranks_per_node=gpus, nics=min(gpus, nics)).flows
        elif pattern == "tree":
            flows = tree_pattern(order, 1.0, nics=min(gpus, nics)).flows
        else:
            flows = _sendrecv(order, gpus, nics)
        rate = slowest_rate(fabric.route(flows)) / slowest_rate(flat.route(flows))
        slow.append(1.0 / min(rate, 1.0))
    return float(1.0 / np.mean(slow))


def _sendrecv(order: list[int], gpus: int, nics: int):
    """nccl-tests' sendrecv ring across nodes: the last GPU of each node sends to the first of the next."""
    from simfog.fabric.base import nic_of_gpu
    from simfog.fabric.flows import Flows

    src = np.asarray(order, dtype=np.int64)
    return Flows.of(src, np.roll(src, -1), 1.0, nic_of_gpu(gpus - 1, nics), nic_of_gpu(0, nics))
