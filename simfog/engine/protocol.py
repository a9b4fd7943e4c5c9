"""The protocol of a training algorithm: every hook an engine may call, and what it must return.

A training algorithm (comm.algorithm) is a class derived from `TrainingAlgorithm`, registered by name in
simfog.algorithms.REGISTRY and built once per run with the run: `cls(run)`, where `run` is the
simfog.simulation.Simulation composing it. The run gives the algorithm what it reads: `experiment`, `cost` (the
collective CostModel), `compute` (simfog.engine.compute.ComputeModel), `draws` (iterations, ranks: each rank's trace
sample per iteration), `variation` (simfog.variation.Variation: the per-call factors of collective times),
`slowdown` (ranks,), `delays` (iterations, ranks), `ranks`, `simulated_ranks`, and for the event engine `env` (the
SimPy environment) with `record(rank, iteration, kind, name, start, end)` and `log` (simfog.span_log.SpanLog) to
keep intervals; a closed form ends with `run.result(...)`, the one place a Result is built.

The base gives every hook a default, so an algorithm overrides only what it does differently; the engines call the
hooks below and read nothing else of an algorithm.

Before the algorithm is built (class level):
- `symmetric`: True when it treats every rank alike, so that one rank may stand for all when the layer times are
  fixed and the ranks homogeneous (the symmetric fast path). Default False.
- `symmetric_draws`: True when, besides, every call it makes is among all ranks, so that one rank still stands for
  all when call times are drawn per call and group (simfog.variation, comm.variation = "draw"). Default False.
- `for_experiment(experiment) -> type`: the class that runs `experiment` (default: this one). A name whose runs
  split by a setting picks here (allreduce with Horovod's run-time fusion runs another program).
- `whole_iterations`: True when the algorithm runs each whole iteration itself (`run_iteration`; communication that
  gates compute, e.g. sharded data parallelism), False when the engine runs forward, backward and the optimizer
  step and calls `backward_started`. Default False.

Once built, for every path:
- `backward_s`: per trace sample, how long backward takes under this algorithm (numpy array), or None for the
  trace's own (an algorithm may lengthen it: comm.overlap_slowdown).
- `memory() -> simfog.memory.Memory`: memory per rank. Default: simfog.memory.estimate of the experiment.
- `describe_buckets() -> list[dict]`: what is sent per iteration, one dict per bucket (Result.buckets); must be
  given.
- `mixing() -> dict | None`: how well the models agree (decentralized algorithms; see simfog.results), None for
  none. Default None.

The event engine (simfog.engine.ranks):
- `backward_started(rank, iteration, sample, t_backward) -> simpy.Event | None`: called when a rank starts
  backward at t_backward (seconds, the SimPy clock) with trace sample `sample`; returns the event the rank's
  optimizer step waits for, or None for nothing to wait for. Default None.
- `run_iteration(rank, iteration, sample, slow, delay)`: with `whole_iterations`, a SimPy generator running one
  whole iteration of `rank` (compute times scaled by `slow`, `delay` seconds of straggler delay added to forward)
  that records its own intervals.
- `events_blocker() -> str | None`: why the event engine cannot run this configuration, or None. Default None.

The closed forms (simfog.simulation chooses the path):
- `closed_form_blocker() -> str | None`: None when `closed_form()` solves this run without the event engine, the
  same times bit for bit, else why not. Default: the algorithm decides while running.
- `closed_form() -> simfog.results.Result`: the run solved (called only when the blocker is None). It may raise
  simfog.errors.Handover while running, where SimPy's order of same-instant events would decide: the event
  engine then runs it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import numpy as np


class TrainingAlgorithm(ABC):
    """Base of every training algorithm: the hooks of the module docstring, with their defaults."""

    symmetric: ClassVar[bool] = False
    symmetric_draws: ClassVar[bool] = False
    whole_iterations: ClassVar[bool] = False
    backward_s: np.ndarray | None = None

    def __init__(self, run):
        self.sim = run

    @classmethod
    def for_experiment(cls, experiment) -> type[TrainingAlgorithm]:
        return cls

    def memory(self):
        from simfog.memory import estimate

        return estimate(self.sim.experiment)

    @abstractmethod
    def describe_buckets(self) -> list[dict]:
        """What is sent per iteration, one dict per bucket."""

    def mixing(self) -> dict | None:
        return None

    def backward_started(self, rank: int, iteration: int, sample: int, t_backward: float):
        return None

    def run_iteration(self, rank: int, iteration: int, sample: int, slow: float, delay: float):
        raise NotImplementedError(f"{type(self).__name__} runs no whole iterations (whole_iterations is False)")

    def events_blocker(self) -> str | None:
        return None

    def closed_form_blocker(self) -> str | None:
        return f"algorithm {self.sim.experiment.comm.algorithm!r} decides while running"

    def closed_form(self):
        raise NotImplementedError(f"{type(self).__name__} has no closed form: {self.closed_form_blocker()}")

    def redefined(self, owner: type, names: tuple[str, ...]) -> str | None:
        """The first of `names` (event-engine methods of `owner`, a class this one derives from) that this object or
        a class between its own and `owner` defines anew (a subclass, or a patch of one), or None. A closed form
        replays `owner`'s program; a program defined anew is one it does not know."""
        below = (self, *type(self).__mro__[:type(self).__mro__.index(owner)])
        return next((name for name in names if any(name in vars(k) for k in below)), None)
