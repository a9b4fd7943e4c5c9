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

from collections.abc import Mapping, Sequence
from dataclasses import replace

from simfog import merge
from simfog.experiment import Comm, Experiment


class Decentralized:
    """What neighbour averaging and WAGMA share: replay only, sendrecv links, the whole model as one bucket, the
    schedule from the simulator (validate.ranks.decentralized.worker_fields), the messages checked per rank."""

    backends = ("gloo",)
    calibration_collective = "sendrecv"
    point_to_point = True
    overhead_input = "bucket_copy_Bps"

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

    def host_overhead(self, rig, like: Experiment, fits: Mapping) -> tuple[float, str] | None:
        return None  # the host's record (validate.calibration.host_overheads) stands


class Neighbor(Decentralized):
    algorithm = "neighbor"

    def simulated_comm(self, comm: Comm) -> Comm:
        # gloo's isend completes once TCP holds the message (the bench's <= 1 MB); without a barrier the ranks
        # drift apart: messages share the NICs as they overlap in time (simfog.flow_fluid)
        return replace(comm, negotiate=False, buffered_sends=True, p2p_sharing="fluid")

    def row_keys(self, exp: Experiment) -> dict:
        from validate.ranks.decentralized import NEIGHBOR_NOTE

        return {"merge": "", "note": NEIGHBOR_NOTE}
