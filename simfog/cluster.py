"""The cluster: nodes of ranks, an intra-node link, one NIC per node and a fabric between the NICs.

Ranks are placed node by node: rank r lives on node r // ranks_per_node. Bandwidths are bytes/s per direction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from simfog.errors import ConfigError
from simfog.variation import MAX_SPREAD

if TYPE_CHECKING:
    from simfog.fabric.job import JobFabric


@dataclass(frozen=True)
class Link:
    """A link class: per-message latency (s), bandwidth (B/s, each direction: what all flows through one end of it
    share, e.g. a NIC's rate) and `flow_bandwidth_Bps`, the most ONE flow reaches on it (B/s; None: the bandwidth).

    Flow-level model (simfog.p2p): k concurrent flows through one end each run at min(flow cap, bandwidth / k), so
    a message of M bytes takes α + max(M / flow cap, k·M / bandwidth). A cap below the bandwidth is what one TCP
    stream (or a CPU-bound sender) reaches on a fast NIC: several flows then add up until they fill the link,
    where without a cap each extra flow divides it at once. Without a cap every number is what it was before the
    cap existed, bit for bit. `spread`: the per-call spread of a call's time on this link class (coefficient of
    variation, 0..simfog.variation.MAX_SPREAD; simfog.variation says how runs draw it), 0 for none."""

    latency_s: float
    bandwidth_Bps: float
    flow_bandwidth_Bps: float | None = None
    spread: float = 0.0

    def __post_init__(self):
        if not self.latency_s >= 0:
            raise ConfigError("latency", self.latency_s, "a time >= 0")
        if not self.bandwidth_Bps > 0:
            raise ConfigError("bandwidth", self.bandwidth_Bps, "a bandwidth > 0")
        if self.flow_bandwidth_Bps is not None and not self.flow_bandwidth_Bps > 0:
            raise ConfigError("flow_bandwidth", self.flow_bandwidth_Bps, "a bandwidth > 0, or none (the link's)")
        if isinstance(self.spread, bool) or not isinstance(self.spread, int | float) or \
                not 0 <= self.spread <= MAX_SPREAD:
            raise ConfigError("spread", self.spread, f"a coefficient of variation from 0 to {MAX_SPREAD} (0.03 = 3 % "
                              "per call)")

    @property
    def flow_Bps(self) -> float:
        """What one flow alone reaches (B/s): the flow cap, at most the link's bandwidth."""
        cap = self.flow_bandwidth_Bps
        return self.bandwidth_Bps if cap is None else min(cap, self.bandwidth_Bps)

    @property
    def beta_s_per_B(self) -> float:
        """Seconds per byte of one flow alone (1 / flow_Bps): the β of the α-β forms, whose steps send one flow
        per link end."""
        if self.flow_bandwidth_Bps is None:
            return 1.0 / self.bandwidth_Bps
        return 1.0 / self.flow_Bps

    def time(self, nbytes: float, flows: int = 1) -> float:
        """One message of `nbytes` while `flows` messages share this link: α + max(M / flow cap, flows·M /
        bandwidth) (α + flows·M / bandwidth without a cap)."""
        shared = self.latency_s + flows * nbytes / self.bandwidth_Bps
        if self.flow_bandwidth_Bps is None:
            return shared
        return max(shared, self.latency_s + nbytes / self.flow_bandwidth_Bps)

    def with_bandwidth(self, bandwidth_Bps: float) -> Link:
        """The same link at another bandwidth (a slower NIC, a fabric share), its flow cap kept."""
        return replace(self, bandwidth_Bps=bandwidth_Bps)


