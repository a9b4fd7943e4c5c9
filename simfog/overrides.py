"""The experiment a run asks for: an experiment file, or the embedded default, with the overrides the command line
(`--ranks`, `--merge`, `--collective`, `--threshold`, `--iterations`, `--seed`: simulate, tune) and the Python API
(simfog.load) share, so that both give the same experiment and the same numbers."""

from __future__ import annotations

import os
from pathlib import Path

from simfog import experiment
from simfog.data import DEFAULT_EXPERIMENT
from simfog.experiment import Experiment


def load_with_overrides(file: str | os.PathLike | None = None, *, ranks: int | None = None, merge: str | None = None,
                        collective: str | None = None, threshold: str | None = None, iterations: int | None = None,
                        seed: int | None = None) -> Experiment:
    """The experiment in `file` (None or "": the embedded default) with each override that is not None applied
    through simfog.experiment.override, which reads and checks them as the file's keys are: `ranks` (whole nodes
    of gpus_per_node), `merge` (comm.merge), `collective`, `threshold` (a size such as "25MiB"), `iterations`,
    `seed`. Raises ConfigError naming the command line's option (--merge); simfog.api.load names its keyword
    instead."""
    exp = experiment.load(Path(file) if file else DEFAULT_EXPERIMENT)
    given = {"ranks": ranks, "merge": merge, "collective": collective, "threshold": threshold,
             "iterations": iterations, "seed": seed}
    return experiment.override(exp, spelling="--", **{k: v for k, v in given.items() if v is not None})
