"""The static-bucket allreduce family's program on the event engine: each rank launches its buckets in order on its
communication stream (or on up to comm.streams at once, sharing the links), each bucket's collective starting when
its last rank has arrived; packs, launch overheads and unpacks on the stream around it. The family's docstring
(simfog.algorithms.allreduce) says what is modelled; its closed forms solve this very program.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from simfog import merge
from simfog.algorithms.allreduce.plan import (
    bucket_ready,
    shared_allreduce_time,
    slowed_backward,
    static_plan,
    tensor_ready_offsets,
)
from simfog.engine.events import Collective, SharedChannel
from simfog.engine.protocol import TrainingAlgorithm
from simfog.memory import estimate
from simfog.overheads import CommOverheads
from simfog.results import PATH_ANALYTIC


class AllreduceSGD(TrainingAlgorithm):
    """Data-parallel SGD: bucketed gradient allreduce overlapping backward (DDP, Horovod, BAGUA, MG-WFBP...)."""

    symmetric = True
    symmetric_draws = True  # every bucket's collective is among all ranks
    overheads = CommOverheads()  # none, for subclasses that do not model them (compressed algorithms)
    # The event-engine methods the closed forms replay: a subclass (or a patch) that defines one anew runs a
    # program they do not know.
    program_methods = ("_comm_stream", "backward_started", "_collective")

    @classmethod
    def for_experiment(cls, experiment) -> type[TrainingAlgorithm]:
        """Horovod's cycles (merge = "horovod") fuse at run time: simfog.algorithms.dynamic runs them."""
        if experiment.comm.merge in merge.DYNAMIC:
            from simfog.algorithms.dynamic.program import HorovodAllreduce

            return HorovodAllreduce
        return cls

    def __init__(self, sim):
        super().__init__(sim)
        comm = sim.experiment.comm
        tensors, offsets = tensor_ready_offsets(sim)
        self.overheads = oh = sim.experiment.overheads()
        # A policy that reasons about cost (MG-WFBP's a + b·M) sees what one bucket's collective costs the rank's
        # stream: the wire time, the launch overhead and both copies (what merging two buckets saves or adds).
        self.buckets = static_plan(sim.experiment, sim.cost)
        # A bucket is launched when its last gradient is ready: (samples, buckets).
        self.ready = bucket_ready(self.buckets, tensors, offsets)
        if oh.overlap_slowdown != 1.0:  # collectives run from the first bucket's launch
            self.backward_s, self.ready = slowed_backward(sim.compute.backward_s, self.ready,
                                                          self.ready.min(axis=1, keepdims=True), oh.overlap_slowdown)
        self.durations = [sim.cost.allreduce(b.nbytes) for b in self.buckets]
        self._start_collectives()
        self.streams = comm.streams
        self.channel = None
        if self.streams > 1:
            self.channel = SharedChannel(sim.env, shared_allreduce_time(sim.cost))

    def closed_form_blocker(self) -> str | None:
        """None when the closed form solves this run (static buckets launched in order: the schedule is fixed
        before the run; on several streams, the collectives sharing links are replayed by closed_form_streams,
        which says itself where it cannot), else why the event engine must run it."""
        redefined = self.redefined(AllreduceSGD, self.program_methods)
        if redefined is not None:
            return f"algorithm {self.sim.experiment.comm.algorithm!r} overrides {redefined}"
        if self.whole_iterations:
            return "the algorithm runs whole iterations itself"
        if self.streams > 1:  # collectives sharing links
            from simfog.algorithms.allreduce.closed_form_streams import blocker

            return blocker(self)
        return None

    def closed_form(self):
        """The run solved over every rank at once (closed_form; closed_form_streams on several streams), imported
        when asked: a run needs one family's closed form, not every family's."""
        if self.streams > 1:
            from simfog.algorithms.allreduce.closed_form_streams import run

            return run(self.sim, PATH_ANALYTIC)
        from simfog.algorithms.allreduce.closed_form import run

        return run(self.sim)

    def memory(self):
        return estimate(self.sim.experiment, self.describe_buckets())

    def _start_collectives(self) -> None:
        """An empty table of (iteration, bucket) collectives."""
        self.collectives: dict[tuple[int, int], Collective] = {}

    def describe_buckets(self) -> list[dict]:
        return [{"bucket": i, "tensors": len(b.tensors), "bytes": b.nbytes, "allreduce_s": d}
                for i, (b, d) in enumerate(zip(self.buckets, self.durations))]

    def wire_durations(self) -> tuple[list[float], list[float] | None]:
        """(the part of each bucket's duration that varies per call, the part that does not or None): the whole
        collective here; a compressed allreduce keeps its codec apart."""
        return self.durations, None

    @cached_property
    def call_factors(self) -> np.ndarray | None:
        """(iterations, buckets): the factor of each bucket's collective in each iteration, its slowest rank's
        among all ranks (simfog.variation), or None when nothing varies."""
        sim = self.sim
        return sim.variation.factors("allreduce.buckets", np.full(len(self.buckets), sim.cost.spread()), sim.ranks)

    @cached_property
    def varied(self) -> np.ndarray | None:
        """(iterations, buckets): each bucket's collective time in each iteration, the wire part times its
        factor (`call_factors`), or None when nothing varies. The event engine and the closed form read this one
        table."""
        f = self.call_factors
        if f is None:
            return None
        wire, fixed = self.wire_durations()
        out = np.asarray(wire, dtype=float) * f
        return out if fixed is None else out + np.asarray(fixed, dtype=float)

    @cached_property
    def _varied_rows(self) -> list[list[float]]:
        return self.varied.tolist()

    def duration(self, iteration: int, b: int) -> float:
        """Bucket b's collective time in `iteration` (its cost-model time when nothing varies)."""
        return self.durations[b] if self.varied is None else self._varied_rows[iteration][b]

    def backward_started(self, rank, iteration, sample, t_backward):
        return self.sim.env.process(self._comm_stream(rank, iteration, sample, t_backward))

    def _collective(self, iteration: int, b: int):
        key = (iteration, b)
        coll = self.collectives.get(key)
        if coll is None:
            factor = 1.0 if self.call_factors is None else float(self.call_factors[iteration, b])
            coll = self.collectives[key] = Collective(self.sim.env, self.sim.simulated_ranks,
                                                      self.duration(iteration, b), f"bucket{b}", self.channel,
                                                      self.buckets[b].nbytes, factor)
        return coll

    def _comm_stream(self, rank, iteration, sample, t_backward):
        env, ready, record = self.sim.env, self.ready[sample], self.sim.record
        slow = self.sim.slowdown[rank]
        in_flight: list[tuple[float, object]] = []  # (arrival, collective), launch order
        running: list = []                          # done events of collectives not yet finished
        finished: list = []                         # per bucket: its collective (and unpack) done
        extra: list[tuple[str, float, float]] = []  # pack / overhead / unpack intervals
        overhead = self.overheads.collective_overhead_s
        for b in range(len(self.buckets)):
            launch = t_backward + ready[b] * slow
            if launch > env.now:  # buckets launch in order: a ready bucket waits for the earlier ones
                yield env.timeout(launch - env.now)
            if self.streams > 1:
                running = [e for e in running if not e.processed]
                while len(running) >= self.streams:  # every stream is busy: wait for one to free
                    yield env.any_of(running)
                    running = [e for e in running if not e.processed]
            coll = self._collective(iteration, b)
            copy = self.overheads.copy_s(self.buckets[b].nbytes)
            for what, cost in (("pack", copy), ("overhead", overhead)):
                if cost > 0:
                    t = env.now
                    yield env.timeout(cost)
                    extra.append((f"{coll.name}.{what}", t, env.now))
            in_flight.append((env.now, coll))
            event = coll.join()
            if copy > 0:
                event = env.process(_unpack(env, coll, event, copy, extra))
            finished.append(event)
            if self.streams == 1:
                yield event
            else:
                running.append(event)
        for event in finished:
            if not event.processed:
                yield event
        for arrived, coll in in_flight:
            if coll.start > arrived:
                record(rank, iteration, "wait", coll.name, arrived, coll.start)
            record(rank, iteration, "comm", coll.name, coll.start, coll.end)
        for name, start, end in extra:
            record(rank, iteration, "comm", name, start, end)


def _unpack(env, coll, done, seconds: float, extra: list):
    """After the collective: copy the bucket back out of its flat buffer (on that collective's stream)."""
    yield done
    start = env.now
    yield env.timeout(seconds)
    extra.append((f"{coll.name}.unpack", start, env.now))
