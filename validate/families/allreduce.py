"""Static-bucket gradient allreduce (algorithm "allreduce", every merge policy): torch DDP itself for merge "ddp",
validate.ranks.buckets.BucketedAllreduce with the simulator's own bucket plan for the others (Horovod with the static
plan its cycles give on identical ranks, launched as soon as each bucket is ready; the simulator models its cycles).
Links from gloo's allreduce (ring fit), or NCCL's model on GPUs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simfog import merge
from simfog.experiment import Comm, Experiment
from simfog.variation import expected_factor
from validate.families.base import buckets_match, fit_of
from validate.host_calibration import (
    EXCESS,
    excess_points,
    overheads_record,
    probe_experiment,
    probe_trace,
    with_overheads,
)


def bucket_plan(sim_exp: Experiment) -> tuple[merge.Bucket, ...]:
    """The buckets both sides use: the simulator's own plan (simfog.algorithms.allreduce.static_plan, with the
    bucket overheads in the cost the policy sees; for horovod the static plan its cycles give on identical ranks)."""
    from simfog.algorithms.allreduce.plan import static_plan

    return static_plan(sim_exp)


class Allreduce:
    algorithm = "allreduce"
    backends = ("gloo", "nccl")
    calibration_collective = "allreduce"
    point_to_point = False
    overhead_input = "bucket_copy_Bps"
    host_measured = EXCESS

    def check(self, exp: Experiment, mode: str, backend: str) -> None:
        pass  # every merge policy runs (the common checks of validate.run apply)

    def simulated_comm(self, comm: Comm) -> Comm:
        return comm

    def plan(self, sim) -> tuple[merge.Bucket, ...]:
        return bucket_plan(sim.experiment)

    def worker_fields(self, sim, warmup: int) -> dict:
        return {}  # merge, buckets and bucket_cap_mb are every configuration's

    def row_keys(self, exp: Experiment) -> dict:
        return {"merge": exp.comm.merge, "note": ""}

    def measured_keys(self, sim_exp: Experiment, config: Mapping, per_rank: Sequence[dict], plan, mode: str) -> dict:
        return {"buckets_match": buckets_match(plan, per_rank)}

    def host_probes(self, experiments: Sequence[Experiment], cost) -> dict[str, tuple[str, Experiment]]:
        """One probe per rank program the group's rows run: torch DDP (merge "ddp"; a bucket cap of one byte, so
        that every probe tensor is its own bucket) and the bucketed hooks (every other policy; wfbp: a bucket per
        tensor); each layer's backward covers the allreduce before it (`cost`)."""
        out = {}
        trace = probe_trace(cover=lambda m: cost("allreduce", m))
        for exp in experiments:
            key = _fit_key(exp)
            if key not in out:
                comm = {"merge": "ddp", "threshold_bytes": 1.0} if key == DDP else {"merge": "wfbp",
                                                                                    "threshold_bytes": None}
                out[key] = (key, probe_experiment(exp, trace, **comm))
        return out

    def host_points(self, prepared, per_rank: Sequence[dict]) -> list[tuple[float, float]]:
        """The in-step excess of each bucket the ranks ran (DDP's as DDP built them) over its allreduce as the
        prediction costs it (on average: with its expected slowest rank, simfog.variation)."""
        trace, cost = prepared.experiment.workload.trace, prepared.sim.cost
        sizes = [float(sum(trace.tensors[n].nbytes for n in bucket)) for bucket in per_rank[0]["buckets"]]
        slowest = expected_factor(cost.spread(), cost.cluster.ranks)
        bare = [(m, cost.allreduce(m) * slowest) for m in sizes]
        return excess_points(per_rank, [bare] * len(per_rank[0]["iterations"]))

    def with_host_costs(self, sim_exp: Experiment, fits: Mapping) -> tuple[Experiment, object, str]:
        """The fit's per-collective excess as collective_overhead_s, its per-byte excess as a slower bucket copy:
        each bucket of M bytes packs and unpacks at the copy bandwidth (2M/bw on its stream), so 1/bw becomes
        1/bw_copy + per_byte/2 (the host's measured copy plus half the excess each way)."""
        fit, why = fit_of(fits, _fit_key(sim_exp))
        if fit is None:
            return sim_exp, None, why
        record = overheads_record(sim_exp)
        record["collective_overhead_s"], record["collective_overhead_s_how"] = fit.overhead_s, fit.how
        copy = record.get("bucket_copy_Bps")
        inverse = (1.0 / copy if copy else 0.0) + fit.per_byte_s / 2
        if inverse > 0:
            record["bucket_copy_Bps"] = 1.0 / inverse
            record["bucket_copy_Bps_how"] = (f"the host's copy ({copy / 1e9:.3g} GB/s, {record.get('how', '')}) "
                                             if copy else "no copy measured ") + \
                f"with half the in-step excess per byte each way ({fit.how})"
        note = (f"{fit.how}; applied as collective_overhead {fit.overhead_s * 1e3:.3f} ms and bucket copy "
                f"{record.get('bucket_copy_Bps', 0) / 1e9:.3g} GB/s" + (f" (measured copy {copy / 1e9:.3g} GB/s)"
                                                                        if copy else ""))
        return with_overheads(sim_exp, record), fit, note


DDP = "allreduce-ddp"  # fit keys: torch DDP's reducer and comm hook, or validate.ranks.buckets' hooks
HOOKS = "allreduce-hooks"


def _fit_key(exp: Experiment) -> str:
    return DDP if exp.comm.merge == "ddp" else HOOKS
