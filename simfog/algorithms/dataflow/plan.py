"""The dataflow family's plan: one iteration's communication as a graph of operations (`Plan`), evaluated in
max-plus algebra (`Run`): every operation (a point-to-point message, an intra-node collective, an encode) starts
once all its inputs have ended and lasts a fixed time, and a rank's optimizer step waits for the rank's last
operation. The step functions `P2PStep` (messages between pairs) and, for BAGUA's "all" peers, an allreduce step
(simfog.algorithms.dataflow.bagua) add one bucket's operations.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from simfog.p2p import links_of, message_times


class Plan:
    """The dataflow template of one iteration (one per topology phase). Op i lasts dur[i] and starts when its
    npred[i] inputs have ended; inputs[r] are rank r's external launch points (one per bucket); parts[r] lists
    (name, launch op, last op, ops the rank takes part in) per bucket; done_of[i] >= 0 marks rank r's completion."""

    def __init__(self, ranks: int):
        self.dur: list[float] = []
        self.succ: list[list[int]] = []
        self.npred: list[int] = []
        self.done_of: list[int] = []
        self.inputs: list[list[int]] = [[] for _ in range(ranks)]
        self.parts: list[list[tuple]] = [[] for _ in range(ranks)]
        self.sends: list[list[tuple[int, int, float]]] = [[] for _ in range(ranks)]  # (op, dst, bytes)
        # ops whose duration varies per call (simfog.variation): op -> (kind, bucket, index) in the algorithm's
        # factor tables (DataflowAlgorithm.flow_factors), the bucket being the one `chain` is building
        self.vary: dict[int, tuple[str, int, int]] = {}
        self.bucket = 0

    def op(self, deps: Sequence[int] = (), duration: float = 0.0, done_of: int = -1,
           vary: tuple[str, int] | None = None) -> int:
        """An op lasting `duration` after its `deps`; `vary` = (kind, index): its time varies per call, as the
        factor table `kind`'s entry `index` of the current bucket says."""
        i = len(self.dur)
        self.dur.append(duration)
        self.succ.append([])
        self.npred.append(len(deps))
        self.done_of.append(done_of)
        for d in deps:
            self.succ[d].append(i)
        if vary is not None:
            self.vary[i] = (vary[0], self.bucket, vary[1])
        return i

    def input(self, rank: int) -> int:
        i = self.op()
        self.inputs[rank].append(i)
        return i


class Run:
    """One iteration's evaluation of a Plan: inputs arrive rank by rank (their times may lie in the past or the
    future: max-plus does not care); `on_done(run, rank, t)` fires when rank's last operation has an end time."""

    def __init__(self, plan: Plan, iteration: int, on_done: Callable, factors: Sequence[float] | None = None):
        self.plan, self.iteration, self.on_done = plan, iteration, on_done
        # each op's duration in this iteration: the plan's, times its per-call factor (simfog.variation) if any
        self.factors = factors
        self.dur = plan.dur if factors is None else [d * f for d, f in zip(plan.dur, factors, strict=True)]
        self.start = [-math.inf] * len(plan.dur)
        self.end = [math.nan] * len(plan.dur)
        self.missing = plan.npred.copy()
        self.events: dict = {}
        self.finished = 0

    def factor(self, op: int) -> float:
        """Op `op`'s per-call factor in this iteration (1.0: it does not vary)."""
        return 1.0 if self.factors is None else self.factors[op]

    def give(self, rank: int, times: Sequence[float]) -> None:
        p, start = self.plan, self.start
        stack = [(op, t) for op, t in zip(p.inputs[rank], times, strict=True)]
        for op, t in stack:
            start[op] = t
        while stack:
            op, t = stack.pop()
            stack += [(s, start[s] + self.dur[s]) for s in self.ended(op, t)]

    def ended(self, op: int, t: float) -> list[int]:
        """Op `op` ends at t: its successors' starts move to t if later, and those with no input left are
        returned (their start is final); a rank's completion op tells on_done."""
        p, start, missing = self.plan, self.start, self.missing
        self.end[op] = t
        ready = []
        for s in p.succ[op]:
            if t > start[s]:
                start[s] = t
            missing[s] -= 1
            if not missing[s]:
                ready.append(s)
        if p.done_of[op] >= 0:
            self.on_done(self, p.done_of[op], t)
        return ready


def exchange(plan: Plan, cluster, ready: dict[int, int], pairs: Sequence[tuple[int, int]], nbytes: float, *,
             latencies: int = 1, one_sided: bool = False, buffered: bool = False) -> dict[int, list[int]]:
    """Add one message of `nbytes` per (src, dst) pair, all sent at once; ready[r] is the op after which rank r
    sends and receives. `latencies` > 1 adds that many link latencies in all (fused buffers sent back to back).
    One-sided messages (puts) depend on the sender only and belong to it only; buffered ones (comm.buffered_sends)
    start when both sides are ready and belong to the receiver only (the sender's send completed into its socket).
    Returns the ops of each rank."""
    live = [(s, d) for s, d in pairs if s != d]
    src, dst = (np.array([p[i] for p in live], dtype=np.int64) for i in (0, 1))
    times = message_durations(cluster, src, dst, nbytes, latencies).tolist()
    mine: dict[int, list[int]] = {r: [] for r in ready}
    for i, ((s, d), t) in enumerate(zip(live, times, strict=True)):
        o = plan.op((ready[s],) if one_sided else (ready[s], ready[d]), t, vary=("message", i))
        plan.sends[s].append((o, d, nbytes))
        if not buffered:
            mine[s].append(o)
        if not one_sided:
            mine[d].append(o)
    return mine


