"""Run experiments for real and simulate them with a calibrated cluster: the heart of `simfog validate`.

For a group of experiments that share one cluster shape (nodes, ranks per node, NIC bandwidth):

1. build the emulated cluster (`validate.cluster.netemu.open_cluster`: namespaces + tbf; plain loopback where that is
   not possible, and every row says so);
2. calibrate it from microbenchmarks on that same network, never from the validation runs (validate.calibration:
   gloo allreduce, or sendrecv for the point-to-point families, on the run's layout and on one node, fitted with
   ring coefficients), then measure what each family's rank program costs the host inside a training step beyond
   the same collectives bare (validate.host_calibration: one probe launch, `Family.host_probes`), which the
   prediction then pays (`Family.with_host_costs`); on switch tiers (a two-tier fat tree [fabric]:
   validate.cluster.fabric_emu) both measure the NICs with the uplinks lifted, and simfog.fabric predicts the rest;
3. simulate each experiment with the calibrated cluster and collective "gloo_ring" (gloo's segmented ring); the
   plan both sides name comes from the simulation that predicts (`Family.plan`), and the compute draws from that
   very `Simulation`, so both sides replay the same recorded iterations;
4. run all of them in one launch (`validate.ranks.worker` on every rank) and compare (`validate.comparison.compare`).

What differs between algorithms (what the rank program can run, which microbenchmark calibrates it, the plan, the
worker's fields, the row's keys) is its family's adapter, validate.families; this module calls their hooks. Not
emulated, hence refused for every family: degraded NICs, a global oversubscription factor (a [fabric]'s tiers
are emulated instead), fabrics other than a two-tier fat tree, and (in model mode) compute slowdown factors.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from simfog import merge
from simfog.calibrate import Calibration
from simfog.cluster import Cluster
from simfog.errors import ConfigError
from simfog.experiment import Experiment, override
from simfog.results import Result
from simfog.simulation import new_simulation
from simfog.trace import NetworkTrace
from validate import host_calibration
from validate.calibration import (
    CALIBRATION_SIZES,
    NCCL_CALIBRATION_SIZES,
    calibration_of,
    flow_link,
    host_overheads,
    host_probes,
    measure_network,
    nic_capacity,
    simulated_experiment,
)
from validate.cluster.fabric_emu import check_fabric, fabric_keys
from validate.cluster.fingerprint import fingerprint
from validate.cluster.hostload import HostSampler
from validate.cluster.nodes import check_gpus, dropped_packets, open_nodes, workspace
from validate.cluster.scheduling import PRIORITIES, RR_TIME_SLICE_MS, rr_time_slice
from validate.comparison import compare, rows
from validate.comparison.rows import export_timelines, measured_result
from validate.families import FAMILIES, family_of
from validate.families.allreduce import bucket_plan
from validate.families.sharded import memory_keys

__all__ = ["CALIBRATION_SIZES", "NCCL_CALIBRATION_SIZES", "GroupRun", "Options", "Validation", "bucket_plan",
           "calibration_of", "check_experiment", "export_timelines", "flow_link", "host_overheads", "measure_network",
           "measured_result", "memory_keys", "nic_capacity", "run_group", "simulated_experiment",
           "validate_experiment"]

MODES = ("replay", "model")
BACKENDS = ("gloo", "nccl")  # validate.ranks.worker.BACKENDS (kept here too: this module does not import torch)
STARTUP_S = 120.0  # starting the ranks (imports of torch on a few loaded cores) and the process group
# Scheduling of the ranks (calibration and runs alike), see validate.cluster.scheduling: "rt" (SCHED_RR, every thread,
# with a 1 ms round-robin slice while the ranks run), "nice" (nice -20) or "none". "rt" needs root.


@dataclass(frozen=True)
class Options:
    """How to run: compute `mode` ("replay" waits the traced times, "model" runs the zoo model), warm-up
    iterations dropped, `emulate` (None: an emulated network where possible, else loopback; False: loopback;
    True: emulated or NetemuError), calibration sizes (bytes), repeats and passes, replay spin (s), the time bound
    of the calibration runs (s), and `workdir` to keep the spec and per-rank records (default: a temporary
    directory)."""

    mode: str = "replay"
    warmup: int = 2
    emulate: bool | None = None
    calibration_sizes: tuple[int, ...] | None = None  # None: CALIBRATION_SIZES (gloo), NCCL_CALIBRATION_SIZES
    # 30 repeats in 10 passes through the sizes (each pass: every size 3 times), so a burst of load hits every size
    # alike rather than one: on this 2-core host, fits of one layout in 4 calibrations, 10 repeats back to back vs
    # 30 in 10 passes: 4 ranks at 200 Mbit/s alpha 297-366 vs 282-325 us, bandwidth 20.0-22.6 vs 22.0-23.1 MB/s;
    # run to run, the bench's predicted times had swung with alpha by up to 35 % (ResNet-20 wfbp, 8 ranks)
    calibration_repeats: int = 30
    calibration_rounds: int = 10
    spin_s: float = 2e-4
    calibration_timeout_s: float = 300.0
    workdir: str | None = None
    launcher: str = "local"       # validate.launch.torchrun.LAUNCHERS: local (simfog starts each rank), torchrun, slurm
    srun: str = "srun"            # the srun program (tests give a stub)
    hosts: tuple[str, ...] | None = None  # torchrun on a real cluster: its hosts, one node agent each (shared_dir)
    rdzv_port: int = 29400        # the rendezvous port on the first host (validate.launch.torchrun.RDZV_PORT)
    secret_file: str | None = None  # with hosts: the node agents' secret (validate.launch.agent_request)
    priority: str | None = None  # PRIORITIES key; None: "rt" in replay mode, "nice" in model mode (real compute
    #                              at real-time priority would starve the rest of the machine)
    backend: str = "gloo"         # BACKENDS: gloo on CPUs; nccl with one GPU per rank (calibrated with NCCL's model)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError("mode", self.mode, f"one of {', '.join(MODES)}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 1:
            raise ConfigError("warmup", self.warmup, "an integer >= 1 (DDP rebuilds its buckets after iteration 1)")
        if self.priority is not None and self.priority not in PRIORITIES:
            raise ConfigError("priority", self.priority, f"one of {', '.join(PRIORITIES)}")
        from validate.launch.torchrun import LAUNCHERS

        if self.launcher not in LAUNCHERS:
            raise ConfigError("launcher", self.launcher, f"one of {', '.join(LAUNCHERS)}")
        if self.backend not in BACKENDS:
            raise ConfigError("backend", self.backend, f"one of {', '.join(BACKENDS)}")
        if self.hosts is not None and (self.launcher != "torchrun" or not self.workdir):
            raise ConfigError("hosts", ",".join(self.hosts), "with --launcher torchrun and a --workdir every host "
                              "sees")

    @property
    def sizes(self) -> tuple[int, ...]:
        """The calibration microbenchmarks' sizes (bytes): as given, else the backend's default."""
        if self.calibration_sizes is not None:
            return tuple(self.calibration_sizes)
        return NCCL_CALIBRATION_SIZES if self.backend == "nccl" else CALIBRATION_SIZES

    @property
    def scheduling(self) -> str:
        """The PRIORITIES entry the ranks use: the chosen one, by default "rt" in replay mode and "nice" in model
        mode (real compute at real-time priority would starve the machine); "none" without root."""
        if os.geteuid() != 0:
            return "none"
        return self.priority or ("rt" if self.mode == "replay" else "nice")


@dataclass
class Validation:
    """One configuration: the experiment as given, the one simulated (calibrated cluster, ring), both Results
    (None when the run failed) and its comparison row (validate.comparison.compare.COLUMNS)."""

    id: str
    experiment: Experiment
    simulated: Experiment
    predicted: Result | None
    measured: Result | None
    row: dict


@dataclass
class GroupRun:
    """A group's validations, the calibration used (None for a single rank) and its measurements."""

    validations: list[Validation]
    calibration: Calibration | None
    network_trace: NetworkTrace | None
    emulated: bool
    note: str = ""
    rows: list[dict] = field(default_factory=list)
    prepared: list = field(default_factory=list)  # each row's Prepared (validate.jobs runs them again, together)


