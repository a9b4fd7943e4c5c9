"""The experiment file: workload × cluster × communication, the contract shared by the simulator and the validator.

TOML, read with tomllib. Paths are relative to the file; every quantity carries its unit; unknown keys are errors.
Over 400 lines because the file's whole contract is here, one parser per section ([workload], [cluster],
[comm], [heterogeneity]): every key, its unit, its default and the one-line error that names it, read top to bottom;
split by section, the cross-section checks (fsdp_unit against the trace, keys allowed per algorithm) would scatter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from simfog import files, nccl, network_file, units
from simfog.cluster import Cluster, Link
from simfog.errors import ConfigError
from simfog.fabric.job import attach as attach_fabric
from simfog.network_file import NetworkFile
from simfog.overheads import APPLIED_BY
from simfog.trace import MAX_COUNT, ModelTrace, load_model_trace

if TYPE_CHECKING:
    from simfog.collectives import CostModel

COMPUTE_MODES = ("samples", "mean", "replay")


@dataclass(frozen=True)
class Workload:
    """A traced model; `compute` says whether layer times are drawn from the samples (seeded), fixed at means, or
    replayed in recorded order ("replay": simulated iteration i takes recorded iteration i mod samples, to
    reproduce a measured run at its own layout)."""

    trace: ModelTrace
    trace_path: str
    compute: str = "samples"
    optimizer: str = "momentum"  # simfog.memory.OPTIMIZERS: the optimizer states each rank holds

    def compute_source(self) -> str:
        """Where the compute times come from, in one line for people: measured (device, date, how many recorded
        iterations, drawn per rank or averaged) or ESTIMATED (how)."""
        t, p = self.trace, self.trace.provenance
        device = t.device.get("name") or t.device.get("kind") or "an unnamed device"
        if p.estimated:
            how = {"mean": "fixed at their means", "samples": "drawn per rank",
                   "replay": "replayed in recorded order"}[self.compute]
            return (f"ESTIMATED for {device} ({p.command or 'no command recorded'}): {t.samples} sample(s) per "
                    f"layer, {how}")
        how = {"samples": f"each rank draws one of {t.samples} recorded iterations per iteration",
               "mean": f"means of {t.samples} recorded iterations",
               "replay": f"{t.samples} recorded iterations replayed in order"}[self.compute]
        return f"{p.source} on {device} ({p.date[:10] or 'undated'}): {how}"


@dataclass(frozen=True)
class Comm:
    """How gradients are communicated: training algorithm, collective algorithm, merge policy and their knobs."""

    algorithm: str = "allreduce"
    collective: str = "ring"
    merge: str = "ddp"
    threshold_bytes: float | None = None
    cycle_time_s: float | None = None
    alpha_s: float | None = None
    beta_s_per_B: float | None = None
    ps_servers: int | None = None
    streams: int = 1                         # collectives a rank keeps in flight (gloo: 2 worker threads; NCCL: 1)
    # Decentralized, group, asynchronous and compressed algorithms (None: the algorithm's own default).
    topology: str | None = None              # a name in simfog.topology.TOPOLOGIES
    combine: str = "awc"                     # neighbor averaging: "awc" adapt-with-combine, "atc" adapt-then-combine
    negotiate: bool | None = None            # BlueFog: ops wait for every rank's request (default true; win_put false)
    buffered_sends: bool = False             # p2p: a send completes once the socket holds it (TCP, gloo), not when
    #                                          delivered (MPI's rendezvous for large messages, NCCL): senders go on
    p2p_sharing: str = "together"            # p2p messages of a step share links as if all started together, or
    #                                          as they overlap in time ("fluid", per step; simfog.p2p)
    hierarchical: bool | None = None         # BAGUA decentralized / low-precision / bytegrad (default true)
    group_size: int | None = None            # WAGMA group size S (default 8, at most the rank count)
    global_every: int | None = None          # WAGMA: a global average every this many iterations (tau + 1, default 11)
    wait_for_group: bool = False             # WAGMA: a group op starts when its LAST member arrives (blocking)
    global_collective: bool = False          # WAGMA: cost the global step as comm.collective's allreduce
    group_collective: bool = False           # WAGMA: cost each group op as a ring allreduce among its members
    powersgd_rank: int | None = None         # PowerSGD matrix approximation rank (default 1)
    encode_bandwidth_Bps: float | None = None  # compression codec throughput, bytes of uncompressed data per s
    async_period_s: float | None = None      # BAGUA async: sleep between two averaging rounds (default 500 ms)
    consensus_eps: float | None = None       # mixing report: consensus error to reach (default 0.01)
    nccl_algorithms: tuple[str, ...] | None = None  # collective "nccl": NCCL_ALGO, the algorithms it may choose
    nccl_protocols: tuple[str, ...] | None = None   # NCCL_PROTO, the protocols it may choose
    mpi_switch_bytes: float | None = None    # collective "ompi": recursive doubling below, ring at or above
    # Costs beyond the wire (simfog.overheads; None: the trace's measurement, else unmeasured).
    bucket_copy_Bps: float | None = None     # flat bucket buffer copy bandwidth: M/bw to pack, M/bw to unpack
    collective_overhead_s: float | None = None  # per collective launch: hooks, negotiation
    overlap_slowdown: float | None = None    # backward runs this many times slower beside a running collective
    # Sharded data parallelism (simfog.algorithms.sharded; None: the algorithm's own default).
    fsdp_unit: str | float | tuple[int, ...] = "layer"  # "layer" | "model" | layer counts | a size in bytes
    reshard_after_forward: bool = True       # fsdp/hsdp: free a unit's parameters after forward, gather again
    prefetch: int = 1                        # fsdp/hsdp: all-gathers issued this many units ahead
    param_dtype: str | None = None           # dtype parameters are gathered and computed in (None: the trace's)
    reduce_dtype: str | None = None          # dtype gradients are reduced in (None: param_dtype)
    hsdp_group: int | None = None            # hsdp: ranks that shard one replica (None: gpus_per_node)
    reduce_bucket_size: int = 500_000_000    # zero*: elements per gradient bucket (DeepSpeed default 5e8)
    allgather_bucket_size: int = 500_000_000  # zero1/2: elements per parameter all-gather shard (5e8)
    prefetch_bucket_size: int = 50_000_000   # zero3: stage3_prefetch_bucket_size, elements prefetched (5e7)
    overlap_comm: bool | None = None         # zero*: reduce on a side stream (None: true for zero3, else false)
    zero_reduce: str = "allreduce"           # zero1/2: "allreduce" per bucket or "reduce" to each owner


STRAGGLER_DISTRIBUTIONS = ("fixed", "exponential", "uniform")

MAX_SEED = 2**63 - 1   # seeds are written to CSV and JSON files and read back as int64
# One run simulates every (rank, iteration) and keeps its intervals: 10**6 of them take minutes and a few GB.
MAX_RANK_ITERATIONS = 10**6
# Collectives one rank keeps in flight ([comm] streams): each is a stream the analytic path and the engine keep state
# for, so 2**63 of them never finished; real libraries run 1 (NCCL) or 2 (gloo).
MAX_STREAMS = 64


def check_run_size(seed: object, iterations: object, ranks: int, *, seed_field: str = "seed",
                   iterations_field: str = "iterations", source: str | None = None) -> None:
    """Raise ConfigError unless `seed` is an integer in 0..MAX_SEED, `iterations` an integer >= 1 and
    ranks x iterations at most MAX_RANK_ITERATIONS (naming the field, e.g. "--iterations", and the bound)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(seed_field, seed, f"an integer in 0..{MAX_SEED}", source=source)
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(iterations_field, iterations, "an integer >= 1", source=source)
    why = f"ranks x iterations is at most {MAX_RANK_ITERATIONS:,} (a larger run takes hours and tens of GB)"
    if ranks > MAX_RANK_ITERATIONS:
        raise ConfigError("ranks", ranks, f"at most {MAX_RANK_ITERATIONS:,}: {why}", source=source)
    if ranks * iterations > MAX_RANK_ITERATIONS:
        raise ConfigError(iterations_field, iterations, f"at most {MAX_RANK_ITERATIONS // ranks:,} with {ranks} "
                          f"ranks: {why}", source=source)


