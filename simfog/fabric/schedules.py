"""Fixed-schedule collectives on a fabric: the flows of each step, known up front, and each step's bottleneck.

A ring or tree collective repeats one pattern of flows; every flow of a step carries the same bytes, and the step
ends when its slowest flow does (a pipelined collective runs at its slowest hop's pace). So a step costs

    latencies · (α + switches · switch_latency) + bytes_per_flow / slowest rate

and the slowest rate of one job alone is the closed form min over links of capacity / Σ weights (one pass over
the routes: simfog.fabric.sharing.slowest_rate). Several jobs' steps running at once share links max-min fairly,
each job's flows coupled to one rate (`shared_step_costs`).

Only the flows between nodes are here (the fabric's part); the hops inside a node are the caller's. Nodes are the
job's in placement order, as NCCL's rings and trees follow the ranks' order. `nics` is how many NICs per node the
job's channels use (NCCL: min(GPUs per node, NICs per node)); channel c crosses the fabric from NIC c to NIC c,
rail to rail, as NCCL's rings and trees do:

- ring (NCCL's, over n = nodes · ranks_per_node ranks): each of `nics` channels is a ring over all ranks on 1/nics
  of the buffer, crossing each node boundary once: flows nodes[k] → nodes[k+1] (cyclic) on each NIC, M/(n·nics)
  bytes per step; 2(n − 1) steps for allreduce, n − 1 for reduce_scatter and allgather.
- tree (NCCL's double binary tree over the nodes, allreduce): two trees (trees.cc ncclGetDtree: a binary tree on
  the nodes, and its mirror, or its shift by one for an odd count), each carrying half the buffer; reduce up and
  broadcast down are pipelined, so every tree edge carries a flow each way at once, M/(2·nics) bytes per NIC; one
  step paying 2·⌈log2 nodes⌉ latencies.
- hierarchical (simfog's "hierarchical"): inside each node a reduce-scatter, then ranks_per_node rings across the
  nodes, local rank l's on NIC l mod nics, each on M/ranks_per_node: M/(ranks_per_node · nodes) bytes per step,
  2(nodes − 1) steps for allreduce (nodes − 1 for the others).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simfog.errors import ConfigError
from simfog.fabric.base import nic_of_gpu
from simfog.fabric.flows import Flows
from simfog.fabric.sharing import max_min_rates, slowest_rate

ALGORITHMS = ("ring", "tree", "hierarchical")
OPS = ("allreduce", "reduce_scatter", "allgather")


@dataclass(frozen=True, eq=False)
class StepPattern:
    """`flows` (each of `bytes_per_flow`) run together, `steps` times in a row; each step first pays `latencies`
    message latencies. `name` says which collective."""

    name: str
    flows: Flows
    bytes_per_flow: float
    steps: int
    latencies: int


@dataclass(frozen=True)
class StepCost:
    """One pattern's step on a fabric: the slowest flow's rate (B/s; inf without fabric flows) and the step's
    seconds; `total_s` over all its steps."""

    name: str
    steps: int
    bytes_per_flow: float
    slowest_Bps: float
    step_s: float

    @property
    def total_s(self) -> float:
        return self.steps * self.step_s


def ring_pattern(nodes: Sequence[int], nbytes: float, *, ranks_per_node: int = 1, nics: int = 1,
                 op: str = "allreduce") -> StepPattern:
    """NCCL's ring over the job's `nodes` (module docstring); `nbytes` the buffer per rank."""
    _check(nodes, nbytes, ranks_per_node, nics, op)
    n = len(nodes) * ranks_per_node
    steps = 2 * (n - 1) if op == "allreduce" else n - 1
    src = np.asarray(nodes, dtype=np.int64)
    flows = _on_nics(src, np.roll(src, -1), nics, nbytes / (n * nics)) if len(nodes) > 1 else _none()
    return StepPattern(f"ring {op}", flows, nbytes / (n * nics), steps, 1)


def tree_pattern(nodes: Sequence[int], nbytes: float, *, nics: int = 1) -> StepPattern:
    """NCCL's double binary tree allreduce over the job's `nodes` (module docstring)."""
    _check(nodes, nbytes, 1, nics, "allreduce")
    m = len(nodes)
    per = nbytes / (2 * nics)
    if m == 1:
        return StepPattern("tree allreduce", _none(), per, 1, 0)
    order = np.asarray(nodes, dtype=np.int64)
    child, parent = double_binary_tree_edges(m)
    up = _on_nics(order[child], order[parent], nics, per)
    down = _on_nics(order[parent], order[child], nics, per)
    return StepPattern("tree allreduce", Flows.concat([up, down]), per, 1, 2 * (m - 1).bit_length())


def hierarchical_pattern(nodes: Sequence[int], nbytes: float, *, ranks_per_node: int, nics: int = 1,
                         op: str = "allreduce") -> StepPattern:
    """The inter-node rings of simfog's hierarchical collective over the job's `nodes` (module docstring)."""
    _check(nodes, nbytes, ranks_per_node, nics, op)
    m, L = len(nodes), ranks_per_node
    steps = 2 * (m - 1) if op == "allreduce" else m - 1
    per = nbytes / (L * m)
    if m == 1:
        return StepPattern(f"hierarchical {op}", _none(), per, steps, 1)
    src = np.asarray(nodes, dtype=np.int64)
    rings = [Flows.of(src, np.roll(src, -1), per, nic_of_gpu(local, nics), nic_of_gpu(local, nics))
             for local in range(L)]
    return StepPattern(f"hierarchical {op}", Flows.concat(rings), per, steps, 1)


def pattern(algorithm: str, nodes: Sequence[int], nbytes: float, *, ranks_per_node: int = 1, nics: int = 1,
            op: str = "allreduce") -> StepPattern:
    """The step pattern of `algorithm` (one of ALGORITHMS; tree for allreduce only, as NCCL runs reduce_scatter and
    allgather as rings)."""
    if algorithm == "ring" or (algorithm == "tree" and op != "allreduce"):
        return ring_pattern(nodes, nbytes, ranks_per_node=ranks_per_node, nics=nics, op=op)
    if algorithm == "tree":
        return tree_pattern(nodes, nbytes, nics=nics)
    if algorithm == "hierarchical":
        return hierarchical_pattern(nodes, nbytes, ranks_per_node=ranks_per_node, nics=nics, op=op)
    raise ConfigError("algorithm", algorithm, f"one of {', '.join(ALGORITHMS)}")


def step_cost(fabric, step: StepPattern, *, latency_s: float = 0.0, ecmp: str | None = None) -> StepCost:
    """`step` alone on `fabric`: its slowest flow in closed form (module docstring)."""
    routes = fabric.route(step.flows, ecmp)
    return _cost(fabric, step, slowest_rate(routes), routes.hops, latency_s)


def shared_step_costs(fabric, steps: Sequence[StepPattern], *, latency_s: float | Sequence[float] = 0.0,
                      ecmp: str | None = None) -> list[StepCost]:
    """Several jobs' steps running at once on `fabric`: all their flows share the links max-min fairly, each
    step's flows coupled to one rate (module docstring). `latency_s`: one α, or one per step."""
    lat = np.broadcast_to(np.asarray(latency_s, dtype=float), (len(steps),))
    sizes = [len(s.flows) for s in steps]
    routes = fabric.route(Flows.concat([s.flows for s in steps]), ecmp)
    rates = max_min_rates(routes, groups=np.repeat(np.arange(len(steps)), sizes))
    starts = np.cumsum([0, *sizes])
    return [_cost(fabric, s, float(rates[a]) if b > a else float("inf"), routes.hops[a:b], float(lat[k]))
            for k, (s, a, b) in enumerate(zip(steps, starts[:-1], starts[1:]))]


