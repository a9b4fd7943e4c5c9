"""Many experiments at once: a grid over ranks, merge policies and collectives (and any Comm field).

Points run in local processes by default (or Dask distributed when a scheduler address is given). Each finished
point is appended to the CSV at once as one complete row, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import csv
import functools
import itertools
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from simfog.caveats import attach as attach_caveats
from simfog.errors import Caveat, ConfigError, SimfogError
from simfog.experiment import Experiment, override, warn_if_nccl_without_network

KEY_COLUMNS = ["ranks", "merge", "collective", "threshold_bytes"]
SUMMARY_COLUMNS = ["iteration_time_s", "samples_per_s", "scaling_efficiency", "compute_s", "comm_s",
                   "comm_exposed_s", "idle_s", "overlap_fraction", "buckets", "memory_peak_B", "memory_complete",
                   "estimated", "error"]
# What produced a row, the same in every row of one run, so a CSV read on its own says where its numbers came
# from: the experiment file, the trace (path, and a hash of its content so an edited trace shows), the
# layer-time mode, the seed, and the network file or network trace the links came from (NO_NETWORK_FILE where the
# experiment writes its links itself: a stated value rather than an empty cell, which reads as a lost one).
RECORD_COLUMNS = ["experiment", "trace", "trace_sha256", "compute", "seed", "experiment_sha256", "network_file",
                  "network_trace"]
# A row's prediction interval (simfog.run_bands) at the sweep's level (`--level`; 5 simulations a row
# instead of 1): NO_INTERVAL in interval_level and the rest empty when the sweep was asked for none.
# interval_unmeasured: the parts nothing measured (they took a stated width), comma-separated.
INTERVAL_COLUMNS = ["interval_level", "iteration_time_lo_s", "iteration_time_hi_s", "samples_per_s_lo",
                    "samples_per_s_hi", "scaling_efficiency_lo", "scaling_efficiency_hi", "interval_unmeasured"]
NO_INTERVAL = "none"
# What the row's number rests on that a reader must see beside it (simfog.caveats: POOR FIT, EXTRAPOLATED, ...), as
# one line, "" for none; NOT_RECORDED in rows of a file written before simfog recorded them.
WARNING_COLUMNS = ["warnings"]
NOT_RECORDED = "not recorded (a row of an older sweep CSV)"
COLUMNS = KEY_COLUMNS + SUMMARY_COLUMNS + RECORD_COLUMNS + INTERVAL_COLUMNS + WARNING_COLUMNS
# The columns of sweep CSVs written before the warnings, before the intervals, and before network_file and
# network_trace were recorded: such files still resume (their rows have no interval, their warnings NOT_RECORDED).
INTERVAL_ERA_COLUMNS = KEY_COLUMNS + SUMMARY_COLUMNS + RECORD_COLUMNS + INTERVAL_COLUMNS
PREVIOUS_COLUMNS = KEY_COLUMNS + SUMMARY_COLUMNS + RECORD_COLUMNS
OLD_COLUMNS = PREVIOUS_COLUMNS[:-2]
EARLIER_COLUMNS = (INTERVAL_ERA_COLUMNS, PREVIOUS_COLUMNS, OLD_COLUMNS)
NO_NETWORK_FILE = "none"  # paths in these columns are absolute, so no file is named this


@dataclass(frozen=True)
class Point:
    ranks: int
    merge: str
    collective: str
    threshold_bytes: float | None = None

    def key(self) -> tuple:
        return (str(self.ranks), self.merge, self.collective,
                "" if self.threshold_bytes is None else repr(float(self.threshold_bytes)))

    def apply(self, exp: Experiment, spelling: str | None = None) -> Experiment:
        """`exp` at this point, through simfog.experiment.override (ConfigError naming the key as `spelling` says)."""
        return override(exp, spelling=spelling, ranks=self.ranks, merge=self.merge, collective=self.collective,
                        threshold_bytes=self.threshold_bytes)


def grid(ranks: Sequence[int], merges: Sequence[str], collectives: Sequence[str],
         thresholds: Sequence[float | None] = (None,)) -> list[Point]:
    return [Point(r, m, c, t) for r, m, c, t in itertools.product(ranks, merges, collectives, thresholds)]


def run_point(exp: Experiment, point: Point, level: float | None = None) -> dict:
    """Simulate one point, with its prediction interval at `level` (None: none; INTERVAL_COLUMNS); a well-formed but
    impossible point (e.g. rhd on 6 ranks) gives a row with `error`."""
    from simfog.simulation import simulate

    row = {"ranks": point.ranks, "merge": point.merge, "collective": point.collective,
           "threshold_bytes": "" if point.threshold_bytes is None else float(point.threshold_bytes)}
    none = {c: "" for c in INTERVAL_COLUMNS} | {"interval_level": NO_INTERVAL if level is None else level}
    try:
        result = attach_caveats(simulate(point.apply(exp)))
        if level is not None:
            from simfog.run_bands import attach

            attach(result, level)
        s = result.summary()
    except SimfogError as e:
        return {**row, **{c: "" for c in SUMMARY_COLUMNS}, **none, "error": str(e), "warnings": ""}
    interval = none if level is None else {c: s[c] for c in INTERVAL_COLUMNS[:-1]} | {
        "interval_unmeasured": ",".join(s["interval_unmeasured"])}
    return {**row, **{c: s.get(c, "") for c in SUMMARY_COLUMNS}, **interval, "error": "",
            "warnings": Caveat.line(result.caveats)}


def against_fastest(exp: Experiment, rows: list[dict], level: float) -> list[dict]:
    """`rows` (a sweep's, as run returns them) each with vs_fastest (its iteration time over that of the fastest row
    of the same rank count, less 1) and within_uncertainty: whether the interval at `level` of that ratio (the same
    model error moved through both runs: simfog.run_bands.ratio_interval) reaches 1, i.e. the model cannot
    tell the row's configuration from the fastest. The fastest row: 0 and False; rows with an error: "" in both."""
    from simfog.run_bands import ratio_interval

    def point(row: dict) -> Point:
        t = row["threshold_bytes"]
        return Point(int(row["ranks"]), row["merge"], row["collective"], None if t in ("", None) else float(t))

    fastest = {}
    for r in rows:
        if not r.get("error") and (r["ranks"] not in fastest or float(r["iteration_time_s"]) <
                                   float(fastest[r["ranks"]]["iteration_time_s"])):
            fastest[r["ranks"]] = r
    out = []
    for r in rows:
        best = fastest.get(r["ranks"])
        if r.get("error") or best is None:
            out.append({**r, "vs_fastest": "", "within_uncertainty": ""})
        elif r is best:
            out.append({**r, "vs_fastest": 0.0, "within_uncertainty": False})
        else:
            iv = ratio_interval(point(r).apply(exp), point(best).apply(exp), level)
            out.append({**r, "vs_fastest": float(r["iteration_time_s"]) / float(best["iteration_time_s"]) - 1,
                        "within_uncertainty": iv.lo <= 1})
    return out