@dataclass(frozen=True)
class Heterogeneity:
    """Ranks that are not alike: compute slowdown factors (1.5 = 50 % slower), random stragglers (each rank's
    iteration is delayed with probability `straggler_rate` by a delay of mean `straggler_delay_s`), and degraded
    NICs (in Cluster.degraded_nics)."""

    rank_slowdown: tuple[tuple[int, float], ...] = ()
    node_slowdown: tuple[tuple[int, float], ...] = ()
    straggler_rate: float = 0.0
    straggler_delay_s: float = 0.0
    straggler_distribution: str = "exponential"

    @property
    def any(self) -> bool:
        return bool(self.rank_slowdown or self.node_slowdown or (self.straggler_rate and self.straggler_delay_s))


@dataclass(frozen=True)
class Experiment:
    seed: int
    iterations: int
    workload: Workload
    cluster: Cluster
    comm: Comm
    source: str | None = None          # the file it came from, for messages
    network_trace: str | None = None   # when the cluster links were calibrated from measurements
    heterogeneity: Heterogeneity = Heterogeneity()
    network: NetworkFile | None = None  # [cluster] network: a calibrated NCCL network (simfog.network_file)

    def __post_init__(self):
        # Here rather than only in from_dict: overrides (--iterations, --ranks, sweep points) go through replace().
        check_run_size(self.seed, self.iterations, self.cluster.ranks, source=self.source)

    def cost_model(self) -> CostModel:
        """The collective cost model of this experiment (comm.collective on the cluster, the network file's NCCL
        network and comm.nccl_algo / nccl_proto where given)."""
        from simfog.collectives import CostModel

        c = self.comm
        return CostModel(self.cluster, c.collective, c.alpha_s, c.beta_s_per_B, c.ps_servers,
                         self.network.nccl if self.network else None, c.nccl_algorithms, c.nccl_protocols,
                         c.mpi_switch_bytes)

    @property
    def homogeneous(self) -> bool:
        return not self.heterogeneity.any and not self.cluster.degraded_nics

    @property
    def ranks(self) -> int:
        return self.cluster.ranks

    @property
    def estimated(self) -> bool:
        """True when any input was estimated rather than measured."""
        return bool(self.workload.trace.provenance.estimated)

    def overheads(self):
        """The communication overheads this experiment runs with, each with its source (simfog.overheads)."""
        from simfog.overheads import resolve

        return resolve(self.comm, self.workload.trace)

    def with_ranks(self, ranks: int) -> Experiment:
        return replace(self, cluster=self.cluster.with_ranks(ranks))

    def with_comm(self, **changes) -> Experiment:
        return replace(self, comm=replace(self.comm, **changes))