def double_binary_tree_edges(m: int) -> tuple[np.ndarray, np.ndarray]:
    """(child, parent) positions of every edge of NCCL's two trees over m >= 2 positions (trees.cc): tree one is
    ncclGetBtree's (root 0; the parent of r flips its lowest set bit b up: (r ^ b) | 2b, or r ^ b when that is past
    the end); tree two mirrors it (r -> m − 1 − r) for an even m, shifts it by one for an odd m."""
    r = np.arange(1, m, dtype=np.int64)
    first = _btree_parent(r, m)
    if m % 2 == 0:
        second_child, second_parent = m - 1 - r, m - 1 - first
    else:
        second_child, second_parent = (r + 1) % m, (first + 1) % m
    return np.concatenate([r, second_child]), np.concatenate([first, second_parent])


def _btree_parent(r: np.ndarray, m: int) -> np.ndarray:
    bit = r & -r
    up = (r ^ bit) | (bit << 1)
    return np.where(up >= m, r ^ bit, up)


def _on_nics(src: np.ndarray, dst: np.ndarray, nics: int, nbytes: float) -> Flows:
    """One flow per NIC c of each src[i] -> dst[i], NIC c to NIC c."""
    c = np.tile(np.arange(nics, dtype=np.int64), len(src))
    return Flows.of(np.repeat(src, nics), np.repeat(dst, nics), nbytes, c, c)


def _none() -> Flows:
    return Flows.of(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))


def _cost(fabric, step: StepPattern, slowest: float, hops: np.ndarray, latency_s: float) -> StepCost:
    if not len(step.flows):
        return StepCost(step.name, step.steps, step.bytes_per_flow, float("inf"), 0.0)
    alpha = latency_s + int(hops.max()) * fabric.switch_latency_s
    return StepCost(step.name, step.steps, step.bytes_per_flow, slowest,
                    step.latencies * alpha + step.bytes_per_flow / slowest)


def _check(nodes: Sequence[int], nbytes: float, ranks_per_node: int, nics: int, op: str) -> None:
    if not len(nodes) or len(set(nodes)) != len(nodes):
        raise ConfigError("nodes", list(nodes)[:8], "the job's nodes, at least one, each once")
    if not (isinstance(nbytes, int | float) and not isinstance(nbytes, bool) and 0 <= nbytes < float("inf")):
        raise ConfigError("nbytes", nbytes, "a size in bytes, finite and >= 0")
    for name, v in (("ranks_per_node", ranks_per_node), ("nics", nics)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(name, v, "an integer >= 1")
    if op not in OPS:
        raise ConfigError("op", op, f"one of {', '.join(OPS)}")
