"""BAGUA's decentralized algorithms (BaguaSys/bagua bagua/torch_api/algorithms/decentralized.py and
rust/bagua-core/.../comm_ops/decentralized_*_synchronous.rs).

- decentralized: the whole model is one bucket, launched at the forward pre-hook (it overlaps forward and
  backward) and waited for after backward; weights averaged with all peers (topology "full": an allreduce,
  hierarchical by default) or with shift_one peers.
- low_precision_decentralized: 8-bit MinMaxUInt8 weight differences with ring neighbours ±1, after the optimizer
  step, no overlap. The engine has no hook there, so the exchange is placed between backward's end and the
  optimizer step: the same iteration time, and its time shows as exposed communication.
"""

from __future__ import annotations

from simfog.algorithms.codecs import codec_bandwidth, minmax_uint8_bytes
from simfog.algorithms.dataflow.plan import Plan
from simfog.algorithms.dataflow.program import DataflowAlgorithm, TopologyAlgorithm
from simfog.algorithms.mixing import mixing_of
from simfog.errors import ConfigError
from simfog.topology import Topology, topology


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
    broadcast), a synchronization of every rank. A step function for `chain`; the closed form reads `alg`."""

    def __init__(self, alg: BaguaDecentralized):
        self.alg = alg

    def __call__(self, plan: Plan, ready: list[int], nbytes: float):
        alg = self.alg
        cluster, cost, n = alg.sim.experiment.cluster, alg.sim.cost, alg.n
        if not alg.hier:
            op = plan.op(ready, cost.allreduce(nbytes), vary=("inter", 0))
            return [op] * n, [[op] for _ in range(n)]
        intra = [plan.op([ready[r] for r in alg.node_ranks(u)], cost.time("allreduce", nbytes, alg.node_ranks(u)),
                         vary=("intra", u)) for u in range(cluster.nodes)]
        leaders = [u * cluster.ranks_per_node for u in range(cluster.nodes)]
        inter = plan.op(intra, cost.time("allreduce", nbytes, leaders), vary=("inter", 0))
        last, owned = [0] * n, [[] for _ in range(n)]
        for u in range(cluster.nodes):
            b = plan.op((inter,), cost.time("broadcast", nbytes, alg.node_ranks(u)), vary=("bcast", u))
            for r in alg.node_ranks(u):
                last[r] = b
                owned[r] = [intra[u], b] + ([inter] if r == leaders[u] else [])
        return last, owned


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
