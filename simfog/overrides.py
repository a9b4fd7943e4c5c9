"""The experiment a run asks for: an experiment file, or the embedded default, with the overrides the command line
(`--ranks`, `--merge`, `--collective`, `--threshold`, `--iterations`, `--seed`: simulate, tune) and the Python API
(simfog.load) share, so that both give the same experiment and the same numbers."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from simfog import experiment, units
from simfog.collectives import ALGORITHMS
from simfog.data import DEFAULT_EXPERIMENT
from simfog.errors import ConfigError
from simfog.experiment import Experiment
from simfog.merge import POLICIES


def load_with_overrides(file: str | os.PathLike | None = None, *, ranks: int | None = None, merge: str | None = None,
                        collective: str | None = None, threshold: str | None = None, iterations: int | None = None,
                        seed: int | None = None) -> Experiment:
    """The experiment in `file` (None or "": the embedded default) with each override that is not None applied:
    `ranks` (whole nodes of gpus_per_node), `merge` (comm.merge), `collective`, `threshold` (a size such as
    "25MiB"), `iterations`, `seed`. Raises ConfigError naming the command line's option (--merge); simfog.api.load
    names its keyword instead."""
    exp = experiment.load(Path(file) if file else DEFAULT_EXPERIMENT)
    if ranks is not None:
        exp = exp.with_ranks(ranks)
    if merge is not None:
        POLICIES.get(merge, field="--merge")  # validates the name
        exp = exp.with_comm(merge=merge)
    if collective is not None:
        ALGORITHMS.get(collective, field="--collective")
        exp = exp.with_comm(collective=collective)
    if threshold is not None:
        exp = exp.with_comm(threshold_bytes=units.nbytes(threshold, field="--threshold"))
    if iterations is not None or seed is not None:
        seed = exp.seed if seed is None else seed
        iterations = exp.iterations if iterations is None else iterations
        experiment.check_run_size(seed, iterations, exp.ranks, seed_field="--seed", iterations_field="--iterations")
        exp = replace(exp, seed=seed, iterations=iterations)
    if exp.comm.merge == "threshold" and exp.comm.threshold_bytes is None:
        raise ConfigError("--threshold", None, 'a size such as "25MiB" when merge = "threshold"')
    return exp
