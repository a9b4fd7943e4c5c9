"""One simulation, composed: the experiment, its training algorithm (from the registry, simfog.algorithms) and the
engine (simfog.engine). The engine knows nothing of the registry; this module is where the three meet."""

from __future__ import annotations

from simfog import algorithms
from simfog.engine import Simulation
from simfog.experiment import Experiment
from simfog.results import Result


def new_simulation(experiment: Experiment, *, symmetric: bool | None = None, path: str | None = None) -> Simulation:
    """The engine's Simulation of `experiment` with the training algorithm its comm.algorithm names. `symmetric` and
    `path`: see simfog.engine.Simulation. Raises ConfigError for an unknown algorithm."""
    cls = algorithms.REGISTRY.get(experiment.comm.algorithm, field="comm.algorithm")
    return Simulation(experiment, cls, symmetric=symmetric, path=path)


def simulate(experiment: Experiment, *, symmetric: bool | None = None, progress: bool = False,
             path: str | None = None) -> Result:
    """Simulate `experiment`. Returns a Result; see simfog.results for its frames and summary. `progress`: a bar
    on stderr when it is a terminal (off by default: sweeps, plans and tunes run many simulations). `path`: see
    simfog.engine.Simulation (None: analytic where it applies, else events)."""
    return new_simulation(experiment, symmetric=symmetric, path=path).run(progress=progress)
