"""The sharded family's plan: what each rank computes and communicates in one iteration, fixed before the run, as
compute steps and the collectives they issue, need and hook (`Plan`); the plans of fsdp and hsdp (FSDP2's units),
zero1/zero2 (DeepSpeed's gradient buckets and parameter all-gathers) and zero3 (per-module all-gathers with
prefetch). Semantics and sources in the family's docstring (simfog.algorithms.sharded).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simfog.errors import ConfigError
from simfog.trace import DTYPE_BYTES

MAX_LIVE_PARAMETERS = 10**9      # DeepSpeed stage3_max_live_parameters default
MAX_REUSE_DISTANCE = 10**9       # DeepSpeed stage3_max_reuse_distance default
ZERO3_REDUCES_IN_FLIGHT = 3      # stage3.py: max_param_reduce_events = 2, waited when more are outstanding
# The most parameter all-gathers one zero1/zero2 step may issue (P // allgather_bucket_size): each is a collective
# every rank simulates, so allgather_bucket_size = 1 on BERT-base (1.1e8 of them) ran for minutes and took GBs.
# DeepSpeed's default (5e8 elements) gives 1 to a few.
MAX_ALLGATHER_SHARDS = 10_000


@dataclass
class Coll:
    """One collective of the plan: op on nbytes among a group ("shard": the sharding group, "replica": the ranks
    holding the same shard, "all"), on a stream ("compute" blocks compute); `after`: a collective it follows."""

    name: str
    op: str
    nbytes: float
    group: str
    stream: str
    units: tuple[int, ...] = ()
    after: int | None = None


@dataclass
class Step:
    """A compute step: forward or backward of `layers`; `issue`: collectives issued when the step is reached; `need`:
    collectives it waits for; `hooks`: after it, (collective to wait for or None, collective to issue); `free`: units
    released after it."""

    kind: str
    name: str
    layers: tuple[int, ...]
    issue: list[int] = field(default_factory=list)
    need: list[int] = field(default_factory=list)
    hooks: list[tuple[int | None, int]] = field(default_factory=list)
    free: list[int] = field(default_factory=list)


@dataclass
class Plan:
    colls: list[Coll] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    epilogue: list[tuple[int | None, int]] = field(default_factory=list)
    after_optimizer: list[int] = field(default_factory=list)

    def add(self, coll: Coll) -> int:
        self.colls.append(coll)
        return len(self.colls) - 1


def fsdp_units(trace, spec) -> list[tuple[int, ...]]:
    """The units (tuples of consecutive layer indices) of `comm.fsdp_unit` = spec. Raises ConfigError when layer
    counts do not add up to the trace's layers."""
    n = len(trace.layers)
    if spec == "layer":
        return [(i,) for i in range(n)]
    if spec == "model":
        return [tuple(range(n))]
    if isinstance(spec, tuple):
        if sum(spec) != n:
            raise ConfigError("comm.fsdp_unit", list(spec), f"layer counts adding up to the trace's {n} layers")
        starts = np.concatenate([[0], np.cumsum(spec)])
        return [tuple(range(a, b)) for a, b in zip(starts[:-1], starts[1:])]
    units, cur, size = [], [], 0.0
    for i, layer in enumerate(trace.layers):
        cur.append(i)
        size += sum(t.nbytes for t in layer.params)
        if size >= spec:
            units.append(tuple(cur))
            cur, size = [], 0.0
    return units + ([tuple(cur)] if cur else [])


def zero_buckets(tensors, bucket_elements: int) -> list[list]:
    """Tensors (in the order they are added) split where DeepSpeed closes a bucket: before a tensor that would
    overflow `bucket_elements` when the bucket is not empty (stage 3 tests this; stage 1/2 reduce an empty bucket,
    a no-op), so a tensor larger than a bucket goes alone. Returns the buckets, each a list of tensors."""
    buckets, cur, elems = [], [], 0
    for t in tensors:
        if cur and elems + t.elements > bucket_elements:
            buckets.append(cur)
            cur, elems = [], 0
        cur.append(t)
        elems += t.elements
    return buckets + ([cur] if cur else [])