def record_of(exp: Experiment) -> dict:
    """The RECORD_COLUMNS of `exp`'s rows."""
    import hashlib
    import json

    content = json.dumps(exp.workload.trace.to_dict(), sort_keys=True, separators=(",", ":")).encode()
    trace_sha = hashlib.sha256(content).hexdigest()
    return {"experiment": exp.source or "", "trace": exp.workload.trace_path, "trace_sha256": trace_sha,
            "compute": exp.workload.compute, "seed": exp.seed, "experiment_sha256": experiment_sha256(exp, trace_sha),
            "network_file": exp.network.path if exp.network is not None else NO_NETWORK_FILE,
            "network_trace": exp.network_trace or NO_NETWORK_FILE}


def experiment_sha256(exp: Experiment, trace_sha256: str) -> str:
    """A hash of everything in `exp` that changes a row's numbers besides the point itself (ranks, merge,
    collective, threshold are the row's key): the trace's content, layer-time mode and optimizer, seed, iterations,
    the cluster (links, oversubscription, memory), every comm setting, heterogeneity and the network model. Rows
    resume only into a file whose rows carry the same hash. The reprs of these frozen dataclasses hold exactly
    their fields, in order (floats as repr: exact)."""
    import hashlib

    w = exp.workload
    parts = (trace_sha256, w.compute, getattr(w, "optimizer", ""), exp.seed, exp.iterations, exp.cluster, exp.comm,
             exp.heterogeneity, exp.network)
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _done_keys(path: Path, experiment_sha: str, level: float | None = None) -> set[tuple]:
    """The keys of the rows `path` already holds. Raises ConfigError when it is not a sweep CSV (COLUMNS, or an
    older one's PREVIOUS_COLUMNS or OLD_COLUMNS), holds a malformed line, or holds rows of another experiment (their
    experiment_sha256 differs) or of another interval level than `level`: those are never reused."""
    if not path.exists() or path.stat().st_size == 0:
        return set()
    import io

    done = set()
    # Bytes, not read_text: its universal newlines made a row torn between "\r" and "\n" end in "\n", counted done
    # and then cut by _drop_partial_last_line, lost.
    text = path.read_bytes().decode("utf-8", errors="replace")
    text = text[:text.rfind("\n") + 1]  # a torn last line (a killed write) is no row: that point runs again
    with io.StringIO(text, newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames
        if columns != COLUMNS and columns not in EARLIER_COLUMNS:
            raise ConfigError("output", str(path), "a CSV written by simfog sweep (columns differ); choose a new file")
        wanted = _level_text(level)
        for row in reader:
            if None in row or any(row[c] is None for c in columns) or not row["ranks"].isdigit():
                raise ConfigError("output", f"{path} line {reader.line_num}", "a sweep CSV whose every line is one "
                                  "whole row (this one is not: edit it out or choose a new file)")
            if row["experiment_sha256"] != experiment_sha:
                raise ConfigError("output", str(path), f"rows of this same experiment to resume; it holds rows of "
                                  f"another (experiment_sha256 {row['experiment_sha256'][:12]}..., this one "
                                  f"{experiment_sha[:12]}...: trace, seed, iterations, mode, cluster or comm differ); "
                                  "choose another -o, or delete the file to start over")
            held = _level_text(row.get("interval_level", NO_INTERVAL))
            if held != wanted:
                raise ConfigError("output", str(path), f"rows of the same interval level to resume; it holds rows "
                                  f"with interval_level {held}, this sweep asks for {wanted} (--level): give the "
                                  "same level, another -o, or delete the file to start over")
            done.add(tuple(row[k] for k in KEY_COLUMNS))
    return done


def _level_text(level) -> str:
    """A level as a sweep CSV holds it ("0.9"), NO_INTERVAL for none; "" (an errored row) counts as its sweep's."""
    if level is None or level == NO_INTERVAL:
        return NO_INTERVAL
    return repr(float(level))


def _upgrade_old_columns(path: Path, record: dict) -> None:
    """Rewrite a sweep CSV of EARLIER_COLUMNS (OLD_COLUMNS: written before the network columns, PREVIOUS_COLUMNS:
    before the intervals, INTERVAL_ERA_COLUMNS: before the warnings) with COLUMNS, atomically: its rows given this
    run's network_file and network_trace, no interval where they had none, and warnings NOT_RECORDED. Only after
    _done_keys found every row of this experiment (at its level): its experiment_sha256 covers the network file
    (path and content) and the links calibrated from a network trace."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames not in EARLIER_COLUMNS:
            return
        rows = list(reader)
    from simfog.files import atomic_open

    missing = {c: record.get(c, "") for c in COLUMNS} | {c: "" for c in INTERVAL_COLUMNS} | {
        "interval_level": NO_INTERVAL, "warnings": NOT_RECORDED}
    with atomic_open(path) as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({**missing, **row} for row in rows)


def _drop_partial_last_line(path: Path) -> None:
    """A sweep killed in the middle of a write leaves a line without its newline: cut it, the point reruns."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def key_of_row(row: dict) -> tuple:
    t = row["threshold_bytes"]
    return (str(row["ranks"]), row["merge"], row["collective"], "" if t == "" else repr(float(t)))


def run(exp: Experiment, points: Iterable[Point], out: str | os.PathLike, *, jobs: int = 1,
        scheduler: str | None = None, progress: bool = True, level: float | None = None) -> list[dict]:
    """Run every point not already in `out` (CSV), appending each row as it finishes, each with its prediction
    interval at `level` (None: none). Returns all rows of `out`."""
    from simfog.files import check_output, make_parent
    from simfog.progress import bar as progress_bar

    out = check_output(out)  # the one check of an output path, before anything is read or run
    record = record_of(exp)
    if level is not None:
        from simfog.bands import check_level

        level = check_level(level, "level")
    # A torn last line (a killed write) does not count as done (it was, then cut and lost), and is cut only once
    # the file is known to be this experiment's.
    done = _done_keys(out, record["experiment_sha256"], level)
    _drop_partial_last_line(out)
    _upgrade_old_columns(out, record)
    todo = [p for p in points if p.key() not in done]
    new_file = not out.exists() or out.stat().st_size == 0
    make_parent(out)
    with _append(out) as f, progress_bar(total=len(todo), enabled=progress, unit="exp") as bar:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new_file:
            writer.writeheader()
            f.flush()
        for row in _execute(exp, todo, jobs, scheduler, level):
            writer.writerow({**row, **record})
            f.flush()  # one whole row at a time: a killed sweep loses at most the points in flight
            bar.update(1)
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    ordered = sorted(rows, key=_axes_order(points))
    if todo and ordered != rows:
        # rows were appended as they finished (16, 256, 64): the file ends sorted by the sweep's axes, written
        # whole and atomically, so a reader (or a resumed sweep) finds them in that order
        from simfog.files import atomic_open

        with atomic_open(out) as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(ordered)
    return ordered


def _append(path: Path):
    """`path` opened to append rows. Raises ConfigError ("output") where it cannot be (a file without write
    permission)."""
    try:
        return open(path, "a", newline="")
    except OSError as e:
        raise ConfigError("output", str(path), f"a file that can be written ({e.strerror or e})") from None


def _axes_order(points: Iterable[Point]):
    """A sort key for sweep rows: ranks as numbers, then merge and collective in the order the sweep gave them,
    then the threshold as a number; rows of other points (an earlier sweep in the same file) after theirs."""
    points = list(points)
    merges = {m: i for i, m in enumerate(dict.fromkeys(p.merge for p in points))}
    collectives = {c: i for i, c in enumerate(dict.fromkeys(p.collective for p in points))}

    def key(row: dict) -> tuple:
        t = row["threshold_bytes"]
        return (int(row["ranks"]), merges.get(row["merge"], len(merges)), row["merge"],
                collectives.get(row["collective"], len(collectives)), row["collective"],
                -1.0 if t in ("", None) else float(t))
    return key


def reused_rows(exp: Experiment, points: Iterable[Point], out: str | os.PathLike, level: float | None = None) -> int:
    """How many of `points` the sweep CSV `out` already holds: what a resumed sweep reuses rather than runs (0 when
    there is no file). Raises ConfigError as run does for a file it would not resume."""
    done = _done_keys(Path(out), record_of(exp)["experiment_sha256"], level)
    return sum(p.key() in done for p in points)


def _execute(exp: Experiment, todo: list[Point], jobs: int, scheduler: str | None, level: float | None = None):
    one = functools.partial(run_point, level=level)
    if scheduler:
        from simfog.dask_backend import execute

        yield from execute(exp, todo, scheduler, one)
    elif jobs <= 1 or len(todo) <= 1:
        for p in todo:
            yield one(exp, p)
    else:
        from simfog.processes import exit_with

        # workers end with the sweep, even a SIGKILLed one
        with ProcessPoolExecutor(max_workers=jobs, initializer=exit_with, initargs=(os.getpid(),)) as pool:
            pending = {pool.submit(one, exp, p) for p in todo}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    yield fut.result()


def option_list(text: str, option: str) -> list[str]:
    """The comma-separated values of `option`. An option given with nothing in it (`--ranks ''`) is an error rather
    than a silent fall back to the file's value, and so is an empty value or one with spaces around it (`4,,8`,
    `' 4'`): a list typed wrong, not what was meant."""
    values = text.split(",")
    if any(not v or v != v.strip() for v in values):
        raise ConfigError(option, text, "one or more comma-separated values, without empty ones or spaces, e.g. 4,8")
    return values


def count_list(text: str, option: str) -> list[int]:
    """The comma-separated whole numbers of `option` (ASCII digits only: int() also reads "4_0" and other
    scripts' digits). Raises ConfigError naming `option`."""
    values = option_list(text, option)
    if not all(v.isascii() and v.isdigit() for v in values):
        raise ConfigError(option, text, "comma-separated whole numbers, e.g. 4,8,16")
    return [int(v) for v in values]


MAX_JOBS = 1024


def check_jobs(jobs: object) -> None:
    """Raise ConfigError ("--jobs") unless `jobs` is a whole number of local worker processes in 1..MAX_JOBS."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
        raise ConfigError("--jobs", jobs, f"an integer in 1..{MAX_JOBS} (local worker processes)")


def checked_grid(exp, ranks: list[int], merge_text: str | None, collective_text: str | None,
                 thresholds: list) -> list:
    """The sweep points for comma-separated --merge/--collective (default: the file's), every name and rank count
    validated before anything runs (ConfigError naming the option)."""
    merges = option_list(merge_text, "--merge") if merge_text is not None else None
    colls = option_list(collective_text, "--collective") if collective_text is not None else None
    return checked_points(exp, ranks, merges, colls, thresholds)


def checked_points(exp, ranks: list | None, merges: list | None, collectives: list | None,
                   thresholds: list | None) -> list[Point]:
    """The sweep points of these values (None: the experiment's own; an empty list is an error), every point checked
    before anything runs by simfog.experiment.override, as the command line's options are (ConfigError naming the
    option, e.g. --merge): whole rank counts the experiment takes, registered merge policies and collectives,
    thresholds in bytes, and every rule between them (merge = "threshold" needs a threshold)."""
    values = {}
    for option, given, default in (("--ranks", ranks, exp.ranks), ("--merge", merges, exp.comm.merge),
                                   ("--collective", collectives, exp.comm.collective),
                                   ("--threshold", thresholds, exp.comm.threshold_bytes)):
        if given is not None and not given:
            raise ConfigError(option, given, "one or more values")
        values[option] = [default] if given is None else list(given)
    for r in values["--ranks"]:
        if isinstance(r, bool) or not isinstance(r, int):
            raise ConfigError("--ranks", r, "whole rank counts, e.g. 4,8,16")
    points = grid(values["--ranks"], values["--merge"], values["--collective"], values["--threshold"])
    for p in points:
        p.apply(exp, spelling="--")
    if collectives is not None:
        for c in dict.fromkeys(values["--collective"]):
            warn_if_nccl_without_network(c, exp.network, "--collective")
    return points