@dataclass(frozen=True)
class Prepared:
    """One configuration ready to run: the simulated experiment, its simulation, the plan both sides name, the
    prediction and the rank's configuration (validate.ranks.worker)."""

    experiment: Experiment
    sim: object
    plan: tuple[merge.Bucket, ...]
    predicted: Result
    config: dict
    host_fit: object = None  # the in-step host fit the prediction pays (validate.host_calibration.HostFit)
    host_note: str = ""      # how it was applied, or why there is none
    unprobed: Result | None = None  # the prediction without the fit (what the probe changed, in the row)


def check_experiment(exp: Experiment, mode: str, backend: str = "gloo", launcher: str = "local") -> None:
    """Raise ConfigError for what the emulated cluster or the worker cannot reproduce."""
    src = exp.source
    algorithm = exp.comm.algorithm
    if backend == "nccl" and (algorithm not in FAMILIES or "nccl" not in FAMILIES[algorithm].backends):
        raise ConfigError("comm.algorithm", algorithm, "allreduce with --backend nccl (the decentralized algorithms "
                          "are validated on gloo)", source=src)
    if backend == "nccl" and launcher == "local" and exp.cluster.nodes > 1:
        raise ConfigError("cluster.nodes", exp.cluster.nodes, "1 with --backend nccl and the local launcher (one "
                          "machine's GPUs; several nodes run through --launcher torchrun or slurm)", source=src)
    family_of(exp).check(exp, mode, backend)
    if exp.cluster.fabric is not None:  # switch tiers: validate.cluster.fabric_emu
        check_fabric(exp.cluster, launcher=launcher, backend=backend, source=src)
    if exp.cluster.oversubscription != 1.0:
        raise ConfigError("cluster.oversubscription", exp.cluster.oversubscription,
                          "1 (the emulated switch is not oversubscribed)", source=src)
    if exp.cluster.degraded_nics:
        raise ConfigError("heterogeneity.degraded_nics", dict(exp.cluster.degraded_nics),
                          "none (every emulated NIC has the same rate)", source=src)
    if mode == "model":
        from validate.collect import models

        h = exp.heterogeneity
        if h.rank_slowdown or h.node_slowdown:
            raise ConfigError("heterogeneity", "rank_slowdown/node_slowdown", "none in model mode (real compute "
                              "cannot be slowed by a factor; use mode replay)", source=src)
        if exp.workload.trace.model not in models.ZOO:
            raise ConfigError("workload.trace", exp.workload.trace.model,
                              f"a trace of a zoo model ({', '.join(models.names())}) in model mode", source=src)


