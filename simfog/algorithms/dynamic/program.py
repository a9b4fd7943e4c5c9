"""The run-time-decided family's programs on the event engine: Horovod's fusion cycles, WAGMA's wait-avoiding group
operations and BAGUA's asynchronous averaging loop. What each models and from which sources: the family's docstring
(simfog.algorithms.dynamic); why none has a closed form: closed_form.py.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from simfog import merge
from simfog.algorithms.allreduce.plan import slowed_backward, tensor_ready_offsets
from simfog.algorithms.dynamic.closed_form import horovod_blocker
from simfog.algorithms.dynamic.plan import (
    BAGUA_ASYNC_PERIOD_S,
    WAGMA_GLOBAL_EVERY,
    WAGMA_GROUP_SIZE,
    group_ring_seconds,
    recursive_doubling_seconds,
    split_by_iteration,
    split_rounds,
    wagma_layouts,
)
from simfog.algorithms.mixing import DEFAULT_CONSENSUS_EPS, mixing_of
from simfog.engine.events import Collective
from simfog.engine.protocol import TrainingAlgorithm
from simfog.errors import ConfigError, Infeasible
from simfog.memory import estimate


class HorovodAllreduce(TrainingAlgorithm):
    """Horovod's allreduce (comm.algorithm "allreduce" with merge = "horovod"): a background loop that, every cycle,
    negotiates which tensors are ready on all ranks, fuses them up to the fusion threshold and allreduces the fused
    buffers one after another; it sleeps until the next cycle is due."""

    symmetric = True
    symmetric_draws = True  # its fused allreduces are among all ranks

    def __init__(self, sim):
        super().__init__(sim)
        comm = sim.experiment.comm
        self.calls = sim.variation.sequence("horovod.fused")  # per-call variation (simfog.variation)
        self.tensors, offsets = tensor_ready_offsets(sim)
        self.overheads = oh = sim.experiment.overheads()
        if oh.overlap_slowdown != 1.0 and offsets.size:
            first = offsets.min(axis=1, keepdims=True)  # collectives can run from the first ready gradient
            self.backward_s, offsets = slowed_backward(sim.compute.backward_s, offsets, first, oh.overlap_slowdown)
        self.offsets = offsets
        self.threshold = comm.threshold_bytes or merge.HOROVOD_FUSION_BYTES
        self.cycle = comm.cycle_time_s or merge.HOROVOD_CYCLE_S
        n_it = sim.experiment.iterations
        self.t_backward = np.zeros((n_it, sim.simulated_ranks))  # when each rank's backward started
        self.ready_all: dict[int, np.ndarray] = {}  # per iteration, when each tensor is ready on every rank
        self.registered = [0] * n_it
        self.done = [sim.env.event() for _ in range(n_it)]
        self.fused: list[dict] = []
        sim.env.process(self._loop())

    def closed_form_blocker(self) -> str | None:
        return horovod_blocker(self.sim.experiment.comm.merge)

    def memory(self):
        return estimate(self.sim.experiment, self.describe_buckets())

    def describe_buckets(self) -> list[dict]:
        return self.fused

    def backward_started(self, rank, iteration, sample, t_backward):
        self.t_backward[iteration, rank] = t_backward
        self.registered[iteration] += 1
        return self.done[iteration]

    def _ready(self, it: int) -> np.ndarray:
        """When each tensor of iteration `it` is ready on every rank (all have registered): the latest over ranks
        of t_backward + offset·slowdown, taken over blocks of ranks (the same products and sums one rank at a
        time would take; maxima are exact in any order)."""
        if it not in self.ready_all:
            sim, n = self.sim, self.sim.simulated_ranks
            out = np.full(self.offsets.shape[1], -np.inf)
            step = max(1, (1 << 20) // max(1, len(out)))
            for lo in range(0, n, step):
                hi = min(n, lo + step)
                ready = self.t_backward[it, lo:hi, None] + self.offsets[sim.draws[it, lo:hi]] * \
                    sim.slowdown[lo:hi, None]
                np.maximum(out, ready.max(axis=0, initial=-np.inf), out=out)
            self.ready_all[it] = out
        return self.ready_all[it]

    def _loop(self):
        env, sim = self.sim.env, self.sim
        for it in range(sim.experiment.iterations):
            pending = list(range(len(self.tensors)))
            fused = 0  # fused buffers of this iteration, named in order
            while pending:
                cycle_start = env.now
                if self.registered[it] == sim.simulated_ranks:
                    ready_at = self._ready(it)
                    ready = [i for i in pending if ready_at[i] <= env.now]
                    if ready:
                        done = set(ready)
                        pending = [i for i in pending if i not in done]
                        for bucket in merge.horovod_fuse([self.tensors[i] for i in ready], self.threshold):
                            duration = sim.cost.allreduce(bucket.nbytes)
                            factor = self.calls.next_factor(sim.cost.spread(), sim.ranks)
                            if factor != 1.0:
                                duration = duration * factor
                            copy = self.overheads.copy_s(bucket.nbytes)
                            for what, cost in (("pack", copy), ("overhead", self.overheads.collective_overhead_s)):
                                if cost > 0:
                                    yield from self._busy(it, f"fused{fused}.{what}", cost)
                            start = env.now
                            yield env.timeout(duration)
                            # the same interval on every rank: one block of records (simfog.span_log)
                            sim.log.record_block(range(sim.simulated_ranks), it, "comm", f"fused{fused}", start,
                                                 env.now)
                            if copy > 0:
                                yield from self._busy(it, f"fused{fused}.unpack", copy)
                            if it == 0:
                                self.fused.append({"bucket": fused, "tensors": len(bucket.tensors),
                                                   "bytes": bucket.nbytes, "allreduce_s": duration})
                            fused += 1
                if pending:
                    # A cycle that took longer than cycle_time is followed at once (Horovod's RunLoopOnce).
                    yield env.timeout(max(cycle_start + self.cycle - env.now, 0.0))
            self.done[it].succeed()

    def _busy(self, it: int, name: str, seconds: float):
        """Every rank's communication stream busy `seconds` with `name` (a copy or the launch overhead)."""
        env = self.sim.env
        start = env.now
        yield env.timeout(seconds)
        self.sim.log.record_block(range(self.sim.simulated_ranks), it, "comm", name, start, env.now)


