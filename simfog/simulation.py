"""One simulation, composed: the experiment, its training algorithm (from the registry, simfog.algorithms) and the
engine (simfog.engine). The engine knows nothing of the registry; this module is where the three meet.

`Simulation` sets a run up (the compute model and its draws, the heterogeneity, the cost model, the algorithm, the
memory check) and chooses its path: the algorithm's closed form where it has one (`why_events`; a run that meets a
tie only SimPy's order of same-instant events settles hands itself over, simfog.errors.Handover), else the event
engine (simfog.engine.ranks), the same times bit for bit. Whichever path runs, `Simulation.result` builds the
Result.
"""

from __future__ import annotations

import time
from functools import cached_property

import numpy as np

from simfog import algorithms
from simfog.engine.compute import ComputeModel
from simfog.engine.ranks import rank_program, run_events
from simfog.errors import Handover, Infeasible, SimfogError
from simfog.experiment import Experiment
from simfog.results import PATH_ANALYTIC, PATH_EVENTS, Result
from simfog.span_log import SpanLog, iteration_columns
from simfog.units import LIMITS
from simfog.variation import Variation

# The longest run simfog simulates (s) and how it is said: the longest time a quantity may say, so that a bandwidth
# too small or a latency too large is refused rather than answered with an iteration of 1e9 s or more.
MAX_RUN_SECONDS, MAX_RUN_TEXT = LIMITS["time"]


