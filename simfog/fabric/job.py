"""A job's view of a shared fabric, and what the fabric does to its collectives' inter-node hops.

`JobFabric` is what a cluster carries when its experiment has a non-flat `[fabric]`: the fabric, how the job's nodes
are placed on it (simfog.fabric.placement: "contiguous", "scattered" from a seed, or a list in rank order) and the
traffic of other jobs on the same fabric (`Traffic`, each with the share of time it is on the network).

`inter_slowdown` is how the collective cost models meet the fabric. A collective with a fixed schedule (ring, tree,
hierarchical) repeats one step pattern (simfog.fabric.schedules); its step is paced by its slowest flow, and that
rate in closed form (simfog.fabric.sharing.slowest_rate) on this fabric, against the same pattern's on a
non-blocking flat fabric of the same NICs, is the factor by which the fabric slows the inter-node β of the
collective's α-β form (`Slowdown.factor`, >= 1 where the fabric only removes bandwidth). Each step also pays the
switches its longest route crosses (`extra_latency_s`). A group of m < the job's nodes sits on the first m of the
job's nodes in rank order (the shape of a group is all a cost model is told of it).

Other jobs: a job idle between iterations frees its links, so job j's flows are on the network a share `duty` of the
time, independently of this job's. The step's seconds per byte, and so the factor, are then the expectation over
which other jobs are communicating: factor = Σ over subsets S of the others of P(S) · reference / rate(S), rate(S)
this job's step sharing the links max-min with S's steps (simfog.fabric.schedules.shared_step_costs), P(S) =
Π_{j∈S} duty_j · Π_{j∉S} (1 − duty_j).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from simfog.errors import ConfigError, Infeasible
from simfog.fabric.base import Fabric
from simfog.fabric.config import from_table
from simfog.fabric.flat import Flat
from simfog.fabric.placement import Placement, place
from simfog.fabric.schedules import StepPattern, pattern, shared_step_costs, step_cost
from simfog.fabric.sharing import slowest_rate

#: simfog collective -> the step pattern its inter-node traffic follows on a fabric. NCCL's model takes the ring's
#: (its bandwidth-bound regime); Gloo's segmented ring is a ring; "linear" is a fitted line, left as fitted.
PATTERN_OF = {"ring": "ring", "gloo_ring": "ring", "nccl": "ring", "tree": "tree", "hierarchical": "hierarchical"}
UNCHANGED = ("linear",)
MOST_OTHERS = 7  # 2^7 subsets of other jobs' activity per step pattern


@dataclass(frozen=True)
class Traffic:
    """Another job's collectives on the fabric: its `nodes` in rank order, its collective's step pattern
    (`algorithm`: ring, tree or hierarchical), ranks per node, NICs per node its channels use, and `duty`, the share
    of time its flows are on the network (0..1)."""

    nodes: tuple[int, ...]
    algorithm: str
    ranks_per_node: int
    nics: int
    duty: float

    def __post_init__(self):
        if not 0.0 <= self.duty <= 1.0:
            raise ConfigError("duty", self.duty, "a share of time in 0..1")

    def step(self) -> StepPattern:
        return pattern(self.algorithm, self.nodes, 1.0, ranks_per_node=self.ranks_per_node, nics=self.nics)


@dataclass(frozen=True)
class JobFabric:
    """A job on a shared fabric (module docstring): `placement` is "contiguous", "scattered" (drawn from
    `placement_seed`) or a tuple of node indices in rank order; `taken` are nodes other jobs hold."""

    fabric: Fabric
    placement: str | tuple[int, ...] = "contiguous"
    placement_seed: int = 0
    taken: tuple[int, ...] = ()
    others: tuple[Traffic, ...] = ()
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if len(self.others) > MOST_OTHERS:
            raise ConfigError("jobs", len(self.others) + 1, f"at most {MOST_OTHERS + 1} jobs on one fabric")
        # Hashed once: a cost model's memo hashes its cluster on every call, and placements run to 10^5 nodes.
        object.__setattr__(self, "_hash", hash((self.fabric, self.placement, self.placement_seed, self.taken,
                                                self.others)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # rebuilt, not copied: another process hashes strings with another seed
        return JobFabric, (self.fabric, self.placement, self.placement_seed, self.taken, self.others)

    def nodes(self, count: int) -> Placement:
        """The job's `count` nodes in rank order. Raises ConfigError (fabric.placement) for a list of another
        length, Infeasible when the fabric has not enough free nodes."""
        try:
            return _placement(self, count)
        except ConfigError as e:
            raise ConfigError("fabric.placement", e.value, e.allowed) from None
        except Infeasible as e:
            raise Infeasible(f"fabric.placement: {e} (the job's {count} nodes)") from None


def attach(cluster, table: object, *, nics_per_node: int = 1, source: str | None = None,
           fabric_nodes: int | None = None, taken: tuple[int, ...] = ()):
    """`cluster` (simfog.cluster.Cluster) on the fabric the experiment's `[fabric]` table describes
    (simfog.fabric.config, plus `placement` and `placement_seed`): its `fabric` set to the job's JobFabric, or, for
    a flat fabric (no table, or kind = "flat"), the cluster as it is, its links being that fabric (the table's
    oversubscription is the cluster's). Each of `nics_per_node` NICs (the network file's; one without it) carries
    an equal share of the cluster's NIC bandwidth. The fabric holds at least `fabric_nodes` nodes (default the
    cluster's); `taken` are nodes other jobs hold. Raises ConfigError naming `source`, the field and the value."""
    if table is None:
        return cluster
    if not isinstance(table, dict):
        raise ConfigError("fabric", table, "a [fabric] table", source=source)
    table = dict(table)
    spec = table.pop("placement", "contiguous")
    seed = table.pop("placement_seed", 0)
    fabric = from_table(table, nodes=fabric_nodes or cluster.nodes, nic_Bps=cluster.nic.bandwidth_Bps / nics_per_node,
                        nics_per_node=nics_per_node, source=source)
    if isinstance(fabric, Flat):
        if spec != "contiguous" or seed != 0:
            field_, value = ("fabric.placement", spec) if spec != "contiguous" else ("fabric.placement_seed", seed)
            raise ConfigError(field_, value, "left out on a flat fabric, where every placement costs the same",
                              source=source)
        if fabric.oversubscription == 1.0:
            return cluster
        if cluster.oversubscription != 1.0:
            raise ConfigError("fabric.oversubscription", fabric.oversubscription, "left out when [cluster] "
                              "oversubscription is set (one place for it)", source=source)
        return replace(cluster, oversubscription=fabric.oversubscription)
    if cluster.oversubscription != 1.0:
        raise ConfigError("cluster.oversubscription", cluster.oversubscription, f"1 (left out) with a "
                          f"{type(fabric).__name__} [fabric], whose tiers say what they oversubscribe",
                          source=source)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError("fabric.placement_seed", seed, "an integer >= 0", source=source)
    view = JobFabric(fabric, tuple(spec) if isinstance(spec, list) else spec, seed, tuple(taken))
    try:
        view.nodes(cluster.nodes)
    except Infeasible as e:
        raise ConfigError("fabric.placement", spec, str(e), source=source) from None
    except ConfigError as e:
        raise ConfigError("fabric.placement", e.value, e.allowed, source=source) from None
    return replace(cluster, fabric=view)


