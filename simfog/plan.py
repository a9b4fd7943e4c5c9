"""Capacity planning: the cheapest GPU count, network option, collective and merge policy reaching a throughput.

A catalogue (TOML) lists cluster options with their price per GPU-hour in one currency: `currency`, an optional
`note`, and one [[option]] table per option (name, gpus_per_node, max_nodes, the links or a calibrated network
file, price_per_gpu_hour, ...), read and checked by load_catalogue; every key with its meaning and default:
`simfog plan --help` and docs/catalogue.md (a test holds both to the keys read here).

For every option, collective and merge policy, the answer is the smallest GPU count that meets the target (any
count up to one node, whole nodes above): more GPUs cost more per hour and, since scaling efficiency does not rise
with GPUs in data-parallel training, more per epoch too. The search doubles (powers of two up to one node, then
whole nodes doubling, then the option's maximum) until a count meets the target, then tries every count between
the last one that did not and that one, smallest first: 96 GPUs are found where doubling alone would say 128.
Cost is GPUs used x price per GPU-hour. Layer times are the experiment's ([workload] compute; a trace alone: an
experiment file's default), as simulate, sweep and curve take them: one answer for one configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from simfog import experiment, files, network_file, units
from simfog.bands import one_sided_level
from simfog.cluster import Cluster, Link
from simfog.errors import ConfigError, Infeasible, one_of, unknown_key
from simfog.experiment import MAX_RANK_ITERATIONS, Comm, Experiment, Workload, check_name, override
from simfog.fabric.job import JobFabric
from simfog.fabric.job import attach as attach_fabric
from simfog.network_file import NetworkFile
from simfog.titles import input_columns, plan_title

_TOP = {"currency", "note", "option"}
_OPTION = {"name", "description", "gpus_per_node", "max_nodes", "intra_bandwidth", "intra_latency", "nic_bandwidth",
           "nic_latency", "oversubscription", "price_per_gpu_hour", "collectives", "merges", "network", "gpu_memory",
           "fabric", "gpu"}


@dataclass(frozen=True)
class ClusterOption:
    """One way to buy a cluster: up to `max_nodes` nodes of `gpus_per_node` GPUs at `price_per_gpu_hour`."""

    name: str
    gpus_per_node: int
    max_nodes: int
    intra: Link
    nic: Link
    price_per_gpu_hour: float
    oversubscription: float = 1.0
    collectives: tuple[str, ...] = ()   # empty: the workload's
    merges: tuple[str, ...] = ()
    description: str = ""
    network: NetworkFile | None = None  # a calibrated network file: NCCL's model on a measured cluster
    gpu_memory_B: float | None = None   # device memory: configurations needing more are refused (simfog.memory)
    fabric: JobFabric | None = None     # the switches of max_nodes nodes and the placement (simfog.fabric)
    gpu: str = ""                       # the GPU model, e.g. "H100" ("": not said); a trace of another is warned of

    def cluster(self) -> Cluster:
        """One full node of this option (`with_ranks` scales it)."""
        return Cluster(1, self.gpus_per_node, self.intra, self.nic, self.oversubscription,
                       gpu_memory_B=self.gpu_memory_B, fabric=self.fabric)

    def gpu_counts(self) -> list[int]:
        """1, 2, 4, ... below one node, then gpus_per_node x 1, 2, 4, ... nodes, then the maximum if not yet hit."""
        counts = [1 << k for k in range(self.gpus_per_node.bit_length()) if 1 << k < self.gpus_per_node]
        nodes = 1
        while nodes <= self.max_nodes:
            counts.append(nodes * self.gpus_per_node)
            nodes *= 2
        if counts[-1] != self.max_nodes * self.gpus_per_node:
            counts.append(self.max_nodes * self.gpus_per_node)
        return counts

    def counts_between(self, low: int, high: int) -> list[int]:
        """Every usable GPU count strictly between `low` and `high`, increasing: any count up to one node, whole
        nodes above (what Cluster.with_ranks accepts)."""
        return [n for n in range(low + 1, high) if n <= self.gpus_per_node or n % self.gpus_per_node == 0]


@dataclass(frozen=True)
class Catalogue:
    currency: str
    options: tuple[ClusterOption, ...]
    source: str | None = None
    note: str = ""


def _option(d: dict, i: int, source: str) -> ClusterOption:
    from simfog import collectives, merge

    if not isinstance(d, dict):
        raise ConfigError(f"option[{i}]", d, "a table [[option]]", source=source)
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"option[{i}].name", name if name is not None else "(missing)", "a non-empty string",
                          source=source)
    p = f"option[{i}] ({name})."
    for key in d:
        if key not in _OPTION:
            raise ConfigError(p + key, d[key], unknown_key(key, _OPTION), source=source)

    def integer(key, most=MAX_RANK_ITERATIONS):
        v = d.get(key, "(missing)")
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
            raise ConfigError(p + key, v, f"an integer in 1..{most:,} (gpus_per_node x max_nodes GPUs at most "
                              f"{MAX_RANK_ITERATIONS:,}, what one simulation may hold)", source=source)
        return v

    def quantity(key, kind, default=None):
        if key not in d and default is None:
            raise ConfigError(p + key, "(missing)", f"a {kind} with its unit", source=source)
        value = units.parse(d.get(key, default), kind, field=p + key, source=source)
        if kind == "bandwidth" and not value > 0:
            raise ConfigError(p + key, d[key], "a bandwidth > 0 with its unit", source=source)
        return value

    network = None
    experiment.check_gpu(d, None, p, source)  # as an experiment's [cluster] gpu; series() checks it on the trace
    gpus_per_node = integer("gpus_per_node")
    intra_latency = quantity("intra_latency", "time", "0us")
    if "network" in d:  # its links, as in an experiment (simfog.network_file.use: one meaning everywhere)
        network, intra, nic = network_file.use(d["network"], Path(source).parent, field=p + "network", source=source,
                                               gpus_per_node=gpus_per_node, intra_latency_s=intra_latency,
                                               written=d, prefix=p)
    else:
        intra = Link(intra_latency, quantity("intra_bandwidth", "bandwidth"))
        nic = Link(quantity("nic_latency", "time", "0us"), quantity("nic_bandwidth", "bandwidth"))

    def names(key, registry, comm_key):
        v = d.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v) or key in d and not v:
            # [] would silently fall back to the workload's: leave the key out for that
            raise ConfigError(p + key, v, f"a non-empty list of names, from: {', '.join(registry.names())} (leave "
                              "the key out for the workload's)", source=source)
        for x in v:
            check_name(comm_key, x, field=p + key, source=source)
        return tuple(v)

    price = d.get("price_per_gpu_hour", "(missing)")
    if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 <= price < math.inf:
        raise ConfigError(p + "price_per_gpu_hour", price, "a finite number >= 0 (in the catalogue's currency)",
                          source=source)
    over = d.get("oversubscription", 1.0)
    if isinstance(over, bool) or not isinstance(over, (int, float)) or not 1 <= over < math.inf:
        raise ConfigError(p + "oversubscription", over, "a finite number >= 1 (1 = full bisection bandwidth)",
                          source=source)
    option = ClusterOption(name, gpus_per_node, integer("max_nodes", MAX_RANK_ITERATIONS // gpus_per_node),
                           intra, nic,
                           float(price), float(over),
                           names("collectives", collectives.ALGORITHMS, "collective") or (("nccl",) if network else ()),
                           names("merges", merge.POLICIES, "merge"), str(d.get("description", "")), network,
                           units.parse(d["gpu_memory"], "bytes", field=p + "gpu_memory", source=source)
                           if "gpu_memory" in d else None, gpu=d.get("gpu", ""))
    return _with_fabric(option, d.get("fabric"), p, source)


def _with_fabric(option: ClusterOption, table: object, p: str, source: str) -> ClusterOption:
    """`option` on the fabric its `fabric` table describes, built for its max_nodes nodes (a flat one: its
    oversubscription is the option's)."""
    if table is None:
        return option
    nics = option.network.nccl.nics_per_node or 1 if option.network else 1
    whole = replace(option.cluster(), nodes=option.max_nodes)
    try:
        c = attach_fabric(whole, table, nics_per_node=nics, source=source)
    except ConfigError as e:
        raise ConfigError(p + e.field.replace("cluster.", ""), e.value, e.allowed, source=source) from None
    return replace(option, fabric=c.fabric, oversubscription=c.oversubscription)


def load_catalogue(path: str | Path, given: Mapping | None = None) -> Catalogue:
    """Read a catalogue TOML; `given`: option keys given elsewhere (the command line's --gpus-per-node,
    --nic-bandwidth, --network: simfog.overrides), read as every option's own in their place
    (network_file.given_keys). Raises ConfigError naming the file, the field (e.g. "option[1] (eth25).max_nodes")
    and the value for anything wrong in it."""
    path, source = Path(path), str(path)
    try:
        text = files.read_text(path)
    except ConfigError as e:
        allowed = "an existing catalogue file (.toml)" if e.allowed == "an existing file" else e.allowed
        raise ConfigError("catalogue", source, allowed) from None
    return catalogue_from_dict(files.parse_toml(text, source), source, given)


def catalogue_from_dict(data: Mapping, source: str, given: Mapping | None = None) -> Catalogue:
    """A catalogue from its parsed TOML (`source` the file it is, or will be: relative paths are its folder's), as
    load_catalogue reads one."""
    for key in data:
        if key not in _TOP:
            raise ConfigError(key, data[key], unknown_key(key, _TOP), source=source)
    currency = data.get("currency")
    if not isinstance(currency, str) or not currency:
        raise ConfigError("currency", currency if currency is not None else "(missing)",
                          'the currency of every price, e.g. "USD"', source=source)
    raw = data.get("option")
    if not isinstance(raw, list) or not raw:
        raise ConfigError("option", raw if raw is not None else "(missing)", "one or more [[option]] tables",
                          source=source)
    if given:
        raw = [network_file.given_keys(d, given) if isinstance(d, dict) else d for d in raw]
    options = tuple(_option(d, i, source) for i, d in enumerate(raw))
    seen = [o.name for o in options]
    dup = next((n for n in seen if seen.count(n) > 1), None)
    if dup:
        raise ConfigError("option.name", dup, "unique option names", source=source)
    return Catalogue(currency, options, source, str(data.get("note", "")))


def workload_experiment(path: str | Path) -> Experiment:
    """The workload to plan for: an experiment file (.toml; its comm settings are the defaults) or a model trace
    (.json, .json.gz; allreduce, ring, ddp). The cluster is replaced by each option's, network file included."""
    from simfog.trace import load_model_trace

    path = Path(path)
    if path.suffix == ".toml":
        return experiment.load(path)
    # what an experiment file naming only this trace runs (its seed, iterations and compute mode), so that plan
    # answers as simulate, sweep and curve do
    trace = load_model_trace(path)
    return Experiment(experiment.DEFAULT_SEED, experiment.DEFAULT_ITERATIONS, Workload(trace, str(path.resolve())),
                      Cluster(1, 1, Link(0.0, 1e11), Link(0.0, 1e9)), Comm(), str(path))


@dataclass(frozen=True, eq=False)
class PlanResult:
    """`candidates`: every configuration simulated (option, gpus, nodes, collective, merge, iteration_time_s,
    samples_per_s, scaling_efficiency, cost_per_hour and, with an epoch, epoch_time_s and cost_per_epoch, in
    `currency`; meets_target; error). `best`: the cheapest row meeting the target, or None. A plan at fixed counts
    (simfog.pricing.plan_counts) has no target (NaN), no meets_target column and no best."""

    candidates: pd.DataFrame
    best: dict | None
    target_samples_per_s: float
    currency: str
    epoch_samples: float | None = None
    title: str = ""
    info: dict = field(default_factory=dict)

    @property
    def cost_column(self) -> str:
        return "cost_per_epoch" if self.epoch_samples else "cost_per_hour"

    def feasible(self) -> pd.DataFrame:
        """The configurations meeting the target, cheapest first (per epoch when an epoch was given, else per
        hour)."""
        ok = self.candidates[self.candidates.meets_target]
        return ok.sort_values([self.cost_column, "gpus"], kind="stable").reset_index(drop=True)


def plan(exp: Experiment, catalogue: Catalogue, *, target_samples_per_s: float, epoch_samples: float | None = None,
         compute: str | None = None, confidence: float | None = None) -> PlanResult:
    """The cheapest configurations of `catalogue` reaching `target_samples_per_s` for the workload of `exp`.
    `epoch_samples`: also report the time and cost of one epoch, and rank by cost per epoch. `confidence` (e.g.
    0.9): a configuration meets the target only when the lower bound of its throughput's interval at that one-sided
    confidence does (simfog.run_bands; rows gain samples_per_s_lo/hi, iteration_time_lo_s/hi_s and
    interval_unmeasured; 5 simulations a configuration). Returns a PlanResult. Raises ConfigError for a target <= 0,
    a bad confidence or a "threshold" merge without a threshold in the workload; Infeasible when no configuration
    reaches the target (its message names the best reachable; `.result` holds the PlanResult). `compute`: the
    layer times' mode (None: the experiment's; with_compute)."""
    from simfog.progress import bar as progress_bar

    if not (isinstance(target_samples_per_s, (int, float)) and target_samples_per_s > 0):
        raise ConfigError("target", target_samples_per_s, "a throughput in samples/s > 0")
    level = one_sided_level(confidence, "--confidence")
    exp = with_compute(exp, compute)
    rows = []
    bar = progress_bar(desc="plan", unit="sim")  # on a terminal only; the count of simulations is not known ahead
    for opt, base, coll, m in series(exp, catalogue):

        def meets(gpus: int, base=base, opt=opt, coll=coll, m=m) -> bool:  # this series' point
            bar.update(1)
            row = evaluate_configuration(base, opt, coll, m, gpus, exp.comm.threshold_bytes, epoch_samples, level)
            reached = row.get("samples_per_s_lo" if level is not None else "samples_per_s")
            row["meets_target"] = bool(not row["error"] and reached >= target_samples_per_s)
            rows.append(row)
            return row["meets_target"]

        below = 0  # the largest count tried that does not meet the target
        for gpus in opt.gpu_counts():
            if meets(gpus):
                # Doubling brackets the answer: the smallest count in the bracket that meets it is it
                # (`gpus` itself when none does).
                for n in opt.counts_between(below, gpus):
                    if meets(n):
                        break
                break
            below = gpus
    bar.close()
    df = candidates_frame(rows, epoch_samples)
    title = plan_title(exp, catalogue, f"for a target of {target_samples_per_s:,.1f} samples/s")
    if confidence is not None:
        title += f", reached with {100 * confidence:g} % confidence"
    result = PlanResult(df, None, float(target_samples_per_s), catalogue.currency, epoch_samples, title,
                        {"catalogue": catalogue.source, "note": catalogue.note, "estimated": bool(exp.estimated),
                         "confidence": confidence})
    ok = result.feasible()
    if len(ok):
        return replace(result, best=ok.iloc[0].to_dict())
    raise _infeasible(result, catalogue)


def with_compute(exp: Experiment, compute: str | None) -> Experiment:
    """`exp` with layer times in `compute` mode (simfog.experiment.COMPUTE_MODES; None: the experiment's own, the
    mode simulate, sweep and curve run it in, so that the same configuration gets one answer)."""
    if compute is None:
        return exp
    if compute not in experiment.COMPUTE_MODES:
        raise ConfigError("--compute", compute, one_of(compute, experiment.COMPUTE_MODES))
    return replace(exp, workload=replace(exp.workload, compute=compute))


def _fabric_cost(base: Experiment, point, iteration_time_s: float) -> float:
    """What the option's fabric and placement cost a configuration: its iteration time over the same run's on a
    non-blocking fabric of the same NICs, less 1 (nan where that run fails)."""
    from simfog.sweeps import run_point

    flat = run_point(replace(base, cluster=replace(base.cluster, fabric=None)), point)
    return iteration_time_s / float(flat["iteration_time_s"]) - 1.0 if not flat["error"] else float("nan")


def series(exp: Experiment, catalogue: Catalogue):
    """(option, experiment on the option's cluster, collective, merge) for every series a plan evaluates. The
    option's links (and its network file, if any) replace the experiment's cluster, and with it any network file
    or network trace the experiment calibrated that cluster from. Raises ConfigError for a "threshold" merge
    without a threshold in the workload."""
    for opt in catalogue.options:
        base = replace(exp, cluster=opt.cluster(), network=opt.network, network_trace=None)
        where = f"{catalogue.source}: option ({opt.name})." if catalogue.source else f"option ({opt.name})."
        experiment.check_gpu({"gpu": opt.gpu} if opt.gpu else {}, exp.workload.trace.device, where, None)
        for coll in opt.collectives or (exp.comm.collective,):
            experiment.warn_if_nccl_without_network(coll, opt.network, f"{where}collectives")
            for m in opt.merges or (exp.comm.merge,):
                try:  # the rules between merge, threshold and collective, checked where they are written
                    override(base, merge=m, collective=coll)
                except ConfigError as e:
                    raise ConfigError(f"option ({opt.name})", f"{coll} / {m}", f"{e} (a collective and merge policy "
                                      "the workload's experiment can run)", source=catalogue.source) from None
                yield opt, base, coll, m


def evaluate_configuration(base: Experiment, opt: ClusterOption, collective: str, merge: str, gpus: int,
                           threshold_bytes: float | None, epoch_samples: float | None,
                           level: float | None = None) -> dict:
    """One configuration's row: its prediction (or error), with its interval at `level` (None: none), and its
    cost."""
    from simfog.sweeps import Point, run_point

    r = run_point(base, Point(gpus, merge, collective, threshold_bytes), level)
    row = {"option": opt.name, "gpus": gpus, "nodes": -(-gpus // opt.gpus_per_node), "collective": collective,
           "merge": merge, "error": r["error"], "warnings": r["warnings"], **input_columns(base)}
    if not r["error"]:
        sps = float(r["samples_per_s"])
        row.update(iteration_time_s=float(r["iteration_time_s"]), samples_per_s=sps,
                   scaling_efficiency=float(r["scaling_efficiency"]),
                   memory_peak_B=float(r["memory_peak_B"]) if r.get("memory_peak_B") != "" else float("nan"),
                   # False: the trace has no activation bytes, the peak counts the rest only
                   memory_complete=r.get("memory_complete") in (True, "True"),
                   cost_per_hour=gpus * opt.price_per_gpu_hour)
        if level is not None:
            row.update({c: float(r[c]) for c in ("samples_per_s_lo", "samples_per_s_hi", "iteration_time_lo_s",
                                                 "iteration_time_hi_s")}, interval_unmeasured=r["interval_unmeasured"])
        if epoch_samples:
            row["epoch_time_s"] = epoch_samples / sps
            row["cost_per_epoch"] = row["cost_per_hour"] * row["epoch_time_s"] / 3600
        if opt.fabric is not None:
            row["fabric_cost"] = _fabric_cost(base, Point(gpus, merge, collective, threshold_bytes),
                                              row["iteration_time_s"])
    return row


def candidates_frame(rows: list[dict], epoch_samples: float | None) -> pd.DataFrame:
    cols = ["option", "gpus", "nodes", "collective", "merge", "iteration_time_s", "samples_per_s",
            "scaling_efficiency", "memory_peak_B", "memory_complete", "cost_per_hour"] + (
        ["epoch_time_s", "cost_per_epoch"] if epoch_samples else []) + (
        ["fabric_cost"] if any("fabric_cost" in r for r in rows) else []) + (
        ["samples_per_s_lo", "samples_per_s_hi", "iteration_time_lo_s", "iteration_time_hi_s", "interval_unmeasured"]
        if any("samples_per_s_lo" in r for r in rows) else [])
    df = pd.DataFrame(rows).reindex(columns=cols + ["meets_target", "error", "warnings", "trace", "network_file"])
    df["warnings"] = df["warnings"].fillna("")  # a count an option cannot hold: no run, nothing to warn of
    return df


def _infeasible(result: PlanResult, catalogue: Catalogue) -> Infeasible:
    done = result.candidates[result.candidates.error == ""]
    if not len(done):
        err = Infeasible(f"no configuration in {catalogue.source or 'the catalogue'} could be simulated: "
                         f"{result.candidates.error.iloc[0]}")
    else:
        b = done.loc[done.samples_per_s.idxmax()]
        err = Infeasible(f"no configuration in {catalogue.source or 'the catalogue'} reaches "
                         f"{result.target_samples_per_s:,.1f} samples/s; the best reachable is "
                         f"{b.samples_per_s:,.1f} samples/s ({b.option}, {b.gpus} GPUs, {b.collective} / {b['merge']}, "
                         f"scaling efficiency {100 * b.scaling_efficiency:.1f} %)")
    err.result = result
    return err
