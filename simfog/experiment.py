"""The experiment file: workload × cluster × communication, the contract shared by the simulator and the validator.

TOML, read with tomllib. Paths are relative to the file; every quantity carries its unit; unknown keys are errors.
Over 400 lines because the file's whole contract is here, one parser per section ([workload], [cluster],
[comm], [heterogeneity]): every key, its unit, its default and the one-line error that names it, read top to bottom;
split by section, the cross-section checks (fsdp_unit against the trace, keys allowed per algorithm) would scatter.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from simfog import files, nccl, network_file, units
from simfog.algorithms import checks
from simfog.algorithms.allreduce.settings import AllreduceSettings, check_merge
from simfog.algorithms.dataflow.settings import DataflowSettings
from simfog.algorithms.dynamic.settings import DynamicSettings
from simfog.algorithms.sharded.settings import FSDP_UNIT_ALLOWED, ShardedSettings
from simfog.cluster import Cluster, Link
from simfog.engine.compute import COMPUTE_DRAWS, SHARED_DEFAULT
from simfog.errors import ConfigError, SimfogWarning, one_of, unknown_key
from simfog.nccl.clusters import trace_for_cluster
from simfog.nccl.prior import check_transport, delivered
from simfog.network_file import NetworkFile
from simfog.overheads import APPLIED_BY
from simfog.trace import ModelTrace, load_model_trace
from simfog.variation import MODES

if TYPE_CHECKING:
    from simfog.collectives import CostModel

COMPUTE_MODES = ("samples", "mean", "replay")
# What an experiment file that leaves them out runs (a trace planned alone too: simfog.plan.workload_experiment)
DEFAULT_COMPUTE = "samples"
DEFAULT_SEED = 0
DEFAULT_ITERATIONS = 5
COMPUTE_DRAWS_ALLOWED = ('"independent" (a draw per rank), "shared" (one draw for all ranks) or the share of '
                         "iterations whose ranks share one draw, from 0 to 1")


@dataclass(frozen=True)
class Workload:
    """A traced model; `compute` says whether layer times are drawn from the samples (seeded), fixed at means, or
    replayed in recorded order ("replay": simulated iteration i takes recorded iteration i mod samples, to
    reproduce a measured run at its own layout)."""

    trace: ModelTrace
    trace_path: str
    compute: str = DEFAULT_COMPUTE
    optimizer: str = "momentum"  # simfog.memory.OPTIMIZERS: the optimizer states each rank holds
    # with compute "samples": the share of iterations whose ranks all run one draw (simfog.engine.compute)
    compute_shared: float = SHARED_DEFAULT

    def __post_init__(self):
        w = self.compute_shared
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w <= 1:
            raise ConfigError("workload.compute_draws", w, COMPUTE_DRAWS_ALLOWED)

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
        each = "each rank draws" if not self.compute_shared else (
            "all ranks draw together" if self.compute_shared == 1 else
            f"ranks draw together in {self.compute_shared:.0%} of iterations, else each rank")
        how = {"samples": f"{each} one of {t.samples} recorded iterations per iteration",
               "mean": f"means of {t.samples} recorded iterations",
               "replay": f"{t.samples} recorded iterations replayed in order"}[self.compute]
        return f"{p.source} on {device} ({p.date[:10] or 'undated'}): {how}"


@dataclass(frozen=True, kw_only=True)
class Comm(AllreduceSettings, ShardedSettings, DataflowSettings, DynamicSettings):
    """How gradients are communicated: the training algorithm, the collective and its cost model's knobs, the costs
    beyond the wire, and each family's own settings (its dataclass in simfog/algorithms/<family>/settings.py, whose
    checks run here too). Every rule on these values is checked in __post_init__, whoever builds one: the
    experiment file, `override` (the command line, the Python API, sweep, plan, validate) or code."""

    algorithm: str = "allreduce"
    """The training algorithm: a name in simfog.algorithms.REGISTRY."""
    collective: str = "ring"
    """The collective algorithm: a name in simfog.collectives.ALGORITHMS."""
    alpha_s: float | None = None
    """collective "linear": seconds per collective (required there)."""
    beta_s_per_B: float | None = None
    """collective "linear": seconds per byte (required there)."""
    ps_servers: int | None = None
    """collective "ps": server machines (None: one per node)."""
    nccl_algorithms: tuple[str, ...] | None = None
    """collective "nccl": NCCL_ALGO, the algorithms it may choose (names of simfog.nccl.ALGOS)."""
    nccl_protocols: tuple[str, ...] | None = None
    """collective "nccl": NCCL_PROTO, the protocols it may choose (names of simfog.nccl.PROTOS)."""
    mpi_switch_bytes: float | None = None
    """collective "ompi": recursive doubling below this many bytes, ring at or above."""
    bucket_copy_Bps: float | None = None
    """Flat bucket buffer copy bandwidth, M/bw to pack and M/bw to unpack (None: the trace's, else unmeasured)."""
    collective_overhead_s: float | None = None
    """Seconds per collective launch: hooks, negotiation (None: the trace's, else unmeasured)."""
    overlap_slowdown: float | None = None
    """Backward runs this many times slower beside a running collective, 1..1000 (None: the trace's)."""
    variation: str = "draw"
    """How the links' per-call spread is evaluated (simfog.variation.MODES): "draw" (each call drawn, seeded) or
    "expected" (each call its expected slowest participant); nothing varies where every spread is 0."""

    def __post_init__(self):
        check_name("algorithm", self.algorithm)
        check_name("collective", self.collective)
        self.check_allreduce()
        self.check_sharded()
        self.check_dataflow()
        self.check_dynamic()
        if self.streams != 1 and self.algorithm != "allreduce":
            raise ConfigError("comm.streams", self.streams, '1 unless algorithm = "allreduce" (several collectives '
                              "in flight are modelled for bucketed allreduce only)")
        if self.collective == "linear" and (self.alpha_s is None or self.beta_s_per_B is None):
            raise ConfigError("comm.alpha" if self.alpha_s is None else "comm.beta", "(missing)",
                              'alpha (e.g. "50us") and beta (e.g. "0.8ns/B") when collective = "linear"')
        checks.integer(self.ps_servers, "comm.ps_servers", 1, MAX_RANK_ITERATIONS, " (server machines)")
        for key, given, allowed in (("nccl_algo", self.nccl_algorithms, nccl.ALGOS),
                                    ("nccl_proto", self.nccl_protocols, nccl.PROTOS)):
            if given is not None and (not isinstance(given, tuple) or not given or
                                      not all(isinstance(x, str) and x in allowed for x in given)):
                raise ConfigError(f"comm.{key}", given, f"one or more of {', '.join(allowed)}, e.g. "
                                  f'"{allowed[1]}"')
        if self.variation not in MODES:
            raise ConfigError("comm.variation", self.variation, f"one of {', '.join(MODES)}")
        f = self.overlap_slowdown
        if f is not None and (isinstance(f, bool) or not isinstance(f, int | float) or not 1 <= f <= 1e3):
            raise ConfigError("comm.overlap_slowdown", f, "a number from 1 to 1000: how many times slower "
                              "backward compute runs while a collective runs beside it (1.0 = no slowdown)")


def check_name(key: str, value: object, *, field: str | None = None, source: str | None = None) -> None:
    """The one check of a name in [comm] `key` = "algorithm", "collective" or "merge" (a catalogue's lists of
    collectives and merges too): ConfigError naming `field` (default comm.<key>) and every allowed name."""
    from simfog import algorithms, collectives

    if key == "merge":
        check_merge(value, field=field or "comm.merge", source=source)
        return
    registry = {"algorithm": algorithms.REGISTRY, "collective": collectives.ALGORITHMS}[key]
    registry.get(value, field=field or f"comm.{key}", source=source)


STRAGGLER_DISTRIBUTIONS = ("fixed", "exponential", "uniform")

MAX_SEED = 2**63 - 1   # seeds are written to CSV and JSON files and read back as int64
# One run simulates every (rank, iteration) and keeps its intervals: 10**6 of them take minutes and a few GB.
MAX_RANK_ITERATIONS = 10**6


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
    # (message bytes, |ln(measured / the installed links' time)|) of every microbenchmark the links were calibrated
    # from (simfog.calibrate.Calibration.link_scores): the interval's network part; empty where the links are written
    link_scores: tuple[tuple[int, float], ...] = ()
    transport: str | None = None  # [cluster] transport: the links' (nobody measured them; simfog.nccl.prior)

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
        """This experiment with Comm fields changed, in SI (threshold_bytes=26214400.0), each checked by Comm.
        Raises ConfigError for a name that is no Comm field (`override` takes the file's [comm] keys and units)."""
        unknown = sorted(set(changes) - set(Comm.__dataclass_fields__))
        if unknown:
            raise ConfigError(unknown[0], changes[unknown[0]], "a field of simfog.experiment.Comm (merge, collective, "
                              "threshold_bytes, ...); simfog.experiment.override takes the file's [comm] keys")
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
_TOP = {"seed", "iterations", "workload", "cluster", "comm", "heterogeneity", "fabric"}
_HETERO = {"rank_slowdown", "node_slowdown", "straggler_rate", "straggler_delay", "straggler_distribution",
           "degraded_nics"}
_WORKLOAD = {"trace", "compute", "optimizer", "compute_draws"}
_CLUSTER = {"nodes", "gpus_per_node", "intra_bandwidth", "intra_latency", "nic_bandwidth", "nic_latency",
            "oversubscription", "network_trace", "reduce_bandwidth", "network", "gpu_memory", "nic_flow_bandwidth",
            "intra_flow_bandwidth", "gpu", "nic_spread", "intra_spread", "transport"}


def _quantity_of(kind: str):
    """A converter of a [comm] key's text ("25MiB") to SI (simfog.units: the one parser of a quantity)."""
    return lambda value, field, source: units.parse(value, kind, field=field, source=source)


def _elements(value, field, source):
    return int(value) if isinstance(value, float) and value.is_integer() else value  # DeepSpeed configs write 5e8


def _number(value, field, source):
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _nccl_names(allowed: tuple[str, ...]):
    """An NCCL_ALGO / NCCL_PROTO-like list, "ring,tree" or ["ring", "tree"], to NCCL's spelling (any case, as
    NCCL); Comm checks the names."""
    canon = {a.lower(): a for a in allowed}

    def convert(value, field, source):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
            return value
        return tuple(canon.get(i.strip().lower(), i) for i in items)
    return convert


def _fsdp_unit(value, field, source):
    """[comm] fsdp_unit: "layer", "model", a list of layer counts or a size such as "50MB" (bytes)."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, str) and value not in ("layer", "model"):
        try:
            return units.parse(value, "bytes", field=field, source=source)
        except ConfigError:
            raise ConfigError(field, value, FSDP_UNIT_ALLOWED, source=source) from None
    if isinstance(value, int | float) and not isinstance(value, bool):  # a bare number: bytes? layers? refused
        raise ConfigError(field, value, FSDP_UNIT_ALLOWED + ' (a size needs its unit, e.g. "50MB")', source=source)
    return value


# Every [comm] key: the Comm field it sets and the converter from the file's value to the field's (None: as
# written). The experiment file and `override` both read keys through this table, and Comm checks the result: one
# parser and one check per key.
COMM_KEYS = {
    "algorithm": ("algorithm", None), "collective": ("collective", None), "merge": ("merge", None),
    "threshold": ("threshold_bytes", _quantity_of("bytes")), "cycle_time": ("cycle_time_s", _quantity_of("time")),
    "alpha": ("alpha_s", _quantity_of("time")), "beta": ("beta_s_per_B", _quantity_of("inverse_bandwidth")),
    "ps_servers": ("ps_servers", None), "streams": ("streams", None), "topology": ("topology", None),
    "combine": ("combine", None), "negotiate": ("negotiate", None), "buffered_sends": ("buffered_sends", None),
    "p2p_sharing": ("p2p_sharing", None), "hierarchical": ("hierarchical", None), "group_size": ("group_size", None),
    "global_every": ("global_every", None), "powersgd_rank": ("powersgd_rank", None),
    "encode_bandwidth": ("encode_bandwidth_Bps", _quantity_of("bandwidth")),
    "async_period": ("async_period_s", _quantity_of("time")), "consensus_eps": ("consensus_eps", None),
    "wait_for_group": ("wait_for_group", None), "global_collective": ("global_collective", None),
    "group_collective": ("group_collective", None), "nccl_algo": ("nccl_algorithms", _nccl_names(nccl.ALGOS)),
    "nccl_proto": ("nccl_protocols", _nccl_names(nccl.PROTOS)), "mpi_switch": ("mpi_switch_bytes",
                                                                              _quantity_of("bytes")),
    "bucket_copy_bandwidth": ("bucket_copy_Bps", _quantity_of("bandwidth")),
    "collective_overhead": ("collective_overhead_s", _quantity_of("time")),
    "overlap_slowdown": ("overlap_slowdown", _number),
    "fsdp_unit": ("fsdp_unit", _fsdp_unit), "reshard_after_forward": ("reshard_after_forward", None),
    "prefetch": ("prefetch", None), "param_dtype": ("param_dtype", None), "reduce_dtype": ("reduce_dtype", None),
    "hsdp_group": ("hsdp_group", None), "reduce_bucket_size": ("reduce_bucket_size", _elements),
    "allgather_bucket_size": ("allgather_bucket_size", _elements),
    "stage3_prefetch_bucket_size": ("prefetch_bucket_size", _elements), "overlap_comm": ("overlap_comm", None),
    "zero_reduce": ("zero_reduce", None), "variation": ("variation", None)}
_COMM = set(COMM_KEYS)
KEY_OF_FIELD = {f: k for k, (f, _) in COMM_KEYS.items()}  # Comm field -> its [comm] key (for messages)


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
            raise ConfigError(f"{prefix}{key}", d[key], unknown_key(key, allowed), source=source)


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


def _choice(d: Mapping, key: str, prefix: str, source: str | None, default: str, choices: tuple[str, ...]) -> str:
    v = d.get(key, default)
    if v not in choices:
        raise ConfigError(f"{prefix}{key}", v, one_of(v, choices), source=source)
    return v


def from_dict(d: Mapping, *, base_dir: Path = Path("."), source: str | None = None) -> Experiment:
    """Build and validate an Experiment from parsed TOML. Raises ConfigError naming the file, field and value."""
    _no_unknown(d, _TOP, "", source)
    seed = _int(d, "seed", "", source, default=DEFAULT_SEED, minimum=0)
    iterations = _int(d, "iterations", "", source, default=DEFAULT_ITERATIONS)
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
    compute = _choice(w, "compute", "workload.", source, DEFAULT_COMPUTE, choices=COMPUTE_MODES)
    from simfog.memory import DEFAULT_OPTIMIZER, OPTIMIZERS

    optimizer = _choice(w, "optimizer", "workload.", source, DEFAULT_OPTIMIZER, choices=tuple(OPTIMIZERS))
    draws = w.get("compute_draws", SHARED_DEFAULT)
    shared = COMPUTE_DRAWS.get(draws, draws) if isinstance(draws, str) else draws
    if isinstance(shared, str):
        raise ConfigError("workload.compute_draws", draws, COMPUTE_DRAWS_ALLOWED, source=source)

    c = _section(d, "cluster", _CLUSTER, source)
    p = "cluster."
    intra = Link(_quantity(c, "intra_latency", "time", p, source, "0us"),
                 _quantity(c, "intra_bandwidth", "bandwidth", p, source, "150GB/s", positive=True))
    if "network_trace" in c and "network" in c:
        raise ConfigError(f"{p}network", c["network"], "either network (a calibrated network file) or "
                          "network_trace, not both", source=source)
    network = None
    if "network" not in c and "network_trace" not in c and "nic_bandwidth" not in c:
        raise ConfigError(f"{p}nic_bandwidth", "(missing)",
                          'a bandwidth such as "25Gbit/s" (or set network or network_trace)', source=source)
    nic = Link(_quantity(c, "nic_latency", "time", p, source, "0us"),
               _quantity(c, "nic_bandwidth", "bandwidth", p, source, "1GB/s", positive=True))
    transport = None
    if "transport" in c:  # links nobody measured, of a stated transport: what the prior says they deliver
        if "network" in c or "network_trace" in c:
            raise ConfigError(f"{p}transport", c["transport"], "only for links nobody measured (nic_bandwidth): a "
                              "network file or network_trace measures what the links deliver", source=source)
        transport = check_transport(c["transport"], field=f"{p}transport", source=source)
        nic = delivered(nic, transport, latency_given="nic_latency" in c)
    over = c.get("oversubscription", 1.0)
    if isinstance(over, bool) or not isinstance(over, (int, float)) or not 1 <= over < math.inf:
        raise ConfigError(f"{p}oversubscription", over, "a finite number >= 1 (1 = full bisection bandwidth)",
                          source=source)
    gpus_per_node = _int(c, "gpus_per_node", p, source, default=0) or None  # None: not stated
    gpu_memory = _quantity(c, "gpu_memory", "bytes", p, source)
    if "network" in c:  # the calibrated network: its links (simfog.network_file.use, one meaning everywhere)
        named = network_file.load_named(c["network"], base_dir, field=f"{p}network", source=source).cluster
        if named is not None:  # a named cluster's GPU: an estimated trace re-estimated for it (simfog.nccl.clusters)
            trace = trace_for_cluster(trace, named, source=source)
            gpu_memory = gpu_memory if gpu_memory is not None else named.gpu_memory_B
        network, intra, nic = network_file.use(c["network"], base_dir, field=f"{p}network", source=source,
                                               gpus_per_node=gpus_per_node, intra_latency_s=intra.latency_s,
                                               written=c, prefix=p, device=_device_name(trace))
        gpus_per_node = network.cluster.gpus_per_node if network.cluster is not None else gpus_per_node
    cluster = Cluster(_int(c, "nodes", p, source), gpus_per_node or 1, intra, nic,
                      float(over), _quantity(c, "reduce_bandwidth", "bandwidth", p, source), gpu_memory_B=gpu_memory)
    network_trace, link_scores = None, ()
    if "network_trace" in c:
        from simfog.calibrate import link_calibration

        path = files.resolve(base_dir, str(c["network_trace"]), field=f"{p}network_trace", source=source)
        try:
            calibration = link_calibration(path)
            cluster, link_scores = calibration.apply(cluster), calibration.link_scores()
        except ConfigError as e:
            if e.field == "path" and e.source is None:  # missing, a directory, ...: the experiment's key is at fault
                raise ConfigError(f"{p}network_trace", c["network_trace"], f"{e.allowed} ({path})",
                                  source=source) from None
            raise e.in_file(str(path)) from None
        network_trace = str(path)

    logs_gpu = network.calibrated.gpu if network is not None and network.calibrated is not None else ""
    check_gpu(c, trace.device, p, source, said=logs_gpu)
    m = _section(d, "comm", _COMM, source, required=False)
    comm = comm_settings(Comm(collective="nccl" if network else "ring"), m, source=source)
    warn_if_nccl_without_network(comm.collective, network, f"{source}: comm.collective" if source else
                                 "comm.collective")
    check_against_workload(comm, trace, cluster, source=source)
    cluster = _with_flow_caps(cluster, c, source)
    if d.get("fabric") is not None:  # imported here: an experiment without one never loads simfog.fabric
        from simfog.fabric.job import attach as attach_fabric

        cluster = attach_fabric(cluster, d["fabric"], source=source,
                                nics_per_node=network.nccl.nics_per_node or 1 if network else 1)
    hetero, degraded = _heterogeneity(_section(d, "heterogeneity", _HETERO, source, required=False), cluster,
                                      source)
    if degraded:
        cluster = replace(cluster, degraded_nics=degraded)
    try:
        workload = Workload(trace, str(trace_path), compute, optimizer, shared)
    except ConfigError as e:
        raise e.in_file(source) if source else e from None
    return Experiment(seed, iterations, workload, cluster, comm, source,
                      network_trace, hetero, network, link_scores, transport)


def comm_settings(base: Comm, keys: Mapping, *, fields: Mapping | None = None, source: str | None = None) -> Comm:
    """`base` with Comm `fields` (SI) and the [comm] `keys` (the file's spelling and units: threshold = "25MiB")
    applied: each key converted by COMM_KEYS and allowed only with the algorithms (and collective) that read it, then
    the whole checked by Comm. The one reader of [comm] keys: the experiment file and `override` both call it.
    Raises ConfigError naming comm.<key>."""
    _no_unknown(keys, _COMM, "comm.", source)
    fields = dict(fields or {})
    for key, value in keys.items():
        name, convert = COMM_KEYS[key]
        fields[name] = convert(value, f"comm.{key}", source) if convert else value
    algorithm, collective = fields.get("algorithm", base.algorithm), fields.get("collective", base.collective)
    if isinstance(algorithm, str) and isinstance(collective, str):  # else Comm names the bad one
        for key, users in SHARDED_KEY_ALGORITHMS.items():
            if key in keys and algorithm not in users:
                raise ConfigError(f"comm.{key}", keys[key], f"only with algorithm = {' | '.join(users)}",
                                  source=source)
        for key, name in (("bucket_copy_bandwidth", "bucket_copy_Bps"),
                          ("collective_overhead", "collective_overhead_s"), ("overlap_slowdown", "overlap_slowdown")):
            if key in keys and algorithm not in APPLIED_BY[name]:
                raise ConfigError(f"comm.{key}", keys[key], f"only with algorithm {' or '.join(APPLIED_BY[name])} "
                                  "(the algorithms that model it)", source=source)
        if "mpi_switch" in keys and collective != "ompi":
            raise ConfigError("comm.mpi_switch", keys["mpi_switch"], 'only with collective = "ompi" (Open MPI\'s '
                              "recursive doubling -> ring switch point, e.g. the breakpoint `simfog calibrate` finds)",
                              source=source)
    try:
        return replace(base, **fields)
    except ConfigError as e:
        raise e.in_file(source) if source else e from None


def comm_value(key: str, value: object, *, field: str | None = None) -> object:
    """[comm] `key`'s value as the file writes it, in the Comm field's units (threshold "25MiB" -> 26214400.0):
    the converter of COMM_KEYS, for options that list several values (sweep's --threshold). Raises ConfigError
    naming `field` (default comm.<key>)."""
    convert = COMM_KEYS[key][1]
    return convert(value, field or f"comm.{key}", None) if convert else value


_TOP_OVERRIDES = ("ranks", "iterations", "seed")


def override(exp: Experiment, *, spelling: str | None = None, **changes) -> Experiment:
    """`exp` with `changes` applied, each read and checked by the same code as the experiment file's: `ranks`
    (whole nodes of gpus_per_node), `iterations`, `seed`, any [comm] key in the file's spelling and units
    (merge="ddp", threshold="25MiB") and any Comm field in SI (threshold_bytes=26214400.0). The command line's
    overrides, the Python API, sweep points, plan and validate all change an experiment here.

    Raises ConfigError naming the key as the caller spells it: `spelling` None names it as the file does
    (comm.threshold, ranks), "--" as the command line (--threshold), "" as the Python API (threshold)."""
    top = {k: changes.pop(k) for k in _TOP_OVERRIDES if k in changes}
    keys = {k: changes.pop(k) for k in list(changes) if k in COMM_KEYS}
    for name, value in changes.items():
        if name not in Comm.__dataclass_fields__:
            raise ConfigError(name if spelling is None else f"{spelling}{name}", value, "ranks, iterations, seed, a "
                              f"[comm] key ({', '.join(sorted(COMM_KEYS))}) or a Comm field")
    try:
        if top.get("ranks") is not None:
            exp = exp.with_ranks(top["ranks"])
        if top.get("iterations") is not None or top.get("seed") is not None:
            seed = exp.seed if top.get("seed") is None else top["seed"]
            iterations = exp.iterations if top.get("iterations") is None else top["iterations"]
            check_run_size(seed, iterations, exp.ranks)
            exp = replace(exp, seed=seed, iterations=iterations)
        comm = comm_settings(exp.comm, keys, fields=changes) if keys or changes else exp.comm
        check_against_workload(comm, exp.workload.trace, exp.cluster)
    except ConfigError as e:
        if spelling is None:
            raise
        field = e.field.removeprefix("comm.")
        field = KEY_OF_FIELD.get(field, field)
        raise ConfigError(f"{spelling}{field}", e.value, e.allowed, source=e.source) from None
    return replace(exp, comm=comm)


def check_against_workload(comm: Comm, trace: ModelTrace, cluster: Cluster, *, source: str | None = None) -> None:
    """The rules of [comm] that need the trace or the cluster: fsdp_unit's layer counts add up to the trace's
    layers, an HSDP group has the same shape everywhere, ZeRO's all-gather shards fit. Raises ConfigError."""
    try:
        if comm.algorithm in _FSDP and isinstance(comm.fsdp_unit, tuple):
            from simfog.algorithms.sharded.plan import fsdp_units

            fsdp_units(trace, comm.fsdp_unit)  # layer counts must add up to the trace's layers (ConfigError)
        if comm.algorithm in ("zero1", "zero2"):
            from simfog.algorithms.sharded.plan import allgather_shards

            allgather_shards(trace.parameters, comm.allgather_bucket_size, source=source)
        g = comm.hsdp_group
        if comm.algorithm == "hsdp" and g is not None:
            L, n = cluster.ranks_per_node, cluster.ranks
            if n % g or not (L % g == 0 or g % L == 0):
                raise ConfigError("comm.hsdp_group", g, f"a divisor of the {n} ranks that divides gpus_per_node = "
                                  f"{L} or is a multiple of it (every group then has the same shape)")
    except ConfigError as e:
        raise e.in_file(source) if source else e from None


def check_gpu(c: Mapping, device: object, prefix: str, source: str | None, *, said: str = "") -> None:
    """[cluster] gpu (a catalogue option's too): the GPU model the cluster has, a name such as "H100"; warned once
    (SimfogWarning) when the trace's device is another model (simfog.nccl.facts.other_device), unless `said` (the
    GPU of the network file's logs, which warns of it) is that model. Raises ConfigError for anything but a non-empty
    string."""
    if "gpu" not in c:
        return
    if not isinstance(c["gpu"], str) or not c["gpu"].strip():
        raise ConfigError(f"{prefix}gpu", c["gpu"], 'the GPU model of the cluster, e.g. "H100" (the trace\'s device '
                          "is checked against it)", source=source)
    from simfog.nccl.facts import model_of_name, other_device

    other = other_device(device, c["gpu"])
    if said and model_of_name(said) == (model_of_name(c["gpu"]) or c["gpu"].strip().upper()):
        return  # the network file's logs are of this model, and use() said it
    if other:
        where = f"{source}: " if source else ""
        warnings.warn(f"{where}{prefix}gpu = {c['gpu']!r}: {other}: the prediction times another GPU's compute "
                      "(simfog retarget estimates a trace for it; simfog collect model measures one)", SimfogWarning,
                      stacklevel=3)


def warn_if_nccl_without_network(collective: str, network: NetworkFile | None, where: str) -> None:
    """One SimfogWarning when NCCL's model is asked for without a network file: it then runs on facts assumed for
    any cluster (simfog.collectives: NCCL 2.30, Ampere, NVLink) over the links as written."""
    if collective == "nccl" and network is None:
        warnings.warn(f'{where} = "nccl" without a network file: NCCL\'s model runs on assumed facts (NCCL 2.30, '
                      "Ampere, NVLink) over the links as written; calibrate your cluster's (simfog calibrate LOGS -o "
                      "network.toml) and set [cluster] network", SimfogWarning, stacklevel=3)


def _with_flow_caps(cluster: Cluster, c: Mapping, source: str | None) -> Cluster:
    """The per-flow caps of the point-to-point model (simfog.p2p) from [cluster] nic_flow_bandwidth /
    intra_flow_bandwidth, and the per-call spreads (simfog.variation) from nic_spread / intra_spread, put on the
    links after any calibration has replaced them (a network file's [p2p] caps come with its links:
    simfog.network_file.use)."""
    links = {}
    for key, link in (("nic_flow_bandwidth", "nic"), ("intra_flow_bandwidth", "intra")):
        if key not in c:
            continue
        cap = _quantity(c, key, "bandwidth", "cluster.", source)
        if not cap > 0:
            raise ConfigError(f"cluster.{key}", c[key], 'a bandwidth > 0 with its unit, e.g. "850Mbit/s" (what one '
                              "flow reaches; leave the key out for the link's bandwidth)", source=source)
        links[link] = replace(getattr(cluster, link), flow_bandwidth_Bps=cap)
    for key, link in (("nic_spread", "nic"), ("intra_spread", "intra")):  # per-call spread (simfog.variation)
        if key in c:
            try:
                links[link] = replace(links.get(link, getattr(cluster, link)), spread=c[key])
            except ConfigError as e:
                raise ConfigError(f"cluster.{key}", c[key], e.allowed, source=source) from None
    return replace(cluster, **links) if links else cluster


def _device_name(trace: ModelTrace) -> str | None:
    name = trace.device.get("name") if isinstance(trace.device, Mapping) else None
    return name if isinstance(name, str) else None


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


def load(path: str | Path, *, cluster: Mapping | None = None) -> Experiment:
    """Read an experiment TOML file; `cluster`: [cluster] keys given elsewhere (the command line's --nodes,
    --network, ...: simfog.overrides), read as the file's own in their place (network_file.given_keys). Raises
    ConfigError (naming the file) for anything wrong in it."""
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
    if cluster:
        table = data.get("cluster", {})
        data = {**data, "cluster": network_file.given_keys(table, cluster) if isinstance(table, dict) else table}
    try:
        return from_dict(data, base_dir=path.parent, source=str(path))
    except ConfigError as e:
        raise e.in_file(str(path)) from None
