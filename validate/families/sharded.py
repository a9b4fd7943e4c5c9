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
from dataclasses import replace

from simfog import merge
from simfog.experiment import Comm, Experiment
from simfog.simulation import new_simulation
from simfog.variation import expected_factor
from validate.families.base import buckets_match, fit_of
from validate.host_calibration import (
    EXCESS,
    FSDP_PROBE_ITERATIONS,
    FSDP_PROBE_LAYERS,
    STEP,
    excess_points,
    overheads_record,
    probe_experiment,
    probe_trace,
    step_excess,
    with_overheads,
)


class _Sharded:
    calibration_collective = "allreduce"
    point_to_point = False
    overhead_input = "collective_overhead_s"
    host_measured = EXCESS

    def simulated_comm(self, comm: Comm) -> Comm:
        return comm

    def plan(self, sim) -> tuple[merge.Bucket, ...]:
        return tuple(merge.Bucket((c.name,), int(c.nbytes)) for c in sim.algorithm.plan.colls)

    def measured_keys(self, sim_exp: Experiment, config: Mapping, per_rank: Sequence[dict], plan, mode: str) -> dict:
        return {"buckets_match": buckets_match(plan, per_rank)}

    def host_probes(self, experiments: Sequence[Experiment], cost) -> dict[str, tuple[str, Experiment]]:
        out = {}  # their collectives run one at a time already (validate.ranks.fsdp, zero)
        for exp in experiments:
            key, comm = self._probe(exp)
            if key not in out:
                out[key] = (key, probe_experiment(exp, probe_trace(), param_dtype=None, reduce_dtype=None, **comm))
        return out

    def host_points(self, prepared, per_rank: Sequence[dict]) -> list[tuple[float, float]]:
        """The in-step excess of the plan's collectives (the records' order) over their cost in the prediction (on
        average: with its expected slowest rank, simfog.variation)."""
        sim = prepared.sim
        slowest = expected_factor(sim.cost.spread(), sim.ranks)
        bare = [(float(c.nbytes), sim.cost.time(c.op, c.nbytes, None) * slowest) for c in sim.algorithm.plan.colls]
        return excess_points(per_rank, [bare] * len(per_rank[0]["iterations"]))

    def with_host_costs(self, sim_exp: Experiment, fits: Mapping) -> tuple[Experiment, object, str]:
        """The fit as collective_overhead_s, the sharded algorithms' one per-collective input: overhead plus
        per_byte times the mean size of the experiment's own planned collectives, so that every iteration pays the
        fit's total over its collectives exactly (each collective the mean of it)."""
        fit, why = fit_of(fits, self._probe(sim_exp)[0])
        if fit is None:
            return sim_exp, None, why
        mean = _mean_collective(sim_exp)
        value = fit.excess_s(mean)
        record = overheads_record(sim_exp)
        record["collective_overhead_s"] = value
        record["collective_overhead_s_how"] = f"{fit.how}; at this plan's mean collective of {mean / 1e3:.4g} kB"
        note = (f"{fit.how}; applied as collective_overhead {value * 1e3:.3f} ms (at the plan's mean collective, "
                f"{mean / 1e3:.4g} kB)")
        return with_overheads(sim_exp, record), fit, note


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

    host_measured = STEP

    def _probe(self, exp: Experiment) -> tuple[str, dict]:
        """FSDP2 with one unit per probe layer, resharded after forward or not and prefetching as the row does."""
        reshard, k = bool(exp.comm.reshard_after_forward), int(exp.comm.prefetch)
        return f"fsdp-{'reshard' if reshard else 'keep'}-k{k}", {
            "algorithm": "fsdp", "fsdp_unit": "layer", "reshard_after_forward": reshard, "prefetch": k}

    def host_probes(self, experiments: Sequence[Experiment], cost) -> dict[str, tuple[str, Experiment]]:
        """Per variant of the rows (reshard_after_forward, prefetch), one probe per size at which a row of that
        variant pays the fit (its plan's mean collective, `with_host_costs`), every layer of that size
        (validate.host_calibration: the step, not the spans, is measured). The rows' own sizes rather than fixed
        ones: a size this host's TCP handles badly (1 MB all-gathers on 2 ranks run ~30 % slow, see
        simfog.collectives' gloo_ring) would otherwise set the per-byte slope for every size."""
        out = {}
        for exp in experiments:
            key, comm = self._probe(exp)
            size = 4 * max(1, round(_mean_collective(exp) / 4))  # whole float32 elements
            trace = probe_trace((size,) * FSDP_PROBE_LAYERS, name=f"p{size}b")
            probe = probe_experiment(exp, trace, param_dtype=None, reduce_dtype=None, **comm)
            out.setdefault(f"{key}-{size}B", (key, replace(probe, iterations=FSDP_PROBE_ITERATIONS)))
        return out

    def host_points(self, prepared, per_rank: Sequence[dict]) -> list[tuple[float, float]]:
        """(the probe's collective size, the per-collective overhead that makes its predicted step the measured
        one): the median steady-state iteration of the probe's records, inverted through simfog
        (validate.host_calibration.step_excess)."""
        import statistics

        from validate.comparison.compare import iteration_times, measured_result

        measured = iteration_times(measured_result(prepared.experiment, per_rank))[1:]
        if not len(measured):
            return []
        size = float(prepared.sim.algorithm.plan.colls[0].nbytes)
        return [(size, step_excess(prepared.experiment, float(statistics.median(measured))))]


class Zero2(_Sharded):
    algorithm = "zero2"
    backends = ("gloo",)

    def check(self, exp: Experiment, mode: str, backend: str) -> None:
        from validate.ranks.zero import check_experiment

        check_experiment(exp, mode, backend)

    def worker_fields(self, sim, warmup: int) -> dict:
        from validate.ranks.zero import worker_fields

        return worker_fields(sim)

    def _probe(self, exp: Experiment) -> tuple[str, dict]:
        """ZeRO-2 with a bucket per probe tensor (reduce_bucket_size of one element) and one parameter
        all-gather, blocking or overlapped as the rows."""
        overlap = bool(exp.comm.overlap_comm)
        return f"zero2-{'overlap' if overlap else 'blocking'}", {"algorithm": "zero2", "reduce_bucket_size": 1,
                                                                 "overlap_comm": overlap}

    def row_keys(self, exp: Experiment) -> dict:
        from validate.ranks.zero import ZERO2_NOTE

        return {"merge": "", "note": ZERO2_NOTE}


def _mean_collective(exp: Experiment) -> float:
    """The mean size of the collectives of `exp`'s plan (bytes; 0 without any)."""
    colls = new_simulation(exp).algorithm.plan.colls
    return sum(c.nbytes for c in colls) / len(colls) if colls else 0.0


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
