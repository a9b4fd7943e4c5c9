"""Decentralized averaging of parameters: BlueFog neighbour averaging and BAGUA decentralized SGD.

Each rank combines its parameters with its neighbours' (simfog.topology); nothing is averaged globally. One
iteration's communication is a `Plan`: a dataflow graph evaluated in max-plus algebra, where every operation (a
point-to-point message, an intra-node collective, an encode) starts once all its inputs have ended and lasts a
fixed time, and a rank's optimizer step waits for the rank's last operation. A message starts when its sender has
launched it and its receiver is ready, i.e. has launched its own exchange (receives are posted with the sends: MPI
Isend/Irecv + Waitall in BlueFog's MPI controller, one NCCL group in BlueFog's NCCL controller and in BAGUA); a
rank's exchange completes when all its sends and receives have. Message durations are, by default ("together"),
what they would be if every rank exchanged at the same moment (simfog.p2p.message_times over all messages of the
step, once per phase; exact when ranks run in step), or, with comm.p2p_sharing = "fluid", what the links give as
messages of any step overlap in time (simfog.flow_fluid, in time order: ranks that drift apart take turns).
Intra-node steps of hierarchical variants are costed by the CostModel of comm.collective among the node's ranks.

Launch points (sources: Bluefog-Lib/bluefog bluefog/torch/optimizers.py; BaguaSys/bagua
bagua/torch_api/algorithms/decentralized.py and rust/bagua-core/.../comm_ops/decentralized_*_synchronous.rs):
- BlueFog adapt-with-combine (combine = "awc"): a forward hook on the whole model launches the neighbour allreduce
  of every parameter once forward ends; step() synchronizes. BlueFog's background thread fuses tensors into
  buffers of up to 8 MiB (BLUEFOG_FUSION_THRESHOLD; comm.threshold overrides) handled one after another: costed as
  one message of the whole model carrying one latency per fused buffer (exact when ranks run in step). Its
  negotiation (bluefog/common/operations.cc: global_skip_negotiate_stage = false, IncrementTensorCount is ready
  when all ranks have requested the tensor; comm.negotiate = false is bf.set_skip_negotiate_stage(True)) makes every
  operation wait until all ranks have requested it, as Horovod's does: a straggler then holds up every rank, not
  only its neighbours. The negotiation's own messages through rank 0 (a 0.5 ms cycle) are not costed.
- BlueFog adapt-then-combine ("atc"): a hook on each gradient applies that parameter's update and at once launches
  its neighbour allreduce, so communication overlaps backward; fused buffers (as above, in gradient-ready order) are
  launched when their last gradient is ready and run one after another. The per-parameter updates are charged, as
  the trace records them, to the optimizer step after the wait.
- BAGUA decentralized: the whole model is one bucket, launched at the forward pre-hook (it overlaps forward and
  backward) and waited for after backward.
- BAGUA low_precision_decentralized: after the optimizer step, no overlap. The engine has no hook there, so the
  exchange is placed between backward's end and the optimizer step: the same iteration time, and its time shows as
  exposed communication.

Ranks are never assumed identical here (`symmetric = False`): placement makes some messages intra-node. The Plan
is fixed before the run, so simfog.analytic_flow evaluates it over every rank at once (numpy), the event engine's
times bit for bit; the event engine runs it only when asked (path = "events"), and not under "fluid", where a
message's duration depends on messages that start after it.
"""

from __future__ import annotations

import itertools

import numpy as np

from simfog import merge
from simfog.algorithms.codecs import codec_bandwidth, minmax_uint8_bytes
from simfog.algorithms.dataflow import DataflowAlgorithm, Plan, mixing_of
from simfog.algorithms.registry import REGISTRY
from simfog.errors import ConfigError
from simfog.topology import Topology, topology

BLUEFOG_FUSION_BYTES = 8 * merge.MiB   # bluefog/common/operations.cc: BLUEFOG_FUSION_THRESHOLD default 8 MiB


def bluefog_fused_buffers(trace, threshold_bytes: float | None) -> list[merge.Bucket]:
    """BlueFog's fused buffers: gradient-ready order, up to the fusion threshold (8 MiB unless comm.threshold)."""
    return merge.horovod_fuse(merge.grad_tensors(trace), threshold_bytes or BLUEFOG_FUSION_BYTES)


def graph_pairs(exchanges) -> np.ndarray:
    """(messages, 2) array of (src, dst) of a topology phase's exchanges, in their order (arrays: a graph of
    131,072 ranks has millions of messages, too many for tuples)."""
    counts = np.fromiter((len(e.send_to) for e in exchanges), dtype=np.int64, count=len(exchanges))
    out = np.empty((int(counts.sum()), 2), dtype=np.int64)
    out[:, 0] = np.repeat(np.fromiter((e.rank for e in exchanges), dtype=np.int64, count=len(exchanges)), counts)
    out[:, 1] = np.fromiter(itertools.chain.from_iterable(e.send_to for e in exchanges), dtype=np.int64,
                            count=len(out))
    return out