def allgather_shards(parameters: int, bucket_elements: int, *, source: str | None = None) -> int:
    """The parameter all-gathers of a zero1/zero2 step: max(1, P // allgather_bucket_size) equal shards. Raises
    ConfigError naming comm.allgather_bucket_size when they would be more than MAX_ALLGATHER_SHARDS."""
    shards = max(1, parameters // bucket_elements)
    if shards > MAX_ALLGATHER_SHARDS:
        least = -(-parameters // MAX_ALLGATHER_SHARDS)
        raise ConfigError("comm.allgather_bucket_size", bucket_elements, f"at least {least:,} elements with this "
                          f"trace's {parameters:,} parameters: they are gathered in parameters // "
                          f"allgather_bucket_size all-gathers, at most {MAX_ALLGATHER_SHARDS:,} per step",
                          source=source)
    return shards



def dtype_bytes(dtype: str | None, trace) -> float:
    """Bytes per element of `dtype` (None: the trace's mean over its parameters)."""
    if dtype is not None:
        return float(DTYPE_BYTES[dtype])
    return trace.nbytes / trace.parameters if trace.parameters else float(DTYPE_BYTES[trace.dtype])


@dataclass(frozen=True)
class LayerBytes:
    """Parameter bytes of a trace's layers: `elements` per layer; `of(layers, dtype)` in a dtype (None: the
    trace's own tensors)."""

    trace: object
    elements: tuple[int, ...]

    @staticmethod
    def of_trace(trace) -> LayerBytes:
        return LayerBytes(trace, tuple(sum(t.elements for t in layer.params) for layer in trace.layers))

    def of(self, layers, dtype: str | None) -> float:
        if dtype is None:
            return float(sum(t.nbytes for i in layers for t in self.trace.layers[i].params))
        return float(sum(self.elements[i] for i in layers) * DTYPE_BYTES[dtype])


def unit_name(trace, layers) -> str:
    """A unit's name: its layer's, or its first and last layers' (first..last)."""
    names = [trace.layers[i].name for i in layers]
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


def fsdp_plan(trace, units, comm, sizes: LayerBytes, param_dtype: str | None, reduce_dtype: str | None, *,
              hsdp: bool, group_size: int) -> Plan:
    """FSDP2's plan for `units` (fsdp_units): per unit an all-gather before forward (prefetched comm.prefetch units
    ahead) and, with comm.reshard_after_forward, again before backward; after its backward a reduce-scatter (and,
    for hsdp, an allreduce of its 1/group_size shard among the replicas)."""
    plan = Plan()
    k, reshard, U = comm.prefetch, comm.reshard_after_forward, len(units)
    names = [unit_name(trace, layers) for layers in units]
    has = [sizes.of(layers, None) > 0 for layers in units]

    def gather(u, phase):
        return plan.add(Coll(f"allgather.{phase}.{names[u]}", "allgather", sizes.of(units[u], param_dtype), "shard",
                             "ag", (u,)))

    fwd_ag: dict[int, int] = {}
    for u in range(U):
        step = Step("forward", names[u], units[u])
        for v in range(u, min(U, u + k + 1)):
            if has[v] and v not in fwd_ag:
                fwd_ag[v] = gather(v, "fwd")
                step.issue.append(fwd_ag[v])
        if has[u]:
            step.need.append(fwd_ag[u])
            if reshard:
                step.free.append(u)
        plan.steps.append(step)
    bwd_ag: dict[int, int] = {}
    prev_rs = None
    for u in range(U - 1, -1, -1):
        step = Step("backward", names[u], units[u])
        if reshard:
            for v in range(u, max(-1, u - k - 1), -1):
                if has[v] and v not in bwd_ag:
                    bwd_ag[v] = gather(v, "bwd")
                    step.issue.append(bwd_ag[v])
            if has[u]:
                step.need.append(bwd_ag[u])
        if has[u]:
            step.free.append(u)
            rs = plan.add(Coll(f"reduce_scatter.{names[u]}", "reduce_scatter", sizes.of(units[u], reduce_dtype),
                               "shard", "rs", (u,)))
            step.hooks.append((prev_rs, rs))
            prev_rs = rs
            if hsdp:
                ar = plan.add(Coll(f"allreduce.{names[u]}", "allreduce", sizes.of(units[u], reduce_dtype) / group_size,
                                   "replica", "ar", (u,), after=rs))
                step.hooks.append((None, ar))
        plan.steps.append(step)
    return plan


def _gradient_hooks(plan: Plan, trace, comm, steps_of_layer: dict[int, Step], ready_order: bool, op: str,
                    in_flight: int, overlap: bool, reduce_dtype: str | None) -> None:
    """DeepSpeed's gradient buckets of reduce_bucket_size elements; each reduced when the gradient that does not fit
    is ready (during backward when `ready_order`, else all after backward), waiting first for bucket
    b - in_flight; on the reduction stream with `overlap`, else on the compute stream."""
    tensors = trace.ready_tensors() if ready_order else [t for layer in trace.layers for t in layer.params]
    buckets = zero_buckets(tensors, comm.reduce_bucket_size)
    layer_of = trace.layer_index()
    stream = "rs" if overlap else "compute"
    ids: list[int] = []
    for b, bucket in enumerate(buckets):
        nbytes = float(sum(t.nbytes if reduce_dtype is None else t.elements * dtype_bytes(reduce_dtype, trace)
                           for t in bucket))
        c = plan.add(Coll(f"reduce.bucket{b}", op, nbytes, "all", stream, tuple(range(len(bucket)))))
        wait = ids[b - in_flight] if b >= in_flight and stream != "compute" else None
        ids.append(c)
        if ready_order and b + 1 < len(buckets):  # closed when the next bucket's first gradient is ready
            steps_of_layer[layer_of[buckets[b + 1][0].name]].hooks.append((wait, c))
        else:
            plan.epilogue.append((wait, c))


def zero_plan(trace, comm, stage: int, overlap: bool, param_dtype: str | None, reduce_dtype: str | None) -> Plan:
    """ZeRO stage 1 or 2: forward, backward layer by layer with the gradient buckets (reduced during backward for
    stage 2 or with `overlap`, else after it), the parameter all-gathers after the optimizer step."""
    plan = Plan()
    L = len(trace.layers)
    plan.steps.append(Step("forward", "forward", tuple(range(L))))
    steps = {}
    for i in range(L - 1, -1, -1):
        steps[i] = Step("backward", trace.layers[i].name, (i,))
        plan.steps.append(steps[i])
    during = stage == 2 or overlap
    op = "allreduce" if comm.zero_reduce == "allreduce" else "reduce_scatter"
    _gradient_hooks(plan, trace, comm, steps, during, op, 1, overlap, reduce_dtype)
    P = trace.parameters
    shards = allgather_shards(P, comm.allgather_bucket_size)
    nbytes = P * dtype_bytes(param_dtype, trace) / shards
    for s in range(shards):
        plan.after_optimizer.append(plan.add(Coll(f"allgather.params{s}", "allgather", nbytes, "all", "compute")))
    return plan


def zero3_plan(trace, comm, sizes: LayerBytes, overlap: bool, param_dtype: str | None,
               reduce_dtype: str | None) -> Plan:
    """ZeRO stage 3: per module an all-gather before it runs unless available, prefetching the next modules up to
    stage3_prefetch_bucket_size elements, releases as DeepSpeed's coordinator makes them; gradient buckets
    reduce-scattered during backward, at most ZERO3_REDUCES_IN_FLIGHT at once."""
    plan, elems = Plan(), sizes.elements
    L = len(trace.layers)
    order = [("forward", i) for i in range(L)] + [("backward", i) for i in range(L - 1, -1, -1)]
    plan.steps = [Step(kind, trace.layers[i].name, (i,)) for kind, i in order]
    occurrences = [(s, i) for s, (_, i) in enumerate(order) if elems[i] > 0]
    later = [sum(elems[i + 1:]) for i in range(L)]
    available: set[int] = set()
    owner: dict[int, int] = {}
    fetched_for: dict[int, int] = {}
    queue = 0

    def gather(modules, what):
        c = plan.add(Coll(f"allgather.{what}", "allgather", sizes.of(modules, param_dtype), "all", "ag",
                          tuple(modules)))
        for m in modules:
            owner[m] = c
            available.add(m)
        return c

    for s, ((kind, m), step) in enumerate(zip(order, plan.steps)):
        if not elems[m]:
            continue
        if m not in available:
            step.issue.append(gather([m], f"{kind[0]}wd.{trace.layers[m].name}"))
        step.need.append(owner[m])
        while queue < len(occurrences) and occurrences[queue][0] <= s:
            queue += 1
        limit = min(MAX_LIVE_PARAMETERS - sum(elems[a] for a in available), comm.prefetch_bucket_size)
        batch: list[int] = []
        numel = 0
        while queue < len(occurrences) and numel < limit:
            s2, m2 = occurrences[queue]
            queue += 1
            fetched_for[m2] = max(fetched_for.get(m2, -1), s2)
            if m2 not in available and m2 not in batch:
                batch.append(m2)
                numel += elems[m2]
        if batch:
            step.issue.append(gather(batch, f"prefetch.{trace.layers[batch[0]].name}+{len(batch) - 1}"))
        reused = kind == "forward" and 2 * later[m] < MAX_REUSE_DISTANCE
        if not reused and fetched_for.get(m, -1) <= s:
            step.free.append(m)
            available.discard(m)
    backward = {i: plan.steps[L + (L - 1 - i)] for i in range(L)}
    _gradient_hooks(plan, trace, comm, backward, True, "reduce_scatter", ZERO3_REDUCES_IN_FLIGHT, overlap,
                    reduce_dtype)
    return plan