# [comm] keys of sharded data parallelism and the algorithms that read them (simfog.algorithms.sharded).
_FSDP = ("fsdp", "hsdp")
_ZERO = ("zero1", "zero2", "zero3")
SHARDED_KEY_ALGORITHMS = {
    "fsdp_unit": _FSDP, "reshard_after_forward": _FSDP, "prefetch": _FSDP, "hsdp_group": ("hsdp",),
    "param_dtype": _FSDP + _ZERO, "reduce_dtype": _FSDP + _ZERO, "reduce_bucket_size": _ZERO,
    "allgather_bucket_size": ("zero1", "zero2"), "stage3_prefetch_bucket_size": ("zero3",),
    "overlap_comm": _ZERO, "zero_reduce": ("zero1", "zero2")}
SHARDED_KEYS = set(SHARDED_KEY_ALGORITHMS)
ZERO_REDUCES = ("allreduce", "reduce")
_TOP = {"seed", "iterations", "workload", "cluster", "comm", "heterogeneity", "fabric"}
_HETERO = {"rank_slowdown", "node_slowdown", "straggler_rate", "straggler_delay", "straggler_distribution",
           "degraded_nics"}
_WORKLOAD = {"trace", "compute", "optimizer"}
_CLUSTER = {"nodes", "gpus_per_node", "intra_bandwidth", "intra_latency", "nic_bandwidth", "nic_latency",
            "oversubscription", "network_trace", "reduce_bandwidth", "network", "gpu_memory", "nic_flow_bandwidth",
            "intra_flow_bandwidth"}
_COMM = {"algorithm", "collective", "merge", "threshold", "cycle_time", "alpha", "beta", "ps_servers", "streams",
         "topology",
         "combine", "negotiate", "buffered_sends", "p2p_sharing", "hierarchical", "group_size", "global_every", "powersgd_rank",
         "encode_bandwidth",
         "async_period", "consensus_eps", "wait_for_group", "global_collective", "group_collective", "nccl_algo",
         "nccl_proto",
         "mpi_switch",
         "bucket_copy_bandwidth", "collective_overhead", "overlap_slowdown"} | SHARDED_KEYS
COMBINES = ("awc", "atc")
P2P_SHARING = ("fluid", "together")