@dataclass(frozen=True)
class Slowdown:
    """What a fabric does to a collective's inter-node hops: β_n multiplied by `factor`, `extra_latency_s` added
    to α_n per step."""

    factor: float
    extra_latency_s: float


def inter_slowdown(view: JobFabric, collective: str, op: str, job_nodes: int, nodes: int,
                   ranks_per_node: int) -> Slowdown:
    """The Slowdown of `collective`'s `op` among `nodes` nodes (the first of the job's `job_nodes`, module
    docstring) with `ranks_per_node` ranks on each. Raises Infeasible for a collective without a step pattern on a
    fabric."""
    if collective in UNCHANGED or nodes < 2:
        return Slowdown(1.0, 0.0)
    if collective not in PATTERN_OF:
        raise Infeasible(f"collective {collective!r} has no step pattern on a shared fabric; use one of "
                         f"{', '.join(sorted(PATTERN_OF))}")
    kind = PATTERN_OF[collective]
    op = op if op in ("reduce_scatter", "allgather") else "allreduce"  # a broadcast: costed on the allreduce's
    return _slowdown(view, kind, op, job_nodes, nodes, ranks_per_node)


@lru_cache(maxsize=256)
def _slowdown(view: JobFabric, kind: str, op: str, job_nodes: int, nodes: int, ranks_per_node: int) -> Slowdown:
    fabric = view.fabric
    nics = min(ranks_per_node, fabric.nics_per_node)
    members = view.nodes(job_nodes).nodes[:nodes]
    step = pattern(kind, members, 1.0, ranks_per_node=ranks_per_node, nics=nics, op=op)
    reference = Flat(nodes=fabric.nodes, nic_Bps=fabric.nic_Bps, nics_per_node=fabric.nics_per_node)
    ref_rate = step_cost(reference, step).slowest_Bps
    routes = fabric.route(step.flows)
    factor = _expected_slowdown(fabric, step, ref_rate, slowest_rate(routes), view.others)
    return Slowdown(factor, int(routes.hops.max()) * fabric.switch_latency_s)


def _expected_slowdown(fabric: Fabric, step: StepPattern, reference_Bps: float, alone_Bps: float,
                       others: tuple[Traffic, ...]) -> float:
    """E[reference rate / rate] of `step` over which of `others` communicate at once (module docstring): exactly
    reference / alone without others."""
    active = [t for t in others if t.duty > 0.0]
    total = 0.0
    for chosen in itertools.product((False, True), repeat=len(active)):
        p = float(np.prod([t.duty if on else 1.0 - t.duty for t, on in zip(active, chosen)]))
        if p == 0.0:
            continue
        with_them = [t.step() for t, on in zip(active, chosen) if on]
        rate = alone_Bps if not with_them else shared_step_costs(fabric, [step, *with_them])[0].slowest_Bps
        total += p * (reference_Bps / rate)
    return total


@lru_cache(maxsize=64)
def _placement(view: JobFabric, count: int) -> Placement:
    spec = list(view.placement) if isinstance(view.placement, tuple) else view.placement
    if isinstance(spec, list) and len(spec) > count:
        spec = spec[:count]  # a smaller run of the job (--ranks): its first nodes in rank order
    return place(spec, count, view.fabric.nodes, seed=view.placement_seed, taken=view.taken)
