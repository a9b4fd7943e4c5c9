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
  neighbour averaging. Nothing is decided while running (a put's start and length are fixed by its sender's
  launch), so its Plan takes the dataflow algorithms' analytic path (simfog.analytic_flow), bit for bit the event
  engine's (tests/test_analytic_flow.py).
- async (BaguaSys/bagua bagua/torch_api/algorithms/async_model_average.py, AsyncModelAverageAlgorithm): a background
  thread loops: negotiate (a 1-byte broadcast from rank 0), allreduce a snapshot of the weights among all ranks,
  sleep comm.async_period (sync_interval_ms = 500). The training loop never waits. The weight lock the thread
  takes while copying weights in and out is not modelled (device copies, short), nor is the bandwidth the
  averaging takes from gradient traffic (there is none: no gradients are communicated).
"""

from __future__ import annotations

import math

import numpy as np

from simfog.algorithms.dataflow import DEFAULT_CONSENSUS_EPS, mixing_of
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
        # starts[r, j]: when rank r's iteration j began, known for j <= known[r]; the entry known[r] is the end of
        # its latest known iteration (iterations follow each other with no wait: forward starts when the optimizer
        # step ends). A table rather than a list per rank: a round cuts every rank's share at once.
        self.starts = np.full((self.n, self.iterations + 1), np.inf)
        self.starts[:, 0] = 0.0
        self.known = np.zeros(self.n, dtype=np.int64)
        self.round_ends: list[float] = []
        if self.n > 1:
            sim.env.process(self._loop())

    def backward_started(self, rank, iteration, sample, t_backward):
        c, slow = self.sim.compute, self.sim.slowdown[rank]
        self.known[rank] = k = self.known[rank] + 1
        self.starts[rank, k] = t_backward + (c.backward_s[sample] + c.optimizer_s[sample]) * slow
        return None

    def _training_end(self) -> float | None:
        """When the last rank finishes its last iteration, once every rank has started it (else None)."""
        if (self.known < self.iterations).any():
            return None
        return self.starts[:, self.iterations].max()

    def _loop(self):
        env, log, n_it = self.sim.env, self.sim.log, self.iterations
        while True:
            end = self._training_end()
            if end is not None and env.now >= end:
                return
            start = env.now
            yield env.timeout(self.round_s)
            self.round_ends.append(env.now)
            ranks, its, s, e = split_rounds(self.starts, self.known, start, env.now)
            kept = its < n_it
            log.record_block(ranks[kept], its[kept], "comm", "async_average", s[kept], e[kept])
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


def split_rounds(starts: np.ndarray, known: np.ndarray, s: float, e: float) -> tuple[np.ndarray, ...]:
    """simfog.algorithms.dataflow.split_by_iteration(starts[r, :known[r] + 1], known[r], s, e) for every rank r at
    once, step for step (the same comparisons and choices, so the same pieces): (ranks, iterations, starts, ends)
    of the pieces, rank by rank, each rank's in iteration order."""
    n = len(known)
    end = np.full(n, e)                      # each rank's e as its walk down the iterations shortens it
    at = known.copy()                        # where each rank's walk stands (it stops where s >= starts)
    walking = np.ones(n, dtype=bool)
    pieces = []
    j = int(known.max()) if n else 0
    while j > 0 and walking.any():
        here = walking & (known >= j)        # ranks whose walk has reached j
        t = starts[:, j]
        go = here & (s < t)
        cut = go & (end > t)
        if cut.any():
            rows = np.flatnonzero(cut)
            pieces.append((rows, np.full(len(rows), j), t[rows], end[rows]))
            end[rows] = t[rows]
        walking &= ~(here & ~go)             # the loop's condition failed: the walk stops at j
        at[go] = j - 1
        j -= 1
    last = end > s
    rows = np.flatnonzero(last)
    pieces.append((rows, at[rows], np.full(len(rows), s), end[rows]))
    ranks, its, lo, hi = (np.concatenate(x) for x in zip(*pieces))
    order = np.lexsort((its, ranks))
    return ranks[order], its[order], lo[order], hi[order]