def _section(d: Mapping, name: str, allowed: set[str], source: str | None, required: bool = True) -> dict:
    if name not in d:
        if required:
            raise ConfigError(name, "(missing)", f"a [{name}] section", source=source)
        return {}
    sec = d[name]
    if not isinstance(sec, dict):
        raise ConfigError(name, sec, f"a [{name}] table", source=source)
    _no_unknown(sec, allowed, f"{name}.", source)
    return sec


def _no_unknown(d: Mapping, allowed: set[str], prefix: str, source: str | None) -> None:
    for key in d:
        if key not in allowed:
            raise ConfigError(f"{prefix}{key}", d[key], f"not a known key; allowed: {', '.join(sorted(allowed))}",
                              source=source)


def _int(d: Mapping, key: str, prefix: str, source: str | None, default: int | None = None, minimum: int = 1,
         maximum: int | None = None, why: str = "") -> int:
    allowed = f"an integer >= {minimum}" if maximum is None else f"an integer in {minimum}..{maximum:,}{why}"
    if key not in d:
        if default is None:
            raise ConfigError(f"{prefix}{key}", "(missing)", allowed, source=source)
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum or maximum is not None and v > maximum:
        raise ConfigError(f"{prefix}{key}", v, allowed, source=source)
    return v


def _quantity(d: Mapping, key: str, kind: str, prefix: str, source: str | None, default: str | None = None, *,
              positive: bool = False):
    """[section] key as a quantity of `kind` (SI), `default` when absent (None: None); `positive`: 0 refused too."""
    if key not in d:
        if default is None:
            return None
        return units.parse(default, kind)
    value = units.parse(d[key], kind, field=f"{prefix}{key}", source=source)
    if positive and not value > 0:
        raise ConfigError(f"{prefix}{key}", d[key], f"a {kind} > 0 with its unit", source=source)
    return value


def _choice(d: Mapping, key: str, prefix: str, source: str | None, default: str, registry=None,
            choices: tuple[str, ...] | None = None) -> str:
    v = d.get(key, default)
    names = registry.names() if registry is not None else list(choices or ())
    if v not in names:
        raise ConfigError(f"{prefix}{key}", v, f"one of {', '.join(names)}", source=source)
    return v


