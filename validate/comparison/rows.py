"""What a validation row says beyond the comparison of two Results (validate.comparison.compare): the
configuration's keys and its calibration's figures (`row_keys`), the host's load while it ran (`host_keys`), the
beyond-the-wire inputs its prediction used (`overhead_keys`); the measured Result under the simulator's names
(`measured_result`); and both sides' timelines as files (`export_timelines`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from simfog import merge
from simfog.experiment import Experiment
from simfog.results import Result
from simfog.simulation import new_simulation
from validate.comparison import compare


def row_keys(vid: str, exp: Experiment, options, emulated: bool, cal) -> dict:
    """The keys of `exp`'s row under `options` (validate.run.Options): what ran, where, and the calibration `cal`
    of its links (None: uncalibrated, a single rank or a failed calibration)."""
    from validate.families import family_of
    from validate.ranks.decentralized import algorithm_label

    c, family = exp.cluster, family_of(exp)
    keys = {"id": vid, "model": exp.workload.trace.model, "mode": options.mode, "algorithm": algorithm_label(exp),
            **family.row_keys(exp), "ranks": c.ranks, "nodes": c.nodes, "ranks_per_node": c.ranks_per_node,
            "nic_bandwidth_Bps": c.nic.bandwidth_Bps, "emulated": emulated, "iterations": exp.iterations,
            "warmup": options.warmup, "trace": exp.workload.trace_path,
            "calibration": "" if cal is None else f"{options.backend} {family.calibration_collective}"}
    for cls in ("nic", "intra"):
        if cal is not None and cls in cal.fits:
            keys[f"{cls}_latency_s"] = cal.fits[cls].latency_s
            keys[f"{cls}_fit_bandwidth_Bps"] = cal.fits[cls].bandwidth_Bps
            keys[f"{cls}_spread"] = getattr(cal.fits[cls], "spread", "")  # per call (simfog.variation)
    return keys


def host_keys(host, per_rank: Sequence[dict]) -> dict:
    """The host's CPU load (a validate.cluster.hostload.HostSampler) while this configuration's measured iterations
    ran."""
    its = [it for r in per_rank for it in r["iterations"]]
    if not its:
        return {}
    return host.load(min(it["start"] for it in its), max(it["end"] for it in its)).row()


def overhead_keys(sim_exp: Experiment, host_fit=None, host_note: str = "") -> dict:
    """The beyond-the-wire inputs the prediction used (simfog.overheads), the in-step host fit it pays
    (`host_fit`, validate.host_calibration.HostFit: per collective and per byte) and where they came from: how the
    fit was measured and applied (`host_note`), else the source of the input that matters for the family
    (Family.overhead_input)."""
    from validate.families import family_of

    oh = sim_exp.overheads()
    source = oh.sources.get(family_of(sim_exp).overhead_input, "")
    return {"bucket_copy_Bps": oh.bucket_copy_Bps, "collective_overhead_s": oh.collective_overhead_s,
            "overlap_slowdown": oh.overlap_slowdown,
            "host_excess_s": "" if host_fit is None else host_fit.overhead_s,
            "host_excess_s_per_B": "" if host_fit is None else host_fit.per_byte_s,
            "overheads_source": host_note if host_fit is not None else "; ".join(filter(None, [source, host_note]))}


def unprobed_keys(measured: Result, unprobed: Result | None) -> dict:
    """What the host probe changed in the prediction of this row, on the same measurements: the predicted
    steady-state iteration without its fit and that prediction's error (validate.host_calibration); {} when no fit
    was applied. For the merge policies that choose their buckets with the cost model (mgwfbp, optimal) the plan
    without the fit may differ from the one that ran."""
    if unprobed is None:
        return {}
    t_m, t_u = compare.steady_iteration_s(measured), compare.steady_iteration_s(unprobed)
    return {"predicted_without_probe_s": t_u, "rel_error_without_probe": (t_u - t_m) / t_m if t_m > 0 else float("nan")}


def measured_result(sim_exp: Experiment, per_rank: Sequence[dict], plan, sim=None) -> Result:
    """The measured Result of one configuration, buckets named as the simulator names them. `sim`: the simulation
    of `sim_exp`, when at hand (its compute model gives the single-rank time)."""
    prefix = "fused" if sim_exp.comm.merge in merge.DYNAMIC else "bucket"
    single = (sim or new_simulation(sim_exp)).compute.single_rank_time_s()
    return compare.measured_result(sim_exp, per_rank, bucket_prefix=prefix, bucket_bytes=[b.nbytes for b in plan],
                                   single_rank_time_s=single)


def export_timelines(validation, directory: str | os.PathLike) -> list[Path]:
    """Write the measured and the predicted intervals of one configuration (a validate.run.Validation) into
    `directory`: CSVs in the schema of Result.intervals() (rank, iteration, kind, name, start_s, end_s), so
    comparing is a join, and Chrome traces (simfog.timeline.write_chrome_trace) for Perfetto. Returns the paths
    written."""
    from simfog.files import atomic_open
    from simfog.timeline import write_chrome_trace

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for side, result in (("measured", validation.measured), ("predicted", validation.predicted)):
        if result is None:
            continue
        csv_path = d / f"{validation.id}-{side}-intervals.csv"
        with atomic_open(csv_path) as f:
            result.intervals().to_csv(f, index=False)
        trace_path = d / f"{validation.id}-{side}.trace.json"
        write_chrome_trace(result, trace_path)
        paths += [csv_path, trace_path]
    return paths
