"""The Python API: load an experiment, simulate it, sweep a grid, as `simfog simulate` and `simfog sweep` do.

Thin wrappers over what the command line runs too (the same loading and overrides, simfog.overrides; the same
validation and sweep engine), so that the same experiment and seed give the same numbers from Python as from the
CLI, which is a thin layer over this module's parts. Re-exported by `simfog`:

    import simfog
    exp = simfog.load("notebooks/experiments/resnet50-v100-25g.toml")
    r = simfog.simulate(exp)
    r.summary()["iteration_time_s"]
    df = simfog.sweep(exp, ranks=[8, 64], merge=["ddp", "mgwfbp"])

Everything heavy (pandas, numpy, SimPy) is imported inside the functions: `import simfog` stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import contextmanager
from typing import TYPE_CHECKING

from simfog.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from simfog.experiment import Experiment
    from simfog.results import Result

# The dtypes of simfog.sweep()'s columns (the sweep CSV's, simfog.sweeps.KEY_COLUMNS + SUMMARY_COLUMNS). A point
# that could not run (its `error` says why) has no numbers: nullable Int64 and boolean keep those columns integer
# and boolean instead of turning them into floats or objects. Columns not named here stay strings.
SWEEP_DTYPES = {
    "ranks": "int64", "merge": "str", "collective": "str", "threshold_bytes": "float64",
    "iteration_time_s": "float64", "samples_per_s": "float64", "scaling_efficiency": "float64",
    "compute_s": "float64", "comm_s": "float64", "comm_exposed_s": "float64", "idle_s": "float64",
    "overlap_fraction": "float64", "buckets": "Int64", "memory_peak_B": "float64", "memory_complete": "boolean",
    "estimated": "boolean", "error": "str",
    # with a level (simfog.sweeps.INTERVAL_COLUMNS); interval_level NaN and the bounds NaN without
    "interval_level": "float64", "iteration_time_lo_s": "float64", "iteration_time_hi_s": "float64",
    "samples_per_s_lo": "float64", "samples_per_s_hi": "float64", "scaling_efficiency_lo": "float64",
    "scaling_efficiency_hi": "float64", "interval_unmeasured": "str",
    # what each number rests on (simfog.caveats: POOR FIT, EXTRAPOLATED, ...), "" for nothing
    "warnings": "str",
}


def load(path: str | os.PathLike | None = None, *, ranks: int | None = None, merge: str | None = None,
         collective: str | None = None, threshold: str | None = None, iterations: int | None = None,
         seed: int | None = None, nodes: int | None = None, gpus_per_node: int | None = None,
         nic_bandwidth: str | None = None, network: str | os.PathLike | None = None) -> Experiment:
    """Read an experiment TOML file (None: the embedded default of `simfog simulate`), with the overrides of the
    command line's --ranks, --merge, --collective, --threshold ("25MiB"), --iterations and --seed, and of its
    cluster: --nodes, --gpus-per-node, --nic-bandwidth ("100Gbit/s") and --network (a network file), read as the
    file's [cluster] keys.

    Anything wrong raises simfog.ConfigError with a one-line message naming the file, field and what is allowed.

        >>> exp = simfog.load("notebooks/experiments/resnet50-v100-25g.toml", ranks=64, seed=3)
        >>> exp.ranks
        64
    """
    from simfog.overrides import load_with_overrides

    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ConfigError("path", path, "a path to an experiment file (.toml)")
    with _keyword_names():
        return load_with_overrides(None if path is None else os.fspath(path), ranks=ranks, merge=merge,
                                   collective=collective, threshold=threshold, iterations=iterations, seed=seed,
                                   nodes=nodes, gpus_per_node=gpus_per_node, nic_bandwidth=nic_bandwidth,
                                   network=None if network is None else os.fspath(network))


def simulate(experiment: Experiment | str | os.PathLike, *, level: float | None = 0.9) -> Result:
    """Simulate an experiment (from simfog.load, or a path to load). Returns a simfog.results.Result:
    `summary()` is the dict of `simfog simulate --json`, `intervals()` a DataFrame of every rank's forward,
    backward, optimizer, comm and wait intervals (rank, iteration, kind, name, start_s, end_s),
    `iterations()` one row per rank and iteration.

        >>> r = simfog.simulate(simfog.load("notebooks/experiments/resnet50-v100-25g.toml"))
        >>> r.summary()["samples_per_s"]           # the CLI's number for the same file and seed
        >>> r.intervals().query("kind == 'comm'")   # every collective of every rank

    `level`: the summary carries the prediction interval at that level, as the CLI's (iteration_time_lo_s, ...,
    simfog.run_bands; it simulates the run again at each part's bounds); None: no interval. The summary's
    "warnings" say what the numbers rest on (simfog.caveats: POOR FIT, EXTRAPOLATED, ...), as the CLI's.
    """
    from simfog.caveats import attach as attach_caveats
    from simfog.run_bands import attach
    from simfog.simulation import simulate as run

    result = attach_caveats(run(_experiment(experiment)))
    return attach(result, level) if level is not None else result


def sweep(experiment: Experiment | str | os.PathLike, ranks: int | Iterable[int] | None = None,
          merge: str | Iterable[str] | None = None, collective: str | Iterable[str] | None = None,
          threshold: str | float | Iterable[str | float] | None = None, *, jobs: int = 1,
          output: str | os.PathLike | None = None, progress: bool = False,
          level: float | None = None) -> pd.DataFrame:
    """Simulate every combination of `ranks` × `merge` × `collective` × `threshold` (each one value or a list;
    None: the experiment's own). Returns one row per point, in grid order, with the columns of the
    `simfog sweep` CSV typed (SWEEP_DTYPES): ranks int64, seconds and rates float64, buckets Int64, estimated
    boolean, merge, collective and error str ("" when the point ran; a point impossible on its rank count, e.g.
    rhd on 6 ranks, has the reason there and no numbers). Thresholds are sizes ("25MiB") or numbers of bytes.

    `jobs` runs points in that many processes. `output` names a CSV to append to and resume from, exactly as
    `simfog sweep -o`; by default nothing is written. `level` (e.g. 0.9) adds each row's prediction interval, as
    `simfog sweep --level` (iteration_time_lo_s ... interval_unmeasured; 5 simulations a row instead of 1).

        >>> df = simfog.sweep(exp, ranks=[8, 64], merge=["ddp", "mgwfbp"], collective="ring")
        >>> df.pivot(index="ranks", columns="merge", values="scaling_efficiency")
    """
    import tempfile
    from pathlib import Path

    from simfog import files, sweeps
    from simfog.experiment import comm_value

    exp = _experiment(experiment)
    # The command line's own checks, in its order: output and jobs first, then every point of the grid.
    if output is not None:
        files.check_output(output)
    if not isinstance(progress, bool):
        raise ConfigError("progress", progress, "True or False")
    with _keyword_names():
        sweeps.check_jobs(jobs)
        thresholds = _values(threshold, "threshold")
        if thresholds is not None:  # sizes as the command line gives them ("25MiB"), or numbers of bytes
            thresholds = [comm_value("threshold", t, field="threshold") if isinstance(t, str) else t
                          for t in thresholds]
        points = sweeps.checked_points(exp, _values(ranks, "ranks"), _values(merge, "merge"),
                                       _values(collective, "collective"), thresholds)
    if level is not None:
        from simfog.bands import check_level

        level = check_level(level, "level")
    if output is None:
        with tempfile.TemporaryDirectory(prefix="simfog-sweep-") as tmp:
            rows = sweeps.run(exp, points, Path(tmp) / "sweep.csv", jobs=jobs, progress=progress, level=level)
    else:
        rows = sweeps.run(exp, points, output, jobs=jobs, progress=progress, level=level)
    return sweep_frame(rows, points)


def sweep_frame(rows: list[dict], points) -> pd.DataFrame:
    """The rows of a sweep CSV (strings, as simfog.sweeps.run returns them) for `points`, in their order, typed as
    SWEEP_DTYPES. Rows of other points (a resumed CSV may hold them) are left out."""
    import pandas as pd

    from simfog.sweeps import key_of_row

    order = {p.key(): i for i, p in enumerate(points)}
    rows = sorted((r for r in rows if key_of_row(r) in order), key=lambda r: order[key_of_row(r)])
    df = pd.DataFrame(rows, columns=list(rows[0]) if rows else list(SWEEP_DTYPES))
    for col, dtype in SWEEP_DTYPES.items():
        if col not in df:
            continue
        if dtype == "str":
            df[col] = df[col].fillna("").astype(str)
        elif dtype == "boolean":  # the CSV holds "True", "False" or "" (no result)
            df[col] = df[col].map({"True": True, "False": False}).astype("boolean")
        else:  # "" (no result) and "none" (no interval asked for) become NaN / <NA>
            df[col] = pd.to_numeric(df[col].mask(df[col].isin(("", "none")))).astype(dtype)
    return df


def _experiment(experiment) -> Experiment:
    """An Experiment as given, or loaded from a path."""
    from simfog.experiment import Experiment

    if isinstance(experiment, Experiment):
        return experiment
    if isinstance(experiment, (str, os.PathLike)):
        return load(experiment)
    raise ConfigError("experiment", experiment, "an Experiment from simfog.load() or a path to an experiment file")


@contextmanager
def _keyword_names():
    """The CLI's validation names its options (--merge); from Python, name the keyword argument (merge)."""
    try:
        yield
    except ConfigError as e:
        if not e.field.startswith("--"):
            raise
        raise ConfigError(e.field.lstrip("-").replace("-", "_"), e.value, e.allowed, source=e.source) from None


def _values(value, name: str) -> list | None:
    """One value or an iterable of them, as a list (None for None: the experiment's own)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, int, float)):
        return [value]
    try:
        return list(value)
    except TypeError:
        raise ConfigError(name, value, "one value or a list of them") from None
