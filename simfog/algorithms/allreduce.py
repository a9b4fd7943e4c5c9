"""Allreduce-SGD: gradients merged into buckets (simfog.merge) and allreduced among all ranks, overlapping backward.

Static policies launch buckets strictly in order on each rank's communication stream; Horovod's fusion happens at
run time in a background cycle that fuses only tensors ready on every rank (its negotiation).

Costs beyond the wire (simfog.overheads, `Experiment.overheads()`): each bucket (fused buffer) of M bytes pays
M/bucket_copy_Bps to pack before its collective, collective_overhead_s to launch it, and M/bucket_copy_Bps to unpack
after it, all on the rank's communication stream (recorded as "comm" intervals named `<bucket>.pack`,
`<bucket>.overhead`, `<bucket>.unpack`). The overlap slowdown is approximated: backward runs overlap_slowdown
times slower from the moment the first bucket is launched (Horovod: the first gradient is ready) to its end,
whether or not a collective is still running then; gradient-ready times after that moment stretch alike. This
over-estimates the slowdown where the collectives finish well before backward does.
"""

from __future__ import annotations

import numpy as np

from simfog import merge
from simfog.algorithms.registry import REGISTRY
from simfog.events import Collective, SharedChannel
from simfog.overheads import CommOverheads, stretch_after


def _settings(comm) -> merge.MergeSettings:
    return merge.MergeSettings(threshold_bytes=comm.threshold_bytes, cycle_time_s=comm.cycle_time_s)


def _tensor_ready_offsets(sim) -> tuple[list, np.ndarray]:
    """The gradient tensors in ready order and, per trace sample, when each is ready after backward starts."""
    trace = sim.experiment.workload.trace
    tensors = merge.grad_tensors(trace)
    layer = trace.layer_index()
    cols = np.array([layer[t.name] for t in tensors], dtype=int)
    return tensors, sim.compute.layer_end_s[:, cols]


def static_plan(experiment, cost=None) -> tuple[merge.Bucket, ...]:
    """The buckets the engine launches for `experiment` under a static merge policy (every policy but horovod's
    cycles), in launch order: the policy applied to the trace's gradients in ready order with the cost one bucket
    pays on the communication stream (wire time, launch overhead, both copies). `cost`: the experiment's
    CostModel when already built. The validator runs exactly this plan."""
    comm = experiment.comm
    cost = cost or experiment.cost_model()
    return merge.plan(comm.merge, merge.grad_tensors(experiment.workload.trace), _settings(comm),
                      _bucket_cost(cost.allreduce, experiment.overheads()))


def _bucket_cost(allreduce, oh: CommOverheads):
    """allreduce_time(nbytes) plus the overheads one bucket pays on the communication stream."""
    if not oh.any:
        return allreduce
    return lambda nbytes: allreduce(nbytes) + oh.collective_overhead_s + 2 * oh.copy_s(nbytes)


