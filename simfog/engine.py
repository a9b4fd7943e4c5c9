"""The event engine: every rank an explicit SimPy process with a compute stream and a communication stream.

The engine knows nothing about GPUs or networks. It runs each rank's compute (forward, backward, optimizer step)
from the trace, tells the training algorithm when backward starts, and lets the algorithm drive the rank's
communication stream through `Collective` rendezvous; durations come from pure cost functions.

Compute draws: with compute = "samples", each (iteration, rank) draws one recorded iteration k of the trace and
uses sample k of every layer, so layer times keep the correlation they had when measured and stragglers arise
from the data. With compute = "mean", every layer takes its mean time; "replay" runs recorded iteration i mod S
at simulated iteration i on every rank (a measured run reproduced in order).
A trace of several recorded ranks (ModelTrace.sample_ranks, `simfog import kineto DIR`) keeps each rank's own
compute: each simulated iteration draws one recorded iteration k, and simulated rank r takes recorded rank
(r mod R)'s sample of iteration k, so the ranks differ as the measured ones did in that very iteration; "mean"
gives each recorded rank its own means.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import numpy as np
import simpy

from simfog.experiment import Experiment
from simfog.interval_log import IntervalLog, iteration_columns
from simfog.results import Result
from simfog.units import LIMITS


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
        host = np.asarray(getattr(trace, "host_s", ()), dtype=float)
        if host.size != fwd.shape[0]:
            host = np.full(fwd.shape[0], host.mean() if host.size else 0.0)
        ranks = np.asarray(getattr(trace, "sample_ranks", ()), dtype=int)
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

    def draw(self, rng: np.random.Generator, iterations: int, ranks: int, *, replay: bool = False) -> np.ndarray:
        """(iterations, ranks) rows: one independent draw per (iteration, rank); with recorded ranks, one recorded
        iteration per simulated iteration, simulated rank r taking recorded rank (r mod R)'s row of it. `replay`:
        recorded iteration i mod S at simulated iteration i instead of a draw (rng untouched)."""
        rows = self.rank_rows if self.rank_rows is not None else np.arange(self.samples)[None, :]
        if replay:
            k = np.arange(iterations) % rows.shape[1]
        elif self.rank_rows is None:
            return rng.integers(0, self.samples, size=(iterations, ranks))
        else:
            k = rng.integers(0, rows.shape[1], size=iterations)
        return rows[np.arange(ranks) % len(rows)][:, k].T

    @property
    def samples(self) -> int:
        return self.forward_s.shape[0]

    def single_rank_time_s(self) -> float:
        """Mean iteration time of one rank with no communication: the reference for scaling efficiency."""
        return float(np.mean(self.forward_s + self.backward_s + self.optimizer_s))


# The longest run simfog simulates (s) and how it is said: the longest time a quantity may say, so that a bandwidth
# too small or a latency too large is refused rather than answered with an iteration of 1e9 s or more.
MAX_RUN_SECONDS, MAX_RUN_TEXT = LIMITS["time"]


class Simulation:
    """One experiment on the event engine, with `algorithm` the training algorithm's class (simfog.algorithms; build
    one through simfog.simulation.new_simulation, which looks it up). `symmetric` simulates a single representative
    rank and is allowed only when all ranks are provably identical (see `symmetric_allowed`); None picks it
    automatically. `path`: "analytic"
    (simfog.analytic: schedules fixed before the run, solved in closed form over every rank at once), "events" (this
    engine) or None: analytic where it applies (`simfog.analytic.why_events`; a run that meets a tie only SimPy's
    event order settles hands itself over, simfog.errors.Handover), the same times bit for bit."""

    def __init__(self, experiment: Experiment, algorithm: type, *, symmetric: bool | None = None,
                 path: str | None = None):
        self.experiment = exp = experiment
        self.algorithm_class = algorithm
        self.path_requested = path
        self.env = simpy.Environment()
        self.compute = ComputeModel.from_trace(exp.workload.trace, exp.workload.compute)
        self.cost = exp.cost_model()
        allowed = self.symmetric_allowed()
        if symmetric and not allowed:
            raise ValueError("symmetric fast path requested, but ranks are not provably identical")
        self.symmetric = allowed if symmetric is None else symmetric
        self.ranks = exp.ranks
        self.simulated_ranks = 1 if self.symmetric else self.ranks
        rng = np.random.default_rng(exp.seed)
        self.draws = self.compute.draw(rng, exp.iterations, self.ranks, replay=exp.workload.compute == "replay")
        self.slowdown, self.delays = _heterogeneity(exp, rng)
        # Every interval recorded, as numpy columns (simfog.interval_log). Algorithms call
        # `record(rank, iteration, kind, name, start, end)` for one, `log.record_block` for a block of ranks.
        self.log = IntervalLog()
        self.record = self.log.record
        self.finished = [0] * self.simulated_ranks  # iterations each simulated rank has completed
        self.algorithm = algorithm(self)
        # Per trace sample, how long backward takes: an algorithm may lengthen it (comm.overlap_slowdown).
        slowed = getattr(self.algorithm, "backward_s", None)
        self.backward_s = self.compute.backward_s if slowed is None else slowed
        self.memory = self._memory()

    def _memory(self):
        """Memory per rank (simfog.memory; an algorithm that shards state gives its own `memory()`). Raises
        Infeasible when it exceeds the cluster's gpu_memory."""
        from simfog.errors import Infeasible
        from simfog.memory import BUCKETED, estimate

        exp = self.experiment
        own = getattr(self.algorithm, "memory", None)
        if callable(own):
            memory = own()
        else:
            memory = estimate(exp, self.algorithm.describe_buckets() if exp.comm.algorithm in BUCKETED else ())
        limit = exp.cluster.gpu_memory_B
        if limit is not None and memory.peak_B > limit:
            from simfog.units import format_bytes

            raise Infeasible(f"needs {format_bytes(memory.peak_B)} per rank (parameters "
                             f"{format_bytes(memory.parameters_B)}, gradients {format_bytes(memory.gradients_B)}, "
                             f"optimizer {format_bytes(memory.optimizer_B)}, buffers {format_bytes(memory.buffers_B)}, activations "
                             f"{format_bytes(memory.activations_B or 0)}, activation gradients "
                             f"{format_bytes(memory.activation_grads_B or 0)}), over cluster.gpu_memory = "
                             f"{format_bytes(limit)}")
        return memory

    def symmetric_allowed(self) -> bool:
        """All ranks are identical when every layer time is fixed and the algorithm treats ranks alike."""
        exp = self.experiment
        fixed = self.compute.samples == 1
        return fixed and exp.homogeneous and getattr(self.algorithm_class, "symmetric", False)

    def single_rank_time_s(self) -> float:
        """The reference of scaling efficiency: the mean time one rank alone (no communication) takes for the very
        compute draws and slowdowns of this run, over every (iteration, rank). The run's mean iteration is at least
        this (each rank's own iterations, done one after another, end before the last iteration does), so the
        efficiency never exceeds 1; with fixed layer times and no slowdowns it is the trace's mean step."""
        c = self.compute
        per_draw = c.forward_s + c.backward_s + c.optimizer_s
        ranks = self.simulated_ranks
        return float(np.mean(per_draw[self.draws[:, :ranks]] * self.slowdown[None, :ranks]))

    def _check_finished(self) -> None:
        """Raise SimfogError when a simulated rank did not finish every iteration: a summary of such a run would
        average ranks that never got there."""
        from simfog.errors import SimfogError

        want = self.experiment.iterations
        short = [r for r in range(self.simulated_ranks) if self.finished[r] < want]
        if short:
            first = short[0]
            got = self.finished[first]
            raise SimfogError(f"rank{'s' if len(short) > 1 else ''} {', '.join(map(str, short[:8]))}"
                              f"{' ...' if len(short) > 8 else ''} did not finish all {want} iterations (rank "
                              f"{first} finished {got}): a collective never completed or a duration was infinite")

    def _step_times(self) -> tuple[list, list, list]:
        """Per iteration and simulated rank (lists of Python floats), the engine's forward (with the straggler
        delay), backward and optimizer durations: the products and sums `_rank` would take one by one, taken over
        arrays at once (the same operations, so the same bits); SimPy's clock and heap then hold Python floats."""
        c, n = self.compute, self.simulated_ranks
        s, slow = self.draws[:, :n], self.slowdown[:n]
        return ((c.forward_s[s] * slow + self.delays[:, :n]).tolist(), (self.backward_s[s] * slow).tolist(),
                (c.optimizer_s[s] * slow).tolist())

    def _rank(self, rank: int, times: tuple | None):
        env, record = self.env, self.record
        # An algorithm whose communication gates compute (sharded data parallelism: a unit's forward waits for its
        # parameters' all-gather) runs each whole iteration itself and records its own intervals (forward and
        # backward may then come in several pieces).
        own = getattr(self.algorithm, "run_iteration", None)
        if own is not None:
            slow = self.slowdown[rank]
            for it in range(self.experiment.iterations):
                yield from own(rank, it, self.draws[it, rank], slow, self.delays[it, rank])
                self.finished[rank] += 1
            return
        forward, backward, optimizer = times
        backward_started = self.algorithm.backward_started
        for it in range(self.experiment.iterations):
            t0 = env.now
            yield env.timeout(forward[it][rank])
            t_b = env.now
            record(rank, it, "forward", "forward", t0, t_b)
            comm_done = backward_started(rank, it, self.draws[it, rank], t_b)
            yield env.timeout(backward[it][rank])
            t_e = env.now
            record(rank, it, "backward", "backward", t_b, t_e)
            if comm_done is not None:
                yield comm_done
            t_o = env.now
            yield env.timeout(optimizer[it][rank])
            record(rank, it, "optimizer", "optimizer", t_o, env.now)
            self.finished[rank] += 1

    def run(self, *, progress: bool = False) -> Result:
        """Simulate every iteration of every rank. Returns the Result (intervals and summary). `progress`: count
        events on a bar (stderr, on a terminal only); the total is not known ahead. Raises Infeasible for a run
        that would last longer than MAX_RUN_SECONDS."""
        result = self._run(progress)
        end = float(result._columns()["end_s"].max())
        if not end <= MAX_RUN_SECONDS:
            from simfog.errors import Infeasible

            raise Infeasible(f"{self.experiment.source or 'the experiment'}: the run would last {end:.3g} s, more "
                             f"than {MAX_RUN_TEXT}: {self._slowest()}")
        return result

    def _slowest(self) -> str:
        """What makes one iteration longest, for the message of a run too long: the mean compute, or the time one
        iteration's gradients take over each link (a bandwidth too small, a latency too large)."""
        from simfog import units

        exp, nbytes = self.experiment, self.experiment.workload.trace.nbytes
        c, network = exp.cluster, exp.network
        where = {"intra": "cluster.intra_bandwidth / intra_latency", "nic": "cluster.nic_bandwidth / nic_latency"}
        if network is not None:
            where = {"intra": f"{network.path}: nccl.intra_bus_bandwidth", "nic": f"{network.path}: "
                     "nccl.inter_bus_bandwidth / latency_inter"}
        elif exp.network_trace:
            where = {k: f"the links calibrated from {exp.network_trace}" for k in where}
        times = {f"the trace's compute ({units.format_time(self.single_rank_time_s())} per iteration)":
                 self.single_rank_time_s()}
        for name, link in (("intra", c.intra), ("nic", c.slowest_inter())):
            times[f"{where[name]} ({units.format_bandwidth(link.bandwidth_Bps)}, {units.format_time(link.latency_s)}"
                  f" latency: {link.time(nbytes):.3g} s for one iteration's {units.format_bytes(nbytes)} of "
                  "gradients)"] = link.time(nbytes)
        for field, bw in (("cluster.reduce_bandwidth", c.reduce_Bps), ("comm.encode_bandwidth",
                          exp.comm.encode_bandwidth_Bps), ("comm.bucket_copy_bandwidth", exp.comm.bucket_copy_Bps)):
            if bw:
                times[f"{field} ({units.format_bandwidth(bw)}: {nbytes / bw:.3g} s for one iteration's "
                      f"{units.format_bytes(nbytes)} of gradients)"] = nbytes / bw
        return "the longest part of an iteration is " + max(times, key=times.get)

    def _run(self, progress: bool) -> Result:
        from simfog import analytic
        from simfog.errors import Handover

        if self.path_requested != analytic.PATH_EVENTS:
            why = analytic.why_events(self)
            if why is None:
                try:
                    return analytic.run(self)
                except Handover as handover:  # a tie only SimPy's order of same-instant events settles
                    why = str(handover)
            if self.path_requested == analytic.PATH_ANALYTIC:
                raise ValueError(f"the analytic path was requested, but {why}")
        else:
            only = getattr(self.algorithm, "events_blocker", lambda: None)()
            if only is not None:
                raise ValueError(f"the event engine was requested, but {only}")
        from simfog.progress import bar

        started = time.perf_counter()
        times = None if getattr(self.algorithm, "run_iteration", None) is not None else self._step_times()
        for r in range(self.simulated_ranks):
            self.env.process(self._rank(r, times))
        events = 0
        step, peek, inf = self.env.step, self.env.peek, float("inf")
        # Millions of short-lived events and records: the cyclic garbage collector, run every few hundred
        # allocations, would scan them all again and again (half the run at 10^5 ranks). Reference counting frees
        # what it can; the collector runs again after the loop.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with bar(desc="simulate", unit="event", enabled=progress) as shown:
                while peek() < inf:
                    step()
                    events += 1
                    if not events & 0xFFFF:  # every 65,536 events: a bar update per event would cost more than it
                        shown.update(0x10000)
        finally:
            if collecting:
                gc.enable()
        self._check_finished()
        return Result(self.experiment, None, symmetric=self.symmetric,
                      single_rank_time_s=self.single_rank_time_s(),
                      buckets=self.algorithm.describe_buckets(),
                      events=events, wall_s=time.perf_counter() - started,
                      mixing=getattr(self.algorithm, "mixing", lambda: None)(), memory=self.memory,
                      columns=iteration_columns(self.log, self.simulated_ranks, self.experiment.iterations),
                      make_records=self.log.tuples)


def _heterogeneity(exp: Experiment, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank compute-time factors (ranks,) and per-iteration straggler delays in seconds (iterations, ranks).
    A straggler's delay is added before its backward, as a hiccup during forward."""
    h, rpn = exp.heterogeneity, exp.cluster.ranks_per_node
    slowdown = np.ones(exp.ranks)
    for node, factor in h.node_slowdown:
        slowdown[node * rpn:(node + 1) * rpn] *= factor
    for rank, factor in h.rank_slowdown:
        slowdown[rank] *= factor
    delays = np.zeros((exp.iterations, exp.ranks))
    if h.straggler_rate > 0 and h.straggler_delay_s > 0:
        hit = rng.random(delays.shape) < h.straggler_rate
        size = int(hit.sum())
        d = h.straggler_delay_s
        draw = {"fixed": lambda: np.full(size, d), "exponential": lambda: rng.exponential(d, size),
                "uniform": lambda: rng.uniform(0, 2 * d, size)}[h.straggler_distribution]
        delays[hit] = draw()
    return slowdown, delays
