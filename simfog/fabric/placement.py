"""Where a job's nodes sit on a fabric: contiguous, scattered by a seeded rule, or a given list.

A `Placement` is the job's nodes in the order its ranks fill them: rank r runs on nodes[r // ranks_per_node], and
NCCL's rings and trees follow that order (simfog.fabric.schedules), as NCCL's follow the ranks a job was given.

- contiguous: the first `count` consecutive free nodes from `start` (a scheduler's block allocation);
- scattered: `count` free nodes drawn without replacement by numpy's Generator from `seed`, in ascending order
  (the sorted host list a scheduler hands a job), so a seed gives the same nodes on every run and platform;
- given: the list as written (its order is the ranks' order).
`taken` are nodes other jobs hold; a placement never uses one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from simfog.errors import ConfigError, Infeasible

RULES = ("contiguous", "scattered", "given")
MOST_SEED = 2**63 - 1


@dataclass(frozen=True)
class Placement:
    """A job's nodes in rank order (module docstring); `rule` and `seed` say how they were chosen."""

    nodes: tuple[int, ...]
    rule: str = "given"
    seed: int | None = None

    def __post_init__(self):
        if not isinstance(self.nodes, tuple) or not self.nodes:
            raise ConfigError("placement", self.nodes, "a non-empty tuple of node indices")
        for v in self.nodes:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError("placement", v, "a node index, an integer >= 0")
        if len(set(self.nodes)) != len(self.nodes):
            twice = next(v for v in self.nodes if self.nodes.count(v) > 1)
            raise ConfigError("placement", twice, "each node once")
        if self.rule not in RULES:
            raise ConfigError("placement", self.rule, f"one of {', '.join(RULES)}")

    def __len__(self) -> int:
        return len(self.nodes)

    def node_of_rank(self, ranks: np.ndarray, ranks_per_node: int) -> np.ndarray:
        """The fabric node of each rank (rank r on nodes[r // ranks_per_node])."""
        return np.asarray(self.nodes, dtype=np.int64)[np.asarray(ranks) // ranks_per_node]

    @staticmethod
    def contiguous(count: int, fabric_nodes: int, *, start: int = 0, taken: Iterable[int] = ()) -> Placement:
        """The first run of `count` consecutive free nodes at or after `start`. Raises Infeasible when none."""
        _check_request(count, fabric_nodes)
        busy = _busy(taken, fabric_nodes)
        free_run = 0
        for node in range(start, fabric_nodes):
            free_run = 0 if busy[node] else free_run + 1
            if free_run == count:
                return Placement(tuple(range(node - count + 1, node + 1)), "contiguous")
        raise Infeasible(f"no {count} consecutive free nodes from node {start} on a fabric of {fabric_nodes} "
                         f"({int(busy.sum())} taken)")

    @staticmethod
    def scattered(count: int, fabric_nodes: int, *, seed: int, taken: Iterable[int] = ()) -> Placement:
        """`count` free nodes drawn by numpy.random.default_rng(seed), ascending. Raises Infeasible when fewer
        are free."""
        _check_request(count, fabric_nodes)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MOST_SEED:
            raise ConfigError("placement.seed", seed, f"an integer in 0..{MOST_SEED}")
        free = np.flatnonzero(~_busy(taken, fabric_nodes))
        if len(free) < count:
            raise Infeasible(f"{count} nodes asked, {len(free)} free on a fabric of {fabric_nodes}")
        chosen = np.sort(np.random.default_rng(seed).choice(free, size=count, replace=False))
        return Placement(tuple(int(v) for v in chosen), "scattered", seed)

    @staticmethod
    def given(nodes: Sequence[int], fabric_nodes: int, *, taken: Iterable[int] = ()) -> Placement:
        """`nodes` in the order given; each must exist on the fabric and be free."""
        placement = Placement(tuple(nodes), "given")
        placement.check(fabric_nodes, taken=taken)
        return placement

    def check(self, fabric_nodes: int, *, taken: Iterable[int] = (), field: str = "placement",
              source: str | None = None) -> None:
        """Raises ConfigError naming `field` when a node is not on a fabric of `fabric_nodes` nodes or is taken."""
        for v in self.nodes:
            if v >= fabric_nodes:
                raise ConfigError(field, v, f"a node in 0..{fabric_nodes - 1} (the fabric's)", source=source)
        clash = sorted(set(self.nodes) & set(taken))
        if clash:
            raise ConfigError(field, clash[0], "a node no other job holds", source=source)


def place(spec: object, count: int, fabric_nodes: int, *, seed: int = 0, taken: Iterable[int] = (),
          field: str = "placement", source: str | None = None) -> Placement:
    """A job's placement from its TOML value `spec`: "contiguous", "scattered" (drawn from `seed`), or a list of
    node indices (`count` of them). Raises ConfigError naming `field` (and `source`) on a bad value, Infeasible
    when the fabric has not enough free nodes."""
    taken = tuple(taken)
    try:
        if spec == "contiguous":
            return Placement.contiguous(count, fabric_nodes, taken=taken)
        if spec == "scattered":
            return Placement.scattered(count, fabric_nodes, seed=seed, taken=taken)
        if isinstance(spec, list | tuple) and not isinstance(spec, str):
            if len(spec) != count:
                raise ConfigError(field, spec, f"a list of {count} node indices (the job's nodes)", source=source)
            return Placement.given(spec, fabric_nodes, taken=taken)
    except ConfigError as e:
        raise ConfigError(field, e.value, e.allowed, source=source) from None
    raise ConfigError(field, spec, f"one of contiguous, scattered, or a list of {count} node indices",
                      source=source)


def _check_request(count: int, fabric_nodes: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError("placement.nodes", count, "an integer >= 1 (nodes the job needs)")
    if count > fabric_nodes:
        raise Infeasible(f"{count} nodes asked of a fabric of {fabric_nodes}")


def _busy(taken: Iterable[int], fabric_nodes: int) -> np.ndarray:
    busy = np.zeros(fabric_nodes, dtype=bool)
    for v in taken:
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= v < fabric_nodes:
            raise ConfigError("placement.taken", v, f"a node in 0..{fabric_nodes - 1}")
        busy[v] = True
    return busy
