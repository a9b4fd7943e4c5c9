"""What validate.run asks of an algorithm family: the written protocol every adapter of validate.families follows.

A validation is the same six steps for every algorithm (validate.run): check what the rig can run, calibrate the
links from microbenchmarks, simulate with the calibrated cluster, run the ranks, turn their records into a measured
Result, compare. Where an algorithm family differs, validate.run calls one of these hooks of the family's adapter,
never tests the algorithm's name itself:

- `check(exp, mode, backend)`: raise ConfigError for what the family's rank program cannot run.
- `calibration_collective`: the microbenchmark whose fit prices the family's communication ("allreduce": gloo's
  ring, fitted with ring coefficients; "sendrecv": one message each way per rank, T = α + M·β).
- `point_to_point`: True when the simulated costs are point-to-point messages (simfog.p2p's flow-level model), so
  that the calibrated NIC becomes a per-flow cap of the emulated NIC's capacity (validate.calibration.flow_link).
- `simulated_comm(comm)`: the experiment's [comm] as simulated against what the rank program runs (gloo's ring is
  set for every family before; e.g. neighbour averaging without negotiation).
- `plan(sim)`: the "buckets" both sides name, in launch order (merge.Bucket: tensor names and bytes), from the
  simulation of the simulated experiment.
- `worker_fields(sim, warmup)`: the fields of the rank's configuration beyond the common ones (validate.ranks.worker).
- `row_keys(exp)`: the comparison row's "merge" and "note".
- `overhead_input`: the simfog.overheads input whose source the row quotes as `overheads_source`.
- `measured_keys(sim_exp, config, per_rank, plan, mode)`: row keys read from the ranks' records: "buckets_match"
  (the ranks ran exactly the simulated communication), and whatever else the family measures (fsdp: memory).
- `host_overhead(rig, like, fits)`: what the family's collectives cost the host beyond the calibrated network,
  measured on the group's cluster (`rig`: validate.run.Rig) after the calibration and before the rows, for
  experiments like `like`, with the group's fits by microbenchmark; (seconds per collective, how) or None (nothing
  to measure: the host's record, validate.calibration.host_overheads, stands).

A new family is one module here with one adapter per algorithm, registered in validate.families.FAMILIES.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from simfog import merge
from simfog.experiment import Comm, Experiment


class Family(Protocol):
    """The hooks of one algorithm's adapter (see the module docstring for what each must return)."""

    algorithm: str
    backends: tuple[str, ...]
    calibration_collective: str
    point_to_point: bool
    overhead_input: str

    def check(self, exp: Experiment, mode: str, backend: str) -> None: ...

    def simulated_comm(self, comm: Comm) -> Comm: ...

    def plan(self, sim) -> tuple[merge.Bucket, ...]: ...

    def worker_fields(self, sim, warmup: int) -> dict: ...

    def row_keys(self, exp: Experiment) -> dict: ...

    def measured_keys(self, sim_exp: Experiment, config: Mapping, per_rank: Sequence[dict], plan, mode: str) -> dict:
        ...

    def host_overhead(self, rig, like: Experiment, fits: Mapping) -> tuple[float, str] | None: ...


def buckets_match(plan, per_rank: Sequence[dict]) -> bool:
    """True when every rank ran exactly the plan's buckets, launched in plan order in every iteration (for ddp:
    the buckets torch DDP built, read from its comm hook)."""
    want = [list(b.tensors) for b in plan]
    for r in per_rank:
        if [list(b) for b in r["buckets"]] != want:
            return False
        if any(d["launch_order"] != list(range(len(want))) for d in r["iterations"]):
            return False
    return True