def message_durations(cluster, src: np.ndarray, dst: np.ndarray, nbytes: float, latencies: int = 1) -> np.ndarray:
    """Seconds of each message src[i] -> dst[i] (no message to oneself) of one exchange step, all sent at once
    (simfog.p2p.message_times), plus latencies − 1 more link latencies (fused buffers sent back to back)."""
    return message_times(cluster, src, dst, nbytes) + (latencies - 1) * links_of(cluster, src, dst)[0]


def graph_pairs(exchanges) -> np.ndarray:
    """(messages, 2) array of (src, dst) of a topology phase's exchanges, in their order (arrays: a graph of
    131,072 ranks has millions of messages, too many for tuples)."""
    counts = np.fromiter((len(e.send_to) for e in exchanges), dtype=np.int64, count=len(exchanges))
    out = np.empty((int(counts.sum()), 2), dtype=np.int64)
    out[:, 0] = np.repeat(np.fromiter((e.rank for e in exchanges), dtype=np.int64, count=len(exchanges)), counts)
    out[:, 1] = np.fromiter(itertools.chain.from_iterable(e.send_to for e in exchanges), dtype=np.int64,
                            count=len(out))
    return out


class P2PStep:
    """A step function for `DataflowAlgorithm.chain` (simfog.algorithms.dataflow.program): messages between
    `pairs`. Hierarchical: each node first averages among its ranks (intra-node allreduce; BAGUA's reduce moves the same
    bytes under a ring), local ranks 0 exchange, then broadcast inside the node (on `intra_bytes`, default the message
    size). codec = (encode_s, decode_s) per rank adds compression around the messages of the ranks that exchange. Its
    fields are what the closed form (simfog.algorithms.dataflow.closed_form) reads to evaluate the same ops over
    arrays."""

    def __init__(self, alg, pairs, hierarchical: bool, latencies: int, one_sided: bool, codec,
                 intra_bytes: float | None):
        self.alg, self.hierarchical, self.latencies = alg, hierarchical, latencies
        self.one_sided, self.codec, self.intra_bytes = one_sided, codec, intra_bytes
        self.buffered = not one_sided and alg.comm.buffered_sends
        self.both = both = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        self.named = np.zeros(alg.n, dtype=bool)  # every rank named in a pair (also a pair with itself)
        self.named[both.ravel()] = True
        live = both[both[:, 0] != both[:, 1]]
        self.src, self.dst = live[:, 0].copy(), live[:, 1].copy()

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return list(map(tuple, self.both.tolist()))

    def __call__(self, plan: Plan, ready: list[int], nbytes: float):
        alg = self.alg
        cluster, cost, codec, hierarchical = alg.sim.experiment.cluster, alg.sim.cost, self.codec, self.hierarchical
        n = alg.n
        last, owned = list(ready), [[] for _ in range(n)]
        if alg.negotiate:  # nothing moves before every rank has requested the operation
            ready = [plan.op(ready)] * n
        senders = set(np.flatnonzero(self.named).tolist())
        full = nbytes if self.intra_bytes is None else self.intra_bytes
        if hierarchical:
            intra, bcast = {}, {}
            for u in range(cluster.nodes):
                members = alg.node_ranks(u)
                intra[u] = plan.op([ready[r] for r in members], cost.time("allreduce", full, members),
                                   vary=("intra", u))
            first = {u * cluster.ranks_per_node: intra[u] for u in range(cluster.nodes)}
        else:
            first = {r: ready[r] for r in range(n)}
        go = dict(first)
        if codec is not None:
            for r in senders:
                go[r] = plan.op((first[r],), codec[0][r])
                owned[r].append(go[r])
        msgs = exchange(plan, cluster, go, self.pairs, nbytes, latencies=self.latencies, one_sided=self.one_sided,
                        buffered=self.buffered)
        after = {}
        for r, start_op in go.items():
            after[r] = plan.op([start_op] + msgs[r], codec[1][r] if codec is not None and r in senders else 0.0)
            owned[r] += msgs[r] + ([after[r]] if codec is not None and r in senders else [])
        if not hierarchical:
            return [after[r] for r in range(n)], owned
        for u in range(cluster.nodes):
            members = alg.node_ranks(u)
            leader = members[0]
            bcast[u] = plan.op((after[leader],), cost.time("broadcast", full, members), vary=("bcast", u))
            for r in members:
                last[r] = bcast[u]
                owned[r] += [intra[u], bcast[u]]
        return last, owned
