"""The dataflow core shared by decentralized algorithms: one iteration's communication as a graph of operations.

A `Plan` is evaluated in max-plus algebra: every operation (a point-to-point message, an intra-node collective, an
encode) starts once all its inputs have ended and lasts a fixed time, and a rank's optimizer step waits for the
rank's last operation. See simfog.algorithms.decentralized for the algorithms built on it and their sources.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from simfog.p2p import links_of, message_times
from simfog.topology import Topology

if TYPE_CHECKING:
    import pandas as pd  # for annotations: imported only where frames are made

DEFAULT_CONSENSUS_EPS = 0.01           # simfog's choice: 1 % of the initial disagreement
MESSAGE_COLUMNS = ["iteration", "src", "dst", "bytes", "start_s", "end_s"]


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

    def op(self, deps: Sequence[int] = (), duration: float = 0.0, done_of: int = -1) -> int:
        i = len(self.dur)
        self.dur.append(duration)
        self.succ.append([])
        self.npred.append(len(deps))
        self.done_of.append(done_of)
        for d in deps:
            self.succ[d].append(i)
        return i

    def input(self, rank: int) -> int:
        i = self.op()
        self.inputs[rank].append(i)
        return i


class Run:
    """One iteration's evaluation of a Plan: inputs arrive rank by rank (their times may lie in the past or the
    future: max-plus does not care); `on_done(run, rank, t)` fires when rank's last operation has an end time."""

    def __init__(self, plan: Plan, iteration: int, on_done: Callable):
        self.plan, self.iteration, self.on_done = plan, iteration, on_done
        self.start = [-math.inf] * len(plan.dur)
        self.end = [math.nan] * len(plan.dur)
        self.missing = plan.npred.copy()
        self.events: dict = {}
        self.finished = 0

    def give(self, rank: int, times: Sequence[float]) -> None:
        p, start = self.plan, self.start
        stack = [(op, t) for op, t in zip(p.inputs[rank], times, strict=True)]
        for op, t in stack:
            start[op] = t
        while stack:
            op, t = stack.pop()
            stack += [(s, start[s] + p.dur[s]) for s in self.ended(op, t)]

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
    for (s, d), t in zip(live, times, strict=True):
        o = plan.op((ready[s],) if one_sided else (ready[s], ready[d]), t)
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


def split_by_iteration(starts: Sequence[float], iteration: int, s: float, e: float) -> list[tuple[int, float, float]]:
    """Pieces (iteration, start, end) of the interval [s, e] of a rank whose iteration j began at starts[j]
    (known up to `iteration`; iterations follow each other without gaps in the engine). The part before
    starts[0] stays with iteration 0."""
    out, j = [], iteration
    while j > 0 and s < starts[j]:
        if e > starts[j]:
            out.append((j, starts[j], e))
            e = starts[j]
        j -= 1
    if e > s:
        out.append((j, s, e))
    return out[::-1]


def mixing_of(topo: Topology | None, eps: float, name: str | None = None) -> dict:
    """Mixing report of a topology averaged once per iteration (see simfog.topology: spectral gap over one
    period, iterations to reach consensus error eps); topo None means an exact average every iteration."""
    if topo is None:
        return {"topology": name or "full", "spectral_gap": 1.0, "iterations_to_consensus": 1, "consensus_eps": eps,
                "averaging_rounds_per_iteration": 1.0}
    return {"topology": name or topo.name, "spectral_gap": topo.spectral_gap(),
            "iterations_to_consensus": topo.iterations_to_consensus(eps), "consensus_eps": eps,
            "averaging_rounds_per_iteration": 1.0}


