"""Collective cost functions: seconds for a collective algorithm on M bytes among a group of ranks of a cluster.

Pure α-β(-γ) closed forms, one private function per algorithm, chosen by name from `ALGORITHMS`; `CostModel` binds
one algorithm to a cluster and memoizes. Notation (as in docs/ALGORITHMS.md §1, §3): n ranks in the group, m nodes
they occupy, L = Group.per_node (the most ranks on one node), M bytes (the full buffer per rank, nccl-tests' "size"),
α_i, β_i the intra-node link, α_n, β_n the inter-node link (`Cluster.inter`: the NIC, slowed by oversubscription),
γ = `Cluster.gamma_s_per_B` per byte of reduction arithmetic. A group of one rank costs 0 under every algorithm.

Ranks are placed node by node; a group that fills its nodes unevenly is costed as if it held L ranks on each of
its m nodes (an approximation only for uneven groups).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from simfog import nccl as nccl_model
from simfog.cluster import Cluster, Group, Link
from simfog.collectives.fabric import on_fabric
from simfog.errors import ConfigError, Infeasible
from simfog.registry import Registry

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast")

#: name -> cost function f(op, nbytes, group, model) -> seconds (op already validated, group.ranks >= 2).
ALGORITHMS: Registry[Callable[[str, float, Group, CostModel], float]] = Registry("collective")

_FIT_BYTES = float(2**30)  # linear_fit's default upper size


def _clog2(k: int) -> int:
    """⌈log2 k⌉ for k >= 1."""
    return (k - 1).bit_length()


def _reduce_s(cluster: Cluster, nbytes: float) -> float:
    return nbytes * cluster.gamma_s_per_B


def _links_used(cluster: Cluster, g: Group) -> list[Link]:
    """The link classes a group touches: intra when two of its ranks share a node, inter when it spans nodes."""
    return [link for link, used in ((cluster.intra, g.per_node > 1), (cluster.inter, g.nodes > 1)) if used]


def _bottleneck_beta(cluster: Cluster, g: Group) -> float:
    return max(link.beta_s_per_B for link in _links_used(cluster, g))


# --- ring ---------------------------------------------------------------------------------------------------------

def _ring_step(cluster: Cluster, g: Group, chunk: float) -> float:
    """One ring step: every rank sends `chunk` to its neighbour at once. Laid out node by node, each node has
    exactly one hop leaving it, so the NIC carries one flow; the step lasts as long as its slowest hop."""
    if g.nodes == 1:
        return cluster.intra.time(chunk)
    if g.per_node == 1:
        return cluster.inter.time(chunk)
    return max(cluster.intra.time(chunk), cluster.inter.time(chunk))


@ALGORITHMS.register("ring")
def _ring(op: str, nbytes: float, g: Group, cm: CostModel) -> float:
    """Ring laid out node by node: the NIC carries only the hops that leave a node.

    With s(x) = max(α_i + x·β_i, α_n + x·β_n) (just the one link when m = 1 or L = 1), c = M/n:
      allreduce       2(n−1)·s(c) + (n−1)/n·M·γ  = 2(n−1)α + 2(n−1)/n·Mβ + (n−1)/n·Mγ on a uniform link
      reduce_scatter   (n−1)·s(c) + (n−1)/n·M·γ
      allgather        (n−1)·s(c)
      broadcast       pipelined chain: (n−m)·α_i + (m−1)·α_n + M·max(β used). The first byte crosses every hop
                      (the sum of hop latencies), the stream then drains at the bottleneck link; on a uniform link
                      (n−1)α + Mβ. Chunking overheads of a real pipeline are not modelled.
    """
    n, c = g.ranks, cm.cluster
    if op == "broadcast":
        lat = (n - g.nodes) * c.intra.latency_s + (g.nodes - 1) * c.inter.latency_s
        return lat + nbytes * _bottleneck_beta(c, g)
    steps = 2 * (n - 1) if op == "allreduce" else n - 1
    t = steps * _ring_step(c, g, nbytes / n)
    if op != "allgather":
        t += _reduce_s(c, (n - 1) / n * nbytes)
    return t


@ALGORITHMS.register("gloo_ring")
def _gloo_ring(op: str, nbytes: float, g: Group, cm: CostModel) -> float:
    """Gloo's segmented ring (torch's CPU default): two segments in flight, so a step's latency hides behind the
    previous segment's transfer.

    Gloo splits the buffer into segments of at most 1 MiB, at least 2 per rank, and keeps two in flight
    (gloo/allreduce.cc), so each ring step costs the larger of its latency and its transfer, not their sum. With
    p(x) = max over the links used of max(α, x·β) and c = M/n:
      allreduce 2(n−1)·p(c) + (n−1)/n·M·γ; allgather (n−1)·p(c); broadcast as "ring";
      reduce_scatter as allreduce: torch's gloo backend (torch 2.13, reduce_scatter_tensor) allreduces the whole
      buffer and keeps its slice. Measured on the emulated cluster at 200 Mbit/s, 2 and 4 nodes, 1 kB to 3 MB:
      reduce_scatter within 10 % of allreduce from 100 kB to 3 MB (3 MB on 2 nodes 127.9 ms vs 127.6 ms), twice the
      ring reduce-scatter's (n−1)·p(c); allgather within 10 % of (n−1)·p(c) from 100 kB up except 1 MB on 2
      and 2x2 ranks (~30 % slower, an outlier of this host's TCP).
    Measured on the emulated cluster (8 nodes, 1 Gbit/s): 256 KiB allreduce 5.3 ms, where the summed ring gives
    8.6 ms and this form 5.3 ms.
    """
    if op == "broadcast":
        return _ring(op, nbytes, g, cm)
    if op == "reduce_scatter":
        op = "allreduce"
    n, c = g.ranks, cm.cluster
    chunk = nbytes / n
    step = max(max(link.latency_s, chunk * link.beta_s_per_B) for link in _links_used(c, g))
    steps = 2 * (n - 1) if op == "allreduce" else n - 1
    t = steps * step
    if op != "allgather":
        t += _reduce_s(c, (n - 1) / n * nbytes)
    return t


# --- recursive halving-doubling ---------------------------------------------------------------------------------

def _check_power_of_two(g: Group) -> None:
    n, L = g.ranks, g.per_node
    if n & (n - 1):
        raise Infeasible(f"collective 'rhd' (recursive halving-doubling) needs a power of two ranks; "
                         f"got {n} ranks")
    if g.nodes > 1 and L & (L - 1):
        raise Infeasible(f"collective 'rhd' (recursive halving-doubling) needs a power of two ranks per node when "
                         f"the group spans several nodes; got {L} ranks per node ({n} ranks on {g.nodes} nodes)")


def _rhd_pass(c: Cluster, g: Group, nbytes: float) -> float:
    """One recursive-halving (or -doubling) pass: log2 n steps; at step k the partner is d = 2^k away and the
    message is M/2^(k+1), as in MPICH's Rabenseifner allreduce (mask 1, 2, 4, ...): the big messages stay on a
    node. Partners d >= L sit on different nodes and all L ranks of a node then cross its NIC at once (L flows)."""
    t, d, msg = 0.0, 1, nbytes / 2
    while d < g.ranks:
        t += c.intra.time(msg) if d < g.per_node else c.inter.time(msg, flows=g.per_node)
        d, msg = 2 * d, msg / 2
    return t


@ALGORITHMS.register("rhd")
def _rhd(op: str, nbytes: float, g: Group, cm: CostModel) -> float:
    """Recursive halving-doubling (Rabenseifner); needs a power of two ranks (and ranks per node).

    With P = Σ_k link_k(M/2^(k+1)) over k = 0..log2(n)−1 (intra when 2^k < L, else inter with L flows):
      allreduce       2P + (n−1)/n·M·γ    = 2·log2(n)·α + 2(n−1)/n·Mβ (+γ term) on a uniform link
      reduce_scatter  P + (n−1)/n·M·γ     (recursive halving)
      allgather       P                    (recursive doubling, far partners first so big messages stay on a node)
      broadcast       binomial tree: Σ_k link_k(M), one sender per node on inter steps = log2(n)·(α + Mβ) uniform
    Raises Infeasible when n (or L, for a group on several nodes) is not a power of two.
    """
    _check_power_of_two(g)
    c = cm.cluster
    if op == "broadcast":
        return sum(c.intra.time(nbytes) if (1 << k) < g.per_node else c.inter.time(nbytes)
                   for k in range(_clog2(g.ranks)))
    t = (2 if op == "allreduce" else 1) * _rhd_pass(c, g, nbytes)
    if op != "allgather":
        t += _reduce_s(c, (g.ranks - 1) / g.ranks * nbytes)
    return t


# --- double binary tree -------------------------------------------------------------------------------------------

def _tree_depth_latency(c: Cluster, g: Group) -> float:
    """Latency down one tree: ⌈log2 L⌉ levels inside a node and ⌈log2 m⌉ across nodes."""
    return _clog2(g.per_node) * c.intra.latency_s + _clog2(g.nodes) * c.inter.latency_s


@ALGORITHMS.register("tree")
def _tree(op: str, nbytes: float, g: Group, cm: CostModel) -> float:
    """Double binary tree, pipelined (NCCL-style); allgather and reduce-scatter fall back to ring as NCCL does.

    D = ⌈log2 L⌉·α_i + ⌈log2 m⌉·α_n is the latency down one two-level tree (= ⌈log2 n⌉·α on a uniform link);
    β_b = the largest β among the links used. In a double tree every rank is interior in one tree (M/2 bytes)
    and a leaf in the other, so each rank sends and receives ~M per phase, and reduces ~M bytes:
      allreduce       2D + 2·M·β_b + M·γ        (reduce up, broadcast down; docs/ALGORITHMS.md §3: ~2·log2(n)·α + 2Mβ)
      broadcast       D + M·β_b
      allgather, reduce_scatter: ring's cost (NCCL implements these only with rings, src/graph/tuning.cc).
    Approximation: pipeline fill per chunk and NCCL's per-protocol constants are not modelled.
    """
    c = cm.cluster
    if op in ("allgather", "reduce_scatter"):
        return _ring(op, nbytes, g, cm)
    beta = _bottleneck_beta(c, g)
    if op == "broadcast":
        return _tree_depth_latency(c, g) + nbytes * beta
    return 2 * _tree_depth_latency(c, g) + 2 * nbytes * beta + _reduce_s(c, nbytes)


# --- hierarchical two-level ---------------------------------------------------------------------------------------

@ALGORITHMS.register("hierarchical")
def _hierarchical(op: str, nbytes: float, g: Group, cm: CostModel) -> float:
    """Two-level (Horovod/NCCL): ring inside each node, ring across nodes with the L local rings sharing the NIC.

    allreduce = intra reduce-scatter over L + inter ring allreduce over m nodes on M/L bytes per rank, the L
    concurrent rings sharing each NIC (L flows) + intra allgather over L:
      (L−1)α_i + (L−1)/L·Mβ_i + 2(m−1)α_n + 2(m−1)/m·(M/L)·L·β_n + (L−1)α_i + (L−1)/L·Mβ_i
      + ((L−1)/L·M + (m−1)/m·M/L)·γ   [= (n−1)/n·Mγ when n = mL]
    reduce_scatter = intra reduce-scatter + inter reduce-scatter (m−1 steps) on M/L, same γ;
    allgather = inter allgather (m−1 steps, L flows) on M/L + intra allgather;
    broadcast = chain across the m nodes, then a chain inside each node, one after the other:
      (m−1)α_n + Mβ_n + (L−1)α_i + Mβ_i   (each part only when m > 1, resp. L > 1).
    Degenerates to the flat ring when m = 1 or L = 1.
    """
    c, L, m = cm.cluster, g.per_node, g.nodes
    if op == "broadcast":
        return ((m - 1) * c.inter.latency_s + nbytes * c.inter.beta_s_per_B if m > 1 else 0.0) + \
            ((L - 1) * c.intra.latency_s + nbytes * c.intra.beta_s_per_B if L > 1 else 0.0)
    intra = (L - 1) * c.intra.time(nbytes / L)             # one intra ring pass (reduce-scatter or allgather)
    inter = (m - 1) * c.inter.time(nbytes / L / m, flows=L)  # one inter ring pass on M/L bytes per rank
    reduce = _reduce_s(c, (L - 1) / L * nbytes + (m - 1) / m * nbytes / L)
    if op == "allreduce":
        return 2 * intra + 2 * inter + reduce
    if op == "reduce_scatter":
        return intra + inter + reduce
    return inter + intra  # allgather


# --- parameter server ---------------------------------------------------------------------------------------------

@ALGORITHMS.register("ps")
def _ps(op: str, nbytes: float, g: Group, cm: CostModel) -> float:
    """Parameter server (BytePS-like): S dedicated server machines, each with a NIC like the workers'.

    A phase moves B bytes in total through the S server NICs (B/S each) and W bytes through the busiest worker
    node's NIC, all messages at once: phase(B, W) = α_n + max(B/S, W)·β_n. For the reductions the node's L ranks
    sum over the intra links first and the node pushes one copy, as BytePS (intra-machine reduce before the push,
    broadcast after the pull) and MXNet's device kvstore do; r(M) = (L−1)·(α_i + M/L·β_i), one intra ring pass:
      allreduce       r(M) + phase(mM, M) push + phase(mM, M) pull + r(M) + ((L−1)/L·M + (m−1)·M/S)·γ
                      (S = m: 2α_n + 2·Mβ_n + two intra passes; the node's sum, then the servers' of m copies)
      reduce_scatter  r(M) + push phase(mM, M) + pull of the node's L shards phase(M, L·M/n) + the same γ
      allgather       push of each rank's shard phase(M, L·M/n) + pull of the other shards
                      phase((n−1)M, L(n−1)/n·M)   (per rank: nothing to sum)
      broadcast       root pushes phase(M, M), the n−1 others pull phase((n−1)M, min(L, n−1)·M)
    S = CostModel.ps_servers, default the cluster's node count. Server traffic crosses the fabric, so β_n
    includes oversubscription. One rank per node: every form is the flat push/pull of n ranks."""
    c, n, L, m = cm.cluster, g.ranks, g.per_node, g.nodes
    servers = cm.ps_servers or c.nodes
    link = c.inter

    def phase(total: float, node: float) -> float:
        return link.latency_s + max(total / servers, node) * link.beta_s_per_B

    M = nbytes
    if op in ("allreduce", "reduce_scatter"):
        local = (L - 1) * c.intra.time(M / L)  # one intra ring pass (none for L = 1)
        reduce = _reduce_s(c, (L - 1) / L * M + (m - 1) * M / servers)
        if op == "allreduce":
            return local + 2 * phase(m * M, M) + local + reduce
        return local + phase(m * M, M) + phase(M, L * M / n) + reduce
    if op == "allgather":
        return phase(M, L * M / n) + phase((n - 1) * M, L * (n - 1) / n * M)
    return phase(M, M) + phase((n - 1) * M, min(L, n - 1) * M)


# --- NCCL ---------------------------------------------------------------------------------------------------------

@ALGORITHMS.register("nccl")
def _nccl(op: str, nbytes: float, g: Group, cm: CostModel) -> float:
    """NCCL's own cost model (simfog.nccl): the least predicted time over the algorithms and protocols NCCL
    considers, or those `CostModel.nccl_algorithms` / `nccl_protocols` force (as NCCL_ALGO / NCCL_PROTO do).
    The network is `CostModel.nccl` (a calibrated network file), else one derived from the cluster: bus bandwidth
    = the intra link's on one node and the NIC's (after oversubscription) on several, latencyInter = the NIC's
    latency, NCCL 2.30 on Ampere with NVLink (an estimate; calibrate for a real cluster). Groups are costed at
    their rank and node counts."""
    net = cm.nccl or _nccl_network_of(cm.cluster)
    return nccl_model.choose(op, nbytes, g.ranks, g.nodes, net, algorithms=cm.nccl_algorithms,
                        protocols=cm.nccl_protocols).time_s


def _nccl_network_of(cluster: Cluster) -> nccl_model.NcclNetwork:
    return nccl_model.NcclNetwork(cluster.intra.bandwidth_Bps, cluster.inter.bandwidth_Bps,
                                  latency_inter_s=cluster.nic.latency_s)


# --- linear -------------------------------------------------------------------------------------------------------

@ALGORITHMS.register("linear")
def _linear(op: str, nbytes: float, g: Group, cm: CostModel) -> float:
    """T = alpha + beta·M for every op and group size (the model MG-WFBP fits); needs comm.alpha and comm.beta."""
    return cm.alpha_s + cm.beta_s_per_B * nbytes


# --- public API ---------------------------------------------------------------------------------------------------

def _check_time(value: object, field: str, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value >= 0):
        raise ConfigError(field, value, what)


def _check_op(op: str, nbytes: float) -> None:
    if op not in OPS:
        raise ConfigError("op", op, f"one of {', '.join(OPS)}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real) or not (math.isfinite(nbytes) and nbytes >= 0):
        raise ConfigError("nbytes", nbytes, "a size in bytes >= 0")


@lru_cache(maxsize=1 << 16)
def _cost(model: CostModel, op: str, nbytes: float, group: Group) -> float:
    if group.ranks <= 1:
        return 0.0
    if model.cluster.fabric is not None and group.nodes > 1:
        model = on_fabric(model, op, group)
    return ALGORITHMS.get(model.algorithm)(op, nbytes, group, model)



@dataclass(frozen=True)
class CostModel:
    """Time of collectives on `cluster` under one algorithm (a name in ALGORITHMS).

    `alpha_s` (s) and `beta_s_per_B` (s/B) are required for "linear" and ignored otherwise; `ps_servers` is the
    number of server machines for "ps" (None: one per node). Raises ConfigError (fields comm.collective,
    comm.alpha, comm.beta, comm.ps_servers) on bad values. Hashable; results are memoized.
    """

    cluster: Cluster
    algorithm: str
    alpha_s: float | None = None
    beta_s_per_B: float | None = None
    ps_servers: int | None = None
    nccl: nccl_model.NcclNetwork | None = None     # the network for "nccl" (None: derived from the cluster)
    nccl_algorithms: tuple[str, ...] | None = None  # NCCL_ALGO: restrict NCCL's choice (None: all it considers)
    nccl_protocols: tuple[str, ...] | None = None   # NCCL_PROTO
    mpi_switch_bytes: float | None = None  # "ompi": a fitted recursive-doubling -> ring switch (None: Open MPI's table)

    def __post_init__(self):
        ALGORITHMS.get(self.algorithm, field="comm.collective")
        if self.algorithm == "linear":
            _check_time(self.alpha_s, "comm.alpha", 'a time >= 0, required for collective = "linear"')
            _check_time(self.beta_s_per_B, "comm.beta", 'an inverse bandwidth >= 0, required for collective = "linear"')
        s = self.ps_servers
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 1):
            raise ConfigError("comm.ps_servers", s, "an integer >= 1")

    def time(self, op: str, nbytes: float, members: Sequence[int] | None = None) -> float:
        """Seconds for collective `op` (one of OPS) on `nbytes` per rank among `members` (rank ids; None: all
        ranks). A group of one rank costs 0. Raises ConfigError for an unknown op, negative or non-finite bytes or
        members outside the cluster; Infeasible where the algorithm cannot run on this group (rhd: power of two)."""
        _check_op(op, nbytes)
        if members is not None:
            bad = [r for r in members if not (isinstance(r, numbers.Integral) and 0 <= r < self.cluster.ranks)]
            if bad or not len(members):
                raise ConfigError("members", list(members), f"one or more ranks in 0..{self.cluster.ranks - 1}")
        nodes = None if members is None or not self.cluster.degraded_nics else \
            {self.cluster.node_of(r) for r in members}
        return self.group_time(op, nbytes, Group.of(self.cluster, members), nodes)

    def group_time(self, op: str, nbytes: float, group: Group, nodes: set[int] | None = None) -> float:
        """time() of a group already described: its cluster.Group and, on a cluster with degraded NICs, the nodes it
        spans (None: all). What time() reads of the members, for callers that cost many groups of one shape."""
        _check_op(op, nbytes)
        model = self
        if self.cluster.degraded_nics:  # a degraded NIC in the group slows its inter-node hops (the bottleneck)
            slow = self.cluster.slowest_inter(nodes)
            if slow != self.cluster.inter:
                plain = replace(self.cluster, degraded_nics=(), oversubscription=1.0, nic=slow)
                model = replace(self, cluster=plain)
        return _cost(model, op, float(nbytes), group)

    def spread(self, members: Sequence[int] | None = None) -> float:
        """The per-call spread (simfog.cluster.Link.spread) of a collective among `members` (None: all ranks): its
        bottleneck class's (slowest per byte; of equals, the larger spread), as a step waits for its slowest hop;
        0 for one rank."""
        return self.group_spread(Group.of(self.cluster, members))

    def group_spread(self, group: Group) -> float:
        """spread() of a group already described."""
        return max(((k.beta_s_per_B, k.spread) for k in _links_used(self.cluster, group)), default=(0.0, 0.0))[1]

    def allreduce(self, nbytes: float) -> float:
        """Seconds for an allreduce of `nbytes` among all ranks (= time("allreduce", nbytes))."""
        return self.time("allreduce", nbytes)

    def linear_fit(self, lo_bytes: float = 4.0, hi_bytes: float = _FIT_BYTES) -> tuple[float, float]:
        """(a, b) with T_ar(M) ≈ a + b·M (s, s/B): MG-WFBP's least-squares line (simfog.merge.linear_cost: relative
        errors on log-spaced sizes) of this model's allreduce between `lo_bytes` and `hi_bytes` (default one
        float32 to 1 GiB; the mgwfbp policy uses the smallest gradient and the whole model). Exact for every
        algorithm here whose allreduce is affine in M over the range."""
        from simfog.merge import linear_cost

        return linear_cost(self.allreduce, lo_bytes, hi_bytes)


def p2p_time(cluster: Cluster, src: int, dst: int, nbytes: float, flows: int = 1) -> float:
    """Seconds for one point-to-point message of `nbytes` from rank `src` to `dst`: α + max(M / flow cap,
    flows·M / bandwidth) of the intra link when both share a node, else of the inter link, with `flows` concurrent
    messages sharing that link's bandwidth (α + flows·M·β without a flow cap; simfog.cluster.Link). A message to
    oneself costs 0. Raises ConfigError for ranks outside the cluster or flows < 1."""
    for name, r in (("src", src), ("dst", dst)):
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < cluster.ranks:
            raise ConfigError(name, r, f"a rank in 0..{cluster.ranks - 1}")
    if isinstance(flows, bool) or not isinstance(flows, int) or flows < 1:
        raise ConfigError("flows", flows, "an integer >= 1")
    if src == dst:
        return 0.0
    return cluster.link_between(src, dst).time(nbytes, flows=flows)