@dataclass
class Rig:
    """A group's cluster as the families see it: `prepare` configurations and `run` them in one launch, under the
    group's options, in a folder of the group's workspace; what families' probes measure with
    (validate.host_calibration). `cache`: measurements kept across groups (the bench's), keyed by what they depend
    on."""

    cluster: object
    shape: Cluster
    options: Options
    work: Path
    cache: dict | None = None
    log: Callable[[str], None] = lambda s: None

    @property
    def key(self) -> tuple:
        """What measurements on this rig depend on: layout, NIC rate, emulation (the cache's key)."""
        return (self.shape.nodes, self.shape.ranks_per_node, self.shape.nic.bandwidth_Bps,
                bool(getattr(self.cluster, "shaped", False)))

    @property
    def replay(self) -> Options:
        """The group's options in replay mode, under the group's scheduling: what synthetic probes run with (their
        replay models are no zoo model, whatever the rows run)."""
        return replace(self.options, mode="replay", priority=self.options.scheduling)

    def prepare(self, vid: str, exp: Experiment, calibration, folder: Path) -> Prepared:
        """A probe configuration (replay mode; no host costs applied)."""
        return _prepare(vid, exp, calibration, self.replay, folder)

    def run(self, prepared: Sequence[Prepared], folder: Path, log=lambda s: None) -> tuple[list | None, str]:
        return _run_ranks(self.cluster, self.shape, prepared, self.replay, folder, log)