class TopologyAlgorithm(DataflowAlgorithm):
    """Averaging over a simfog.topology graph (rank level), hierarchical when the graph says so."""

    default_topology = "exp2"

    def __init__(self, sim):
        super().__init__(sim)
        cluster = sim.experiment.cluster
        self.topo = self._topology(cluster) if self.n > 1 else None
        self.period = self.topo.period if self.topo is not None else 1

    def _topology(self, cluster) -> Topology:
        return topology(self.comm.topology or self.default_topology, self.n, ranks_per_node=cluster.ranks_per_node)

    def pairs(self, phase: int) -> np.ndarray:
        """(messages, 2) array of (src, dst): every rank's sends of phase `phase`, rank by rank."""
        return graph_pairs(self.topo.exchanges(phase))

    @property
    def hierarchical(self) -> bool:
        return self.topo is not None and self.topo.intra_node is not None

    def mixing(self) -> dict | None:
        return None if self.topo is None else mixing_of(self.topo, self.eps)


@REGISTRY.register("neighbor")
class NeighborAveraging(TopologyAlgorithm):
    """BlueFog neighbour averaging of parameters over comm.topology (default exp2); combine = "awc" or "atc"."""

    name = "neighbor"

    def __init__(self, sim):
        super().__init__(sim)
        self.negotiate = self.comm.negotiate is not False
        self.atc = self.comm.combine == "atc"
        self.fused = bluefog_fused_buffers(self.trace, self.comm.threshold_bytes)
        if self.atc:
            # A fused buffer is launched when its last gradient is ready (offsets per trace sample, unscaled).
            layer = self.trace.layer_index()
            self.offsets = [sim.compute.layer_end_s[:, [layer[name] for name in b.tensors]].max(axis=1)
                            for b in self.fused]

    def steps(self, phase: int):
        if self.atc:
            return [b.nbytes for b in self.fused], self.p2p_step(self.pairs(phase), hierarchical=self.hierarchical)
        step = self.p2p_step(self.pairs(phase), hierarchical=self.hierarchical, latencies=max(1, len(self.fused)))
        return [self.nbytes], step

    def _inputs(self, rank, iteration, sample, t_backward):
        if not self.atc:
            return [t_backward]
        slow = self.sim.slowdown[rank]
        return [t_backward + off[sample] * slow for off in self.offsets]

    def describe_buckets(self) -> list[dict]:
        if self.n == 1:
            return []
        sent = int(self.sent_per_rank().max())
        per_bucket = sent // (len(self.fused) if self.atc else 1)
        if not self.atc:
            return [{"bucket": 0, "tensors": len(self.trace.tensors), "bytes": int(self.nbytes),
                     "fused_buffers": len(self.fused), "messages_per_rank_max": sent, "combine": "awc"}]
        return [{"bucket": i, "tensors": len(b.tensors), "bytes": b.nbytes, "messages_per_rank_max": per_bucket,
                 "combine": "atc"} for i, b in enumerate(self.fused)]


@REGISTRY.register("hierarchical_neighbor")
class HierarchicalNeighborAveraging(NeighborAveraging):
    """BlueFog hierarchical neighbour allreduce: node average, leaders exchange over a machine graph, broadcast."""

    name = "hierarchical_neighbor"

    def _topology(self, cluster) -> Topology | None:
        # The graph is over machines (BlueFog's machine topology, exp2 by default); none with a single node.
        if cluster.nodes == 1:
            return None
        return topology(self.comm.topology or self.default_topology, cluster.nodes)

    def pairs(self, phase: int) -> np.ndarray:
        if self.topo is None:
            return np.zeros((0, 2), dtype=np.int64)
        return graph_pairs(self.topo.exchanges(phase)) * self.sim.experiment.cluster.ranks_per_node

    @property
    def hierarchical(self) -> bool:
        return True

    def mixing(self) -> dict | None:
        # Π_k = Π_k(machines) ⊗ J_L, so the rank-level mixing equals the machine graph's (simfog.topology).
        if self.n == 1:
            return None
        if self.topo is None:
            return mixing_of(None, self.eps, "intra-node allreduce")
        return mixing_of(self.topo, self.eps, f"{self.topo.name} over machines")