def from_dict(d: Mapping, *, base_dir: Path = Path("."), source: str | None = None) -> Experiment:
    """Build and validate an Experiment from parsed TOML. Raises ConfigError naming the file, field and value."""
    from simfog import algorithms, collectives, merge  # registries; imported here to keep this module light

    _no_unknown(d, _TOP, "", source)
    seed = _int(d, "seed", "", source, default=0, minimum=0)
    iterations = _int(d, "iterations", "", source, default=5)
    if seed > MAX_SEED:
        raise ConfigError("seed", seed, f"an integer in 0..{MAX_SEED}", source=source)
    w = _section(d, "workload", _WORKLOAD, source)
    if "trace" not in w or not isinstance(w["trace"], str):
        raise ConfigError("workload.trace", w.get("trace", "(missing)"), "a path to a model trace (.json or .json.gz)",
                          source=source)
    trace_path = files.resolve(base_dir, w["trace"], field="workload.trace", source=source)
    try:
        trace = load_model_trace(trace_path)
    except ConfigError as e:
        if e.field == "path":
            allowed = "an existing model trace file" if e.allowed == "an existing file" else e.allowed
            raise ConfigError("workload.trace", w["trace"], f"{allowed} ({trace_path})", source=source) from None
        raise
    compute = _choice(w, "compute", "workload.", source, "samples", choices=COMPUTE_MODES)
    from simfog.memory import DEFAULT_OPTIMIZER, OPTIMIZERS

    optimizer = _choice(w, "optimizer", "workload.", source, DEFAULT_OPTIMIZER, choices=tuple(OPTIMIZERS))

    c = _section(d, "cluster", _CLUSTER, source)
    p = "cluster."
    intra = Link(_quantity(c, "intra_latency", "time", p, source, "0us"),
                 _quantity(c, "intra_bandwidth", "bandwidth", p, source, "150GB/s", positive=True))
    if "network_trace" in c and "network" in c:
        raise ConfigError(f"{p}network", c["network"], "either network (a calibrated network file) or "
                          "network_trace, not both", source=source)
    network = _network_file(c, base_dir, source)
    if network is None and "network_trace" not in c and "nic_bandwidth" not in c:
        raise ConfigError(f"{p}nic_bandwidth", "(missing)",
                          'a bandwidth such as "25Gbit/s" (or set network or network_trace)', source=source)
    nic = Link(_quantity(c, "nic_latency", "time", p, source, "0us"),
               _quantity(c, "nic_bandwidth", "bandwidth", p, source, "1GB/s", positive=True))
    over = c.get("oversubscription", 1.0)
    if isinstance(over, bool) or not isinstance(over, (int, float)) or not 1 <= over < math.inf:
        raise ConfigError(f"{p}oversubscription", over, "a finite number >= 1 (1 = full bisection bandwidth)",
                          source=source)
    if network is not None:  # the calibrated bus bandwidths and inter-node latency stand in for the links
        intra = Link(intra.latency_s, network.nccl.intra_bus_Bps)
        nic = Link(network.nccl.latency_inter_s, network.nccl.inter_bus_Bps)
    cluster = Cluster(_int(c, "nodes", p, source), _int(c, "gpus_per_node", p, source, default=1), intra, nic,
                      float(over), _quantity(c, "reduce_bandwidth", "bandwidth", p, source),
                      gpu_memory_B=_quantity(c, "gpu_memory", "bytes", p, source))
    network_trace = None
    if "network_trace" in c:
        from simfog.calibrate import cluster_from_network_trace

        path = files.resolve(base_dir, str(c["network_trace"]), field=f"{p}network_trace", source=source)
        try:
            cluster = cluster_from_network_trace(path, cluster)
        except ConfigError as e:
            if e.field == "path" and e.source is None:  # missing, a directory, ...: the experiment's key is at fault
                raise ConfigError(f"{p}network_trace", c["network_trace"], f"{e.allowed} ({path})",
                                  source=source) from None
            raise e.in_file(str(path)) from None
        network_trace = str(path)

    m = _section(d, "comm", _COMM, source, required=False)
    p = "comm."
    comm = Comm(
        algorithm=_choice(m, "algorithm", p, source, "allreduce", algorithms.REGISTRY),
        collective=_choice(m, "collective", p, source, "nccl" if network else "ring", collectives.ALGORITHMS),
        merge=_choice(m, "merge", p, source, "ddp", merge.POLICIES),
        threshold_bytes=_quantity(m, "threshold", "bytes", p, source),
        cycle_time_s=_quantity(m, "cycle_time", "time", p, source),
        alpha_s=_quantity(m, "alpha", "time", p, source),
        beta_s_per_B=_quantity(m, "beta", "inverse_bandwidth", p, source),
        ps_servers=_int(m, "ps_servers", p, source, maximum=MAX_RANK_ITERATIONS, why=" (server machines)")
        if "ps_servers" in m else None,
        streams=_int(m, "streams", p, source, default=1, maximum=MAX_STREAMS,
                     why=" (collectives one rank keeps in flight: gloo 2, NCCL 1)"),
        nccl_algorithms=_names(m, "nccl_algo", p, source, nccl.ALGOS),
        nccl_protocols=_names(m, "nccl_proto", p, source, nccl.PROTOS),
        mpi_switch_bytes=_quantity(m, "mpi_switch", "bytes", p, source),
        **_decentralized_keys(m, p, source), **_overhead_keys(m, p, source), **_sharded_keys(m, p, source, cluster))
    if comm.streams != 1 and comm.algorithm != "allreduce":
        raise ConfigError("comm.streams", comm.streams, '1 unless algorithm = "allreduce" (several collectives in '
                          "flight are modelled for bucketed allreduce only)", source=source)
    for key, name in (("bucket_copy_bandwidth", "bucket_copy_Bps"), ("collective_overhead", "collective_overhead_s"),
                      ("overlap_slowdown", "overlap_slowdown")):
        if key in m and comm.algorithm not in APPLIED_BY[name]:
            raise ConfigError(f"comm.{key}", m[key], f"only with algorithm {' or '.join(APPLIED_BY[name])} (the "
                              "algorithms that model it)", source=source)
    if comm.algorithm in _FSDP and isinstance(comm.fsdp_unit, tuple):
        from simfog.algorithms.sharded.plan import fsdp_units

        fsdp_units(trace, comm.fsdp_unit)  # layer counts must add up to the trace's layers (ConfigError)
    if comm.algorithm in ("zero1", "zero2"):
        from simfog.algorithms.sharded.plan import allgather_shards

        allgather_shards(trace.parameters, comm.allgather_bucket_size, source=source)
    if comm.mpi_switch_bytes is not None and comm.collective != "ompi":
        raise ConfigError("comm.mpi_switch", m["mpi_switch"], 'only with collective = "ompi" (Open MPI\'s '
                          "recursive doubling -> ring switch point, e.g. the breakpoint `simfog calibrate` finds)",
                          source=source)
    if comm.merge == "threshold" and comm.threshold_bytes is None:
        raise ConfigError("comm.threshold", "(missing)", 'a size such as "25MiB" when merge = "threshold"',
                          source=source)
    if comm.collective == "linear" and (comm.alpha_s is None or comm.beta_s_per_B is None):
        raise ConfigError("comm.alpha" if comm.alpha_s is None else "comm.beta", "(missing)",
                          'alpha (e.g. "50us") and beta (e.g. "0.8ns/B") when collective = "linear"', source=source)
    cluster = _with_flow_caps(cluster, c, network, source)
    cluster = attach_fabric(cluster, d.get("fabric"), source=source,
                            nics_per_node=network.nccl.nics_per_node or 1 if network else 1)
    hetero, degraded = _heterogeneity(_section(d, "heterogeneity", _HETERO, source, required=False), cluster,
                                      source)
    if degraded:
        cluster = replace(cluster, degraded_nics=degraded)
    return Experiment(seed, iterations, Workload(trace, str(trace_path), compute, optimizer), cluster, comm, source,
                      network_trace, hetero, network)