class Simulation:
    """One experiment, with `algorithm` the training algorithm's class (simfog.engine.protocol.TrainingAlgorithm;
    build one through new_simulation, which looks it up). `symmetric` simulates a single representative rank and is
    allowed only when all ranks are provably identical (see `symmetric_allowed`); None picks it automatically.
    `path`: "analytic" (the algorithm's closed form: schedules fixed before the run, solved over every rank at
    once), "events" (the event engine) or None: the closed form where it applies (`why_events`), else events."""

    def __init__(self, experiment: Experiment, algorithm: type, *, symmetric: bool | None = None,
                 path: str | None = None):
        self.experiment = exp = experiment
        self.algorithm_class = algorithm
        self.path_requested = path
        self.compute = ComputeModel.from_trace(exp.workload.trace, exp.workload.compute)
        self.cost = exp.cost_model()
        # per-call variation of collective times (simfog.variation): the tables algorithms draw from
        self.variation = Variation(exp.comm.variation, exp.seed, exp.iterations)
        allowed = self.symmetric_allowed()
        if symmetric and not allowed:
            raise ValueError("symmetric fast path requested, but ranks are not provably identical")
        self.symmetric = allowed if symmetric is None else symmetric
        self.ranks = exp.ranks
        self.simulated_ranks = 1 if self.symmetric else self.ranks
        rng = np.random.default_rng(exp.seed)
        self.draws = self.compute.draw(rng, exp.iterations, self.ranks, replay=exp.workload.compute == "replay",
                                       shared=exp.workload.compute_shared)
        self.slowdown, self.delays = _heterogeneity(exp, rng)
        # Every interval recorded, as numpy columns (simfog.span_log). Algorithms call
        # `record(rank, iteration, kind, name, start, end)` for one, `log.record_block` for a block of ranks.
        self.log = SpanLog()
        self.record = self.log.record
        self.finished = [0] * self.simulated_ranks  # iterations each simulated rank has completed
        self.algorithm = algorithm(self)
        # Per trace sample, how long backward takes: an algorithm may lengthen it (comm.overlap_slowdown).
        slowed = self.algorithm.backward_s
        self.backward_s = self.compute.backward_s if slowed is None else slowed
        self.memory = self._memory()

    @cached_property
    def env(self):
        """The event engine's clock, made on first use: a run its closed form solves never imports SimPy."""
        import simpy

        return simpy.Environment()

    def _memory(self):
        """Memory per rank (the algorithm's `memory()`). Raises Infeasible when it exceeds the cluster's
        gpu_memory."""
        memory = self.algorithm.memory()
        limit = self.experiment.cluster.gpu_memory_B
        if limit is not None and memory.peak_B > limit:
            from simfog.units import format_bytes

            raise Infeasible(f"needs {format_bytes(memory.peak_B)} per rank (parameters "
                             f"{format_bytes(memory.parameters_B)}, gradients {format_bytes(memory.gradients_B)}, "
                             f"optimizer {format_bytes(memory.optimizer_B)}, buffers {format_bytes(memory.buffers_B)}, "
                             "activations "
                             f"{format_bytes(memory.activations_B or 0)}, activation gradients "
                             f"{format_bytes(memory.activation_grads_B or 0)}), over cluster.gpu_memory = "
                             f"{format_bytes(limit)}")
        return memory

    def symmetric_allowed(self) -> bool:
        """All ranks are identical when every layer time is fixed and the algorithm treats ranks alike, and, when
        call times are drawn per call (simfog.variation), every call the algorithm makes is among all ranks
        (`symmetric_draws`)."""
        exp = self.experiment
        fixed = self.compute.samples == 1
        drawn = exp.comm.variation == "draw" and (exp.cluster.nic.spread or exp.cluster.intra.spread)
        return fixed and exp.homogeneous and self.algorithm_class.symmetric and \
            (not drawn or self.algorithm_class.symmetric_draws)

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
        want = self.experiment.iterations
        short = [r for r in range(self.simulated_ranks) if self.finished[r] < want]
        if short:
            first = short[0]
            got = self.finished[first]
            raise SimfogError(f"rank{'s' if len(short) > 1 else ''} {', '.join(map(str, short[:8]))}"
                              f"{' ...' if len(short) > 8 else ''} did not finish all {want} iterations (rank "
                              f"{first} finished {got}): a collective never completed or a duration was infinite")

    def result(self, columns: dict | None = None, *, path: str, started: float, events: int = 0, finished=None,
               make_records=None, make_columns=None) -> Result:
        """The Result of this run, wherever it was solved: the one place a simulated Result is built. `columns`:
        per (rank, iteration) arrays (simfog.results.ITERATION_COLUMNS), or None: from the intervals the run
        recorded in `log` (which then give the records too); `path` names the path; `started`: its
        time.perf_counter() at the start; `finished`: per rank the iterations done, where the path counted them
        rather than the event engine's ranks; `make_records` and `make_columns` build the per-interval records and
        the columns only frames need, when asked. Raises SimfogError when a rank did not finish every iteration."""
        if finished is not None:
            self.finished = finished.tolist()
        self._check_finished()
        if columns is None:
            columns = iteration_columns(self.log, self.simulated_ranks, self.experiment.iterations)
            make_records = self.log.tuples
        alg = self.algorithm
        return Result(self.experiment, None, symmetric=self.symmetric, single_rank_time_s=self.single_rank_time_s(),
                      buckets=alg.describe_buckets(), events=events, wall_s=time.perf_counter() - started,
                      mixing=alg.mixing(), memory=self.memory, columns=columns, path=path,
                      make_records=make_records, make_columns=make_columns)

    def run(self, *, progress: bool = False) -> Result:
        """Simulate every iteration of every rank. Returns the Result (intervals and summary). `progress`: count
        events on a bar (stderr, on a terminal only); the total is not known ahead. Raises Infeasible for a run
        that would last longer than MAX_RUN_SECONDS."""
        result = self._run(progress)
        end = float(result._columns()["end_s"].max())
        if not end <= MAX_RUN_SECONDS:
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
        if self.path_requested != PATH_EVENTS:
            why = why_events(self)
            if why is None:
                try:
                    return self.algorithm.closed_form()
                except Handover as handover:  # a tie only SimPy's order of same-instant events settles
                    why = str(handover)
            if self.path_requested == PATH_ANALYTIC:
                raise ValueError(f"the analytic path was requested, but {why}")
        else:
            only = self.algorithm.events_blocker()
            if only is not None:
                raise ValueError(f"the event engine was requested, but {only}")
        return self._run_events(progress)

    def _run_events(self, progress: bool) -> Result:
        """The run on the event engine: one SimPy process per simulated rank."""
        started = time.perf_counter()
        alg, n, iterations = self.algorithm, self.simulated_ranks, self.experiment.iterations
        times = None if alg.whole_iterations else self._step_times()
        for r in range(n):
            self.env.process(rank_program(self.env, alg, r, iterations, self.draws, times, self.record,
                                          self.finished, self.slowdown, self.delays))
        events = run_events(self.env, progress=progress)
        return self.result(path=PATH_EVENTS, started=started, events=events)

    def _step_times(self) -> tuple[list, list, list]:
        """Per iteration and simulated rank (lists of Python floats), the engine's forward (with the straggler
        delay), backward and optimizer durations: the products and sums a rank would take one by one, taken over
        arrays at once (the same operations, so the same bits); SimPy's clock and heap then hold Python floats."""
        c, n = self.compute, self.simulated_ranks
        s, slow = self.draws[:, :n], self.slowdown[:n]
        return ((c.forward_s[s] * slow + self.delays[:, :n]).tolist(), (self.backward_s[s] * slow).tolist(),
                (c.optimizer_s[s] * slow).tolist())


def why_events(sim: Simulation) -> str | None:
    """None when `sim` can take its algorithm's closed form, else why it needs the event engine (the algorithm's
    `closed_form_blocker()`); a run may still hand itself over to the event engine while running
    (simfog.errors.Handover)."""
    return sim.algorithm.closed_form_blocker()


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


def new_simulation(experiment: Experiment, *, symmetric: bool | None = None, path: str | None = None) -> Simulation:
    """The Simulation of `experiment` with the training algorithm its comm.algorithm names. `symmetric` and `path`:
    see Simulation. Raises ConfigError for an unknown algorithm."""
    cls = algorithms.REGISTRY.get(experiment.comm.algorithm, field="comm.algorithm").for_experiment(experiment)
    return Simulation(experiment, cls, symmetric=symmetric, path=path)


def simulate(experiment: Experiment, *, symmetric: bool | None = None, progress: bool = False,
             path: str | None = None) -> Result:
    """Simulate `experiment`. Returns a Result; see simfog.results for its frames and summary. `progress`: a bar
    on stderr when it is a terminal (off by default: sweeps, plans and tunes run many simulations). `path`: see
    Simulation (None: the closed form where it applies, else events)."""
    return new_simulation(experiment, symmetric=symmetric, path=path).run(progress=progress)
