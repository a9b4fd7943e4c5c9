"""Static-bucket gradient allreduce (algorithm "allreduce", every merge policy): torch DDP itself for merge "ddp",
validate.ranks.buckets.BucketedAllreduce with the simulator's own bucket plan for the others (Horovod with the static
plan its cycles give on identical ranks, launched as soon as each bucket is ready; the simulator models its cycles).
Links from gloo's allreduce (ring fit), or NCCL's model on GPUs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simfog import merge
from simfog.experiment import Comm, Experiment
from validate.families.base import buckets_match


def bucket_plan(sim_exp: Experiment) -> tuple[merge.Bucket, ...]:
    """The buckets both sides use: the simulator's own plan (simfog.algorithms.allreduce.static_plan, with the
    bucket overheads in the cost the policy sees; for horovod the static plan its cycles give on identical ranks)."""
    from simfog.algorithms.allreduce import static_plan

    return static_plan(sim_exp)


class Allreduce:
    algorithm = "allreduce"
    backends = ("gloo", "nccl")
    calibration_collective = "allreduce"
    point_to_point = False
    overhead_input = "bucket_copy_Bps"

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

    def host_overhead(self, rig, like: Experiment, fits: Mapping) -> tuple[float, str] | None:
        return None  # the host's record (validate.calibration.host_overheads) stands
