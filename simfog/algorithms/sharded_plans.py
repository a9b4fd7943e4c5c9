"""The plans of the sharded algorithms (fsdp, hsdp, zero1, zero2, zero3); semantics and sources in
simfog.algorithms.sharded's docstring."""

from __future__ import annotations

from simfog.algorithms.registry import REGISTRY
from simfog.algorithms.sharded import (
    MAX_LIVE_PARAMETERS,
    MAX_REUSE_DISTANCE,
    ZERO3_REDUCES_IN_FLIGHT,
    Coll,
    Plan,
    Step,
    _dtype_bytes,
    _Sharded,
    allgather_shards,
    fsdp_units,
    zero_buckets,
)
from simfog.memory import Memory


def _unit_name(trace, layers) -> str:
    names = [trace.layers[i].name for i in layers]
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


@REGISTRY.register("fsdp")
class FSDP(_Sharded):
    """FSDP2 fully_shard: per-unit all-gather before forward (and before backward with reshard_after_forward),
    reduce-scatter after backward, prefetch k units ahead, all-gather and reduce-scatter on their own streams."""

    hsdp = False

    def __init__(self, sim):
        super().__init__(sim)
        if self.hsdp:
            self.group_size = self.comm.hsdp_group or sim.experiment.cluster.ranks_per_node
        self.shards = self.group_size
        self.units = fsdp_units(self.trace, self.comm.fsdp_unit)
        self.plan = self._build()

    def _build(self) -> Plan:
        plan, units, comm, trace = Plan(), self.units, self.comm, self.trace
        k, reshard, U = comm.prefetch, comm.reshard_after_forward, len(self.units)
        names = [_unit_name(trace, layers) for layers in units]
        has = [self._bytes(layers, None) > 0 for layers in units]

        def gather(u, phase):
            return plan.add(Coll(f"allgather.{phase}.{names[u]}", "allgather", self._bytes(units[u], self.param_dtype),
                                 "shard", "ag", (u,)))

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
                rs = plan.add(Coll(f"reduce_scatter.{names[u]}", "reduce_scatter",
                                   self._bytes(units[u], self.reduce_dtype), "shard", "rs", (u,)))
                step.hooks.append((prev_rs, rs))
                prev_rs = rs
                if self.hsdp:
                    ar = plan.add(Coll(f"allreduce.{names[u]}", "allreduce",
                                       self._bytes(units[u], self.reduce_dtype) / self.group_size, "replica", "ar",
                                       (u,), after=rs))
                    step.hooks.append((None, ar))
            plan.steps.append(step)
        return plan

    def memory(self, activations: bool = True) -> Memory:
        """Peak memory per rank by walking FSDP2's allocations along the plan (simfog.algorithms.fsdp_memory).
        `activations` False: as if the model kept none and computed no activation gradients (the validator's
        replay keeps none)."""
        from simfog.algorithms.fsdp_memory import UnitBytes, walk
        from simfog.memory import gradient_bytes

        optimizer, states, acts, params_B = self._base_memory()
        N, trace, units = self.shards, self.trace, self.units
        b_p, b_r = _dtype_bytes(self.param_dtype, trace), _dtype_bytes(self.reduce_dtype, trace)
        b_o = _dtype_bytes(None, trace)
        elems = [sum(self.elements[i] for i in layers) for layers in units]
        known = activations and acts is not None
        pairs = gradient_bytes(trace) if activations else None
        per_layer = [(self.elements[i] * b_p, trace.layers[i].activation_bytes if known else 0.0,
                      *(pairs[i] if pairs is not None else (0.0, 0.0))) for i in range(len(trace.layers))]
        sizes = UnitBytes(tuple(e * b_p for e in elems), tuple(e * b_p if N > 1 else 0.0 for e in elems),
                          tuple(e * b_r for e in elems), tuple(e * b_o / N for e in elems),
                          tuple(tuple(per_layer[i] for i in layers) for layers in units),
                          activations_known=known or not activations,
                          activation_grads_known=pairs is not None or not activations)
        U = len(units)
        unit_of_step = list(range(U)) + list(range(U - 1, -1, -1))
        notes = (f"parameters: 1/{N} shard ({trace.dtype}) + the units unsharded at the peak",
                 f"gradients: the sharded gradients reduced so far + the unit's unsharded ones at the peak",
                 f"optimizer {optimizer}: {states} state buffer(s) per parameter of the shard",
                 "buffers: all-gather outputs not yet copied out + reduce-scatter inputs in flight at the peak",
                 "activations: the trace's per-layer activation_bytes alive at the peak (kept from forward, freed "
                 "by each layer's backward)" if known else
                 "activations: UNKNOWN (the trace does not record them)" if activations else
                 "activations: none (asked without)",
                 "activation gradients: the gradients w.r.t. layer outputs and inputs alive at the peak (the trace's "
                 "output_bytes)" if pairs is not None else
                 "activation gradients: UNKNOWN (the trace does not record output_bytes)" if activations else
                 "activation gradients: none (asked without)",
                 "peak: FSDP2's allocations walked in order (simfog.algorithms.fsdp_memory)")
        return walk(self.plan, unit_of_step, sizes, params_B / N, states * params_B / N, notes)


@REGISTRY.register("hsdp")
class HSDP(FSDP):
    """FSDP2 with a (Replicate, Shard) mesh: fsdp inside groups of hsdp_group ranks, gradients allreduced across."""

    hsdp = True


