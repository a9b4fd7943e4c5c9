"""The warnings a prediction carries wherever it goes: simulate's summary, and every row of sweep, curve, plan and
tune (their `warnings` column and the printed row), so that a number read alone still says what it rests on.

Each is a simfog.errors.Caveat, a short code and one phrase. A run's come from CHECKS, each a function
(experiment, buckets) -> Caveats, run in order: the network file's calibration (POOR FIT, FLAGGED, AT BOUND:
simfog.network_file.caveats) and every way the run leaves what that calibration measured (EXTRAPOLATED: node and
GPU counts, message sizes, release: simfog.run_bands.extrapolated). To carry a new kind, write one such function
and decorate it with `@check`. What is said once per command rather than per row (a trace of another GPU than the
cluster's, NCCL's model without a network file) is a SimfogWarning where the input is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from simfog import network_file
from simfog.errors import Caveat

CHECKS: list[Callable[[object, list], Iterable[Caveat]]] = []


def check(fn: Callable[[object, list], Iterable[Caveat]]):
    """Register `fn(experiment, buckets)` as one more source of every run's caveats."""
    CHECKS.append(fn)
    return fn


@check
def _calibration(exp, buckets: list) -> list[Caveat]:
    """How well the network file's model fitted its logs (every run on it: its links are the file's)."""
    return network_file.caveats(exp.network) if getattr(exp, "network", None) is not None else []


@check
def _extrapolated(exp, buckets: list) -> list[Caveat]:
    """Where the run leaves what the network file's logs covered (NCCL's collectives only)."""
    from simfog.run_bands import extrapolated

    return [Caveat("EXTRAPOLATED", note) for note in extrapolated(exp, buckets) or []]


def of_run(exp, buckets: list) -> tuple[Caveat, ...]:
    """The caveats of a run of `exp` whose buckets (Result.buckets: dicts with "bytes") are `buckets`, in CHECKS'
    order, each once."""
    out: list[Caveat] = []
    for fn in CHECKS:
        out += [c for c in fn(exp, buckets) if c not in out]
    return tuple(out)


def of_result(result) -> tuple[Caveat, ...]:
    """The caveats of a simfog.results.Result."""
    return of_run(result.experiment, result.buckets)


def attach(result):
    """`result` with its caveats gathered (Result.caveats: its summary's "warnings"); returns it."""
    result.caveats = of_result(result)
    return result
