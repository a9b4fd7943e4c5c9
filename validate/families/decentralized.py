"""Decentralized parameter averaging, replay mode: "neighbor" (combine "awc", a non-hierarchical topology such as
one_peer_exp2) runs validate.ranks.decentralized's NeighborExchange with the simulator's own schedule of messages.

Its simulated costs are point-to-point messages, so its links are calibrated from a gloo "sendrecv" microbenchmark
(every rank sends M to its ring neighbour and receives M, both at once; T = α + M·β) on the same network instead of
the allreduce ring fit. That ring shift puts exactly one flow on each NIC (each way), so its fitted rate is what ONE
flow reaches: on an emulated cluster it becomes the per-flow cap of a NIC whose capacity is the tbf rate's TCP
payload (validate.calibration.flow_link, nic_capacity; simfog.p2p's flow-level model), so that exchanges with several
flows on a NIC are not charged the fit's shortfall twice.

neighbor is simulated with comm.negotiate = false (the real run does not negotiate) and comm.buffered_sends (gloo's
isend completes once the socket holds the message: a rank's exchange ends with its receives) and
comm.p2p_sharing = "fluid": without a barrier the ranks drift apart, so the two flows of a node's NIC overlap only
in part (measured transfers ~9 ms in steady state), which simfog.flow_fluid times as they overlap; starting both at
once (15.7 ms, "together") had mlp-neighbor-8r-4x2-1Gbit +19/+20/+24 % off in three bench runs.

Both sides name one "bucket" per iteration: the flat parameters, the whole model.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from simfog import merge
from simfog.experiment import Comm, Experiment
from simfog.simulation import new_simulation, simulate
from validate.families.base import fit_of
from validate.host_calibration import EXCESS, excess_points, probe_experiment, probe_trace, spans


class Decentralized:
    """What neighbour averaging and WAGMA share: replay only, sendrecv links, the whole model as one bucket, the
    schedule from the simulator (validate.ranks.decentralized.worker_fields), the messages checked per rank."""

    backends = ("gloo",)
    calibration_collective = "sendrecv"
    point_to_point = True
    overhead_input = "bucket_copy_Bps"
    host_measured = EXCESS

    def check(self, exp: Experiment, mode: str, backend: str) -> None:
        from validate.ranks.decentralized import check_experiment

        check_experiment(exp, mode)

    def plan(self, sim) -> tuple[merge.Bucket, ...]:
        trace = sim.experiment.workload.trace
        return (merge.Bucket(tuple(trace.tensors), int(trace.nbytes)),)

    def worker_fields(self, sim, warmup: int) -> dict:
        from validate.ranks.decentralized import worker_fields

        return worker_fields(sim, warmup)

    def measured_keys(self, sim_exp: Experiment, config: Mapping, per_rank: Sequence[dict], plan, mode: str) -> dict:
        from validate.ranks.decentralized import communication_matches

        return {"buckets_match": communication_matches(config, per_rank, int(sim_exp.workload.trace.nbytes))}

    def host_probes(self, experiments: Sequence[Experiment], cost) -> dict[str, tuple[str, Experiment]]:
        """The rows' exchange on synthetic models of PROBE_MODEL_BYTES in four layers (one message of the whole
        model per rank and iteration: two sizes give the line), with the first row's topology, groups and
        schedule."""
        like = experiments[0]
        return {f"{self.algorithm}-{m // 1000}kB": (self.algorithm, probe_experiment(
            like, probe_trace((m // 4,) * 4, name=f"p{m // 1000}k"))) for m in PROBE_MODEL_BYTES}

    def host_points(self, prepared, per_rank: Sequence[dict]) -> list[tuple[float, float]]:
        """The in-step excess of each iteration's exchange over the prediction's (its comm intervals per rank, mean
        over ranks)."""
        nbytes = float(prepared.experiment.workload.trace.nbytes)
        model = predicted_spans(prepared.predicted)
        return excess_points(per_rank, [[(nbytes, model.get(it, 0.0))] for it in range(len(per_rank[0]["iterations"]))])


def predicted_spans(result) -> dict[int, float]:
    """Per iteration of a predicted Result, the mean over ranks of each rank's communication (comm intervals)."""
    frame = result.intervals()
    comm = frame[frame.kind == "comm"]
    spans = (comm.end_s - comm.start_s).groupby([comm.iteration, comm["rank"]]).sum().groupby(level=0).mean()
    return {int(it): float(v) for it, v in spans.items()}


