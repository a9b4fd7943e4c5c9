"""BlueFog's algorithms (Bluefog-Lib/bluefog bluefog/torch/optimizers.py): neighbour averaging of parameters over a
topology, its hierarchical form over machines, and one-sided win_put.

- Adapt-with-combine (combine = "awc"): a forward hook on the whole model launches the neighbour allreduce of every
  parameter once forward ends; step() synchronizes. BlueFog's background thread fuses tensors into buffers of up
  to 8 MiB (BLUEFOG_FUSION_THRESHOLD; comm.threshold overrides) handled one after another: costed as one message
  of the whole model carrying one latency per fused buffer (exact when ranks run in step). Its negotiation
  (bluefog/common/operations.cc: global_skip_negotiate_stage = false, IncrementTensorCount is ready when all ranks
  have requested the tensor; comm.negotiate = false is bf.set_skip_negotiate_stage(True)) makes every operation
  wait until all ranks have requested it, as Horovod's does: a straggler then holds up every rank, not only its
  neighbours. The negotiation's own messages through rank 0 (a 0.5 ms cycle) are not costed.
- Adapt-then-combine ("atc"): a hook on each gradient applies that parameter's update and at once launches its
  neighbour allreduce, so communication overlaps backward; fused buffers (as above, in gradient-ready order) are
  launched when their last gradient is ready and run one after another. The per-parameter updates are charged, as
  the trace records them, to the optimizer step after the wait.
- win_put (DistributedWinPutOptimizer): a forward hook on the whole model puts every parameter into the windows of
  the rank's out-neighbours of comm.topology (default exp2); step() waits for the rank's own puts to complete
  (win_wait: the data is in the remote windows) and averages whatever its window holds (win_update), never waiting
  for anyone (BlueFog's negotiation is off here, as its asynchronous examples set bf.set_skip_negotiate_stage(True);
  comm.negotiate = true puts it back). Puts start when the sender launches them (one-sided, no receiver
  involvement); their durations come from simfog.p2p.exchange_times over all puts of the step (the receivers' NICs
  are shared too) with one latency per 8 MiB fused buffer, as for neighbour averaging. Nothing is decided while
  running (a put's start and length are fixed by its sender's launch), so its Plan takes the family's closed form,
  bit for bit the event engine's (tests/test_analytic_flow.py).
"""

from __future__ import annotations

import numpy as np

from simfog import merge
from simfog.algorithms.dataflow.plan import graph_pairs
from simfog.algorithms.dataflow.program import TopologyAlgorithm
from simfog.algorithms.mixing import mixing_of
from simfog.errors import ConfigError
from simfog.topology import Topology, topology

BLUEFOG_FUSION_BYTES = 8 * merge.MiB   # bluefog/common/operations.cc: BLUEFOG_FUSION_THRESHOLD default 8 MiB


def bluefog_fused_buffers(trace, threshold_bytes: float | None) -> list[merge.Bucket]:
    """BlueFog's fused buffers: gradient-ready order, up to the fusion threshold (8 MiB unless comm.threshold)."""
    return merge.horovod_fuse(merge.grad_tensors(trace), threshold_bytes or BLUEFOG_FUSION_BYTES)


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


class WinPut(TopologyAlgorithm):
    """BlueFog win_put: one-sided puts of the parameters to the out-neighbours; no rank waits for another."""

    name = "win_put"

    def __init__(self, sim):
        super().__init__(sim)
        if self.topo is not None and self.topo.intra_node is not None:
            raise ConfigError("comm.topology", self.topo.name, "a rank-level graph for win_put (BlueFog's windows "
                              "have no hierarchical form)")
        self.fused = bluefog_fused_buffers(self.trace, self.comm.threshold_bytes)
        self.negotiate = self.comm.negotiate is True

    def steps(self, phase: int):
        step = self.p2p_step(self.pairs(phase), hierarchical=False, latencies=max(1, len(self.fused)),
                             one_sided=True)
        return [self.nbytes], step

    def mixing(self) -> dict | None:
        out = super().mixing()
        if out is not None:
            out["averaging_rounds_per_iteration"] = 1.0
        return out
