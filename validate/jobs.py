"""`simfog validate JOBS.toml`: several jobs on one emulated fabric, each measured alone and together, and its
slowdown against simfog.jobs' prediction.

One TieredCluster (validate.cluster.fabric_emu) of the jobs file's two-tier fat tree holds every job's nodes where
the file places them. Then:

1. alone: each job is validated as `simfog validate` validates one experiment (validate.run.run_group on the job's
   view of the cluster: its calibration with the uplinks lifted, its host probes, its prediction), one job at a
   time, the others' nodes idle: the "<job>-alone" rows;
2. together: the same configurations (the same plans and compute draws) of every job in one launch per job, all
   at once; a start gate in the worker (validate.ranks.worker: every rank of every job ready before any starts)
   lines their first iterations up, an end gate keeps every rank until all have finished (a job's teardown would
   slow the others' last iterations), and each job runs as many iterations as keep it busy while the slowest runs
   its own (from simfog.jobs' prediction), so that the jobs overlap from end to end (`overlap` says how much
   they did: the share of the job's measured window in which another job was running);
3. the prediction together is simfog.jobs' timeline model over the calibrated experiments: each job's predicted
   run alone replayed beside the others' (simfog.fabric.cosim), each job starting when its first measured
   iteration started, relative to the first job to start (`start_offset_s`: the measured phase, not an assumed
   one); the "<job>-together" rows compare the measured and predicted iteration times together, and carry both
   slowdowns (together / alone, steady state on each side), the slowdown's relative error, and the predicted
   slowdown's range over simfog.jobs.PHASES start phases (`predicted_slowdown_lo`, `predicted_slowdown_hi`).

Figures measured on a loaded host are the emulation's, not accuracy claims: a job's ranks and the other job's
share the host's cores, which a real cluster's do not (host_cpu_busy and host_limited say when that ruled).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from simfog import jobs as simfog_jobs
from simfog import units
from simfog.errors import ConfigError
from simfog.results import Result
from simfog.run_bands import attach
from validate.cluster import netemu
from validate.cluster.fabric_emu import TieredCluster, check_fabric
from validate.cluster.hostload import HostSampler
from validate.cluster.nodes import dropped_packets, workspace
from validate.cluster.scheduling import rr_time_slice
from validate.comparison import compare, rows
from validate.comparison.rows import measured_result
from validate.run import STARTUP_S, GroupRun, Options, _run_ranks, check_experiment, run_group

MOST_STRETCH = 20  # at most this many times a job's iterations, to span a slower job's run


@dataclass
class JobsRun:
    """Each job's alone validation (validate.run.GroupRun) and the rows: per job "<name>-alone", then per job
    "<name>-together"."""

    alone: list[GroupRun]
    rows: list[dict]
    note: str = ""


def check_jobs(jobs: Sequence[simfog_jobs.Job], options: Options, source: str | None = None) -> None:
    """Raise ConfigError for a jobs file the emulated fabric cannot run: fewer than two jobs, a flat fabric (jobs
    there share no link), or a job `simfog validate` refuses (validate.run.check_experiment)."""
    if len(jobs) < 2:
        raise ConfigError("job", f"{len(jobs)} table", "at least two [[job]] tables for simfog validate (one job: "
                          "validate it as an experiment with a [fabric])", source=source)
    for k, job in enumerate(jobs):
        exp = job.experiment
        if exp.cluster.fabric is None:
            raise ConfigError("fabric.kind", "flat", "a two-tier fat_tree for simfog validate of several jobs (on a "
                              "flat fabric jobs share no link: nothing to measure)", source=source)
        try:
            check_experiment(exp, options.mode, options.backend, options.launcher)
            check_fabric(exp.cluster, launcher=options.launcher, backend=options.backend)
        except ConfigError as e:
            field = e.field if e.field.startswith(("fabric", "cluster")) else f"job[{k}].{e.field}"
            raise ConfigError(field, e.value, e.allowed, source=source) from None


def stretched(jobs: Sequence[simfog_jobs.Job]) -> list[simfog_jobs.Job]:
    """The jobs, each with as many iterations (at least its own, at most MOST_STRETCH times) as keep it running
    while the slowest runs its iterations, at simfog.jobs' predicted times together."""
    times = simfog_jobs.run(list(jobs)).jobs
    span = max(job.experiment.iterations * t.together_s for job, t in zip(jobs, times, strict=True))
    out = []
    for job, t in zip(jobs, times, strict=True):
        n = job.experiment.iterations
        n = min(n * MOST_STRETCH, max(n, math.ceil(span / t.together_s))) if t.together_s > 0 else n
        out.append(replace(job, experiment=replace(job.experiment, iterations=n)))
    return out


