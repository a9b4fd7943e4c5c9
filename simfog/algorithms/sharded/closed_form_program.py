"""The sharded program flattened for its closed form (simfog.algorithms.sharded.closed_form): `program(sim)` turns
the plan into the ops every rank runs in order (`Program`), with each collective's groups (`Groups`) and duration;
`Iteration` is one iteration's solution over every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Groups:
    """The groups one plan group forms among the simulated ranks (Sharded._members): "all" (one group), "shard"
    (`size` consecutive ranks) or "replica" (ranks equal modulo `size`)."""

    kind: str
    size: int
    n: int  # simulated ranks

    @property
    def rows(self) -> int:
        return -(-self.n // self.size)

    @property
    def count(self) -> int:
        return 1 if self.kind == "all" else self.rows if self.kind == "shard" else self.size

    def max(self, x: np.ndarray):
        """Per group, the latest of `x` (n,): a scalar for "all", else (count,)."""
        if self.kind == "all":
            return x.max()
        table = x
        if self.n % self.size:  # (symmetric runs) groups beyond the simulated ranks: -inf never wins
            table = np.full(self.rows * self.size, -np.inf)
            table[:self.n] = x
        table = table.reshape(self.rows, self.size)
        return table.max(1) if self.kind == "shard" else table.max(0)

    def per_rank(self, v):
        """Each simulated rank's value of its group's `v` (a scalar stays one)."""
        if self.kind == "all":
            return v
        return np.repeat(v, self.size)[:self.n] if self.kind == "shard" else np.tile(v, self.rows)[:self.n]

    def ids(self, lo: int, hi: int) -> np.ndarray:
        """The group of each rank lo..hi-1 (not "all")."""
        ranks = np.arange(lo, hi)
        return ranks // self.size if self.kind == "shard" else ranks % self.size


@dataclass(frozen=True)
class Program:
    """What run_iteration does, flattened from the plan: `ops` ("issue", c, after or None) | ("need", c) |
    ("step", i) | ("drain",) | ("optimizer",); per collective its groups, stream and duration (a float, or per
    group); per step its layer time sum per trace sample; collectives in issue order."""

    ops: tuple
    groups: tuple
    communicators: tuple  # per collective its plan group ("shard", "replica", "all"): one communicator each
    streams: tuple
    durations: tuple
    seconds: tuple
    kinds: tuple
    last_forward: int
    issued: tuple
    # per collective, (iterations,) or (iterations, groups): its duration in each iteration under per-call variation
    # (simfog.variation: the overhead plus the wire time times the factor), or None when nothing varies
    varied: tuple | None = None

    def duration(self, k: int, it: int):
        """Collective k's duration in iteration `it` (a float, or per group)."""
        return self.durations[k] if self.varied is None else self.varied[k][it]


def program(sim) -> Program:
    alg, plan = sim.algorithm, sim.algorithm.plan
    ops, done, issued = [], set(), []

    def issue(c, hook):
        coll = plan.colls[c]
        # run_iteration looks `after` up among the collectives issued so far (done.get)
        ops.append(("issue", c, coll.after if coll.after in done else None))
        issued.append(c)
        if coll.stream != "compute" or hook:
            done.add(c)

    def hooks(pairs, hook=True):
        for wait, c in pairs:
            if wait is not None:
                ops.append(("need", wait))
            issue(c, hook)

    for i, step in enumerate(plan.steps):
        for c in step.issue:
            issue(c, False)
        ops += [("need", c) for c in step.need]
        ops.append(("step", i))
        hooks(step.hooks)
    hooks(plan.epilogue)
    ops += [("drain",), ("optimizer",)]
    hooks([(None, c) for c in plan.after_optimizer], hook=False)
    groups = tuple(_groups(alg, sim.simulated_ranks, coll.group) for coll in plan.colls)
    c = sim.compute
    seconds = []
    for step in plan.steps:
        times = c.layer_forward_s if step.kind == "forward" else c.layer_backward_s
        total = np.zeros(times.shape[0])
        for j in step.layers:  # float(sum(times[j] for j in layers)): added in this order, from 0
            total = total + times[:, j]
        seconds.append(total)
    wire = _wire_times(sim, groups)
    overhead = alg.collective_overhead_s
    factors = alg.call_factors
    varied = None
    if factors is not None:  # the engine's overhead + time · factor, per (iteration, group)
        varied = tuple(overhead + w * (factors[:, k, 0] if g.kind == "all" else factors[:, k, :g.count])
                       for k, (w, g) in enumerate(zip(wire, groups)))
    return Program(tuple(ops), groups, tuple(coll.group for coll in plan.colls),
                   tuple(coll.stream for coll in plan.colls), tuple(overhead + w for w in wire),
                   tuple(seconds), tuple(step.kind for step in plan.steps),
                   max(i for i, s in enumerate(plan.steps) if s.kind == "forward"), tuple(issued), varied)