class DataflowAlgorithm:
    """Base of the algorithms whose iteration is a Plan. Subclasses set `period`, `name` and implement
    `steps(phase) -> (bucket sizes, step)` (the Plan is chain(sizes, step)) and `_inputs(rank, iteration, sample,
    t_backward) -> launch times` (numpy-friendly: simfog.analytic_flow passes every rank at once as arrays)."""

    symmetric = False
    period = 1
    name = "exchange"
    negotiate = False

    def __init__(self, sim):
        self.sim = sim
        self.n = sim.simulated_ranks
        self.comm = sim.experiment.comm
        self.trace = sim.experiment.workload.trace
        self.nbytes = float(self.trace.nbytes)
        self.eps = self.comm.consensus_eps or DEFAULT_CONSENSUS_EPS
        self._plans: dict[int, Plan] = {}
        self._runs: dict[int, Run] = {}
        self.log: list[tuple] = []
        self.make_log: Callable[[], list] | None = None

    # --- what subclasses provide --------------------------------------------------------------------------------

    def _build(self, phase: int) -> Plan:
        return self.chain(*self.phase_steps(phase))

    def phase_steps(self, phase: int) -> tuple[list[float], Callable]:
        """steps(phase), made once per phase (the event engine's Plan and the analytic path share it)."""
        memo = self.__dict__.setdefault("_steps", {})
        if phase not in memo:
            memo[phase] = self.steps(phase)
        return memo[phase]

    def _inputs(self, rank: int, iteration: int, sample: int, t_backward: float) -> list[float]:
        return [t_backward]

    # --- engine interface -----------------------------------------------------------------------------------------

    def plan(self, phase: int) -> Plan:
        """The Plan of iteration phase `phase` (built once)."""
        if phase not in self._plans:
            self._plans[phase] = self._build(phase)
        return self._plans[phase]

    def backward_started(self, rank, iteration, sample, t_backward):
        if self.n == 1:
            return None
        run = self._runs.get(iteration)
        if run is None:
            run = self._runs[iteration] = Run(self.plan(iteration % self.period), iteration, self._finished)
        run.events[rank] = event = self.sim.env.event()
        run.give(rank, self._inputs(rank, iteration, sample, t_backward))
        return event

    def _finished(self, run: Run, rank: int, t: float) -> None:
        env, event = self.sim.env, run.events.pop(rank)
        if t > env.now:
            env.timeout(t - env.now).callbacks.append(lambda _e: event.succeed())
        else:
            event.succeed()
        self._record(run, rank)
        run.finished += 1
        if run.finished == self.n:
            del self._runs[run.iteration]

    def _record(self, run: Run, rank: int) -> None:
        """Comm intervals: the union of the rank's operations per bucket; wait: the gaps from its launch on."""
        record, it, start, end = self.sim.record, run.iteration, run.start, run.end
        for name, launch, last, ops in run.plan.parts[rank]:
            cur = end[launch]
            for s, e in sorted((start[o], end[o]) for o in ops if end[o] > start[o]):
                if e <= cur:
                    continue
                if s > cur:
                    record(rank, it, "wait", name, cur, s)
                record(rank, it, "comm", name, max(s, cur), e)
                cur = e
            if end[last] > cur:
                record(rank, it, "wait", name, cur, end[last])
        for op, dst, nbytes in run.plan.sends[rank]:
            self.log.append((it, rank, dst, nbytes, start[op], end[op]))

    def messages(self) -> pd.DataFrame:
        """Every point-to-point message sent: iteration, src, dst, bytes, start_s, end_s."""
        import pandas as pd

        if self.make_log is not None:  # the analytic path (simfog.analytic_flow) builds the log when asked
            self.log, self.make_log = self.make_log(), None
        return pd.DataFrame.from_records(self.log, columns=MESSAGE_COLUMNS)

    def describe_buckets(self) -> list[dict]:
        if self.n == 1:
            return []
        sent = self.sent_per_rank()
        return [{"bucket": 0, "tensors": len(self.trace.tensors), "bytes": int(self.nbytes), "algorithm": self.name,
                 "messages_per_rank_max": int(sent.max()), "messages_per_iteration": int(sent.sum())}]

    # --- building blocks for _build -----------------------------------------------------------------------------

    def chain(self, sizes: Sequence[float], step) -> Plan:
        """A Plan of buckets launched one after another on every rank: bucket b starts on rank r once its input
        has arrived and the rank's bucket b-1 has ended. step(plan, ready ops, nbytes) -> (last op, ops) per rank."""
        plan, prev = Plan(self.n), None
        for b, nbytes in enumerate(sizes):
            ready = [plan.input(r) for r in range(self.n)]
            if prev is not None:
                ready = [plan.op((x, p)) for x, p in zip(ready, prev, strict=True)]
            last, owned = step(plan, ready, nbytes)
            for r in range(self.n):
                plan.parts[r].append((self.name if len(sizes) == 1 else f"{self.name}{b}", ready[r], last[r],
                                      owned[r]))
            prev = last
        for r in range(self.n):
            plan.op((prev[r],), 0.0, done_of=r)
        return plan

    def node_ranks(self, node: int) -> range:
        L = self.sim.experiment.cluster.ranks_per_node
        return range(node * L, (node + 1) * L)

    def p2p_step(self, pairs, *, hierarchical: bool, latencies: int = 1, one_sided: bool = False, codec=None,
                 intra_bytes: float | None = None) -> P2PStep:
        """A step function for `chain`: messages between `pairs`, (src, dst) pairs or a (messages, 2) array (see
        P2PStep)."""
        return P2PStep(self, pairs, hierarchical, latencies, one_sided, codec, intra_bytes)

    def steps(self, phase: int) -> tuple[list[float], Callable]:
        """(bucket sizes, step) of phase `phase`: the Plan is chain(sizes, step). Subclasses provide it."""
        raise NotImplementedError

    def sent_per_rank(self) -> np.ndarray:
        """Messages each rank sends per iteration (phase 0), counted without building the Plan."""
        sizes, step = self.phase_steps(0)
        if not isinstance(step, P2PStep):
            return np.zeros(self.n, dtype=int)
        return np.bincount(step.src, minlength=self.n) * len(sizes)

    def analytic_blocker(self) -> str | None:
        """None: the Plan is fixed before the run, so simfog.analytic_flow solves it over every rank at once."""
        return None

    def events_blocker(self) -> str | None:
        """Why the event engine cannot run this configuration, or None. Its Plan gives each message a duration
        fixed when the message starts; under fluid sharing a message's duration depends on messages that start
        later (they slow it down), which simfog.flow_fluid's evaluation in time order sees."""
        if self.n > 1 and self.comm.p2p_sharing == "fluid" and isinstance(self.phase_steps(0)[1], P2PStep):
            return ('point-to-point messages share links as they overlap in time (comm.p2p_sharing = "fluid"), '
                    'which simfog.flow_fluid evaluates; p2p_sharing = "together" runs on the event engine')
        return None


class P2PStep:
    """A step function for `DataflowAlgorithm.chain`: messages between `pairs`. Hierarchical: each node first
    averages among its ranks (intra-node allreduce; BAGUA's reduce moves the same bytes under a ring), local ranks 0
    exchange, then broadcast inside the node (on `intra_bytes`, default the message size). codec = (encode_s,
    decode_s) per rank adds compression around the messages of the ranks that exchange. Its fields are what
    simfog.analytic_flow reads to evaluate the same ops over arrays."""

    def __init__(self, alg: DataflowAlgorithm, pairs, hierarchical: bool, latencies: int, one_sided: bool, codec,
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
                intra[u] = plan.op([ready[r] for r in members], cost.time("allreduce", full, members))
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
            bcast[u] = plan.op((after[leader],), cost.time("broadcast", full, members))
            for r in members:
                last[r] = bcast[u]
                owned[r] += [intra[u], bcast[u]]
        return last, owned