@REGISTRY.register("decentralized")
class BaguaDecentralized(TopologyAlgorithm):
    """BAGUA decentralized SGD: weights averaged with all (topology "full") or shift_one peers from forward on."""

    name = "decentralized"
    default_topology = "full"

    def _topology(self, cluster) -> Topology | None:
        name = self.comm.topology or self.default_topology
        if name not in ("full", "shift_one"):
            raise ConfigError("comm.topology", name, 'for algorithm "decentralized": "full" (BAGUA\'s '
                              'peer_selection_mode "all") or "shift_one"')
        self.hier = self.comm.hierarchical is not False and cluster.ranks_per_node > 1
        if name == "full":
            return None
        return topology("shift_one", self.n, ranks_per_node=cluster.ranks_per_node, hierarchical=self.hier)

    def steps(self, phase: int):
        if self.topo is not None:
            return [self.nbytes], self.p2p_step(self.pairs(phase), hierarchical=self.hierarchical)
        return [self.nbytes], AllreduceStep(self)

    def _inputs(self, rank, iteration, sample, t_backward):
        # Launched at the forward pre-hook: when this iteration's forward (and any straggler delay) began.
        c = self.sim.compute
        return [t_backward - (c.forward_s[sample] * self.sim.slowdown[rank] + self.sim.delays[iteration, rank])]

    def mixing(self) -> dict | None:
        if self.n == 1:
            return None
        return mixing_of(self.topo, self.eps)


class AllreduceStep:
    """peer_selection_mode "all": an allreduce of the weights (hierarchical: node reduce, leaders' allreduce, node
    broadcast), a synchronization of every rank. A step function for `chain`; simfog.analytic_flow reads `alg`."""

    def __init__(self, alg: BaguaDecentralized):
        self.alg = alg

    def __call__(self, plan: Plan, ready: list[int], nbytes: float):
        alg = self.alg
        cluster, cost, n = alg.sim.experiment.cluster, alg.sim.cost, alg.n
        if not alg.hier:
            op = plan.op(ready, cost.allreduce(nbytes))
            return [op] * n, [[op] for _ in range(n)]
        intra = [plan.op([ready[r] for r in alg.node_ranks(u)], cost.time("allreduce", nbytes, alg.node_ranks(u)))
                 for u in range(cluster.nodes)]
        leaders = [u * cluster.ranks_per_node for u in range(cluster.nodes)]
        inter = plan.op(intra, cost.time("allreduce", nbytes, leaders))
        last, owned = [0] * n, [[] for _ in range(n)]
        for u in range(cluster.nodes):
            b = plan.op((inter,), cost.time("broadcast", nbytes, alg.node_ranks(u)))
            for r in alg.node_ranks(u):
                last[r] = b
                owned[r] = [intra[u], b] + ([inter] if r == leaders[u] else [])
        return last, owned


@REGISTRY.register("low_precision_decentralized")
class BaguaLowPrecisionDecentralized(DataflowAlgorithm):
    """BAGUA low-precision decentralized: 8-bit weight differences with ring neighbours ±1 after the update."""

    name = "low_precision_decentralized"

    def __init__(self, sim):

        super().__init__(sim)
        cluster = sim.experiment.cluster
        self.hier = self.comm.hierarchical is not False and cluster.ranks_per_node > 1
        self.units = cluster.nodes if self.hier else self.n
        self.unit = cluster.ranks_per_node if self.hier else 1
        self.wire = float(minmax_uint8_bytes(self.trace.parameters, 1))
        # decentralized_low_precision_synchronous.rs: compress the difference once, decompress the two received
        # ones and its own: 1 + 3 passes over the model at the codec throughput, on the ranks that send.
        bw = codec_bandwidth(self.comm, "minmax_uint8")
        slow = sim.slowdown
        self.codec = ([self.nbytes / bw * slow[r] for r in range(self.n)],
                      [3 * self.nbytes / bw * slow[r] for r in range(self.n)])

    def steps(self, phase: int):
        N, u = self.units, self.unit
        # Ring peers: send to and receive from left and right (twice the same peer when N = 2, as BAGUA does).
        pairs = [] if N < 2 else [(i * u, ((i + k) % N) * u) for i in range(N) for k in (-1, 1)]
        step = self.p2p_step(pairs, hierarchical=self.hier, codec=self.codec if N > 1 else None,
                             intra_bytes=self.nbytes)
        return [self.wire], step

    def _inputs(self, rank, iteration, sample, t_backward):
        # After the optimizer step; placed before it (module docstring), once backward has ended.
        return [t_backward + self.sim.compute.backward_s[sample] * self.sim.slowdown[rank]]

    def describe_buckets(self) -> list[dict]:
        out = super().describe_buckets()
        for b in out:
            b["wire_bytes"] = int(self.wire)
        return out

    def mixing(self) -> dict | None:
        if self.n == 1:
            return None
        if self.units < 2:
            return mixing_of(None, self.eps, "intra-node allreduce")
        return mixing_of(topology("ring", self.units), self.eps, "ring over nodes" if self.hier else "ring")