class _Zero(_Sharded):
    stage = 1

    def __init__(self, sim):
        super().__init__(sim)
        self.shards = self.n
        overlap = self.comm.overlap_comm
        self.overlap = (self.stage == 3) if overlap is None else overlap
        self.plan = self._build()

    def _bucket(self, plan: Plan, b: int, tensors, op: str, stream: str) -> int:
        dtype = self.reduce_dtype
        nbytes = float(sum(t.nbytes if dtype is None else t.elements * _dtype_bytes(dtype, self.trace)
                           for t in tensors))
        return plan.add(Coll(f"reduce.bucket{b}", op, nbytes, "all", stream, tuple(range(len(tensors)))))

    def _gradient_hooks(self, plan: Plan, steps_of_layer: dict[int, Step], ready_order: bool, op: str,
                        in_flight: int) -> None:
        """Buckets of reduce_bucket_size elements; each reduced when the gradient that does not fit is ready
        (during backward when `ready_order`, else all after backward), waiting first for bucket b - in_flight."""
        trace = self.trace
        tensors = trace.ready_tensors() if ready_order else [t for layer in trace.layers for t in layer.params]
        buckets = zero_buckets(tensors, self.comm.reduce_bucket_size)
        layer_of = trace.layer_index()
        stream = "rs" if self.overlap else "compute"
        ids: list[int] = []
        for b, bucket in enumerate(buckets):
            c = self._bucket(plan, b, bucket, op, stream)
            wait = ids[b - in_flight] if b >= in_flight and stream != "compute" else None
            ids.append(c)
            if ready_order and b + 1 < len(buckets):  # closed when the next bucket's first gradient is ready
                steps_of_layer[layer_of[buckets[b + 1][0].name]].hooks.append((wait, c))
            else:
                plan.epilogue.append((wait, c))

    def _build(self) -> Plan:
        plan, trace = Plan(), self.trace
        L = len(trace.layers)
        plan.steps.append(Step("forward", "forward", tuple(range(L))))
        steps = {}
        for i in range(L - 1, -1, -1):
            steps[i] = Step("backward", trace.layers[i].name, (i,))
            plan.steps.append(steps[i])
        during = self.stage == 2 or self.overlap
        op = "allreduce" if self.comm.zero_reduce == "allreduce" else "reduce_scatter"
        self._gradient_hooks(plan, steps, during, op, 1)
        P = trace.parameters
        shards = allgather_shards(P, self.comm.allgather_bucket_size)
        nbytes = P * _dtype_bytes(self.param_dtype, trace) / shards
        for s in range(shards):
            plan.after_optimizer.append(plan.add(Coll(f"allgather.params{s}", "allgather", nbytes, "all", "compute")))
        return plan

    def memory(self) -> Memory:
        from simfog.memory import activation_grads_B, activation_grads_note

        optimizer, states, acts, params_B = self._base_memory()
        act_grads = activation_grads_B(self.trace)
        N, trace, P = self.n, self.trace, self.trace.parameters
        b_p = _dtype_bytes(self.param_dtype, trace)
        b_o = _dtype_bytes(None, trace)
        master = 1 if b_p != b_o else 0
        params = P * b_p
        if self.stage == 3:
            params = P * b_p / N + self._live_peak_elements([(i,) for i in range(len(trace.layers))]) * b_p
        grads = P * b_p if self.stage == 1 else P * b_p / N
        buffers = self.comm.reduce_bucket_size * b_p * (2 if self.overlap and self.stage < 3 else 1)
        return Memory(params, grads, (states + master) * P * b_o / N, buffers, acts, act_grads,
                      (f"parameters ({self.param_dtype or trace.dtype}): " + (
                          f"1/{N} + the gathered modules" if self.stage == 3 else "a full replica"),
                       f"gradients: {'a full replica' if self.stage == 1 else f'1/{N} partition'}",
                       f"optimizer {optimizer}: {states} state buffer(s){' + fp32 master' if master else ''} "
                       f"per parameter of the 1/{N} partition",
                       "buffers: reduce_bucket_size elements" + (" twice (overlap_comm)" if self.overlap
                                                                 and self.stage < 3 else ""),
                       "activations: the trace's per-layer activation_bytes, all alive when backward starts"
                       if acts is not None else "activations: UNKNOWN (the trace does not record them)",
                       activation_grads_note(act_grads is not None)))


@REGISTRY.register("zero1")
class Zero1(_Zero):
    """DeepSpeed ZeRO stage 1: optimizer states partitioned; bucketed gradient reduction, parameter all-gather."""

    stage = 1


@REGISTRY.register("zero2")
class Zero2(_Zero):
    """DeepSpeed ZeRO stage 2: optimizer states and gradients partitioned; buckets reduced during backward."""

    stage = 2


@REGISTRY.register("zero3")
class Zero3(_Zero):
    """DeepSpeed ZeRO stage 3: parameters partitioned too; per-module all-gathers with prefetch by bucket size."""

    stage = 3

    def _build(self) -> Plan:
        plan, trace, elems = Plan(), self.trace, self.elements
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
            c = plan.add(Coll(f"allgather.{what}", "allgather", self._bytes(modules, self.param_dtype), "all", "ag",
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
            limit = min(MAX_LIVE_PARAMETERS - sum(elems[a] for a in available), self.comm.prefetch_bucket_size)
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
        self._gradient_hooks(plan, backward, True, "reduce_scatter", ZERO3_REDUCES_IN_FLIGHT)
        return plan