def _with_flow_caps(cluster: Cluster, c: Mapping, network: NetworkFile | None, source: str | None) -> Cluster:
    """The per-flow caps of the point-to-point model (simfog.p2p), from [cluster] nic_flow_bandwidth /
    intra_flow_bandwidth or the network file's [p2p] section (one place per cap, not both), put on the links
    after any calibration has replaced them."""
    links = {}
    for key, link, name in (("nic_flow_bandwidth", "nic", "nic_Bps"), ("intra_flow_bandwidth", "intra", "intra_Bps")):
        from_file = getattr(network.flows, name) if network is not None else None
        if key in c and from_file is not None:
            raise ConfigError(f"cluster.{key}", c[key], f"either here or in the network file's [p2p] section "
                              f"({network.path}), not both", source=source)
        cap = _quantity(c, key, "bandwidth", "cluster.", source) if key in c else from_file
        if cap is None:
            continue
        if not cap > 0:
            raise ConfigError(f"cluster.{key}", c[key], 'a bandwidth > 0 with its unit, e.g. "850Mbit/s" (what one '
                              "flow reaches; leave the key out for the link's bandwidth)", source=source)
        links[link] = replace(getattr(cluster, link), flow_bandwidth_Bps=cap)
    return replace(cluster, **links) if links else cluster


def _network_file(c: Mapping, base_dir: Path, source: str | None) -> NetworkFile | None:
    """[cluster] network: the calibrated network file, relative to the experiment's folder."""
    if "network" not in c:
        return None
    if not isinstance(c["network"], str):
        raise ConfigError("cluster.network", c["network"], "a path to a network file (simfog calibrate -o ...)",
                          source=source)
    path = files.resolve(base_dir, c["network"], field="cluster.network", source=source)
    if not path.is_file():
        raise ConfigError("cluster.network", c["network"], f"an existing network file ({path})", source=source)
    return network_file.load(path)


