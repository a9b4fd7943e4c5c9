"""The dataflow family's program on the event engine: each rank hands its launch times to the iteration's Plan when
its backward starts and waits, before its optimizer step, for its part of the Plan to end (`DataflowAlgorithm`);
`TopologyAlgorithm` averages over a simfog.topology graph. The algorithms: simfog.algorithms.dataflow.bluefog and
.bagua; the family's docstring (simfog.algorithms.dataflow) says what is modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from simfog.algorithms.dataflow.plan import P2PStep, Plan, Run, graph_pairs
from simfog.algorithms.mixing import DEFAULT_CONSENSUS_EPS, mixing_of
from simfog.engine.protocol import TrainingAlgorithm
from simfog.results import PATH_ANALYTIC
from simfog.topology import Topology, topology

if TYPE_CHECKING:
    import pandas as pd  # for annotations: imported only where frames are made

MESSAGE_COLUMNS = ["iteration", "src", "dst", "bytes", "start_s", "end_s"]


class DataflowAlgorithm(TrainingAlgorithm):
    """Base of the algorithms whose iteration is a Plan. Subclasses set `period`, `name` and implement
    `steps(phase) -> (bucket sizes, step)` (the Plan is chain(sizes, step)) and `_inputs(rank, iteration, sample,
    t_backward) -> launch times` (numpy-friendly: the closed form passes every rank at once as arrays)."""

    symmetric = False
    period = 1
    name = "exchange"
    negotiate = False

    def __init__(self, sim):
        super().__init__(sim)
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
            phase = iteration % self.period
            run = self._runs[iteration] = Run(self.plan(phase), iteration, self._finished,
                                              self.op_factors(phase, iteration))
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

        if self.make_log is not None:  # the closed form builds the log when asked
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
            plan.bucket = b  # the bucket of the ops `step` adds (their per-call factors, Plan.vary)
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

    def flow_factors(self, phase: int) -> dict[str, np.ndarray] | None:
        """Per kind of op that varies per call (simfog.variation; Plan.vary), (iterations, buckets, index)
        factors of phase `phase`: "message" (by the link it crosses; see _flow_factors for its n), "intra" and
        "bcast" (per node, among its ranks), "inter" (the allreduce among all ranks, or among the node leaders when
        hierarchical); None when nothing varies. Made once per phase: the event engine's Runs and the closed form
        read the same tables."""
        memo = self.__dict__.setdefault("_factor_tables", {})
        if phase not in memo:
            memo[phase] = self._flow_factors(phase)
        return memo[phase]

    def _flow_factors(self, phase: int) -> dict[str, np.ndarray] | None:
        cluster, cost = self.sim.experiment.cluster, self.sim.cost
        if self.n == 1 or not (cluster.nic.spread or cluster.intra.spread):
            return None
        sizes, step = self.phase_steps(phase)
        buckets, per_node = len(sizes), cluster.ranks_per_node
        hier = step.hierarchical if isinstance(step, P2PStep) else self.hier
        spreads = {}
        if isinstance(step, P2PStep):
            crossing = np.where(step.src // per_node == step.dst // per_node, cluster.intra.spread,
                                cluster.nic.spread)
            # drawn, each message is a call of its own (n = 1): a rank waiting for k of them pays the slowest draw;
            # expected, each pays the expected slowest of the messages its receiver takes part in
            taking_part = np.bincount(step.src, minlength=self.n) + np.bincount(step.dst, minlength=self.n)
            n = taking_part[step.dst] if self.sim.variation.mode == "expected" else 1
            spreads["message"] = (np.tile(crossing, (buckets, 1)), n)
        else:
            leaders = list(range(0, self.n, per_node)) if hier else None
            spreads["inter"] = (np.full((buckets, 1), cost.spread(leaders)), cluster.nodes if hier else self.n)
        if hier:
            node = (np.full((buckets, cluster.nodes), cost.spread(list(self.node_ranks(0)))), per_node)
            spreads["intra"] = spreads["bcast"] = node
        tables = {kind: self.sim.variation.factors(f"dataflow.{kind}.{phase}", s, n)
                  for kind, (s, n) in spreads.items()}
        return {kind: t for kind, t in tables.items() if t is not None} or None

    def op_factors(self, phase: int, iteration: int) -> list[float] | None:
        """Each op's per-call factor in `iteration` (1.0 for ops that do not vary), for a Run; None when nothing
        varies."""
        tables = self.flow_factors(phase)
        if tables is None:
            return None
        plan = self.plan(phase)
        out = [1.0] * len(plan.dur)
        for op, (kind, b, i) in plan.vary.items():
            if kind in tables:
                out[op] = float(tables[kind][iteration, b, i])
        return out

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

    def closed_form_blocker(self) -> str | None:
        """None: the Plan is fixed before the run, so the closed form solves it over every rank at once (under
        comm.p2p_sharing = "fluid", the evaluation in time order, simfog.algorithms.dataflow.fluid)."""
        return None

    def closed_form(self):
        """The run solved without the event engine (closed_form, or fluid in time order), imported when asked."""
        if self.comm.p2p_sharing == "fluid":  # message times decided by what overlaps: in time order
            from simfog.algorithms.dataflow.fluid import run

            return run(self.sim)
        from simfog.algorithms.dataflow.closed_form import run

        return run(self.sim, PATH_ANALYTIC)

    def events_blocker(self) -> str | None:
        """Why the event engine cannot run this configuration, or None. Its Plan gives each message a duration
        fixed when the message starts; under fluid sharing a message's duration depends on messages that start
        later (they slow it down), which the evaluation in time order (simfog.algorithms.dataflow.fluid) sees."""
        if self.n > 1 and self.comm.p2p_sharing == "fluid" and isinstance(self.phase_steps(0)[1], P2PStep):
            return ('point-to-point messages share links as they overlap in time (comm.p2p_sharing = "fluid"), '
                    'which simfog.algorithms.dataflow.fluid evaluates; p2p_sharing = "together" runs on the event '
                    'engine')
        return None


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


