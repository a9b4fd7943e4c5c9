"""One rank's iteration as Chakra nodes: the graph of the bucketed allreduce family and the graph of a sharded
plan (simfog.algorithms.sharded.plan), on the engine's rules, written as data dependencies for ASTRA-sim.

ASTRA-sim's NPU runs one compute node and one collective at a time, the lowest ready id first; ids here follow
the order simfog's engine issues work in, and every collective depends on the one issued before it, as simfog's
communicator runs them (one at a time, in issue order). Collective sizes follow ASTRA-sim's reading of comm_size
(checked on its microbenchmarks): the whole buffer for ALL_REDUCE and REDUCE_SCATTER, each rank's input, 1/n of
the buffer, for ALL_GATHER. Every compute node carries simfog's exact values (simfog.importers.chakra).
"""

from __future__ import annotations

import json

from simfog.importers import chakra as names
from simfog.importers import chakra_schema as schema

US = 1e6
OPS = {"allreduce": "ALL_REDUCE", "reduce_scatter": "REDUCE_SCATTER", "allgather": "ALL_GATHER"}


class Nodes:
    """A rank's nodes, in issue order (id = position)."""

    def __init__(self, trace):
        self.trace, self.nodes = trace, []

    def add(self, name: str, kind: str, deps, duration_s: float | None = None, attrs=()) -> int:
        node = schema.Node(id=len(self.nodes), name=name, type=schema.NODE_TYPES[kind],
                           data_deps=sorted({d for d in deps if d is not None}))
        if duration_s is not None:
            node.duration_micros = round(duration_s * US)
        node.attr.extend([schema.attr("is_cpu_op", bool_val=False), *attrs])
        self.nodes.append(node)
        return node.id

    def layer(self, i: int, phase: str, seconds: float, deps) -> int:
        """Layer i's forward or backward (with its exact samples, and its numbers or its parameters)."""
        layer = self.trace.layers[i]
        attrs = [schema.attr(names.LAYER, string_val=layer.name), schema.attr(names.PHASE, string_val=phase),
                 schema.attr(names.SAMPLES, double_list=list(getattr(layer, f"{phase}_s")))]
        if phase == "forward":
            attrs += [schema.attr(f"simfog.{k}", double_val=getattr(layer, k)) for k in names.LAYER_NUMBERS
                      if getattr(layer, k) is not None]
            if layer.ops:  # what simfog retarget reads
                attrs.append(schema.attr(names.OPS, string_val=json.dumps([dict(o) for o in layer.ops])))
        else:
            attrs += [schema.attr(names.PARAMS, string_list=[t.name for t in layer.params]),
                      schema.attr(names.ELEMENTS, int64_list=[t.elements for t in layer.params]),
                      schema.attr(names.DTYPES, string_list=[t.dtype for t in layer.params])]
        return self.add(f"{phase}:{layer.name}", "COMP_NODE", deps, seconds, attrs)

    def collective(self, name: str, op: str, nbytes: float, deps, tensors=()) -> int:
        attrs = [schema.attr("comm_type", int64_val=schema.COLLECTIVE_TYPES[op]),
                 schema.attr("comm_size", int64_val=round(nbytes))]
        if tensors:
            attrs.append(schema.attr(names.TENSORS, string_list=list(tensors)))
        return self.add(name, "COMM_COLL_NODE", deps, attrs=attrs)

    def optimizer(self, seconds: float, deps) -> int:
        t = self.trace
        return self.add("optimizer", "COMP_NODE", deps, seconds,
                        [schema.attr(names.PHASE, string_val="optimizer"),
                         schema.attr(names.SAMPLES, double_list=list(t.optimizer_s)),
                         schema.attr(names.HOST, double_list=list(t.host_s))])


def allreduce_nodes(trace, buckets, forward, backward, optimizer_s: float) -> list:
    """Forward of every layer, backward in reverse, each bucket's ALL_REDUCE once its last gradient is ready and
    the bucket before it launched, then the optimizer step after the last backward and the last bucket."""
    out = Nodes(trace)
    prev = None
    for i in range(len(trace.layers)):
        prev = out.layer(i, "forward", forward[i], [prev])
    layer_of = trace.layer_index()
    # backward runs from layer L-1 down to 0, so bucket k goes after the backward of layer min(ready[:k + 1])
    ready = [min(layer_of[t] for t in b.tensors) for b in buckets]
    launch_at = [min(ready[:k + 1]) for k in range(len(ready))]
    backward_node: dict[int, int] = {}
    last, k = None, 0
    for i in reversed(range(len(trace.layers))):
        prev = backward_node[i] = out.layer(i, "backward", backward[i], [prev])
        while k < len(buckets) and launch_at[k] == i:
            last = out.collective(f"allreduce:bucket{k}", "ALL_REDUCE", buckets[k].nbytes,
                                  [backward_node[ready[k]], last], buckets[k].tensors)
            k += 1
    out.optimizer(optimizer_s, [prev, last])
    return out.nodes


def sharded_nodes(trace, plan, ranks: int, forward, backward, optimizer_s: float) -> list:
    """A sharded plan's steps as simfog's engine runs them (ShardedAlgorithm.run_iteration): a step's collectives
    issued when compute reaches it, its compute after the collectives it needs, its hooks after it (compute waits
    for a hook's `wait`, and for a collective on the compute stream), the epilogue, the optimizer step after every
    collective, then the collectives after the optimizer, each waited for."""
    out = Nodes(trace)
    cursor: set = set()   # what the next compute node waits for
    last = None           # the last collective issued: the communicator runs them in issue order
    ids: dict[int, int] = {}

    def launch(c: int) -> int:
        nonlocal last
        coll = plan.colls[c]
        size = coll.nbytes / ranks if coll.op == "allgather" else coll.nbytes
        deps = [*cursor, last, ids.get(coll.after) if coll.after is not None else None]
        last = ids[c] = out.collective(coll.name, OPS[coll.op], size, deps)
        return last

    def hooks(pairs) -> None:
        for wait, c in pairs:
            if wait is not None:
                cursor.add(ids[wait])
            node = launch(c)
            if plan.colls[c].stream == "compute":
                cursor.add(node)

    for step in plan.steps:
        for c in step.issue:
            launch(c)
        cursor.update(ids[c] for c in step.need)
        times = forward if step.kind == "forward" else backward
        for i in step.layers:
            node = out.layer(i, step.kind, times[i], cursor)
            cursor.clear()
            cursor.add(node)
        hooks(step.hooks)
    hooks(plan.epilogue)
    step = out.optimizer(optimizer_s, [*cursor, last])
    cursor.clear()
    cursor.add(step)
    for c in plan.after_optimizer:
        cursor.add(launch(c))
    return out.nodes