def run_group(experiments: Sequence[Experiment], options: Options = Options(), *, ids: Sequence[str] | None = None,
              cache: dict | None = None, log: Callable[[str], None] = lambda s: None, nodes=None) -> GroupRun:
    """Validate experiments that share nodes, ranks per node and NIC bandwidth, in one emulated cluster and one
    launch; `nodes`: an open cluster to run on instead (validate.jobs: one job's view of a shared fabric).
    Returns a GroupRun; a failed calibration or launch gives rows with `error` set (and no measured
    Result) rather than raising. Raises ConfigError for experiments that differ in shape or that cannot be
    emulated (`check_experiment`), NetemuError when `options.emulate` is True and no emulated network can be
    built."""
    from validate.launch.launcher import LaunchError

    if not experiments:
        return GroupRun([], None, None, False)
    machine = fingerprint()  # measured before any rank runs (once per process)
    first = experiments[0].cluster
    shape = (first.nodes, first.ranks_per_node, first.nic.bandwidth_Bps, first.fabric)
    for exp in experiments:
        check_experiment(exp, options.mode, options.backend, options.launcher)
        if (exp.cluster.nodes, exp.cluster.ranks_per_node, exp.cluster.nic.bandwidth_Bps, exp.cluster.fabric) != shape:
            raise ConfigError("cluster", exp.source or "experiment", "the same nodes, gpus_per_node, "
                              "nic_bandwidth and [fabric] (placement included) for every experiment of one group")
    if first.fabric is not None and options.emulate is False:
        raise ConfigError("--loopback", True, "left out for an experiment with a [fabric] (plain loopback has no "
                          "switch tiers to share)", source=experiments[0].source)
    if options.backend == "nccl" and options.launcher == "local":
        check_gpus(first.ranks_per_node)
    ids = list(ids) if ids is not None else [f"c{i}" for i in range(len(experiments))]
    families = [family_of(e) for e in experiments]
    slice_ = rr_time_slice() if options.scheduling == "rt" else contextlib.nullcontext(False)
    with workspace() as tmp, \
            (contextlib.nullcontext(nodes) if nodes is not None else open_nodes(first, options)) as cluster, \
            slice_ as short_slice:
        work = Path(options.workdir) if options.workdir else tmp
        work.mkdir(parents=True, exist_ok=True)
        emulated = bool(getattr(cluster, "shaped", False))
        real = options.launcher == "slurm" or options.hosts is not None
        note = "" if emulated else (f"not emulated: {cluster.reason}" if real else
                                    f"not emulated: plain loopback ({getattr(cluster, 'reason', '')})")
        if options.launcher != "local":
            note = "; ".join(filter(None, [note, f"launched with {options.launcher}"]))
        log(f"cluster {first.nodes} node(s) x {first.ranks_per_node}, NIC {first.nic.bandwidth_Bps * 8 / 1e6:g} "
            f"Mbit/s, {'emulated' if emulated else 'LOOPBACK'}, scheduling {options.scheduling}"
            f"{f' ({RR_TIME_SLICE_MS} ms round-robin slice)' if short_slice else ''}: calibrating")
        collectives = tuple(dict.fromkeys(f.calibration_collective for f in families))
        lifted = getattr(cluster, "uplinks_lifted", contextlib.nullcontext)  # the NICs alone (fabric_emu)
        try:
            with lifted():
                net = measure_network(cluster, first.ranks_per_node, options, work, cache, collectives)
        except LaunchError as e:
            failed = [Validation(vid, exp, exp, None, None, compare.failed_row(
                rows.row_keys(vid, exp, options, emulated, None), f"calibration failed: {e}"))
                for vid, exp in zip(ids, experiments, strict=True)]
            return GroupRun(failed, None, None, emulated, note, [v.row for v in failed])
        fits = {c: calibration_of(net, c, options.backend) for c in collectives}
        calibration = fits[collectives[0]]
        capacity = nic_capacity(first, emulated) if options.backend == "gloo" else None
        rig = Rig(cluster, first, options, work, cache, log)
        # gloo's in-step host work per collective (NCCL's GPUs: not probed); a single rank runs no collective
        with lifted():
            host = host_calibration.measure(rig, host_probes(families, experiments, fits), fits) \
                if options.backend == "gloo" and first.ranks > 1 else {}
        prepared = [_prepare(vid, exp, fits[fam.calibration_collective], options, work, capacity,
                             host)
                    for vid, exp, fam in zip(ids, experiments, families, strict=True)]
        load = os.getloadavg()[0]  # other work on the machine slows the ranks: recorded in every row
        drops = dropped_packets(cluster)
        with HostSampler() as host:  # is the CPU, rather than the emulated network, what limits a run?
            ranks, error = _run_ranks(cluster, first, prepared, options, work, log)
        drops = dropped_packets(cluster) - drops  # packets the shapers dropped during the runs (TCP then retransmits)
    validations = []
    for k, (vid, exp, fam) in enumerate(zip(ids, experiments, families, strict=True)):
        p = prepared[k]
        keys = {**rows.row_keys(vid, exp, options, emulated, fits[fam.calibration_collective]), "load_average": load,
                "dropped_packets": drops, **rows.overhead_keys(p.experiment, p.host_fit, p.host_note), **machine.row(),
                **fabric_keys(exp.cluster)}
        if p.experiment.cluster.nic.flow_bandwidth_Bps is not None:  # the flow-level model's NIC (flow_link)
            keys["nic_capacity_Bps"] = p.experiment.cluster.nic.bandwidth_Bps
        if ranks is None:
            validations.append(Validation(vid, exp, p.experiment, p.predicted, None, compare.failed_row(keys, error)))
            continue
        per_rank = [r["configs"][k] for r in ranks]
        keys.update(rows.host_keys(host, per_rank))
        measured = measured_result(p.experiment, per_rank, p.plan, p.sim)
        keys.update(fam.measured_keys(p.experiment, p.config, per_rank, p.plan, options.mode))
        row = {**compare.compare(keys, measured, p.predicted), **rows.unprobed_keys(measured, p.unprobed)}
        validations.append(Validation(vid, exp, p.experiment, p.predicted, measured, row))
    return GroupRun(validations, calibration, net, emulated, note, [v.row for v in validations], prepared)


