"""The compute model: each layer's forward and backward times per recorded iteration of a trace, and the draws
that give every simulated (iteration, rank) one of them.

Compute draws: with compute = "samples", each (iteration, rank) draws one recorded iteration k of the trace and
uses sample k of every layer, so layer times keep the correlation they had when measured and stragglers arise
from the data. With compute = "mean", every layer takes its mean time; "replay" runs recorded iteration i mod S
at simulated iteration i on every rank (a measured run reproduced in order).
A trace of several recorded ranks (ModelTrace.sample_ranks, `simfog import kineto DIR`) keeps each rank's own
compute: each simulated iteration draws one recorded iteration k, and simulated rank r takes recorded rank
(r mod R)'s sample of iteration k, so the ranks differ as the measured ones did in that very iteration; "mean"
gives each recorded rank its own means.

Shared draws (`shared`, [workload] compute_draws): a trace of one recorded rank says how one rank's iterations
vary, not whether the ranks of one iteration vary together. With `shared` = w, each simulated iteration is, with
probability w, one draw for every rank (a common part: all ranks run the same recorded iteration), else a draw
per rank: two ranks' compute times then correlate by exactly w, and a synchronous step pays the slowest of N own
draws only in the other iterations. 0 ("independent") is the draw per (iteration, rank); 1 ("shared") one draw
per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The default share of iterations whose ranks share one compute draw ([workload] compute_draws): independent, as
# measured by `python bench/distributions.py --compute` (docs/distributions.md) on this project's 2-core VM, MLP
# computed for real by 2 and 4 ranks of one per node, 119 iterations each, 2026-12-07 while other jobs loaded the
# machine (load 8-10, rows host-limited; to be re-measured idle): the ranks' shared share of the compute variance
# was 0.20 (90 % interval 0.06-0.34) on 2 ranks and 0.11 (0.03-0.18) on 4 (0.00, 0.00-0.04, in an earlier run);
# judged on the 4-rank row, what its steps paid for their slowest rank (mean slowest / mean 1.347) was closest to
# independent draws (1.367) against the 2-rank fit (1.294) and shared draws (1.000).
SHARED_DEFAULT = 0.0
COMPUTE_DRAWS = {"independent": 0.0, "shared": 1.0}


@dataclass(frozen=True)
class ComputeModel:
    """Per recorded iteration (row) of the trace: forward, backward and optimizer totals, when each layer's
    backward ends, measured from the start of backward, and each layer's forward and backward time (seconds).
    `optimizer_s` is the step's serial tail: the trace's optimizer step plus its host time (ModelTrace.host_s:
    data loading, launch gaps), which `host_s` keeps apart for reporting."""

    forward_s: np.ndarray      # (S,)
    backward_s: np.ndarray     # (S,)
    optimizer_s: np.ndarray    # (S,)
    layer_end_s: np.ndarray    # (S, layers)
    host_s: np.ndarray | None = None  # (S,): the part of optimizer_s that is host time, when the trace has it
    layer_forward_s: np.ndarray | None = None   # (S, layers): each layer's forward time
    layer_backward_s: np.ndarray | None = None  # (S, layers): each layer's backward time
    # (R, I): row of recorded rank r's iteration i, for a trace of R recorded ranks (ModelTrace.sample_ranks)
    rank_rows: np.ndarray | None = None

    @staticmethod
    def from_trace(trace, mode: str) -> ComputeModel:
        fwd = np.array([layer.forward_s for layer in trace.layers]).T        # (S, L)
        bwd = np.array([layer.backward_s for layer in trace.layers]).T
        opt = np.asarray(trace.optimizer_s, dtype=float)
        if opt.size != fwd.shape[0]:
            opt = np.full(fwd.shape[0], opt.mean() if opt.size else 0.0)
        host = np.asarray(trace.host_s, dtype=float)
        if host.size != fwd.shape[0]:
            host = np.full(fwd.shape[0], host.mean() if host.size else 0.0)
        ranks = np.asarray(trace.sample_ranks, dtype=int)
        rows = np.array([np.flatnonzero(ranks == r) for r in np.unique(ranks)]) if ranks.size else None
        if mode == "mean" and rows is not None:   # each recorded rank its own means
            fwd, bwd, opt, host = (np.array([x[r].mean(0) for r in rows]) for x in (fwd, bwd, opt, host))
            rows = np.arange(len(rows))[:, None]
        elif mode == "mean":
            fwd, bwd = fwd.mean(0, keepdims=True), bwd.mean(0, keepdims=True)
            opt, host = opt.mean(keepdims=True), host.mean(keepdims=True)
        # Backward runs from the last layer to the first: layer l ends after all layers >= l.
        layer_end = np.cumsum(bwd[:, ::-1], axis=1)[:, ::-1]
        return ComputeModel(fwd.sum(1), layer_end[:, 0].copy(), opt + host, layer_end, host, fwd, bwd, rows)

    def draw(self, rng: np.random.Generator, iterations: int, ranks: int, *, replay: bool = False,
             shared: float = 0.0) -> np.ndarray:
        """(iterations, ranks) rows: one independent draw per (iteration, rank), or, with probability `shared`
        per iteration, one draw for all its ranks (module docstring); with recorded ranks, one recorded iteration
        per simulated iteration, simulated rank r taking recorded rank (r mod R)'s row of it. `replay`: recorded
        iteration i mod S at simulated iteration i instead of a draw (rng untouched)."""
        rows = self.rank_rows if self.rank_rows is not None else np.arange(self.samples)[None, :]
        if replay:
            k = np.arange(iterations) % rows.shape[1]
        elif self.rank_rows is None:
            if not shared:  # the draw per (iteration, rank), as it always was
                return rng.integers(0, self.samples, size=(iterations, ranks))
            common = rng.integers(0, self.samples, size=(iterations, 1))
            if shared == 1:
                return np.repeat(common, ranks, axis=1)
            own = rng.integers(0, self.samples, size=(iterations, ranks))
            return np.where(rng.random((iterations, 1)) < shared, common, own)
        else:
            k = rng.integers(0, rows.shape[1], size=iterations)
        return rows[np.arange(ranks) % len(rows)][:, k].T

    @property
    def samples(self) -> int:
        return self.forward_s.shape[0]

    def single_rank_time_s(self) -> float:
        """Mean iteration time of one rank with no communication: the reference for scaling efficiency."""
        return float(np.mean(self.forward_s + self.backward_s + self.optimizer_s))