def _names(m: Mapping, key: str, p: str, source: str | None, allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    """An NCCL_ALGO / NCCL_PROTO-like list: "ring,tree" or ["ring", "tree"] (case as NCCL: any)."""
    if key not in m:
        return None
    value = m[key]
    items = value.split(",") if isinstance(value, str) else value
    canon = {a.lower(): a for a in allowed}
    if not isinstance(items, list | tuple) or not items or not all(
            isinstance(i, str) and i.strip().lower() in canon for i in items):
        raise ConfigError(f"{p}{key}", value, f"one or more of {', '.join(allowed)}, e.g. \"{allowed[1]}\"",
                          source=source)
    return tuple(canon[i.strip().lower()] for i in items)


def _overhead_keys(m: Mapping, p: str, source: str | None) -> dict:
    """[comm] bucket_copy_bandwidth ("10GB/s", "0GB/s" = free copies), collective_overhead ("20us") and
    overlap_slowdown (a factor >= 1), validated; absent keys stay None (the trace's measurement or unmeasured)."""
    out: dict = {}
    if "bucket_copy_bandwidth" in m:
        out["bucket_copy_Bps"] = _quantity(m, "bucket_copy_bandwidth", "bandwidth", p, source)
    if "collective_overhead" in m:
        out["collective_overhead_s"] = _quantity(m, "collective_overhead", "time", p, source)
    if "overlap_slowdown" in m:
        f = m["overlap_slowdown"]
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 1 <= f <= 1e3:
            raise ConfigError(f"{p}overlap_slowdown", f, "a number from 1 to 1000: how many times slower backward "
                              "compute runs while a collective runs beside it (1.0 = no slowdown)", source=source)
        out["overlap_slowdown"] = float(f)
    for key, name in (("bucket_copy_bandwidth", "bucket_copy_Bps"), ("collective_overhead", "collective_overhead_s")):
        if name in out and not math.isfinite(out[name]):
            raise ConfigError(f"{p}{key}", m[key], "a finite value", source=source)
    return out


def _sharded_keys(m: Mapping, p: str, source: str | None, cluster: Cluster) -> dict:
    """The [comm] keys of sharded data parallelism, validated; each only with the algorithms that read it."""
    from simfog.trace import DTYPE_BYTES

    algorithm = m.get("algorithm", "allreduce")
    for key, users in SHARDED_KEY_ALGORITHMS.items():
        if key in m and algorithm not in users:
            raise ConfigError(f"{p}{key}", m[key], f"only with algorithm = {' | '.join(users)}", source=source)
    out: dict = {}
    if "fsdp_unit" in m:
        out["fsdp_unit"] = _fsdp_unit(m["fsdp_unit"], f"{p}fsdp_unit", source)
    for key in ("reshard_after_forward", "overlap_comm"):
        if key in m:
            if not isinstance(m[key], bool):
                raise ConfigError(f"{p}{key}", m[key], "true or false", source=source)
            out[key] = m[key]
    if "prefetch" in m:
        out["prefetch"] = _int(m, "prefetch", p, source, minimum=0)
    for key in ("param_dtype", "reduce_dtype"):
        if key in m:
            out[key] = _choice(m, key, p, source, "", choices=tuple(DTYPE_BYTES))
    if "hsdp_group" in m:
        g = _int(m, "hsdp_group", p, source, minimum=1)
        L, n = cluster.ranks_per_node, cluster.ranks
        if n % g or not (L % g == 0 or g % L == 0):
            raise ConfigError(f"{p}hsdp_group", g, f"a divisor of the {n} ranks that divides gpus_per_node = {L} or "
                              "is a multiple of it (every group then has the same shape)", source=source)
        out["hsdp_group"] = g
    for key, field in (("reduce_bucket_size", "reduce_bucket_size"), ("allgather_bucket_size", "allgather_bucket_size"),
                       ("stage3_prefetch_bucket_size", "prefetch_bucket_size")):
        if key in m:
            v = m[key]
            if isinstance(v, float) and v.is_integer():  # DeepSpeed configs write 5e8
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_COUNT:
                raise ConfigError(f"{p}{key}", m[key], f"a number of elements in 1..{MAX_COUNT:.4g} (2**53; an "
                                  "integer such as 5e8 or 500000000: DeepSpeed counts elements, not bytes)",
                                  source=source)
            out[field] = v
    if "zero_reduce" in m:
        out["zero_reduce"] = _choice(m, "zero_reduce", p, source, "allreduce", choices=ZERO_REDUCES)
    return out


def _fsdp_unit(v: object, field: str, source: str | None):
    """[comm] fsdp_unit: "layer", "model", a list of layer counts or a size such as "50MB" (bytes)."""
    allowed = '"layer", "model", a list of layer counts such as [2, 3] or a size such as "50MB"'
    if v in ("layer", "model"):
        return v
    if isinstance(v, list):
        if not v or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in v):
            raise ConfigError(field, v, allowed + " (counts are integers >= 1)", source=source)
        return tuple(v)
    if isinstance(v, str):
        try:
            size = units.parse(v, "bytes", field=field, source=source)
        except ConfigError:
            raise ConfigError(field, v, allowed, source=source) from None
        if not (size > 0 and math.isfinite(size)):
            raise ConfigError(field, v, allowed + " (a size > 0)", source=source)
        return float(size)
    raise ConfigError(field, v, allowed, source=source)


