"""Asynchronous averaging: BlueFog's one-sided win_put and BAGUA's background model averaging.

Neither makes a rank wait for another, so a straggler slows only itself; the network still carries the traffic
(recorded as communication), and the models agree less than under synchronous averaging.

- win_put (Bluefog-Lib/bluefog bluefog/torch/optimizers.py, DistributedWinPutOptimizer): a forward hook on the whole
  model puts every parameter into the windows of the rank's out-neighbours of comm.topology (default exp2); step()
  waits for the rank's own puts to complete (win_wait: the data is in the remote windows) and averages whatever
  its window holds (win_update), never waiting for anyone (BlueFog's negotiation is off here, as its asynchronous
  examples set bf.set_skip_negotiate_stage(True); comm.negotiate = true puts it back). Puts start when the sender
  launches them (one-sided, no receiver involvement); their durations come from simfog.p2p.exchange_times over all
  puts of the step (the receivers' NICs are shared too) with one latency per 8 MiB fused buffer, as for BlueFog's
  neighbour averaging.
- async (BaguaSys/bagua bagua/torch_api/algorithms/async_model_average.py, AsyncModelAverageAlgorithm): a background
  thread loops: negotiate (a 1-byte broadcast from rank 0), allreduce a snapshot of the weights among all ranks,
  sleep comm.async_period (sync_interval_ms = 500). The training loop never waits. The weight lock the thread
  takes while copying weights in and out is not modelled (device copies, short), nor is the bandwidth the
  averaging takes from gradient traffic (there is none: no gradients are communicated).
"""

from __future__ import annotations

import math

from simfog.algorithms.dataflow import DEFAULT_CONSENSUS_EPS, mixing_of, split_by_iteration
from simfog.algorithms.decentralized import TopologyAlgorithm, bluefog_fused_buffers
from simfog.algorithms.registry import REGISTRY
from simfog.errors import ConfigError

BAGUA_ASYNC_PERIOD_S = 0.5  # AsyncModelAverageAlgorithm(sync_interval_ms=500)


@REGISTRY.register("win_put")
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

    def analytic_blocker(self) -> str | None:
        return "algorithm 'win_put' is kept on the event engine (one-sided puts: not covered by the analytic tests)"

    def mixing(self) -> dict | None:
        out = super().mixing()
        if out is not None:
            out["averaging_rounds_per_iteration"] = 1.0
        return out


@REGISTRY.register("async")
class AsyncModelAverage:
    """BAGUA asynchronous model averaging: a background allreduce of the weights every 500 ms; training never waits."""

    symmetric = False

    def __init__(self, sim):
        self.sim = sim
        exp = sim.experiment
        self.n = sim.simulated_ranks
        self.iterations = exp.iterations
        self.nbytes = float(exp.workload.trace.nbytes)
        self.period_s = exp.comm.async_period_s or BAGUA_ASYNC_PERIOD_S
        self.eps = exp.comm.consensus_eps or DEFAULT_CONSENSUS_EPS
        self.round_s = sim.cost.time("broadcast", 1) + sim.cost.allreduce(self.nbytes)
        # starts[r][j]: when rank r's iteration j began; the last entry is the end of its latest known iteration
        # (iterations follow each other with no wait: forward starts when the optimizer step ends).
        self.starts = [[0.0] for _ in range(self.n)]
        self.round_ends: list[float] = []
        if self.n > 1:
            sim.env.process(self._loop())

    def backward_started(self, rank, iteration, sample, t_backward):
        c, slow = self.sim.compute, self.sim.slowdown[rank]
        self.starts[rank].append(t_backward + (c.backward_s[sample] + c.optimizer_s[sample]) * slow)
        return None

    def _training_end(self) -> float | None:
        """When the last rank finishes its last iteration, once every rank has started it (else None)."""
        if any(len(s) <= self.iterations for s in self.starts):
            return None
        return max(s[-1] for s in self.starts)

    def _loop(self):
        env, record, n_it = self.sim.env, self.sim.record, self.iterations
        while True:
            end = self._training_end()
            if end is not None and env.now >= end:
                return
            start = env.now
            yield env.timeout(self.round_s)
            self.round_ends.append(env.now)
            for r, starts in enumerate(self.starts):
                for it, s, e in split_by_iteration(starts, len(starts) - 1, start, env.now):
                    if it < n_it:
                        record(r, it, "comm", "async_average", s, e)
            yield env.timeout(self.period_s)

    def describe_buckets(self) -> list[dict]:
        if self.n == 1:
            return []
        return [{"bucket": 0, "bytes": int(self.nbytes), "round_s": self.round_s, "period_s": self.period_s,
                 "rounds": len(self.round_ends), **self._rates()}]

    def _rates(self) -> dict:
        end = self._training_end()
        rounds = sum(t <= end for t in self.round_ends) if end is not None else len(self.round_ends)
        return {"averaging_rounds_per_iteration": float(rounds) / self.iterations}

    def mixing(self) -> dict | None:
        """Each round is an exact average of the snapshot (gap 1); consensus takes the iterations between two
        rounds, ⌈1 / rounds per iteration⌉ (None if no round completed during training)."""
        if self.n == 1:
            return None
        rate = self._rates()["averaging_rounds_per_iteration"]
        out = mixing_of(None, self.eps, "full (asynchronous)")
        out["iterations_to_consensus"] = math.ceil(1 / rate) if rate > 0 else None
        out["averaging_rounds_per_iteration"] = rate
        return out