class WAGMA(TrainingAlgorithm):
    """WAGMA-SGD: wait-avoiding group averaging (groups of comm.group_size, a global average every global_every)."""

    def __init__(self, sim):
        super().__init__(sim)
        exp, comm = sim.experiment, sim.experiment.comm
        self.n = n = sim.simulated_ranks
        self.nbytes = float(exp.workload.trace.nbytes)
        self.eps = comm.consensus_eps or DEFAULT_CONSENSUS_EPS
        if n & (n - 1):
            raise Infeasible(f"algorithm wagma needs a power of two ranks; got {n}")
        self.group_size = comm.group_size or min(WAGMA_GROUP_SIZE, n)
        s = self.group_size
        if s & (s - 1) or not 2 <= s <= max(n, 2):
            raise ConfigError("comm.group_size", s, f"a power of two from 2 to the rank count ({n})")
        self.global_every = comm.global_every or WAGMA_GLOBAL_EVERY
        self.wait_for_group = bool(comm.wait_for_group)
        self.overhead_s = exp.overheads().collective_overhead_s  # per group or global operation
        bits = n.bit_length() - 1
        self.layouts = wagma_layouts(n, s)
        self.masks = [sum(1 << b for b in layout) for layout in self.layouts]  # a rank's group id: rank & ~mask
        self.sizes = [2 ** len(layout) for layout in self.layouts]            # members per group
        self._group_s: dict[int, np.ndarray] = {}
        if n == 1:
            self.global_s = 0.0
        elif comm.global_collective:
            self.global_s = sim.cost.allreduce(self.nbytes) + self.overhead_s
        else:
            self.global_s = self._rounds(tuple(range(bits))).max() + self.overhead_s
        self.ops: dict[tuple[int, int], list] = {}     # (iteration, group id) -> [start, end, event, members seen]
        self.blocking: dict[tuple[int, int], object] = {}  # wait_for_group: (iteration, group id) -> Collective
        self.globals: dict[int, object] = {}
        self.starts = [[] for _ in range(n)]            # per rank: when each of its iterations began
        self.calls = sim.variation.sequence("wagma.operations")  # per-call variation (simfog.variation)

    # --- costs --------------------------------------------------------------------------------------------------

    def _rounds(self, bits: tuple[int, ...]) -> np.ndarray:
        return recursive_doubling_seconds(self.sim.experiment.cluster, self.n, self.nbytes, bits)

    def _ring(self, bits: tuple[int, ...]) -> np.ndarray:
        return group_ring_seconds(self.sim.experiment.cluster, self.n, self.nbytes, bits)

    def group_seconds(self, layout: int) -> np.ndarray:
        """Seconds of the group operation of each rank's group under layout `layout` (rank-indexed)."""
        if layout not in self._group_s:
            cost = self._ring if self.sim.experiment.comm.group_collective else self._rounds
            self._group_s[layout] = cost(self.layouts[layout]) + self.overhead_s
        return self._group_s[layout]

    def is_global(self, iteration: int) -> bool:
        return (iteration + 1) % self.global_every == 0

    def _varied(self, seconds: float, layout: int | None = None, gid: int = 0) -> float:
        """`seconds` of one group operation (layout and group id; None: the global one) times its slowest member's
        factor (simfog.variation), drawn in the order the engine starts them."""
        cost = self.sim.cost
        if not (cost.cluster.nic.spread or cost.cluster.intra.spread):
            return seconds
        members = None if layout is None else [gid | sum(1 << b for b, on in zip(self.layouts[layout], pick) if on)
                                                for pick in itertools.product((0, 1), repeat=len(self.layouts[layout]))]
        factor = self.calls.next_factor(cost.spread(members), self.n if members is None else len(members))
        return seconds * factor if factor != 1.0 else seconds

    # --- the event engine's hooks -------------------------------------------------------------------------------

    def backward_started(self, rank, iteration, sample, t_backward):
        sim = self.sim
        c = sim.compute
        self.starts[rank].append(t_backward - c.forward_s[sample] * sim.slowdown[rank] - sim.delays[iteration, rank])
        if self.n == 1:
            return None
        if self.is_global(iteration):
            return sim.env.process(self._global(rank, iteration))
        layout = iteration % len(self.layouts)
        gid = rank & ~self.masks[layout]
        if self.wait_for_group:
            return sim.env.process(self._blocking_group(rank, iteration, layout, gid))
        key, now = (iteration, gid), sim.env.now
        op = self.ops.get(key)
        if op is None:  # the first member triggers the group's collective
            d = self._varied(float(self.group_seconds(layout)[rank]), layout, gid)
            op = self.ops[key] = [now, now + d, sim.env.timeout(d), 0]
        op[3] += 1
        if op[3] == self.sizes[layout]:
            del self.ops[key]
        for it, s, e in split_by_iteration(self.starts[rank], iteration, op[0], op[1]):
            sim.record(rank, it, "comm", "group", s, e)
        return op[2] if op[1] > now else None

    def _blocking_group(self, rank, iteration, layout, gid):
        """wait_for_group: the group's operation starts when its last member has arrived; every member waits."""
        key = (iteration, gid)
        coll = self.blocking.get(key)
        if coll is None:
            coll = self.blocking[key] = Collective(self.sim.env, 2 ** len(self.layouts[layout]),
                                                   self._varied(float(self.group_seconds(layout)[rank]), layout,
                                                                gid), "group")
        arrived = self.sim.env.now
        done = coll.join()
        if coll.arrived == coll.expected:
            del self.blocking[key]
        yield done
        if coll.start > arrived:
            self.sim.record(rank, iteration, "wait", "group", arrived, coll.start)
        self.sim.record(rank, iteration, "comm", "group", coll.start, coll.end)

    def _global(self, rank, iteration):
        coll = self.globals.get(iteration)
        if coll is None:
            coll = self.globals[iteration] = Collective(self.sim.env, self.n, self._varied(self.global_s), "global")
        arrived = self.sim.env.now
        yield coll.join()
        if coll.start > arrived:
            self.sim.record(rank, iteration, "wait", "global", arrived, coll.start)
        self.sim.record(rank, iteration, "comm", "global", coll.start, coll.end)

    def describe_buckets(self) -> list[dict]:
        if self.n == 1:
            return []
        return [{"bucket": 0, "bytes": int(self.nbytes), "group_size": self.group_size, "layouts": len(self.layouts),
                 "group_s": float(self.group_seconds(0).max()), "global_s": float(self.global_s),
                 "global_every": self.global_every}]

    def mixing(self) -> dict | None:
        """Group averaging without staleness: one layout averages its bits exactly, so the product over all layouts
        (or one global step) is the exact average J; before that the error is 1 (‖Π − J‖₂ over a direction no
        layout has touched yet). Spectral gap over that period: 1."""
        if self.n == 1:
            return None
        covered, full, k = set(), set(range(self.n.bit_length() - 1)), 0
        while covered != full:
            covered = full if self.is_global(k) else covered | set(self.layouts[k % len(self.layouts)])
            k += 1
        return {"topology": f"wagma groups of {self.group_size}", "spectral_gap": 1.0,
                "iterations_to_consensus": k if self.eps < 1 else 0, "consensus_eps": self.eps,
                "averaging_rounds_per_iteration": 1.0}


class AsyncModelAverage(TrainingAlgorithm):
    """BAGUA asynchronous model averaging: a background allreduce of the weights every 500 ms; training never waits."""

    def __init__(self, sim):
        super().__init__(sim)
        exp = sim.experiment
        self.n = sim.simulated_ranks
        self.iterations = exp.iterations
        self.nbytes = float(exp.workload.trace.nbytes)
        self.period_s = exp.comm.async_period_s or BAGUA_ASYNC_PERIOD_S
        self.eps = exp.comm.consensus_eps or DEFAULT_CONSENSUS_EPS
        self.round_s = sim.cost.time("broadcast", 1) + sim.cost.allreduce(self.nbytes)
        self.calls = sim.variation.sequence("async.rounds")  # per-call variation (simfog.variation)
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
            factor = self.calls.next_factor(self.sim.cost.spread(), self.sim.ranks)
            yield env.timeout(self.round_s * factor if factor != 1.0 else self.round_s)
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