def validate_jobs(jobs: Sequence[simfog_jobs.Job], options: Options | None = None, *, source: str | None = None,
                  cache: dict | None = None, log: Callable[[str], None] = lambda s: None) -> JobsRun:
    """Validate the jobs of a jobs file on one emulated fabric (module docstring); `cache`: calibrations kept
    across runs (validate.run.run_group's). Raises ConfigError for what cannot be run (`check_jobs`), NetemuError
    when the emulated network cannot be built; a failed launch gives rows with `error` set."""
    options = options or Options()
    check_jobs(jobs, options, source)
    if options.emulate is False:
        raise ConfigError("--loopback", True, "left out for a jobs file (several jobs on plain loopback share "
                          "no fabric)", source=source)
    ok, why = netemu.available()
    if not ok:
        raise netemu.NetemuError(f"{source or 'jobs'}: several jobs need the emulated network: {why}")
    jobs = stretched(jobs)
    fabric = jobs[0].experiment.cluster.fabric.fabric
    cache = {} if cache is None else cache
    with workspace() as tmp, TieredCluster.for_fabric(fabric, jobs=[j.nodes for j in jobs]) as tiered:
        work = Path(options.workdir) if options.workdir else tmp
        alone = []
        for k, job in enumerate(jobs):
            log(f"job {job.name}: alone on nodes {' '.join(map(str, job.nodes))}")
            folder = work / f"alone-{k}"
            folder.mkdir(parents=True, exist_ok=True)
            alone.append(run_group([job.experiment], replace(options, workdir=str(folder)),
                                   ids=[f"{job.name}-alone"], cache=cache, log=log, nodes=tiered.job(k)))
        if any(not g.prepared or g.validations[0].measured is None for g in alone):
            failed = [compare.failed_row({**g.rows[0], "id": f"{job.name}-together", "job": job.name},
                                         "not run together: a job failed alone") for job, g in zip(jobs, alone)]
            return JobsRun(alone, [*(g.rows[0] for g in alone), *failed])
        together = _run_together(tiered, jobs, [g.prepared[0] for g in alone], options, work, log)
    return JobsRun(alone, [*({**g.rows[0], "job": j.name} for g, j in zip(alone, jobs)),
                           *_together_rows(jobs, alone, *together)])


def _run_together(tiered: TieredCluster, jobs, prepared, options: Options, work: Path, log):
    """Every job's configuration in one launch per job, all at once behind the start gate: (per job (per-rank
    records or None, error), the calibrated jobs and their timelines (simfog.jobs.timelines), the host sampler,
    dropped packets, load average)."""
    calibrated = [replace(job, experiment=p.experiment) for job, p in zip(jobs, prepared, strict=True)]
    lines = simfog_jobs.timelines(calibrated, [p.predicted for p in prepared])
    gate_dir = work / "gate"
    gate_dir.mkdir(parents=True, exist_ok=True)
    total = sum(p.experiment.cluster.ranks for p in prepared)
    results: list = [(None, "not started")] * len(jobs)

    def one(k: int) -> None:
        folder = work / f"together-{k}"
        folder.mkdir(parents=True, exist_ok=True)
        gate = {"dir": str(gate_dir), "end_dir": str(work / "end-gate"), "ranks": total, "job": k,
                "timeout_s": STARTUP_S, "end_timeout_s": STARTUP_S}
        results[k] = _run_ranks(tiered.job(k), prepared[k].experiment.cluster, [prepared[k]], options, folder,
                                said, gate)

    lock = threading.Lock()

    def said(line: str) -> None:  # one line at a time from the jobs' threads
        with lock:
            log(line)

    log(f"running {len(jobs)} jobs together ({total} ranks)")
    slice_ = rr_time_slice() if options.scheduling == "rt" else contextlib.nullcontext(False)
    drops, load = dropped_packets(tiered), os.getloadavg()[0]
    with slice_, HostSampler() as host:
        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results, (calibrated, lines), host, dropped_packets(tiered) - drops, load


def _window(per_rank) -> tuple[float, float]:
    its = [it for r in per_rank for it in r["iterations"]]
    return min(it["start"] for it in its), max(it["end"] for it in its)