@dataclass(frozen=True)
class Cluster:
    """`nodes` × `ranks_per_node` ranks. `oversubscription` > 1 means the fabric core carries less than all NICs
    at once: inter-node traffic then sees nic bandwidth / oversubscription. `reduce_Bps` is the speed of the
    reduction arithmetic (γ = 1/reduce_Bps; None means free)."""

    nodes: int
    ranks_per_node: int
    intra: Link
    nic: Link
    oversubscription: float = 1.0
    reduce_Bps: float | None = None
    degraded_nics: tuple[tuple[int, float], ...] = ()  # (node, bandwidth_Bps) of NICs slower than `nic`
    gpu_memory_B: float | None = None  # device memory per rank: configurations that need more are refused
    fabric: JobFabric | None = None  # a non-flat [fabric] and the job's place on it (None: the links above are all)

    def __post_init__(self):
        for name in ("nodes", "ranks_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"cluster.{name}", v, "an integer >= 1")
        if not 1.0 <= self.oversubscription < math.inf:
            raise ConfigError("cluster.oversubscription", self.oversubscription, "a finite number >= 1 (1 = full "
                              "bisection)")
        if self.gpu_memory_B is not None and not self.gpu_memory_B > 0:
            raise ConfigError("cluster.gpu_memory", self.gpu_memory_B, 'a size > 0 such as "80GB"')
        if self.reduce_Bps is not None and not self.reduce_Bps > 0:
            raise ConfigError("cluster.reduce_bandwidth", self.reduce_Bps, "a bandwidth > 0")
        for node, bw in self.degraded_nics:
            if not 0 <= node < self.nodes:
                raise ConfigError("heterogeneity.degraded_nics", node, f"a node in 0..{self.nodes - 1}")
            if not bw > 0:
                raise ConfigError("heterogeneity.degraded_nics", bw, "a bandwidth > 0")

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def inter(self) -> Link:
        """What a flow leaving a node sees: the NIC, slowed by fabric oversubscription when there are several nodes."""
        if self.nodes == 1 or self.oversubscription == 1.0:
            return self.nic
        return self.nic.with_bandwidth(self.nic.bandwidth_Bps / self.oversubscription)

    @property
    def gamma_s_per_B(self) -> float:
        return 0.0 if self.reduce_Bps is None else 1.0 / self.reduce_Bps

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def slowest_inter(self, nodes: Iterable[int] | None = None) -> Link:
        """The inter-node link as seen by traffic among `nodes` (None: all): the slowest of their NICs."""
        if not self.degraded_nics:
            return self.inter
        wanted = None if nodes is None else set(nodes)
        bws = [bw for node, bw in self.degraded_nics if wanted is None or node in wanted]
        if not bws or min(bws) >= self.nic.bandwidth_Bps:
            return self.inter
        return self.nic.with_bandwidth(min(bws) / (self.oversubscription if self.nodes > 1 else 1.0))

    def link_between(self, a: int, b: int) -> Link:
        na, nb = self.node_of(a), self.node_of(b)
        return self.intra if na == nb else self.slowest_inter((na, nb))

    def with_ranks(self, ranks: int) -> Cluster:
        """The same kind of cluster with `ranks` ranks: whole nodes, or one partly used node if fewer ranks than
        a node holds. Raises ConfigError when `ranks` is not a multiple of ranks_per_node."""
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ConfigError("ranks", ranks, "an integer >= 1")
        if ranks <= self.ranks_per_node:
            return replace(self, nodes=1, ranks_per_node=ranks)
        if ranks % self.ranks_per_node:
            raise ConfigError("ranks", ranks,
                              f"a multiple of gpus_per_node ({self.ranks_per_node}) or at most one node's worth")
        return replace(self, nodes=ranks // self.ranks_per_node)


@dataclass(frozen=True)
class Group:
    """Where a collective's participants sit: n ranks spread over `nodes` nodes, at most `per_node` on one."""

    ranks: int
    nodes: int
    per_node: int

    @staticmethod
    def of(cluster: Cluster, members: Sequence[int] | None = None) -> Group:
        """The whole cluster when `members` is None, else the nodes those ranks occupy."""
        if members is None:
            return Group(cluster.ranks, cluster.nodes, cluster.ranks_per_node)
        counts: dict[int, int] = {}
        for r in members:
            counts[cluster.node_of(r)] = counts.get(cluster.node_of(r), 0) + 1
        return Group(len(members), len(counts), max(counts.values()))
