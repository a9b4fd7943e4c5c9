"""Several jobs on one shared fabric: each job's iteration time alone and together, and its slowdown.

A jobs file is an experiment file whose `[comm]` and `[workload]` move into `[[job]]` tables:

    seed = 1
    iterations = 5
    [cluster]                      # the machines every job runs on, as an experiment's; nodes = all of them
    nodes = 64
    gpus_per_node = 8
    nic_bandwidth = "400Gbit/s"
    [fabric]                       # the fabric they share, as an experiment's (without placement)
    kind = "fat_tree"
    nodes_per_leaf = 16
    leaf_oversubscription = 2
    [[job]]
    name = "ddp"                   # default job0, job1, ...
    workload = "resnet50.json.gz"  # a trace, or a table as an experiment's [workload]
    ranks = 128                    # whole nodes of gpus_per_node
    placement = "contiguous"       # contiguous | scattered (placement_seed) | [node list], on nodes no earlier
    start = "0s"                   #   job holds; start: when the job starts (default 0)
    algorithm = "allreduce"        # every other key is the job's [comm] key, as in an experiment
    collective = "ring"

Each job alone is its own experiment on its nodes of the fabric. Together, job k's collectives are on the network
a share `duty_k` of its iterations (its mean collective time over its iteration time, at most 1): a job idle
between iterations frees its links, and job j sees k's step pattern beside its own with that probability
(simfog.fabric.job: each step's seconds per byte are the expectation over which others communicate), weighted by
the share of j's run that k's run overlaps (runs from `start` for `iterations` iterations). The duties depend on
the times and the times on the duties: a fixed point, found by rounds in which every job is simulated with the
others' duties of the round before (from the duties alone). The map is monotone (more traffic beside a job slows
its collectives, which raises its duty), so the rounds rise to the fixed point; they stop when no iteration time
moves by more than TOLERANCE (relative) or after MOST_ROUNDS (`converged` says which). On a flat fabric jobs share
no link (each NIC is its own node's, the core non-blocking or oversubscribed per NIC) and run as alone.

That is the "expectation" model (`run`'s default): each job sees the others at random phases. The "timeline" model
(`simfog simulate` of a jobs file, validate) runs the jobs in time instead (simfog.fabric.cosim): each job's run
alone is replayed from its `start` beside the others', its collectives slowed, while other jobs' collectives run
beside them, by what the fabric makes of the traffic on at that instant (`timelines`: the job simulated with each
set of the others' traffic always on). A job's together time and duty are then its replayed run's; `slowdown_lo`
and `slowdown_hi` are the band over PHASES start phases: for phase k, job i >= 1 starts (k·i mod PHASES)/PHASES of
its iteration alone after its `start` (phase 0: the starts as given). Jobs whose collectives never run together,
and a single job, come back as alone, bit for bit.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

from simfog import files, units
from simfog.errors import ConfigError, Infeasible, unknown_key
from simfog.experiment import Experiment, from_dict
from simfog.fabric.cosim import Timeline, collectives, cosimulate
from simfog.fabric.job import PATTERN_OF, JobFabric, Traffic, attach
from simfog.fabric.placement import place
from simfog.results import Result
from simfog.simulation import simulate

TOLERANCE = 1e-9
MOST_ROUNDS = 50
MOST_JOBS = 8
PHASES = 16
MODELS = ("timeline", "expectation")
_TOP = {"seed", "iterations", "cluster", "fabric", "job"}
_JOB = {"name", "workload", "ranks", "placement", "placement_seed", "start"}


@dataclass(frozen=True)
class Job:
    """One job: its experiment (on its own nodes, its cluster's fabric view holding its placement), when it
    starts (s) and its name."""

    name: str
    experiment: Experiment
    nodes: tuple[int, ...]
    start_s: float = 0.0

    def traffic(self, duty: float) -> Traffic:
        """This job's collectives as another job sees them on the fabric, on the network a share `duty`."""
        c = self.experiment.cluster
        return Traffic(self.nodes, PATTERN_OF.get(self.experiment.comm.collective, "ring"), c.ranks_per_node,
                       min(c.ranks_per_node, c.fabric.fabric.nics_per_node), duty)


@dataclass(frozen=True)
class JobTimes:
    """A job's mean iteration time (s) and duty (its collectives' share of the iteration) alone and together."""

    name: str
    ranks: int
    nodes: tuple[int, ...]
    start_s: float
    alone_s: float
    together_s: float
    duty_alone: float
    duty_together: float
    slowdown_lo: float = math.nan  # the timeline model's band over start phases (module docstring)
    slowdown_hi: float = math.nan

    @property
    def slowdown(self) -> float:
        return self.together_s / self.alone_s


@dataclass(frozen=True)
class JobsResult:
    jobs: tuple[JobTimes, ...]
    rounds: int
    converged: bool
    model: str = "expectation"


def load(path: str | Path) -> list[Job]:
    """The jobs of a jobs file (module docstring). Raises ConfigError naming the file, the field and the value (or
    "path" for what is no file)."""
    path = files.check_input(path)
    data = files.parse_toml(files.read_text(path), str(path))
    try:
        return from_table(data, base_dir=path.parent, source=str(path))
    except ConfigError as e:
        raise e.in_file(str(path)) from None


def is_jobs_file(path: str | Path) -> bool:
    """True when `path` is a TOML file with [[job]] tables."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        return False
    path = Path(path)
    if not path.is_file() or path.suffix != ".toml":
        return False
    try:
        return "job" in files.parse_toml(files.read_text(path), str(path))
    except ConfigError:
        return False


def from_table(d: dict, *, base_dir: Path = Path("."), source: str | None = None) -> list[Job]:
    """The jobs of a jobs file's parsed table `d` (module docstring), its paths relative to `base_dir`. Raises
    ConfigError naming `source`, the field and the value (or the argument, for a `d` that is no table)."""
    if not isinstance(d, dict):
        raise ConfigError("d", d, "a jobs file's table: a dict with [cluster], [fabric] and [[job]] tables")
    if not isinstance(base_dir, (str, os.PathLike)):
        raise ConfigError("base_dir", base_dir, "the folder the file's paths are relative to (a str or os.PathLike)")
    base_dir = Path(base_dir)
    for key in d:
        if key not in _TOP:
            raise ConfigError(key, d[key], unknown_key(key, _TOP, "not a key of a jobs file"), source=source)
    tables = d.get("job")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ConfigError("job", tables if tables is not None else "(missing)", "one or more [[job]] tables",
                          source=source)
    if len(tables) > MOST_JOBS:
        raise ConfigError("job", f"{len(tables)} tables", f"at most {MOST_JOBS} jobs", source=source)
    cluster = d.get("cluster")
    if not isinstance(cluster, dict):
        raise ConfigError("cluster", cluster if cluster is not None else "(missing)", "a [cluster] table",
                          source=source)
    total, gpus = cluster.get("nodes"), cluster.get("gpus_per_node", _network_gpus(cluster, base_dir, source))
    for key, v in (("nodes", total), ("gpus_per_node", gpus)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"cluster.{key}", v if v is not None else "(missing)", "an integer >= 1 (nodes: all "
                              "the jobs' machines)", source=source)
    jobs, taken = [], ()
    for i, t in enumerate(tables):
        job = _job(i, t, d, cluster, total, gpus, taken, base_dir, source)
        check_jobs([*jobs, job], source=source)
        taken += job.nodes
        jobs.append(job)
    return jobs


def check_jobs(jobs: object, *, source: str | None = None) -> None:
    """What jobs on one fabric must be, from a jobs file or given to `run`: a list of 1 to MOST_JOBS Jobs (from
    `load` or `from_table`), no two of one name or on one node. Raises ConfigError naming the first at fault."""
    if not isinstance(jobs, (list, tuple)) or not 1 <= len(jobs) <= MOST_JOBS:
        raise ConfigError("jobs", jobs, f"a list of 1 to {MOST_JOBS} jobs (simfog.jobs.load or from_table)",
                          source=source)
    names, nodes = set(), set()
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise ConfigError(f"jobs[{i}]", job, "a Job (simfog.jobs.load or from_table)", source=source)
        if job.name in names:
            raise ConfigError(f"job[{i}].name", job.name, "a name no other job has", source=source)
        shared = nodes.intersection(job.nodes)
        if shared:
            raise ConfigError(f"job[{i}].placement", sorted(shared)[:8], "nodes no earlier job holds (each node "
                              "runs one job)", source=source)
        names.add(job.name)
        nodes.update(job.nodes)


def _network_gpus(cluster: dict, base_dir: Path, source: str | None) -> int:
    """The GPUs per node of the network the [cluster] names (a shipped cluster's: simfog.network_file.layout_gpus),
    else 1."""
    if "network" not in cluster:
        return 1
    from simfog.network_file import load_named

    named = load_named(cluster["network"], base_dir, field="cluster.network", source=source).cluster
    return named.gpus_per_node if named is not None else 1


def _job(i: int, t: dict, d: dict, cluster: dict, total: int, gpus: int, taken: tuple, base_dir: Path,
         source: str | None) -> Job:
    p = f"job[{i}]."
    name = t.get("name", f"job{i}")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{p}name", name, "a non-empty string", source=source)
    ranks = t.get("ranks")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1 or (ranks > gpus and ranks % gpus):
        raise ConfigError(f"{p}ranks", ranks if ranks is not None else "(missing)", f"an integer >= 1: whole nodes "
                          f"of gpus_per_node ({gpus}), or at most one node's worth", source=source)
    nodes = -(-ranks // gpus)
    start = units.seconds(t["start"], field=f"{p}start", source=source) if "start" in t else 0.0
    if not 0.0 <= start < units.LIMITS["time"][0]:
        raise ConfigError(f"{p}start", t["start"], "a time >= 0", source=source)
    workload = t.get("workload", "(missing)")
    workload = {"trace": workload} if isinstance(workload, str) else workload
    exp_table = {"seed": d.get("seed", 0), "iterations": d.get("iterations", 5), "workload": workload,
                 "cluster": {**cluster, "nodes": nodes, "gpus_per_node": min(gpus, ranks)},
                 "comm": {k: v for k, v in t.items() if k not in _JOB}}
    try:
        exp = from_dict(exp_table, base_dir=base_dir, source=source)
    except ConfigError as e:
        field = e.field
        if field.startswith("comm."):
            field = p + field[len("comm."):]
        elif field.startswith("workload."):
            field = p + ("workload" if isinstance(t.get("workload"), str) else field)
        raise ConfigError(field, e.value, e.allowed, source=source) from None
    if len(taken) + nodes > total:
        raise ConfigError(f"{p}ranks", ranks, f"at most {(total - len(taken)) * gpus} ranks: the [cluster]'s "
                          f"{total} nodes, less the {len(taken)} earlier jobs hold", source=source)
    table = d.get("fabric") or {}
    spec, seed = t.get("placement", "contiguous"), t.get("placement_seed", 0)
    nics = exp.network.nccl.nics_per_node or 1 if exp.network else 1
    if isinstance(table, dict) and table.get("kind", "flat") == "flat":  # the placement only says which nodes
        try:
            placed = place(spec, nodes, total, seed=seed, taken=taken, field=f"{p}placement", source=source)
        except Infeasible as e:
            raise ConfigError(f"{p}placement", spec, str(e), source=source) from None
        c = attach(exp.cluster, table, nics_per_node=nics, source=source)
        return Job(name, replace(exp, cluster=c), placed.nodes, start)
    try:
        c = attach(exp.cluster, {**table, "placement": spec, "placement_seed": seed}, nics_per_node=nics,
                   source=source, fabric_nodes=total, taken=taken)
    except ConfigError as e:
        field = e.field.replace("fabric.placement", f"{p}placement") if e.field.startswith("fabric.placement") \
            else e.field
        raise ConfigError(field, e.value, e.allowed, source=source) from None
    placed = c.fabric.nodes(nodes).nodes  # fixed now, in rank order, so later jobs' placements cannot move them
    return Job(name, replace(exp, cluster=replace(c, fabric=JobFabric(c.fabric.fabric, placed))), placed, start)


def run(jobs: list[Job], *, model: str = "expectation") -> JobsResult:
    """Each job's iteration time and duty alone and together under `model`, "timeline" or "expectation" (module
    docstring)."""
    check_jobs(jobs)
    if model not in MODELS:
        raise ConfigError("model", model, f"one of {', '.join(MODELS)}")
    if model == "timeline":
        return _run_timeline(jobs)
    alone = [_measure(job.experiment) for job in jobs]
    times = list(alone)
    rounds, converged = 0, len(jobs) < 2 or all(job.experiment.cluster.fabric is None for job in jobs)
    while not converged and rounds < MOST_ROUNDS:
        rounds += 1
        new = [_measure(_beside(j, jobs, times)) for j in range(len(jobs))]
        converged = all(abs(n[0] - o[0]) <= TOLERANCE * o[0] for n, o in zip(new, times))
        times = new
    rows = tuple(JobTimes(job.name, job.experiment.ranks, job.nodes, job.start_s, a[0], t[0], a[1], t[1])
                 for job, a, t in zip(jobs, alone, times))
    return JobsResult(rows, rounds, converged)


def _run_timeline(jobs: list[Job]) -> JobsResult:
    alone = [simulate(job.experiment) for job in jobs]
    times = [_times(r) for r in alone]
    lines = timelines(jobs, alone)
    starts = [job.start_s for job in jobs]
    together = [_times(r) for r in replayed(jobs, alone, lines, starts)]
    band = [[t] for t, _ in together]
    for k in range(1, PHASES if _shared(jobs) else 1):
        for j, r in enumerate(replayed(jobs, alone, lines, phased(starts, [t for t, _ in times], k))):
            band[j].append(_times(r)[0])
    rows = tuple(JobTimes(job.name, job.experiment.ranks, job.nodes, job.start_s, a[0], t[0], a[1], t[1],
                          min(b) / a[0], max(b) / a[0]) for job, a, t, b in zip(jobs, times, together, band))
    return JobsResult(rows, 0, True, "timeline")


def phased(starts: list[float], alone_s: list[float], k: int) -> list[float]:
    """The jobs' starts for start phase k of PHASES (module docstring)."""
    return [s + (k * i % PHASES) / PHASES * t if i else s for i, (s, t) in enumerate(zip(starts, alone_s))]


def _shared(jobs: list[Job]) -> bool:
    return len(jobs) > 1 and sum(job.experiment.cluster.fabric is not None for job in jobs) > 1


def timelines(jobs: list[Job], alone: list[Result]) -> list[Timeline]:
    """Each job's run alone (`alone`, its Result) as simfog.fabric.cosim replays it: its records, and its
    collectives' durations beside every set of the other jobs' traffic (each such set on all the time). Raises
    Infeasible where a job's collectives beside others are not those alone (a merge policy deciding at run time)."""
    out = []
    for j, (job, result) in enumerate(zip(jobs, alone)):
        records = tuple(result.interval_records())
        on_fabric = [k for k, other in enumerate(jobs) if k != j and other.experiment.cluster.fabric is not None]
        beside = {}
        if job.experiment.cluster.fabric is not None:
            own = collectives(records)
            for size in range(1, len(on_fabric) + 1):
                for chosen in itertools.combinations(on_fabric, size):
                    exp = with_traffic(job.experiment, [jobs[k].traffic(1.0) for k in chosen])
                    durations = collectives(simulate(exp).interval_records())
                    if durations.keys() != own.keys():
                        raise Infeasible(f"job {job.name}: its collectives beside other jobs are not those it runs "
                                         "alone; the timeline model cannot replay it (use the expectation model)")
                    beside[frozenset(chosen)] = durations
        out.append(Timeline(records, beside))
    return out


def replayed(jobs: list[Job], alone: list[Result], lines: list[Timeline], starts: list[float]) -> list[Result]:
    """Each job's Result when the jobs run together from `starts` (s, on one clock): its run alone replayed by
    simfog.fabric.cosim beside the others'."""
    records = cosimulate(lines, starts)
    return [Result(job.experiment, recs, symmetric=r.symmetric, single_rank_time_s=r.single_rank_time_s,
                   buckets=r.buckets, memory=r.memory, path=r.path) for job, r, recs in zip(jobs, alone, records)]


def together(j: int, jobs: list[Job], result: JobsResult) -> Experiment:
    """Job j's experiment beside the others at `result`'s fixed point: what its together time is the time of."""
    return _beside(j, jobs, [(t.together_s, t.duty_together) for t in result.jobs])


def _measure(exp: Experiment) -> tuple[float, float]:
    return _times(simulate(exp))


def _times(result: Result) -> tuple[float, float]:
    """(mean iteration time, duty) of a run."""
    s = result.summary()
    t = s["iteration_time_s"]
    return t, min(1.0, s["comm_s"] / t) if t > 0 else 0.0


def with_traffic(exp: Experiment, others: list[Traffic]) -> Experiment:
    """`exp` (a job's experiment on a fabric) with `others`' traffic beside it."""
    return replace(exp, cluster=replace(exp.cluster, fabric=replace(exp.cluster.fabric, others=tuple(others))))


def _beside(j: int, jobs: list[Job], times: list[tuple[float, float]]) -> Experiment:
    """Job j's experiment with the others' traffic on its fabric view, at their duties weighted by overlap."""
    exp = jobs[j].experiment
    if exp.cluster.fabric is None:
        return exp
    windows = [(job.start_s, job.start_s + job.experiment.iterations * t) for job, (t, _) in zip(jobs, times)]
    lo, hi = windows[j]
    others = []
    for k, (job, (_, duty)) in enumerate(zip(jobs, times)):
        if k == j or job.experiment.cluster.fabric is None:
            continue
        share = max(0.0, min(hi, windows[k][1]) - max(lo, windows[k][0])) / (hi - lo) if hi > lo else 0.0
        if duty * share > 0.0:
            others.append(job.traffic(min(1.0, duty * share)))
    return with_traffic(exp, others)


def format_result(result: JobsResult) -> str:
    """The table `simfog simulate` prints for a jobs file."""
    timeline = result.model == "timeline"
    lines = [f"{'job':12} {'ranks':>7} {'start':>9} {'alone':>10} {'together':>10} {'slowdown':>8} "
             f"{'duty alone':>10} {'together':>8}" + (f" {'over phases':>13}" if timeline else "")]
    for r in result.jobs:
        lines.append(f"{r.name[:12]:12} {r.ranks:>7} {units.format_time(r.start_s):>9} "
                     f"{units.format_time(r.alone_s):>10} {units.format_time(r.together_s):>10} "
                     f"{r.slowdown:>8.3f} {100 * r.duty_alone:>9.1f}% {100 * r.duty_together:>7.1f}%"
                     + (f" {r.slowdown_lo:>6.3f}-{r.slowdown_hi:<6.3f}" if timeline else ""))
    if timeline:
        lines.append(f"iteration times per job; together: the jobs' runs replayed in time from their starts; over "
                     f"phases: the slowdown's range over {PHASES} start phases")
        return "\n".join(lines)
    state = "converged" if result.converged else f"NOT converged (stopped after {MOST_ROUNDS})"
    lines.append(f"iteration times per job; together: the fixed point over the jobs' duty cycles, {state} in "
                 f"{result.rounds} round(s)")
    return "\n".join(lines)