def _predicted(alone: list[GroupRun], windows, calibrated, lines) -> tuple[list[float], list, list[tuple]]:
    """(each job's start offset, its predicted Result together from the measured offsets, its predicted slowdown's
    range over start phases). A job that did not run starts with the first."""
    known = [w[0] for w in windows if w is not None]
    offsets = [w[0] - min(known) if w is not None else 0.0 for w in windows]
    predicted_alone = [g.prepared[0].predicted for g in alone]
    predicted = simfog_jobs.replayed(calibrated, predicted_alone, lines, offsets)
    for together, alone_ in zip(predicted, predicted_alone):
        together.interval = _interval_beside(alone_, together)
    steady = [compare.steady_iteration_s(r) for r in predicted_alone]
    alone_s = [r.summary()["iteration_time_s"] for r in predicted_alone]
    slowdowns = [[compare.steady_iteration_s(r) / a for r, a in zip(predicted, steady)]]
    for k in range(1, simfog_jobs.PHASES):
        phased = simfog_jobs.replayed(calibrated, predicted_alone, lines, simfog_jobs.phased(offsets, alone_s, k))
        slowdowns.append([compare.steady_iteration_s(r) / a for r, a in zip(phased, steady)])
    return offsets, predicted, [(min(s), max(s)) for s in zip(*slowdowns)]


def _interval_beside(alone: Result, together: Result) -> dict:
    """The prediction interval of a replayed run (its experiment alone does not see the others, so its interval is
    not computed on it): the run alone's interval (simfog.run_bands, attached when missing) with the same
    relative bounds around the time together."""
    s = (alone.interval and alone.summary()) or attach(alone).summary()
    ratio = together.summary()["iteration_time_s"] / s["iteration_time_s"]
    scaled = {k: s[k] * ratio for k in ("iteration_time_lo_s", "iteration_time_hi_s")}
    scaled.update({k: s[k] / ratio for k in ("samples_per_s_lo", "samples_per_s_hi", "scaling_efficiency_lo",
                                             "scaling_efficiency_hi")})
    return {**alone.interval, **scaled}


def _together_rows(jobs, alone: list[GroupRun], results, prediction, host, drops, load) -> list[dict]:
    windows = [None if ranks is None else _window([r["configs"][0] for r in ranks]) for ranks, _ in results]
    offsets, predicted, bands = _predicted(alone, windows, *prediction)
    out = []
    for k, (job, group) in enumerate(zip(jobs, alone, strict=True)):
        # the alone row's keys, less what was of the alone run: its load and its prediction without the host probe
        base = {**group.rows[0], "id": f"{job.name}-together", "job": job.name, "dropped_packets": drops,
                "load_average": load, "predicted_without_probe_s": "", "rel_error_without_probe": ""}
        ranks, error = results[k]
        if ranks is None:
            out.append(compare.failed_row(base, error))
            continue
        p = group.prepared[0]
        per_rank = [r["configs"][0] for r in ranks]
        measured = measured_result(p.experiment, per_rank, p.plan, p.sim)
        row = compare.compare({**base, **rows.host_keys(host, per_rank)}, measured, predicted[k])
        m_alone = compare.steady_iteration_s(group.validations[0].measured)
        p_alone = compare.steady_iteration_s(p.predicted)
        m_slow, p_slow = row["measured_iteration_s"] / m_alone, row["predicted_iteration_s"] / p_alone
        lo, hi = windows[k]
        others = [w for j, w in enumerate(windows) if j != k and w is not None]
        shared = max((min(hi, b) - max(lo, a) for a, b in others), default=0.0)
        row.update({"measured_alone_s": m_alone, "predicted_alone_s": p_alone, "measured_slowdown": m_slow,
                    "predicted_slowdown": p_slow, "slowdown_rel_error": (p_slow - m_slow) / m_slow,
                    "overlap": max(0.0, shared) / (hi - lo) if hi > lo else 0.0, "start_offset_s": offsets[k],
                    "predicted_slowdown_lo": bands[k][0], "predicted_slowdown_hi": bands[k][1]})
        out.append(row)
    return out


def format_slowdowns(rows_: Sequence[dict]) -> str:
    """Per job: measured and predicted slowdown together, the slowdown's relative error, the measured start offset
    the prediction took and its slowdown's range over start phases."""
    lines = [f"{'job':24} {'slowdown measured':>17} {'predicted':>9} {'error':>7} {'overlap':>7} {'offset':>9} "
             f"{'over phases':>13}"]
    for r in rows_:
        if not r.get("id", "").endswith("-together") or r.get("error"):
            continue
        lines.append(f"{r['job'][:24]:24} {r['measured_slowdown']:17.3f} {r['predicted_slowdown']:9.3f} "
                     f"{r['slowdown_rel_error']:+7.1%} {r['overlap']:7.0%} "
                     f"{units.format_time(r['start_offset_s']):>9} "
                     f"{r['predicted_slowdown_lo']:>6.3f}-{r['predicted_slowdown_hi']:<6.3f}")
    return "\n".join(lines)
