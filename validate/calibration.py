"""The calibrated cluster of a validation: microbenchmarks on the run's own nodes, their fit, the host's costs beyond
the wire, and the experiment as simulated with all of them.

1. `measure_network`: gloo collectives (allreduce; sendrecv for the point-to-point families) at a few sizes on
   one rank per node (the NIC class; on as many such nodes as the run has ranks, so that as many processes share
   the cores) and on the ranks of one node (the intra class), timed by `validate.ranks.worker --calibrate` as
   `simfog collect network` times, under the runs' scheduling; never from the validation runs.
2. `calibration_of`: fitted by `simfog.calibrate.fit` with ring coefficients and each class's per-call spread
   (the repetitions' spread, simfog.variation: the prediction draws every call from it) for gloo's allreduce, on
   the measured medians without a spread for sendrecv (see there), or NCCL's model (validate.nccl_calibration) on
   GPUs.
3. `host_overheads`: this host's bucket copy bandwidth (simfog.overheads' inputs), measured by the validator.
4. `host_probes`: the group's probes of what its families' rank programs cost the host (validate.host_calibration),
   sized with the calibrated collective costs.
5. `simulated_experiment`: the experiment with the calibrated links, collective "gloo_ring" (gloo's segmented ring)
   and what its family's rank program runs (validate.families: e.g. neighbour averaging without negotiation).
"""

from __future__ import annotations

import datetime
import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from simfog.calibrate import Calibration, fit
from simfog.cluster import Cluster, Link
from simfog.experiment import Experiment
from simfog.trace import NetworkTrace, Provenance

# Microbenchmark sizes (bytes): 1 kB pins the per-step latency, 3 MB the bandwidth; gradients and buckets of the
# bench models lie in between. Decimal, not powers of two: gloo's ring cuts a buffer into at least 2n segments,
# and exactly 64 KiB segments (1 MiB on 8 ranks) stall here, 16-70 ms instead of 15.7 ms (TCP's 64 KiB
# segmentation offload limit, presumably), while 940 kB and 1.31 MB take their bandwidth-bound time; a power of
# two would calibrate that artifact into every size.
CALIBRATION_SIZES = (1_000, 10_000, 100_000, 300_000, 1_000_000, 3_000_000)
# NCCL on GPUs: nccl-tests' `-b 8 -e 1G -f 2`, so the fit sees every protocol and algorithm regime NCCL switches
# between (simfog.nccl.fit needs the 64 KiB-4 MiB transitions, where buckets lie).
NCCL_CALIBRATION_SIZES = tuple(2**k for k in range(3, 31))


def calibration_of(net: NetworkTrace | None, collective: str, backend: str = "gloo"):
    """The fit of the measurements of `collective` in `net`: for gloo a Calibration (ring coefficients, a mixed
    layout's measurements as the NIC class), for nccl a validate.nccl_calibration.NcclFit (NCCL's model); None
    without measurements."""
    if net is None:
        return None
    if backend == "nccl":
        from validate import nccl_calibration

        return nccl_calibration.fit(net, collective)
    # The point-to-point families' ring shift is fitted on its medians as measured: each exchange of a step waits
    # for its slowest participant just as the microbenchmark's sample does, and the flow-level model that prices
    # those exchanges (flow_link) draws no per-call spread; dividing out an expected slowest rank (per_call) would
    # fit links faster than the shaper carries (1.13-1.3x on 4-8 ranks) with nothing to add it back.
    return fit(replace(net, measurements=tuple(m for m in net.measurements if m.collective == collective)),
               algorithm="ring", mixed_as_nic=True, per_call=collective != "sendrecv")


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
    """`exp` with the calibrated links and collective ring (what gloo runs), and the [comm] its family's rank program
    runs (validate.families: `simulated_comm`). `overheads`: this host's `host_overheads`, which replace the trace's
    own record (measured where the trace was collected); the experiment file's values still win
    (simfog.overheads.resolve). `nic_capacity_Bps`: what all flows through one NIC carry (`nic_capacity`); given,
    the calibrated NIC rate becomes the per-flow cap of a NIC of that capacity (flow_link)."""
    from validate.families import FAMILIES

    if overheads is not None:
        from validate.host_calibration import with_overheads

        exp = with_overheads(exp, overheads)
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
    if exp.comm.algorithm in FAMILIES:
        comm = FAMILIES[exp.comm.algorithm].simulated_comm(comm)
    scores = calibration.link_scores() if calibration is not None else ()
    return replace(exp, cluster=cluster, comm=comm, link_scores=scores)


def host_probes(families, experiments: Sequence[Experiment], fits: Mapping) -> dict:
    """The group's host probes: probe id -> (family, fit key, probe experiment), each family's over its rows, sized
    with the family's calibrated collective costs."""
    mine: dict = {}
    for fam, exp in zip(families, experiments, strict=True):
        mine.setdefault(fam.algorithm, (fam, []))[1].append(exp)
    out = {}
    for fam, exps in mine.values():
        model = simulated_experiment(exps[0], fits[fam.calibration_collective]).cost_model()
        probes = fam.host_probes(exps, lambda op, nbytes, model=model: model.time(op, nbytes, None))
        out.update({pid: (fam, key, probe) for pid, (key, probe) in probes.items()})
    return out


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


class _Nodes:
    """Some nodes of a cluster, for a launch on just those (e.g. node 0 for the intra-node microbenchmark)."""

    def __init__(self, cluster, nodes):
        self.cluster, self.nodes, self.shaped = cluster, tuple(nodes), getattr(cluster, "shaped", False)
        self.agents = getattr(cluster, "agents", None)

    def run_in(self, node: int, argv, **kwargs):
        return self.cluster.run_in(node, argv, **kwargs)


def _microbenchmark(cluster, ranks_per_node: int, link: str, options, work: Path,
                    collectives: tuple[str, ...] = ("allreduce",)) -> NetworkTrace:
    """`collectives` (options.backend) at options.sizes on `cluster`'s nodes, timed as `simfog collect network` times
    (validate.collect.collect_network.time_plan: barrier, then each call on every rank; sample = max over ranks), by
    validate.ranks.worker --calibrate so that the scheduling is the runs' own."""
    from validate.collect.collect_network import TIMING, make_plan, merge_ranks
    from validate.launch.launcher import python_rank_argv
    from validate.launch.torchrun import launch_ranks

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


def measure_network(cluster, ranks_per_node: int, options, work: Path, cache: dict | None = None,
                    collectives: tuple[str, ...] = ("allreduce",)) -> NetworkTrace | None:
    """Calibration measurements for a run of `ranks_per_node` ranks on each node of `cluster` (an EmulatedCluster
    or LoopbackCluster), under `options` (validate.run.Options): gloo `collectives` (allreduce; sendrecv for
    point-to-point families) on all ranks of the run's layout (NIC class, when there are several nodes; see below)
    and on `ranks_per_node` ranks of node 0 (intra class, when more than one), all collectives in one launch per
    class. `cache` (keyed by class, layout, NIC rate, emulation and, beyond allreduce alone, the collectives)
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
