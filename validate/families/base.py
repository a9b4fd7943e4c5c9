"""What validate.run asks of an algorithm family: the written protocol every adapter of validate.families follows.

A validation is the same steps for every algorithm (validate.run): check what the rig can run, calibrate the links
from microbenchmarks, probe what collectives cost the host inside a training step (validate.host_calibration),
simulate with all of it, run the ranks, turn their records into a measured Result, compare. Where an algorithm family
differs, validate.run calls one of these hooks of the family's adapter, never tests the algorithm's name itself:

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
- `host_probes(experiments, cost)`: the in-training host cost probes of the family's experiments of a group
  (validate.host_calibration): probe id -> (fit key, probe experiment: the family's rank program on a synthetic
  model with collectives of known sizes); probes of one fit key are fitted together, and the rows of one rank
  program share a fit key (allreduce: DDP's and the bucketed hooks' apart). `cost(op, bytes)`: seconds of a
  collective on the group's calibrated cluster (to size the probe's compute). {}: nothing to probe.
- `host_points(prepared, per_rank)`: the points (bytes, seconds) a probe's records give its fit, and
  `host_measured`, what those seconds are (most families: the in-step span minus what the calibrated model gives
  the same collective, validate.host_calibration.excess_points).
- `with_host_costs(sim_exp, fits)`: the simulated experiment with the fitted in-step excess applied through the
  model's inputs, the fit used (None: none) and a note of how, for the row's `overheads_source` ("" when the
  family has no fit: then the host's record stands).

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
    host_measured: str

    def check(self, exp: Experiment, mode: str, backend: str) -> None: ...

    def simulated_comm(self, comm: Comm) -> Comm: ...

    def plan(self, sim) -> tuple[merge.Bucket, ...]: ...

    def worker_fields(self, sim, warmup: int) -> dict: ...

    def row_keys(self, exp: Experiment) -> dict: ...

    def measured_keys(self, sim_exp: Experiment, config: Mapping, per_rank: Sequence[dict], plan, mode: str) -> dict:
        ...

    def host_probes(self, experiments: Sequence[Experiment], cost) -> dict[str, tuple[str, Experiment]]: ...

    def host_points(self, prepared, per_rank: Sequence[dict]) -> list[tuple[float, float]]: ...

    def with_host_costs(self, sim_exp: Experiment, fits: Mapping) -> tuple[Experiment, object, str]: ...


def fit_of(fits: Mapping, key: str):
    """(HostFit, "") of `key` in a group's host fits, (None, why) when its probe failed, (None, "") when none ran."""
    from validate.host_calibration import HostFit

    got = fits.get(key)
    return (got, "") if isinstance(got, HostFit) else (None, got or "")


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