def _decentralized_keys(m: Mapping, p: str, source: str | None) -> dict:
    """The [comm] keys of the decentralized, group, asynchronous and compressed algorithms, validated."""
    from simfog.topology import TOPOLOGIES

    out: dict = {}
    if "topology" in m:
        out["topology"] = _choice(m, "topology", p, source, "", TOPOLOGIES)
    out["combine"] = _choice(m, "combine", p, source, "awc", choices=COMBINES)
    out["p2p_sharing"] = _choice(m, "p2p_sharing", p, source, "together", choices=P2P_SHARING)
    for key in ("hierarchical", "negotiate", "buffered_sends", "wait_for_group", "global_collective",
                "group_collective"):
        if key in m:
            if not isinstance(m[key], bool):
                raise ConfigError(f"{p}{key}", m[key], "true or false", source=source)
            out[key] = m[key]
    for key, least in (("group_size", 2), ("global_every", 1), ("powersgd_rank", 1)):
        if key in m:
            out[key] = _int(m, key, p, source, minimum=least)
    if "encode_bandwidth" in m:
        bw = _quantity(m, "encode_bandwidth", "bandwidth", p, source)
        if not bw > 0:
            raise ConfigError(f"{p}encode_bandwidth", m["encode_bandwidth"], 'a bandwidth > 0 such as "5GB/s"',
                              source=source)
        out["encode_bandwidth_Bps"] = bw
    if "async_period" in m:
        period = _quantity(m, "async_period", "time", p, source)
        if not period > 0:
            raise ConfigError(f"{p}async_period", m["async_period"], 'a time > 0 such as "500ms"', source=source)
        out["async_period_s"] = period
    if "consensus_eps" in m:
        eps = m["consensus_eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ConfigError(f"{p}consensus_eps", eps, "a number in (0, 1): the consensus error to reach, "
                              "relative to the initial disagreement", source=source)
        out["consensus_eps"] = float(eps)
    return out


def _index_map(h: Mapping, key: str, limit: int, what: str, source: str | None) -> dict[int, object]:
    table = h.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError(f"heterogeneity.{key}", table, f'a table of {what} index -> value, e.g. {{ "3" = 1.5 }}',
                          source=source)
    out = {}
    for k, v in table.items():
        if not (k.isdigit() and int(k) < limit):
            raise ConfigError(f"heterogeneity.{key}", k, f"a {what} index in 0..{limit - 1}", source=source)
        out[int(k)] = v
    return out


def _heterogeneity(h: Mapping, cluster: Cluster, source: str | None):
    p = "heterogeneity."
    slow = {}
    for key, limit, what in (("rank_slowdown", cluster.ranks, "rank"), ("node_slowdown", cluster.nodes, "node")):
        table = _index_map(h, key, limit, what, source)
        for i, v in table.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1e-3 <= v <= 1e3:  # NaN fails too
                # 1e-300 made a rank's iteration 1e-293 s and its throughput a 300-digit number
                raise ConfigError(f"{p}{key}.{i}", v, "a compute-time factor from 0.001 to 1000 (1.5 = 50 % "
                                  "slower)", source=source)
        slow[key] = tuple(sorted((i, float(v)) for i, v in table.items()))
    rate = h.get("straggler_rate", 0.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        raise ConfigError(f"{p}straggler_rate", rate, "a probability in [0, 1]", source=source)
    delay = _quantity(h, "straggler_delay", "time", p, source, "0s")
    if rate > 0 and "straggler_delay" not in h:
        raise ConfigError(f"{p}straggler_delay", "(missing)", 'a mean delay such as "50ms" when straggler_rate > 0',
                          source=source)
    dist = _choice(h, "straggler_distribution", p, source, "exponential", choices=STRAGGLER_DISTRIBUTIONS)
    degraded = tuple(sorted((node, units.bandwidth(v, field=f"{p}degraded_nics.{node}", source=source))
                            for node, v in _index_map(h, "degraded_nics", cluster.nodes, "node", source).items()))
    return Heterogeneity(slow["rank_slowdown"], slow["node_slowdown"], float(rate), delay, dist), degraded


def load(path: str | Path) -> Experiment:
    """Read an experiment TOML file. Raises ConfigError (naming the file) for anything wrong in it."""
    path = Path(path)
    try:
        text = files.read_text(path)
    except ConfigError as e:
        allowed = "an existing experiment file (.toml)" if e.allowed == "an existing file" else e.allowed
        raise ConfigError("path", str(path), allowed) from None
    if path.name.endswith((".json", ".json.gz")) or text.lstrip().startswith("{"):
        raise ConfigError("path", str(path), "an experiment file (.toml); this is JSON, e.g. a trace, which an "
                          'experiment names in [workload] trace = "..."')
    data = files.parse_toml(text, str(path))
    try:
        return from_dict(data, base_dir=path.parent, source=str(path))
    except ConfigError as e:
        raise e.in_file(str(path)) from None
