"""Run experiments for real and simulate them with a calibrated cluster: the heart of `simfog validate`.
Over 400 lines because it is the one place the steps of a validation meet (cluster, calibration, prediction, real
run, comparison); each step's machinery lives in its own module.

For a group of experiments that share one cluster shape (nodes, ranks per node, NIC bandwidth):

1. build the emulated cluster (`validate.cluster.netemu.open_cluster`: namespaces + tbf; plain loopback where that is not
   possible, and every row says so);
2. calibrate it from microbenchmarks on that same network, never from the validation runs: gloo allreduce at a few
   sizes on one rank per node (the NIC class; on as many such nodes as the run has ranks, so that as many
   processes share the cores) and on the ranks of one node (the intra class), timed by `validate.ranks.worker
   --calibrate` as `simfog collect network` times, under the runs' scheduling, fitted by `simfog.calibrate.fit`
   with ring coefficients;
3. simulate each experiment with the calibrated cluster and collective "gloo_ring" (gloo's segmented ring); the
   bucket plan comes from `simfog.merge.plan` with the same `CostModel`
   the simulator uses, and the compute draws from the very `Simulation` that predicts, so both sides replay the
   same recorded iterations;
4. run all of them in one launch (`validate.ranks.worker` on every rank) and compare (`validate.comparison.compare`).

Horovod is run with `merge.plan("horovod", ...)`'s static plan (the fusion its cycles produce on identical ranks),
launched as soon as each bucket is ready; the simulator models its cycles.

Decentralized algorithms (replay mode): "neighbor" (combine "awc", a non-hierarchical topology such as
one_peer_exp2) and "wagma" run `validate.ranks.decentralized` with the simulator's own schedule of messages or groups.
Their simulated costs are point-to-point messages, so their links are calibrated from a gloo "sendrecv"
microbenchmark (every rank sends M to its ring neighbour and receives M, both at once; T = α + M·β) on the same
network instead of the allreduce ring fit. That ring shift puts exactly one flow on each NIC (each way), so its
fitted rate is what ONE flow reaches: on an emulated cluster it becomes the per-flow cap of a NIC whose capacity is
the tbf rate's TCP payload (`flow_link`, `nic_capacity`; simfog.p2p's flow-level model), so that exchanges with
several flows on a NIC are not charged the fit's shortfall twice. neighbor is simulated with comm.negotiate =
false (the real run does not negotiate) and comm.buffered_sends (gloo's isend completes once the socket holds the
message: a rank's exchange ends with its receives) and comm.p2p_sharing = "fluid": without a barrier the ranks
drift apart, so the two flows of a node's NIC overlap only in part (measured transfers ~9 ms in steady state), which
simfog.flow_fluid times as they overlap; starting both at once (15.7 ms, "together") had mlp-neighbor-8r-4x2-1Gbit
+19/+20/+24 % off in three bench runs. wagma is run as a blocking group allreduce, which waits for the group's
members where simfog's model (and real WAGMA) does not: the two agree only without stragglers, so heterogeneity is
refused for it (see validate.ranks.decentralized). Not emulated, hence rejected: degraded NICs, oversubscription, other algorithms, and (in
model mode) compute slowdown factors and decentralized algorithms.

fsdp (replay or model mode, gloo) runs FSDP2 itself (`validate.ranks.fsdp`: fully_shard per unit of the experiment's fsdp_unit,
reshard_after_forward as given, the prefetch depth as FSDP2's explicit prefetch lists, all-gathers and
reduce-scatters asynchronous so that they overlap the replayed compute as FSDP2's streams do on GPUs). Its links
use the allreduce fit: gloo's all-gather follows the ring, and its reduce-scatter IS an allreduce of the whole
buffer, which simfog's gloo_ring costs as such (simfog.collectives). Its rows add the measured memory peak per rank
beside simfog's (`memory_keys`). zero2 (replay, gloo) runs DeepSpeed stage 2's schedule written by hand
(`validate.ranks.zero`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from simfog import merge
from simfog.calibrate import Calibration, fit
from simfog.cluster import Cluster, Link
from simfog.engine.compute import ComputeModel
from simfog.errors import ConfigError
from simfog.experiment import Experiment
from simfog.results import Result
from simfog.simulation import Simulation, new_simulation
from simfog.trace import NetworkTrace, Provenance
from validate.cluster.fingerprint import fingerprint
from validate.cluster.hostload import HostSampler
from validate.cluster.scheduling import PRIORITIES, RR_TIME_SLICE_MS, rr_time_slice
from validate.comparison import compare

MODES = ("replay", "model")
BACKENDS = ("gloo", "nccl")  # validate.ranks.worker.BACKENDS (kept here too: this module does not import torch)
DECENTRALIZED = ("neighbor", "wagma")  # validate.ranks.decentralized runs these
SHARDED = ("fsdp", "zero2")  # validate.ranks.fsdp (FSDP2 itself), validate.ranks.zero (a hand-written DeepSpeed stage 2)
REPO = Path(__file__).resolve().parents[1]
# Microbenchmark sizes (bytes): 1 kB pins the per-step latency, 3 MB the bandwidth; gradients and buckets of the
# bench models lie in between. Decimal, not powers of two: gloo's ring cuts a buffer into at least 2n segments,
# and exactly 64 KiB segments (1 MiB on 8 ranks) stall here, 16-70 ms instead of 15.7 ms (TCP's 64 KiB
# segmentation offload limit, presumably), while 940 kB and 1.31 MB take their bandwidth-bound time; a power of
# two would calibrate that artifact into every size.
CALIBRATION_SIZES = (1_000, 10_000, 100_000, 300_000, 1_000_000, 3_000_000)
# NCCL on GPUs: nccl-tests' `-b 8 -e 1G -f 2`, so the fit sees every protocol and algorithm regime NCCL switches
# between (simfog.nccl_fit needs the 64 KiB-4 MiB transitions, where buckets lie).
NCCL_CALIBRATION_SIZES = tuple(2**k for k in range(3, 31))
STARTUP_S = 120.0  # starting the ranks (imports of torch on a few loaded cores) and the process group
# The run's temporary folder in tempfile.gettempdir(): "simfog-validate-<pid>-<8 random>". A validator killed with
# SIGKILL (the only exit that cannot remove its own) has it removed by its supervisor (validate.cluster.supervisor)
# and, should that be killed too, by a later run, which the pid tells whose it is.
WORKSPACE_PREFIX = "simfog-validate-"
_WORKSPACE = re.compile(rf"{re.escape(WORKSPACE_PREFIX)}(?P<pid>\d+)-[a-z0-9_]{{8}}")
# Scheduling of the ranks (calibration and runs alike), see validate.cluster.scheduling: "rt" (SCHED_RR, every thread, with
# a 1 ms round-robin slice while the ranks run), "nice" (nice -20) or "none". "rt" needs root.


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


def check_experiment(exp: Experiment, mode: str, backend: str = "gloo", launcher: str = "local") -> None:
    """Raise ConfigError for what the emulated cluster or the worker cannot reproduce."""
    src = exp.source
    algorithm = exp.comm.algorithm
    if backend == "nccl" and algorithm not in ("allreduce", "fsdp"):
        raise ConfigError("comm.algorithm", algorithm, "allreduce with --backend nccl (the decentralized algorithms "
                          "are validated on gloo)", source=src)
    if backend == "nccl" and launcher == "local" and exp.cluster.nodes > 1:
        raise ConfigError("cluster.nodes", exp.cluster.nodes, "1 with --backend nccl and the local launcher (one "
                          "machine's GPUs; several nodes run through --launcher torchrun or slurm)", source=src)
    if algorithm not in ("allreduce", *DECENTRALIZED, *SHARDED):
        raise ConfigError("comm.algorithm", algorithm, f"one of allreduce, {', '.join(DECENTRALIZED)}, "
                          f"{', '.join(SHARDED)} (the algorithms validate runs)", source=src)
    if algorithm == "zero2":
        from validate.ranks.zero import check_experiment as check_zero

        check_zero(exp, mode, backend)
    if algorithm == "fsdp":
        from validate.ranks.fsdp import check_experiment as check_fsdp

        check_fsdp(exp, mode, backend)
    if algorithm in DECENTRALIZED:
        from validate.ranks.decentralized import check_experiment as check_decentralized

        check_decentralized(exp, mode)
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


def calibration_collective(exp: Experiment) -> str:
    """The microbenchmark that calibrates `exp`'s links: "allreduce" (fitted with ring coefficients) for algorithm
    allreduce, "sendrecv" (one message of M each way per rank, T = α + M·β) for the decentralized algorithms, whose
    simulated costs are point-to-point messages."""
    return "sendrecv" if exp.comm.algorithm in DECENTRALIZED else "allreduce"


def calibration_of(net: NetworkTrace | None, collective: str, backend: str = "gloo"):
    """The fit of the measurements of `collective` in `net`: for gloo a Calibration (ring coefficients, a mixed
    layout's measurements as the NIC class), for nccl a validate.nccl_calibration.NcclFit (NCCL's model); None
    without measurements."""
    if net is None:
        return None
    if backend == "nccl":
        from validate import nccl_calibration

        return nccl_calibration.fit(net, collective)
    return fit(replace(net, measurements=tuple(m for m in net.measurements if m.collective == collective)),
               algorithm="ring", mixed_as_nic=True)


def host_overheads(trace, mode: str, backend: str = "gloo") -> dict:
    """What communication costs beyond the wire on this host, measured here for the validation runs (a
    `comm_overheads` record, simfog.overheads.TRACE_KEY): the bucket copy bandwidth of `trace`'s gradients (one
    torch thread, as the ranks run), no separate per-collective overhead (the calibration microbenchmark times each
    allreduce from its Python call, so launching is already in the fitted latency) and, in replay mode, no overlap
    slowdown (replayed compute waits the traced times: nothing to slow down). In model mode the slowdown is left
    to the trace or the experiment file (measuring it needs a second process: `simfog collect model --overlap`)."""
    import torch

    from validate.collect.collect_model import _cpu_name, measure_copy

    if backend == "nccl":  # buckets are packed on the GPU: measured there, or said to be unmeasured
        if not torch.cuda.is_available():
            return {"bucket_copy_Bps": None, "bucket_copy_Bps_how": "not measured: no GPU visible to the validator "
                    "process (the ranks' GPUs pack the buckets)", "collective_overhead_s": 0.0,
                    "overlap_slowdown": 1.0 if mode == "replay" else None, "by": "the validator"}
        copy = measure_copy([((t.elements,), getattr(torch, t.dtype)) for t in trace.tensors.values()], "cuda")
        device = torch.cuda.get_device_name()
    else:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            copy = measure_copy([((t.elements,), getattr(torch, t.dtype)) for t in trace.tensors.values()])
        finally:
            torch.set_num_threads(threads)
        device = f"{_cpu_name()} (this host)"
    record = {"bucket_copy_Bps": copy["Bps"], "bytes": copy["bytes"],
              "bucket_copy_s": {"pack": copy["pack_s"], "unpack": copy["unpack_s"]},
              "collective_overhead_s": 0.0,
              "collective_overhead_s_how": "in the calibrated latency: the microbenchmark times each allreduce "
                                           "from its Python call, launch included",
              "overlap_slowdown": 1.0 if mode == "replay" else None,
              "device": device, "by": "the validator", "how": copy["how"]}
    if mode == "replay":
        record["overlap_slowdown_how"] = "replay mode: compute is waited, not run, so nothing slows it down"
    return record


def simulated_experiment(exp: Experiment, calibration: Calibration | None, overheads: dict | None = None,
                         nic_capacity_Bps: float | None = None) -> Experiment:
    """`exp` with the calibrated links and collective ring (what gloo runs); neighbor averaging without
    negotiation (the real run posts its messages at once). `overheads`: this host's `host_overheads`, which
    replace the trace's own record (measured where the trace was collected); the experiment file's values still
    win (simfog.overheads.resolve). `nic_capacity_Bps`: what all flows through one NIC carry (`nic_capacity`);
    given, the calibrated NIC rate becomes the per-flow cap of a NIC of that capacity (flow_link)."""
    if overheads is not None:
        from simfog.overheads import TRACE_KEY

        trace = exp.workload.trace
        trace = replace(trace, extra={**trace.extra, TRACE_KEY: overheads})
        exp = replace(exp, workload=replace(exp.workload, trace=trace))
    if calibration is not None and hasattr(calibration, "simulated"):  # NCCL on GPUs: NCCL's model, fitted
        return calibration.simulated(exp)
    cluster = calibration.apply(exp.cluster) if calibration is not None else exp.cluster
    if nic_capacity_Bps is not None and calibration is not None and "nic" in calibration.fits:
        cluster = replace(cluster, nic=flow_link(calibration.fits["nic"].link, nic_capacity_Bps))
    # gloo: a segmented ring whose step latency hides behind the transfer. Its 2 worker threads could run two
    # collectives at once (comm.streams = 2), but on this emulation (up to 8 ranks on 2 cores, per-message costs
    # are CPU time) that over-corrects: re-predicting the 96 allreduce rows of a bench run gave median/worst
    # |error| 1.7/21 % (ring), 2.1/23 % (gloo_ring), 3.1/46 % (gloo_ring, 2 streams). One stream it is.
    comm = replace(exp.comm, collective="gloo_ring")
    if exp.comm.algorithm == "neighbor":  # gloo's isend completes once TCP holds the message (the bench's <= 1 MB);
        # without a barrier the ranks drift apart: messages share the NICs as they overlap in time (simfog.flow_fluid)
        comm = replace(comm, negotiate=False, buffered_sends=True, p2p_sharing="fluid")
    if exp.comm.algorithm == "wagma":  # the real run: blocking subgroup allreduces and a global one, gloo rings
        comm = replace(comm, wait_for_group=True, global_collective=True, group_collective=True)
    return replace(exp, cluster=cluster, comm=comm)


def flow_link(fitted: Link, capacity_Bps: float) -> Link:
    """The NIC link of the flow-level point-to-point model (simfog.p2p) from a sendrecv fit: the fitted latency,
    the fitted rate as the per-flow cap and `capacity_Bps` as what the NIC carries in all (never below the fitted
    rate, so that the model still reproduces the microbenchmark it was fitted on).

    The sendrecv microbenchmark is a ring shift in the run's layout (rank r sends to r + 1, node by node), so
    every NIC carries exactly one flow each way: its fit is the rate ONE flow reaches while every rank of the run
    is busy, which is a per-flow rate, not the NIC's. Exchanges that put several flows on one NIC (one-peer exp2
    on 2 ranks per node: both ranks of a node send off-node at shifts >= 2) then run at min(cap, capacity /
    flows), where dividing the fitted rate by the flows would count the NIC twice."""
    return Link(fitted.latency_s, max(capacity_Bps, fitted.bandwidth_Bps), flow_bandwidth_Bps=fitted.bandwidth_Bps)


def nic_capacity(shape: Cluster, emulated: bool) -> float | None:
    """Bytes/s of TCP payload that all flows through one NIC of `shape` carry at most: the declared rate (what
    tbf shapes) times the payload share of a frame (validate.cluster.netemu.TCP_GOODPUT) on an emulated cluster;
    None elsewhere (loopback has no NIC; a real cluster's NIC rate is not known here), which keeps the calibrated
    rate as the NIC's."""
    if not emulated:
        return None
    from validate.cluster.netemu import TCP_GOODPUT

    return shape.nic.bandwidth_Bps * TCP_GOODPUT


def bucket_plan(sim_exp: Experiment) -> tuple[merge.Bucket, ...]:
    """The buckets both sides use: the simulator's own plan (simfog.algorithms.allreduce.static_plan, with the
    bucket overheads in the cost the policy sees; for horovod the static plan its cycles give on identical ranks)."""
    from simfog.algorithms.allreduce.plan import static_plan

    return static_plan(sim_exp)


class _Nodes:
    """Some nodes of a cluster, for a launch on just those (e.g. node 0 for the intra-node microbenchmark)."""

    def __init__(self, cluster, nodes):
        self.cluster, self.nodes, self.shaped = cluster, tuple(nodes), getattr(cluster, "shaped", False)
        self.agents = getattr(cluster, "agents", None)

    def run_in(self, node: int, argv, **kwargs):
        return self.cluster.run_in(node, argv, **kwargs)


def _microbenchmark(cluster, ranks_per_node: int, link: str, options: Options, work: Path,
                    collectives: tuple[str, ...] = ("allreduce",)) -> NetworkTrace:
    """`collectives` (options.backend) at options.sizes on `cluster`'s nodes, timed as `simfog collect network` times
    (validate.collect.collect_network.time_plan: barrier, then each call on every rank; sample = max over ranks), by
    validate.ranks.worker --calibrate so that the scheduling is the runs' own."""
    from validate.collect.collect_network import TIMING, make_plan, merge_ranks
    from validate.launch.launcher import python_rank_argv

    n_nodes = len(cluster.nodes)
    ranks = n_nodes * ranks_per_node
    plan = make_plan(collectives, options.sizes, ranks, options.calibration_repeats, 1,
                     min(options.calibration_rounds, options.calibration_repeats))
    out = work / f"calibration-{link}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan))
    argv = python_rank_argv("validate.ranks.worker", out / "plan.json", out, "--calibrate", "--priority",
                            options.scheduling, "--timeout", options.calibration_timeout_s,
                            "--backend", options.backend)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    launch_ranks(cluster, ranks_per_node, argv, options, options.calibration_timeout_s)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    where = "emulated network" if cluster.shaped else "plain loopback"
    notes = (f"{link} class: {ranks} rank(s) on {n_nodes} node(s) of an {where}; {options.calibration_repeats} "
             f"repeats in {plan['rounds']} passes through the sizes, 1 warm-up per size and pass; scheduling "
             f"{options.scheduling}; {TIMING}")
    software = results[0].get("info", {}).get("software", {})
    return NetworkTrace(options.backend, "tcp" if options.backend == "gloo" else "nccl",
                        Provenance("validate.run calibration microbenchmarks", started, platform.node(), "measured",
                                   notes=notes),
                        merge_ranks(results, ranks, n_nodes), {"link_class": link, "software": software})


def launch_ranks(cluster, ranks_per_node: int, argv: list[str], options: Options, timeout_s: float) -> None:
    """Run `argv` (a `python -m validate.ranks.worker ...` command) on every rank with the chosen launcher: simfog
    itself ("local"), one torchrun agent per node ("torchrun": started here in the emulated nodes, or by the node
    agents of a real cluster's hosts, validate.launch.shared_dir) or srun inside a Slurm allocation ("slurm"); see
    validate.launch.torchrun. Raises LaunchError."""
    from validate.launch.launcher import launch
    from validate.launch.torchrun import launch_slurm, launch_torchrun

    if getattr(cluster, "agents", None) is not None:  # a real cluster's node agents (validate.launch.shared_dir)
        cluster.agents.launch([n.index for n in cluster.nodes], ranks_per_node, argv, env=_rank_env(),
                              timeout_s=timeout_s)
    elif options.launcher == "torchrun":
        launch_torchrun(cluster, ranks_per_node, argv, env=_rank_env(), timeout_s=timeout_s)
    elif options.launcher == "slurm":
        launch_slurm(len(cluster.nodes), ranks_per_node, argv, env=_rank_env(), timeout_s=timeout_s,
                     srun=options.srun)
    else:
        launch(cluster, ranks_per_node, lambda r, node: argv, env_for_rank=lambda r, node: _rank_env(),
               timeout_s=timeout_s)


def _rank_env() -> dict:
    return {"OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def measure_network(cluster, ranks_per_node: int, options: Options, work: Path, cache: dict | None = None,
                    collectives: tuple[str, ...] = ("allreduce",)) -> NetworkTrace | None:
    """Calibration measurements for a run of `ranks_per_node` ranks on each node of `cluster` (an EmulatedCluster
    or LoopbackCluster): gloo `collectives` (allreduce; sendrecv for decentralized algorithms) on all ranks of the
    run's layout (NIC class, when there are several nodes; see below) and on `ranks_per_node` ranks of node 0
    (intra class, when more than one), all collectives in one launch per class. `cache` (keyed by class, layout,
    NIC rate, emulation and, beyond allreduce alone, the collectives)
    reuses measurements of the same shape. Returns one NetworkTrace, or None for a single rank. Raises LaunchError
    when one fails."""
    shaped = bool(getattr(cluster, "shaped", False))
    ranks = len(cluster.nodes) * ranks_per_node
    wanted = []
    extra = () if tuple(collectives) == ("allreduce",) else (tuple(collectives),)
    if len(cluster.nodes) > 1:
        wanted.append(("nic", ranks, ranks_per_node, cluster.nic_bandwidth_Bps, shaped, *extra))
    if ranks_per_node > 1:
        wanted.append(("intra", ranks_per_node, shaped, *extra))
    parts = []
    for key in wanted:
        if cache is not None and key in cache:
            parts.append(cache[key])
            continue
        if key[0] == "intra":
            trace = _microbenchmark(_Nodes(cluster, cluster.nodes[:1]), ranks_per_node, "intra", options, work,
                                    collectives)
        else:
            # One rank per node: the NIC class proper. Several ranks per node: the run's own layout (fitted as the
            # NIC class, see calibration_of), so that its intra-node traffic loads the host's cores as in the run.
            # A stand-in of as many nodes as ranks (one rank each) shapes twice the NICs on the same 2 cores: at
            # 200 Mbit/s it fitted 381 us and 21.1 MB/s where 4 nodes x 2 fit 290 us and 22.9 MB/s, and the 4x2
            # rows came out +3 to +24 % (ResNet-20 wfbp +21 %; with its own layout +0.6 %).
            trace = _microbenchmark(cluster, ranks_per_node, "nic", options, work, collectives)
        if cache is not None:
            cache[key] = trace
        parts.append(trace)
    if not parts:
        return None
    first = parts[0]
    return NetworkTrace(first.backend, first.transport,
                        replace(first.provenance, notes=" | ".join(p.provenance.notes or "" for p in parts)),
                        tuple(m for p in parts for m in p.measurements), {"parts": [dict(p.extra) for p in parts]})


def _config(vid: str, exp: Experiment, sim: Simulation, plan, options: Options, trace_path: str) -> dict:
    comm = exp.comm
    cap = None if comm.threshold_bytes is None else comm.threshold_bytes / merge.MiB
    config = {"id": vid, "mode": options.mode, "trace": trace_path, "compute": exp.workload.compute,
              "seed": exp.seed, "iterations": exp.iterations, "warmup": options.warmup, "merge": comm.merge,
              "buckets": None if comm.merge == "ddp" else [list(b.tensors) for b in plan], "bucket_cap_mb": cap,
              "samples": sim.draws.tolist(), "slowdown": sim.slowdown.tolist(), "delays": sim.delays.tolist(),
              "spin_s": options.spin_s}
    if comm.algorithm in DECENTRALIZED:
        from validate.ranks.decentralized import worker_fields

        config.update(worker_fields(sim, options.warmup))
    if comm.algorithm == "fsdp":
        from validate.ranks.fsdp import worker_fields as fsdp_fields

        config.update(fsdp_fields(sim))
    if comm.algorithm == "zero2":
        from validate.ranks.zero import worker_fields as zero_fields

        config.update(zero_fields(sim))
    return config


def _row_keys(vid: str, exp: Experiment, options: Options, emulated: bool, cal: Calibration | None) -> dict:
    from validate.ranks.decentralized import NEIGHBOR_NOTE, WAGMA_NOTE, algorithm_label
    from validate.ranks.fsdp import FSDP_NOTE
    from validate.ranks.zero import ZERO2_NOTE

    c = exp.cluster
    decentralized = exp.comm.algorithm in (*DECENTRALIZED, *SHARDED)
    keys = {"id": vid, "model": exp.workload.trace.model, "mode": options.mode, "algorithm": algorithm_label(exp),
            "merge": "" if decentralized else exp.comm.merge,
            "ranks": c.ranks, "nodes": c.nodes, "ranks_per_node": c.ranks_per_node,
            "nic_bandwidth_Bps": c.nic.bandwidth_Bps, "emulated": emulated, "iterations": exp.iterations,
            "warmup": options.warmup, "trace": exp.workload.trace_path,
            "calibration": "" if cal is None else f"{options.backend} {calibration_collective(exp)}",
            "note": {"neighbor": NEIGHBOR_NOTE, "wagma": WAGMA_NOTE, "fsdp": FSDP_NOTE,
                     "zero2": ZERO2_NOTE}.get(exp.comm.algorithm, "")}
    for cls in ("nic", "intra"):
        if cal is not None and cls in cal.fits:
            keys[f"{cls}_latency_s"] = cal.fits[cls].latency_s
            keys[f"{cls}_fit_bandwidth_Bps"] = cal.fits[cls].bandwidth_Bps
    return keys


def _host_keys(host: HostSampler, per_rank: Sequence[dict]) -> dict:
    """The host's CPU load while this configuration's measured iterations ran (validate.cluster.hostload)."""
    its = [it for r in per_rank for it in r["iterations"]]
    if not its:
        return {}
    return host.load(min(it["start"] for it in its), max(it["end"] for it in its)).row()


def _overhead_keys(sim_exp: Experiment) -> dict:
    """The beyond-the-wire inputs the prediction used (simfog.overheads) and where the one that matters came from:
    the copy bandwidth (allreduce), the per-collective overhead (the sharded algorithms)."""
    oh = sim_exp.overheads()
    which = "collective_overhead_s" if sim_exp.comm.algorithm in SHARDED else "bucket_copy_Bps"
    return {"bucket_copy_Bps": oh.bucket_copy_Bps, "collective_overhead_s": oh.collective_overhead_s,
            "overlap_slowdown": oh.overlap_slowdown, "overheads_source": oh.sources.get(which, "")}


def run_group(experiments: Sequence[Experiment], options: Options = Options(), *, ids: Sequence[str] | None = None,
              cache: dict | None = None, log: Callable[[str], None] = lambda s: None) -> GroupRun:
    """Validate experiments that share nodes, ranks per node and NIC bandwidth, in one emulated cluster and one
    launch. Returns a GroupRun; a failed calibration or launch gives rows with `error` set (and no measured
    Result) rather than raising. Raises ConfigError for experiments that differ in shape or that cannot be
    emulated (`check_experiment`), NetemuError when `options.emulate` is True and no emulated network can be
    built."""
    from validate.launch.launcher import LaunchError

    if not experiments:
        return GroupRun([], None, None, False)
    machine = fingerprint()  # measured before any rank runs (once per process)
    first = experiments[0].cluster
    shape = (first.nodes, first.ranks_per_node, first.nic.bandwidth_Bps)
    for exp in experiments:
        check_experiment(exp, options.mode, options.backend, options.launcher)
        if (exp.cluster.nodes, exp.cluster.ranks_per_node, exp.cluster.nic.bandwidth_Bps) != shape:
            raise ConfigError("cluster", exp.source or "experiment", "the same nodes, gpus_per_node and "
                              "nic_bandwidth for every experiment of one group")
    if options.backend == "nccl" and options.launcher == "local":
        _check_gpus(first.ranks_per_node)
    ids = list(ids) if ids is not None else [f"c{i}" for i in range(len(experiments))]
    slice_ = rr_time_slice() if options.scheduling == "rt" else contextlib.nullcontext(False)
    with _workspace() as tmp, \
            _open(first, options) as cluster, \
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
        collectives = tuple(dict.fromkeys(calibration_collective(e) for e in experiments))
        try:
            net = measure_network(cluster, first.ranks_per_node, options, work, cache, collectives)
        except LaunchError as e:
            failed = [Validation(vid, exp, exp, None, None, compare.failed_row(
                _row_keys(vid, exp, options, emulated, None), f"calibration failed: {e}"))
                for vid, exp in zip(ids, experiments, strict=True)]
            return GroupRun(failed, None, None, emulated, note, [v.row for v in failed])
        fits = {c: calibration_of(net, c, options.backend) for c in collectives}
        calibration = fits[collectives[0]]
        capacity = nic_capacity(first, emulated) if options.backend == "gloo" else None
        fsdp_overhead = None
        if options.backend == "gloo" and any(e.comm.algorithm == "fsdp" for e in experiments):
            log("measuring FSDP2's host work per collective (validate.fsdp_calibration)")
            fsdp_overhead = _fsdp_overhead(cluster, first, experiments[0], fits["allreduce"], options, work, cache)
        prepared = [_prepare(vid, exp, fits[calibration_collective(exp)], options, work, capacity,
                             fsdp_overhead if exp.comm.algorithm == "fsdp" else None)
                    for vid, exp in zip(ids, experiments, strict=True)]
        load = os.getloadavg()[0]  # other work on the machine slows the ranks: recorded in every row
        drops = _drops(cluster)
        with HostSampler() as host:  # is the CPU, rather than the emulated network, what limits a run?
            ranks, error = _run_ranks(cluster, first, prepared, options, work, log)
        drops = _drops(cluster) - drops  # packets the shapers dropped during the runs (TCP then retransmits)
    validations = []
    for k, (vid, exp) in enumerate(zip(ids, experiments, strict=True)):
        sim_exp, plan, predicted, config = prepared[k]
        keys = {**_row_keys(vid, exp, options, emulated, fits[calibration_collective(exp)]), "load_average": load,
                "dropped_packets": drops, **_overhead_keys(sim_exp), **machine.row()}
        if sim_exp.cluster.nic.flow_bandwidth_Bps is not None:  # the flow-level model's NIC (flow_link)
            keys["nic_capacity_Bps"] = sim_exp.cluster.nic.bandwidth_Bps
        if ranks is None:
            validations.append(Validation(vid, exp, sim_exp, predicted, None, compare.failed_row(keys, error)))
            continue
        per_rank = [r["configs"][k] for r in ranks]
        keys.update(_host_keys(host, per_rank))
        measured = measured_result(sim_exp, per_rank, plan)
        if exp.comm.algorithm == "fsdp":
            keys.update(memory_keys(sim_exp, per_rank, options.mode))
        if exp.comm.algorithm in DECENTRALIZED:
            from validate.ranks.decentralized import communication_matches

            keys["buckets_match"] = communication_matches(config, per_rank, int(exp.workload.trace.nbytes))
        else:
            keys["buckets_match"] = _buckets_match(plan, per_rank)
        validations.append(Validation(vid, exp, sim_exp, predicted, measured,
                                      compare.compare(keys, measured, predicted)))
    return GroupRun(validations, calibration, net, emulated, note, [v.row for v in validations])


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


def _check_gpus(ranks: int) -> None:
    """Raise ConfigError unless this machine shows torch `ranks` CUDA GPUs (--backend nccl, local launcher)."""
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < ranks:
        raise ConfigError("--backend", "nccl", f"gloo on this machine: nccl needs one CUDA GPU per rank ({ranks}), "
                          f"torch sees {have}")


def _open(shape: Cluster, options: Options):
    """The nodes to run on: an emulated (or loopback) cluster of shape.nodes, or a Slurm allocation's nodes."""
    from validate.cluster.netemu import open_cluster
    from validate.launch.shared_dir import AgentNodes
    from validate.launch.torchrun import RealNodes

    if options.launcher == "slurm":
        return RealNodes([f"slurm-node{i}" for i in range(shape.nodes)], shape.nic.bandwidth_Bps,
                         "a real cluster through Slurm (srun)")
    if options.hosts is not None:
        if len(options.hosts) != shape.nodes:
            raise ConfigError("--hosts", ",".join(options.hosts), f"{shape.nodes} host names (cluster.nodes), the "
                              "first hosting the rendezvous")
        return AgentNodes(list(options.hosts), shape.nic.bandwidth_Bps, options.workdir, port=options.rdzv_port,
                          secret_file=options.secret_file)
    # NCCL's GPUs talk over NVLink / PCIe, not through an emulated NIC: one machine's GPUs are one node
    emulate = False if options.backend == "nccl" else options.emulate
    return open_cluster(shape.nodes, shape.nic.bandwidth_Bps, emulate=emulate)


@contextlib.contextmanager
def _workspace() -> Iterator[Path]:
    """The run's temporary folder, removed on leaving the block (success, error, KeyboardInterrupt; SIGTERM too, as
    it raises SystemExit meanwhile; SIGKILL by the supervisor, which this starts before anything else changes the
    host). Folders of validators killed with their supervisors are removed first."""
    from validate.cluster.supervisor import temporary_folder
    from validate.launch.launcher import signals_raise

    _remove_dead_workspaces()
    with signals_raise(), temporary_folder(f"{WORKSPACE_PREFIX}{os.getpid()}-") as tmp:
        yield tmp


def _remove_dead_workspaces() -> None:
    """Removes temporary folders of validators whose process is gone (or a zombie); those of live runs stay."""
    from validate.cluster.supervisor import process_alive

    root = Path(tempfile.gettempdir())
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = _WORKSPACE.fullmatch(name)
        if m and not process_alive(int(m["pid"])):
            shutil.rmtree(root / name, ignore_errors=True)


def _drops(cluster) -> int:
    return sum(n[d]["dropped_packets"] for n in cluster.shaper_stats() for d in ("upload", "download"))


def _fsdp_overhead(cluster, shape: Cluster, like: Experiment, calibration, options: Options, work: Path,
                   cache: dict | None) -> tuple[float, str]:
    """(seconds, how): FSDP2's host work per collective on this cluster and layout, from the probe
    (validate.fsdp_calibration), run and fitted before the validated runs; (0, why) when the probe failed."""
    from validate import fsdp_calibration as probe

    key = ("fsdp-overhead", shape.nodes, shape.ranks_per_node, shape.nic.bandwidth_Bps,
           bool(getattr(cluster, "shaped", False)))
    if cache is not None and key in cache:
        return cache[key]
    exp = probe.probe_experiment(like)
    (work / "fsdp-probe").mkdir(parents=True, exist_ok=True)
    prepared = _prepare(probe.PROBE_ID, exp, calibration, options, work / "fsdp-probe")
    sim = new_simulation(prepared[0])
    predicted = [sim.cost.time(c.op, c.nbytes, None) for c in sim.algorithm.plan.colls]
    ranks, error = _run_ranks(cluster, shape, [prepared], options, work / "fsdp-probe", lambda s: None)
    if ranks is None:
        return 0.0, f"unmeasured, 0: the FSDP2 probe failed ({error.splitlines()[0]})"
    result = probe.overhead(predicted, [r["configs"][0] for r in ranks])
    if cache is not None:
        cache[key] = result
    return result


def _prepare(vid: str, exp: Experiment, calibration: Calibration | None, options: Options, work: Path,
             capacity_Bps: float | None = None, collective_overhead: tuple[float, str] | None = None):
    """(simulated experiment, bucket plan, predicted Result, worker config) of one configuration. A decentralized
    algorithm's plan is one bucket, the whole model (its flat parameters). `capacity_Bps`: the NIC capacity of
    point-to-point experiments (nic_capacity), None for the others. `collective_overhead`: (seconds, how) measured
    per collective (fsdp: _fsdp_overhead), else the host's record says none beyond the calibrated latency."""
    p2p = calibration_collective(exp) == "sendrecv"
    overheads = host_overheads(exp.workload.trace, options.mode, options.backend)
    if collective_overhead is not None:
        overheads["collective_overhead_s"], overheads["collective_overhead_s_how"] = collective_overhead
    sim_exp = simulated_experiment(exp, calibration, overheads, capacity_Bps if p2p else None)
    sim = new_simulation(sim_exp)
    if exp.comm.algorithm in DECENTRALIZED:
        trace = exp.workload.trace
        plan = (merge.Bucket(tuple(trace.tensors), int(trace.nbytes)),)
    elif exp.comm.algorithm in SHARDED:  # the simulated plan's collectives, one "bucket" each
        plan = tuple(merge.Bucket((c.name,), int(c.nbytes)) for c in sim.algorithm.plan.colls)
    else:
        plan = bucket_plan(sim_exp)
    trace_path = exp.workload.trace_path
    if not Path(trace_path).is_file():  # an in-memory trace: the ranks read it from a file
        trace_path = str(work / f"{vid}-trace.json")
        exp.workload.trace.save(trace_path)
    config = _config(vid, exp, sim, plan, options, trace_path)
    return sim_exp, plan, sim.run(), config


def _run_ranks(cluster, shape: Cluster, prepared, options: Options, work: Path, log) -> tuple[list | None, str]:
    """Launch validate.ranks.worker on every rank for all configurations: (per-rank records, "") or (None, error)."""
    from validate.launch.launcher import LaunchError, python_rank_argv

    budget = STARTUP_S + sum((options.warmup + e.iterations) * (3 * p.summary()["iteration_time_s"] + 1.0)
                             for e, _, p, _ in prepared)
    spec = work / "spec.json"
    spec.write_text(json.dumps({"configs": [c for *_, c in prepared], "threads": 1, "timeout_s": budget,
                                "priority": options.scheduling, "backend": options.backend}))
    out = work / "ranks"
    out.mkdir(exist_ok=True)
    log(f"running {len(prepared)} configuration(s) on {shape.ranks} rank(s), time bound {budget:.0f} s")
    try:
        launch_ranks(cluster, shape.ranks_per_node, python_rank_argv("validate.ranks.worker", spec, out), options, budget)
    except LaunchError as e:
        return None, f"launch failed: {e}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(shape.ranks)], ""


def measured_result(sim_exp: Experiment, per_rank: Sequence[dict], plan) -> Result:
    """The measured Result of one configuration, buckets named as the simulator names them."""
    prefix = "fused" if sim_exp.comm.merge in merge.DYNAMIC else "bucket"
    single = ComputeModel.from_trace(sim_exp.workload.trace, sim_exp.workload.compute).single_rank_time_s()
    return compare.measured_result(sim_exp, per_rank, bucket_prefix=prefix, bucket_bytes=[b.nbytes for b in plan],
                                   single_rank_time_s=single)


def _buckets_match(plan, per_rank: Sequence[dict]) -> bool:
    """True when every rank ran exactly the plan's buckets, launched in plan order in every iteration (for ddp:
    the buckets torch DDP built, read from its comm hook)."""
    want = [list(b.tensors) for b in plan]
    for r in per_rank:
        if [list(b) for b in r["buckets"]] != want:
            return False
        if any(d["launch_order"] != list(range(len(want))) for d in r["iterations"]):
            return False
    return True


def validate_experiment(exp: Experiment, options: Options = Options(), *, merges: Sequence[str] | None = None,
                        log: Callable[[str], None] = lambda s: None) -> GroupRun:
    """Validate one experiment (or the same one under each policy in `merges`). See `run_group`."""
    if merges and exp.comm.algorithm != "allreduce":
        raise ConfigError("--merge", ",".join(merges), f"no merge policies for algorithm {exp.comm.algorithm} "
                          "(it averages parameters, not gradients)", source=exp.source)
    if merges:
        for m in merges:
            merge.POLICIES.get(m, field="--merge")
        exps = [exp.with_comm(merge=m) for m in merges]
        ids = [f"{exp.workload.trace.model}-{m}" for m in merges]
    else:
        what = exp.comm.merge if exp.comm.algorithm == "allreduce" else exp.comm.algorithm
        exps, ids = [exp], [f"{exp.workload.trace.model}-{what}"]
    return run_group(exps, options, ids=ids, log=log)


def export_timelines(validation: Validation, directory: str | os.PathLike) -> list[Path]:
    """Write the measured and the predicted intervals of one configuration into `directory`: CSVs in the schema of
    Result.intervals() (rank, iteration, kind, name, start_s, end_s), so comparing is a join, and Chrome traces
    (simfog.timeline.write_chrome_trace) for Perfetto. Returns the paths written."""
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

