"""One Chakra execution trace as a checked graph: its nodes by id, in the order ASTRA-sim's feeder issues them.

`load(path)` reads the file (simfog.importers.chakra_schema), checks its schema version and refuses, each with one
line naming the file and the node id: a node id given twice, a data dependency on a node the file lacks, data
dependencies that form a cycle (ASTRA-sim would wait for ever), a node type or collective simfog does not simulate
(point-to-point sends and receives of pipeline parallelism, remote-memory loads and stores, all-to-all of expert
parallelism, ...), and a collective whose group is not every rank (a process group or involved dimensions of a
tensor- or pipeline-parallel layout).

Control dependencies name a node's parent operator in PyTorch's trace; the Chakra converter drops many of those
parents (the process and thread roots), so a control dependency on a missing node is not an error, and only data
dependencies order the graph, as in ASTRA-sim's feeder (chakra src/feeder/et_feeder.cpp).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path

from simfog import files
from simfog.errors import ConfigError
from simfog.importers import chakra_schema as schema

# What simfog simulates: compute, and the collectives of data parallelism over every rank (gradients allreduced,
# or reduce-scattered and parameters all-gathered as FSDP/ZeRO do; DDP broadcasts its buffers once at start).
SIMULATED_TYPES = ("COMP_NODE", "COMM_COLL_NODE", "METADATA_NODE", "INVALID_NODE")
SIMULATED_COLLECTIVES = ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "BROADCAST")
OUT_OF_SCOPE = ("tensor- and pipeline-parallel workloads are not simulated (simfog simulates data parallelism: "
                "compute, and ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER or BROADCAST over every rank)")


@dataclass(frozen=True)
class Graph:
    """A checked Chakra trace: `nodes` in issue order (data dependencies first, then the lowest id, as ASTRA-sim's
    feeder picks among ready nodes), `by_id`, its schema `version`, its GlobalMetadata's attributes `meta`."""

    path: str
    version: str
    meta: dict
    nodes: tuple
    by_id: dict

    def attrs(self, node) -> dict:
        return schema.attributes(node)

    def is_gpu(self, node) -> bool:
        """A device operation: is_cpu_op false or absent (ASTRA-sim's default)."""
        return not schema.attributes(node).get("is_cpu_op", False)


def load(path: str | Path) -> Graph:
    """The checked graph of the Chakra file `path` (".gz" read transparently). Raises ConfigError (one line,
    naming the file and the node id) for what the module's docstring lists."""
    source = str(path)
    stream = schema.decode(files.read_bytes(path), source)
    version = schema.check_version(stream.metadata, source)
    by_id: dict = {}
    for node in stream.nodes:
        if node.id in by_id:
            raise ConfigError("node id", node.id, "ids used once (this id names two nodes)", source=source)
        by_id[node.id] = node
        _check_supported(node, source)
    for node in stream.nodes:
        for dep in node.data_deps:
            if dep not in by_id:
                raise ConfigError(f"node {node.id} data_deps", dep, "ids of nodes in the file (no node has this "
                                  "id)", source=source)
    _check_groups(stream.nodes, source)
    order = _issue_order(stream.nodes, by_id, source)
    return Graph(source, version, schema.attributes(stream.metadata), order, by_id)


def _check_supported(node, source: str) -> None:
    kind = schema.NODE_TYPE_NAMES.get(node.type, f"type {node.type}")
    if kind not in SIMULATED_TYPES:
        raise ConfigError(f"node {node.id}", kind, f"{OUT_OF_SCOPE}; this trace has a {kind}", source=source)
    if kind == "COMM_COLL_NODE":
        attrs = schema.attributes(node)
        comm = attrs.get("comm_type")
        if comm is None and attrs.get("is_cpu_op"):
            return  # the host side of a collective (c10d::allreduce_): its device node carries the type
        name = schema.COLLECTIVE_TYPE_NAMES.get(comm, f"comm_type {comm}")
        if name not in SIMULATED_COLLECTIVES:
            raise ConfigError(f"node {node.id} comm_type", name, f"{OUT_OF_SCOPE}; this trace has {name}",
                              source=source)
        size = attrs.get("comm_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ConfigError(f"node {node.id} comm_size", size, "the collective's size in bytes (an integer "
                              ">= 0)", source=source)


def _check_groups(nodes, source: str) -> None:
    """Every collective runs on one process group, over every dimension: a second process group (pg_name) or an
    involved_dim that leaves a dimension out is a collective among a subset of the ranks."""
    first = None
    for node in nodes:
        if node.type != schema.NODE_TYPES["COMM_COLL_NODE"]:
            continue
        attrs = schema.attributes(node)
        dims = attrs.get("involved_dim")
        if isinstance(dims, list) and not all(dims):
            raise ConfigError(f"node {node.id} involved_dim", dims, f"every dimension (a collective over every "
                              f"rank): {OUT_OF_SCOPE}", source=source)
        group = attrs.get("pg_name", "")
        if group == "":
            continue
        if first is None:
            first = (node.id, group)
        elif group != first[1]:
            raise ConfigError(f"node {node.id} pg_name", group, f"the process group of the other collectives "
                              f"({first[1]!r}, node {first[0]}): a collective among a subset of the ranks; "
                              f"{OUT_OF_SCOPE}", source=source)


def _issue_order(nodes, by_id: dict, source: str) -> tuple:
    """Nodes in the order ASTRA-sim's feeder issues them on one free device: among those whose data dependencies
    are done, the lowest id first. ConfigError naming a node on a cycle when some never become ready."""
    waiting = {n.id: len(set(n.data_deps)) for n in nodes}
    children: dict = {}
    for n in nodes:
        for dep in set(n.data_deps):
            children.setdefault(dep, []).append(n.id)
    ready = [i for i, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(by_id[i])
        for child in children.get(i, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    if len(order) < len(nodes):
        stuck = {i for i, k in waiting.items() if k > 0}
        node = _on_cycle(stuck, by_id)
        raise ConfigError(f"node {node} data_deps", list(by_id[node].data_deps), "dependencies without a cycle "
                          "(this node depends on itself through them: it could never run)", source=source)
    return tuple(order)


def _on_cycle(stuck: set, by_id: dict) -> int:
    """A node on a dependency cycle among `stuck` (nodes that never became ready): walk up stuck dependencies
    from the lowest id until a node repeats."""
    seen: list = []
    node = min(stuck)
    while node not in seen:
        seen.append(node)
        node = min(d for d in by_id[node].data_deps if d in stuck)
    return node