PROBE_MODEL_BYTES = (100_000, 1_000_000)  # the bench's models are ~1 MB (one message each)


class Neighbor(Decentralized):
    algorithm = "neighbor"

    def simulated_comm(self, comm: Comm) -> Comm:
        # gloo's isend completes once TCP holds the message (the bench's <= 1 MB); without a barrier the ranks
        # drift apart: messages share the NICs as they overlap in time (simfog.flow_fluid)
        return replace(comm, negotiate=False, buffered_sends=True, p2p_sharing="fluid")

    def with_host_costs(self, sim_exp: Experiment, fits: Mapping) -> tuple[Experiment, object, str]:
        """The fit at the model's size, added to the latency of every link: neighbour averaging sends one message
        of the model per peer and iteration, which simfog.p2p charges one link latency (one per fused buffer, so
        the excess is split among them), and models no per-message overhead of its own."""
        fit, why = fit_of(fits, self.algorithm)
        if fit is None:
            return sim_exp, None, why
        nbytes = float(sim_exp.workload.trace.nbytes)
        slower, per_link = with_latency(sim_exp, fit.excess_s(nbytes))
        note = (f"{fit.how}; applied as {per_link * 1e3:.3f} ms more latency on every link (the fit at the "
                f"model's {nbytes / 1e3:.4g} kB)")
        return slower, fit, note

    host_measured = ("the link latency added that makes the model's exchange last as long as the one in the step "
                     "(the mean over the topology's phases of each phase's median)")

    def host_points(self, prepared, per_rank: Sequence[dict]) -> list[tuple[float, float]]:
        """(model bytes, the latency that, added to every link, makes the prediction's exchange last as long as the
        measured one in the step): the in-step excess as this model applies it. Under fluid sharing a message's
        latency overlaps other messages' transfers on a shared NIC, so that added latency lengthens an exchange by
        less than itself; the probe's own prediction is solved for it (bisection) rather than assumed. Both sides
        are compared phase by phase of the topology (one-peer exp2 alternates exchanges of one and of two flows
        per NIC): the median of each phase's iterations, averaged over the phases."""
        nbytes = float(prepared.experiment.workload.trace.nbytes)
        config = prepared.config
        phases = config["schedule"][config["warmup"]:]
        measured = by_phase(dict(enumerate(s[0] for s in spans(per_rank))), phases)

        def model(extra: float) -> float:
            return by_phase(predicted_spans(simulate(with_latency(prepared.experiment, extra)[0])), phases)

        if model(0.0) >= measured:
            return [(nbytes, 0.0)]
        low, high = 0.0, measured  # that much more latency makes the exchange at least that long
        while high - low > LATENCY_TOLERANCE_S:
            mid = (low + high) / 2
            low, high = (mid, high) if model(mid) < measured else (low, mid)
        return [(nbytes, (low + high) / 2)]

    def row_keys(self, exp: Experiment) -> dict:
        from validate.ranks.decentralized import NEIGHBOR_NOTE

        return {"merge": "", "note": NEIGHBOR_NOTE}


LATENCY_TOLERANCE_S = 1e-5


def by_phase(per_iteration: Mapping[int, float], phases: Sequence[int]) -> float:
    """The mean over phases of the median over each phase's iterations (`phases[it]`: iteration it's phase) of
    `per_iteration` (NaN values left out)."""
    groups: dict[int, list[float]] = {}
    for it, value in per_iteration.items():
        if it < len(phases) and value == value:
            groups.setdefault(phases[it], []).append(value)
    return statistics.fmean(statistics.median(v) for v in groups.values())


def with_latency(sim_exp: Experiment, extra_s: float) -> tuple[Experiment, float]:
    """`sim_exp` whose links (intra-node and NIC) take `extra_s` more latency per exchange: split among the fused
    buffers the model sends back to back (one link latency each; one for the validator's runs), and that share."""
    latencies = max(1, len(new_simulation(sim_exp).algorithm.fused))
    extra = extra_s / latencies
    c = sim_exp.cluster
    return replace(sim_exp, cluster=replace(c, intra=replace(c.intra, latency_s=c.intra.latency_s + extra),
                                            nic=replace(c.nic, latency_s=c.nic.latency_s + extra))), extra