def _groups(alg, n: int, group: str) -> Groups:
    if group == "all" or (group == "shard" and alg.group_size == alg.n):
        return Groups("all", alg.n, n)
    return Groups(group, alg.group_size, n)


def _wire_times(sim, groups) -> tuple:
    """Each collective's network time (a float, or per group), as cost.time gives it for the group's members, asked
    once per distinct (op, bytes, group shape); its duration adds the collective overhead (before any variation:
    the engine's overhead + time, or overhead + time · factor)."""
    alg, cost = sim.algorithm, sim.cost
    shapes: dict = {}
    memo: dict = {}
    out = []
    for coll, g in zip(alg.plan.colls, groups):
        if g.kind == "all":
            out.append(cost.time(coll.op, coll.nbytes, None))
            continue
        if g not in shapes:
            shapes[g] = _shapes(alg, g)
        index, reps = shapes[g]
        times = []
        for group, nodes in reps:
            key = (coll.op, coll.nbytes, group, None if nodes is None else frozenset(nodes))
            if key not in memo:
                memo[key] = cost.group_time(coll.op, coll.nbytes, group, nodes)
            times.append(memo[key])
        out.append(np.array(times)[index])
    return tuple(out)


def group_spreads(alg) -> tuple[np.ndarray, np.ndarray]:
    """(spread, size), each (collectives, most groups of one): the per-call spread and the ranks of each
    collective's group gid (Sharded._members over all ranks; padded with spread 0 and size 1)."""
    cost, colls = alg.sim.cost, alg.plan.colls
    groups = [_groups(alg, alg.n, coll.group) for coll in colls]
    width = max((g.count for g in groups), default=1)
    spread, size = np.zeros((len(colls), width)), np.ones((len(colls), width))
    shapes: dict = {}
    for k, g in enumerate(groups):
        if g.kind == "all":
            spread[k, 0], size[k, 0] = cost.spread(), alg.n
            continue
        if g not in shapes:
            index, reps = _shapes(alg, g)
            shapes[g] = (np.array([cost.group_spread(r) for r, _ in reps])[index],
                         np.array([r.ranks for r, _ in reps])[index])
        spread[k, :g.count], size[k, :g.count] = shapes[g]
    return spread, size


def _shapes(alg, g: Groups):
    """(per group the index of its shape (count,), [(cluster.Group, nodes or None)] per shape): what cost.time reads
    of a group's members (Sharded._members, over all ranks): how many ranks, on how many nodes, at most how many on
    one, and, with degraded NICs, which nodes."""
    from simfog.cluster import Group

    cluster = alg.sim.cost.cluster
    ranks = np.arange(alg.n)
    gid = ranks // g.size if g.kind == "shard" else ranks % g.size
    node = ranks // cluster.ranks_per_node
    width = int(node[-1]) + 1
    pairs, per_pair = np.unique(gid * width + node, return_counts=True)  # (group, node), sorted by group
    of_pair = pairs // width
    spans = np.split(pairs % width, np.flatnonzero(np.diff(of_pair)) + 1) if cluster.degraded_nics else None
    size = np.bincount(gid, minlength=g.count)[:g.count]
    nodes = np.bincount(of_pair, minlength=g.count)[:g.count]
    per_node = np.zeros(g.count, dtype=int)
    np.maximum.at(per_node, of_pair[of_pair < g.count], per_pair[of_pair < g.count])
    index = np.zeros(g.count, dtype=int)
    seen: dict = {}
    reps = []
    for x in range(g.count):
        on = None if spans is None else frozenset(spans[x].tolist())
        sig = (int(size[x]), int(nodes[x]), int(per_node[x]), on)
        if sig not in seen:
            seen[sig] = len(reps)
            reps.append((Group(*sig[:3]), None if on is None else set(on)))
        index[x] = seen[sig]
    return index, reps


@dataclass(frozen=True)
class Iteration:
    """One iteration of every simulated rank: per rank (n,) its start, backward's end, the optimizer step, its end;
    per collective its start and end (per group); with `keep`, per collective each rank's arrival and per
    step each rank's (start, end)."""

    t0: np.ndarray
    bwd_end: np.ndarray
    opt_start: np.ndarray
    opt_end: np.ndarray
    t_end: np.ndarray
    start: list
    end: list
    arrive: list | None
    steps: list | None