@REGISTRY.register("allreduce")
class AllreduceSGD:
    """Data-parallel SGD: bucketed gradient allreduce overlapping backward (DDP, Horovod, BAGUA, MG-WFBP...)."""

    symmetric = True
    overheads = CommOverheads()  # none, for subclasses that do not model them (compressed algorithms)
    backward_s = None            # the engine's own backward, unless the overlap slowdown lengthens it

    def __init__(self, sim):
        self.sim = sim
        comm = sim.experiment.comm
        tensors, offsets = _tensor_ready_offsets(sim)
        self.overheads = oh = sim.experiment.overheads()
        self.dynamic = comm.merge in merge.DYNAMIC
        if self.dynamic:
            if oh.overlap_slowdown != 1.0 and offsets.size:
                first = offsets.min(axis=1, keepdims=True)  # collectives can run from the first ready gradient
                offsets = self._slow_backward(offsets, first)
            self._impl = _HorovodCycles(sim, tensors, offsets, _settings(comm), oh)
            return
        # A policy that reasons about cost (MG-WFBP's a + b·M) sees what one bucket's collective costs the rank's
        # stream: the wire time, the launch overhead and both copies (what merging two buckets saves or adds).
        self.buckets = static_plan(sim.experiment, sim.cost)
        index = {t.name: i for i, t in enumerate(tensors)}
        # A bucket is launched when its last gradient is ready: (samples, buckets).
        self.ready = np.stack([offsets[:, [index[n] for n in b.tensors]].max(1) for b in self.buckets], axis=1)
        if oh.overlap_slowdown != 1.0:
            self.ready = self._slow_backward(self.ready, self.ready.min(axis=1, keepdims=True))
        self.durations = [sim.cost.allreduce(b.nbytes) for b in self.buckets]
        self._start_collectives()
        self.streams = comm.streams
        self.channel = None
        if self.streams > 1:
            self.channel = SharedChannel(sim.env, _shared_allreduce_time(sim.cost))

    def analytic_blocker(self) -> str | None:
        """None when simfog.analytic can solve this run in closed form (static buckets launched in order: the
        schedule is fixed before the run; on several streams, the collectives sharing links are replayed by
        simfog.analytic_streams, which says itself where it cannot), else why the event engine must run it."""
        name = self.sim.experiment.comm.algorithm
        for method in ("_comm_stream", "backward_started", "_collective"):  # a subclass (or a patch) that changes
            if getattr(getattr(self, method), "__func__", None) is not getattr(AllreduceSGD, method):  # the schedule
                return f"algorithm {name!r} overrides {method}"
        if getattr(self, "run_iteration", None) is not None:
            return "the algorithm runs whole iterations itself"
        if self.dynamic:
            return f"merge {self.sim.experiment.comm.merge!r} fuses at run time"
        return None

    def _start_collectives(self) -> None:
        """An empty table of (iteration, bucket) collectives."""
        self.collectives: dict[tuple[int, int], Collective] = {}

    def _slow_backward(self, ready: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Stretch backward after `first` (samples, 1) by the overlap slowdown: sets self.backward_s (what the
        engine runs) and returns `ready` (samples, n), times from backward's start, stretched alike."""
        f = self.overheads.overlap_slowdown
        self.backward_s = stretch_after(self.sim.compute.backward_s, first[:, 0], f)
        return stretch_after(ready, first, f)

    def describe_buckets(self) -> list[dict]:
        if self.dynamic:
            return self._impl.describe_buckets()
        return [{"bucket": i, "tensors": len(b.tensors), "bytes": b.nbytes, "allreduce_s": d}
                for i, (b, d) in enumerate(zip(self.buckets, self.durations))]

    def backward_started(self, rank, iteration, sample, t_backward):
        if self.dynamic:
            return self._impl.backward_started(rank, iteration, sample, t_backward)
        return self.sim.env.process(self._comm_stream(rank, iteration, sample, t_backward))

    def _collective(self, iteration: int, b: int):
        key = (iteration, b)
        coll = self.collectives.get(key)
        if coll is None:
            coll = self.collectives[key] = Collective(self.sim.env, self.sim.simulated_ranks,
                                                                self.durations[b], f"bucket{b}", self.channel,
                                                                self.buckets[b].nbytes)
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


def _shared_allreduce_time(cost):
    """duration(nbytes, k): allreduce time when k collectives share every link's bandwidth (latency unshared; a
    link's flow cap, simfog.cluster.Link, still bounds each collective's flow)."""
    from dataclasses import replace

    models = {}

    def duration(nbytes: float, k: int) -> float:
        if k not in models:
            c = cost.cluster
            cluster = replace(c, intra=c.intra.with_bandwidth(c.intra.bandwidth_Bps / k),
                              nic=c.nic.with_bandwidth(c.nic.bandwidth_Bps / k),
                              degraded_nics=tuple((n, bw / k) for n, bw in c.degraded_nics))
            beta = None if cost.beta_s_per_B is None else cost.beta_s_per_B * k
            models[k] = replace(cost, cluster=cluster, beta_s_per_B=beta)
        return models[k].allreduce(nbytes)

    return duration


class _HorovodCycles:
    """Horovod's background loop: every cycle, negotiate which tensors are ready on all ranks, fuse them up to the
    fusion threshold, allreduce the fused buffers one after another; sleep until the next cycle is due."""

    def __init__(self, sim, tensors, offsets, settings: merge.MergeSettings, overheads):
        self.sim, self.tensors, self.offsets, self.overheads = sim, tensors, offsets, overheads
        self.threshold = settings.threshold_bytes or merge.HOROVOD_FUSION_BYTES
        self.cycle = settings.cycle_time_s or merge.HOROVOD_CYCLE_S
        n_it = sim.experiment.iterations
        self.t_backward = np.zeros((n_it, sim.simulated_ranks))  # when each rank's backward started
        self.ready_all: dict[int, np.ndarray] = {}  # per iteration, when each tensor is ready on every rank
        self.registered = [0] * n_it
        self.done = [sim.env.event() for _ in range(n_it)]
        self.fused: list[dict] = []
        sim.env.process(self._loop())

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
                            copy = self.overheads.copy_s(bucket.nbytes)
                            for what, cost in (("pack", copy), ("overhead", self.overheads.collective_overhead_s)):
                                if cost > 0:
                                    yield from self._busy(it, f"fused{fused}.{what}", cost)
                            start = env.now
                            yield env.timeout(duration)
                            # the same interval on every rank: one block of records (simfog.interval_log)
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
