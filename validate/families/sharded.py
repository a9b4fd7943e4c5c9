"""Sharded data parallelism: "fsdp" runs FSDP2 itself (validate.ranks.fsdp: fully_shard per unit of the experiment's
fsdp_unit, reshard_after_forward as given, the prefetch depth as FSDP2's explicit prefetch lists, all-gathers and
reduce-scatters asynchronous so that they overlap the replayed compute as FSDP2's streams do on GPUs), "zero2"
DeepSpeed stage 2's schedule written by hand (validate.ranks.zero).

Their links use the allreduce fit: gloo's all-gather follows the ring, and its reduce-scatter IS an allreduce of
the whole buffer, which simfog's gloo_ring costs as such (simfog.collectives). Both sides name the simulated plan's
collectives, one "bucket" each. fsdp rows add the measured memory peak per rank beside simfog's (`memory_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simfog import merge
from simfog.experiment import Comm, Experiment
from simfog.simulation import new_simulation
from validate.families.base import buckets_match


class _Sharded:
    calibration_collective = "allreduce"
    point_to_point = False
    overhead_input = "collective_overhead_s"

    def simulated_comm(self, comm: Comm) -> Comm:
        return comm

    def plan(self, sim) -> tuple[merge.Bucket, ...]:
        return tuple(merge.Bucket((c.name,), int(c.nbytes)) for c in sim.algorithm.plan.colls)

    def measured_keys(self, sim_exp: Experiment, config: Mapping, per_rank: Sequence[dict], plan, mode: str) -> dict:
        return {"buckets_match": buckets_match(plan, per_rank)}

    def host_overhead(self, rig, like: Experiment, fits: Mapping) -> tuple[float, str] | None:
        return None  # the host's record (validate.calibration.host_overheads) stands


class Fsdp(_Sharded):
    algorithm = "fsdp"
    backends = ("gloo", "nccl")  # validate.run lets nccl through; validate.ranks.fsdp says gloo only

    def check(self, exp: Experiment, mode: str, backend: str) -> None:
        from validate.ranks.fsdp import check_experiment

        check_experiment(exp, mode, backend)

    def worker_fields(self, sim, warmup: int) -> dict:
        from validate.ranks.fsdp import worker_fields

        return worker_fields(sim)

    def row_keys(self, exp: Experiment) -> dict:
        from validate.ranks.fsdp import FSDP_NOTE

        return {"merge": "", "note": FSDP_NOTE}

    def measured_keys(self, sim_exp: Experiment, config: Mapping, per_rank: Sequence[dict], plan, mode: str) -> dict:
        return {**memory_keys(sim_exp, per_rank, mode), **super().measured_keys(sim_exp, config, per_rank, plan, mode)}

    def host_overhead(self, rig, like: Experiment, fits: Mapping) -> tuple[float, str] | None:
        """FSDP2's host work per collective (validate.fsdp_calibration's probe, on the allreduce fit)."""
        from validate import fsdp_calibration

        rig.log("measuring FSDP2's host work per collective (validate.fsdp_calibration)")
        return fsdp_calibration.measure(rig, like, fits["allreduce"])


class Zero2(_Sharded):
    algorithm = "zero2"
    backends = ("gloo",)

    def check(self, exp: Experiment, mode: str, backend: str) -> None:
        from validate.ranks.zero import check_experiment

        check_experiment(exp, mode, backend)

    def worker_fields(self, sim, warmup: int) -> dict:
        from validate.ranks.zero import worker_fields

        return worker_fields(sim)

    def row_keys(self, exp: Experiment) -> dict:
        from validate.ranks.zero import ZERO2_NOTE

        return {"merge": "", "note": ZERO2_NOTE}


def memory_keys(sim_exp: Experiment, per_rank: Sequence[dict], mode: str) -> dict:
    """Measured and predicted memory per rank (bytes) of an fsdp run: measured, the most over the ranks of the
    local shards plus the iteration's allocation peak without gloo's own temporaries
    (validate.ranks.fsdp.MemoryProfile "framework_peak_B": what FSDP2 allocates; NCCL makes no such copies and simfog
    models none); predicted, simfog's walk of FSDP2's allocations without optimizer states (allocated before the
    profiled iteration; in replay the step is a wait) and, in replay mode, without activations (the replay keeps
    none; in model mode the trace's activation_bytes, and the activation gradients of backward from its
    output_bytes)."""
    measured = [r["memory"]["framework_peak_B"] for r in per_rank if r.get("memory")]
    if not measured:
        return {}
    mem = new_simulation(sim_exp).algorithm.memory(activations=mode == "model")
    m = float(max(measured))
    p = float(mem.parameters_B + mem.gradients_B + mem.buffers_B + (mem.activations_B or 0.0)
              + (mem.activation_grads_B or 0.0))
    return {"measured_memory_B": m, "predicted_memory_B": p, "memory_rel_error": (p - m) / m if m else float("nan")}