def _prepare(vid: str, exp: Experiment, calibration: Calibration | None, options: Options, work: Path,
             capacity_Bps: float | None = None, host: Mapping | None = None) -> Prepared:
    """One configuration, prepared. `capacity_Bps`: the NIC capacity of point-to-point families (nic_capacity),
    ignored by the others. `host`: the group's in-step host fits (validate.host_calibration.measure), applied by
    the family (Family.with_host_costs); without, the host's record says none beyond the calibrated latency."""
    family = family_of(exp)
    overheads = host_overheads(exp.workload.trace, options.mode, options.backend)
    sim_exp = simulated_experiment(exp, calibration, overheads, capacity_Bps if family.point_to_point else None)
    fit, note, unprobed = None, "", None
    if host:
        paid, fit, note = family.with_host_costs(sim_exp, host)
        unprobed, sim_exp = (new_simulation(sim_exp).run() if fit is not None else None), paid
    sim = new_simulation(sim_exp)
    plan = family.plan(sim)
    trace_path = exp.workload.trace_path
    if not Path(trace_path).is_file():  # an in-memory trace: the ranks read it from a file
        trace_path = str(work / f"{vid}-trace.json")
        exp.workload.trace.save(trace_path)
    comm = exp.comm
    cap = None if comm.threshold_bytes is None else comm.threshold_bytes / merge.MiB
    config = {"id": vid, "mode": options.mode, "trace": trace_path, "compute": exp.workload.compute,
              "seed": exp.seed, "iterations": exp.iterations, "warmup": options.warmup, "merge": comm.merge,
              "buckets": None if comm.merge == "ddp" else [list(b.tensors) for b in plan], "bucket_cap_mb": cap,
              "samples": sim.draws.tolist(), "slowdown": sim.slowdown.tolist(), "delays": sim.delays.tolist(),
              "spin_s": options.spin_s, **family.worker_fields(sim, options.warmup)}
    return Prepared(sim_exp, sim, plan, sim.run(), config, fit, note, unprobed)


def _run_ranks(cluster, shape: Cluster, prepared: Sequence[Prepared], options: Options, work: Path,
               log, gate: dict | None = None) -> tuple[list | None, str]:
    """Launch validate.ranks.worker on every rank for all configurations: (per-rank records, "") or (None, error).
    `gate`: the worker's start gate, for several jobs started at once (validate.jobs)."""
    from validate.launch.launcher import LaunchError, python_rank_argv
    from validate.launch.torchrun import launch_ranks

    budget = STARTUP_S + sum((options.warmup + p.experiment.iterations)
                             * (3 * p.predicted.summary()["iteration_time_s"] + 1.0) for p in prepared)
    spec = work / "spec.json"
    spec.write_text(json.dumps({"configs": [p.config for p in prepared], "threads": 1, "timeout_s": budget,
                                "priority": options.scheduling, "backend": options.backend,
                                **({"gate": gate} if gate else {})}))
    out = work / "ranks"
    out.mkdir(exist_ok=True)
    log(f"running {len(prepared)} configuration(s) on {shape.ranks} rank(s), time bound {budget:.0f} s")
    try:
        launch_ranks(cluster, shape.ranks_per_node, python_rank_argv("validate.ranks.worker", spec, out), options,
                     budget)
    except LaunchError as e:
        return None, f"launch failed: {e}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(shape.ranks)], ""


def validate_experiment(exp: Experiment, options: Options = Options(), *, merges: Sequence[str] | None = None,
                        log: Callable[[str], None] = lambda s: None) -> GroupRun:
    """Validate one experiment (or the same one under each policy in `merges`). See `run_group`."""
    if merges and exp.comm.algorithm != "allreduce":
        raise ConfigError("--merge", ",".join(merges), f"no merge policies for algorithm {exp.comm.algorithm} "
                          "(it averages parameters, not gradients)", source=exp.source)
    if merges:
        exps = [override(exp, spelling="--", merge=m) for m in merges]
        ids = [f"{exp.workload.trace.model}-{m}" for m in merges]
    else:
        what = exp.comm.merge if exp.comm.algorithm == "allreduce" else exp.comm.algorithm
        exps, ids = [exp], [f"{exp.workload.trace.model}-{what}"]
    return run_group(exps, options, ids=ids, log=log)
