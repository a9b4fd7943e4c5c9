"""The sharded family's program on the event engine: every rank runs the plan's steps on its compute stream and the
plan's collectives on its communication streams, one whole iteration at a time (`run_iteration`); a collective
starts when every rank of its group has issued it, its stream is free and its process group's previous collective
has ended. The family's docstring (simfog.algorithms.sharded) says what is modelled and from which sources; its
closed form solves this very program.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from simfog.algorithms.sharded.plan import (
    LayerBytes,
    Plan,
    dtype_bytes,
    fsdp_plan,
    fsdp_units,
    zero3_plan,
    zero_plan,
)
from simfog.engine.events import Collective
from simfog.engine.protocol import TrainingAlgorithm
from simfog.memory import Memory
from simfog.results import PATH_ANALYTIC


class ShardedAlgorithm(TrainingAlgorithm):
    """Base: runs a Plan (simfog.algorithms.sharded.plan) whole iteration by whole iteration. Subclasses build
    `self.plan` and set `self.shards`."""

    symmetric = True
    symmetric_draws = True  # every collective is among all ranks (hsdp's are not)
    whole_iterations = True
    shards = 1
    # The event-engine methods the closed form replays: a subclass (or a patch) that defines one anew runs a
    # program it does not know.
    program_methods = ("run_iteration", "_on_stream", "_collective", "_members")

    def __init__(self, sim):
        super().__init__(sim)
        exp = sim.experiment
        self.comm, self.trace = exp.comm, exp.workload.trace
        self.n = exp.ranks
        self.group_size = self.n
        self.sizes = LayerBytes.of_trace(self.trace)
        self.elements = self.sizes.elements
        self._collectives: dict = {}
        # rank -> group -> the rank's last collective of that process group: one communicator runs its collectives
        # one at a time, in the order the rank issued them, whatever stream they were issued on (see the docstring)
        self._communicator_tails: dict = {}
        # per collective, on top of its network cost (simfog.overheads: FSDP2's and the issuing thread's host work)
        self.collective_overhead_s = exp.overheads().collective_overhead_s

    # --- sizes -------------------------------------------------------------------------------------------------

    @property
    def param_dtype(self):
        return self.comm.param_dtype

    @property
    def reduce_dtype(self):
        return self.comm.reduce_dtype or self.comm.param_dtype

    # --- groups and costs -----------------------------------------------------------------------------------------

    def _members(self, group: str, rank: int) -> tuple[int, tuple[int, ...] | None]:
        G, n = self.group_size, self.n
        if group == "all" or (group == "shard" and G == n):
            return 0, None
        if group == "shard":
            g = rank // G
            return g, tuple(range(g * G, (g + 1) * G))
        g = rank % G
        return g, tuple(range(g, n, G))

    def _collective(self, iteration: int, c: int, rank: int):
        coll = self.plan.colls[c]
        gid, members = self._members(coll.group, rank)
        key = (iteration, c, gid)
        obj = self._collectives.get(key)
        if obj is None:
            sim = self.sim
            local = sim.simulated_ranks if members is None else sum(1 for m in members if m < sim.simulated_ranks)
            wire = sim.cost.time(coll.op, coll.nbytes, members)
            if self.call_factors is not None:  # per-call variation (simfog.variation)
                wire = wire * float(self.call_factors[iteration, c, gid])
            obj = self._collectives[key] = Collective(sim.env, local, self.collective_overhead_s + wire, coll.name)
        return key, obj

    @cached_property
    def call_factors(self) -> np.ndarray | None:
        """(iterations, collectives, groups): the factor of each collective of each group gid in each iteration,
        its slowest member's (simfog.variation), or None when nothing varies."""
        from simfog.algorithms.sharded.closed_form_program import group_spreads

        if not (self.sim.cost.cluster.nic.spread or self.sim.cost.cluster.intra.spread):
            return None
        spread, size = group_spreads(self)
        return self.sim.variation.factors("sharded.collectives", spread, size)

    def describe_buckets(self) -> list[dict]:
        return [{"bucket": i, "name": c.name, "collective": c.op, "bytes": c.nbytes, "tensors": len(c.units),
                 "group": c.group, "stream": c.stream} for i, c in enumerate(self.plan.colls)]

    def closed_form_blocker(self) -> str | None:
        """None: the plan is fixed before the run and the closed form solves this very program (these methods,
        unchanged); else why the event engine must run it."""
        redefined = self.redefined(ShardedAlgorithm, self.program_methods)
        if redefined is not None:
            return f"algorithm {self.comm.algorithm!r} overrides {redefined}"
        from simfog.algorithms.sharded.closed_form import blocker

        return blocker(self)

    def closed_form(self):
        """The run solved over every rank at once (closed_form), imported when asked."""
        from simfog.algorithms.sharded.closed_form import run

        return run(self.sim, PATH_ANALYTIC)

    # --- the iteration --------------------------------------------------------------------------------------------

    def _on_stream(self, rank, iteration, c, prev, after, comm_prev=None):
        env, record = self.sim.env, self.sim.record
        for event in (prev, after, comm_prev):
            if event is not None and not event.processed:
                yield event
        arrived = env.now
        key, coll = self._collective(iteration, c, rank)
        done = coll.join()
        if coll.arrived == coll.expected:
            del self._collectives[key]
        yield done
        if coll.start > arrived:
            record(rank, iteration, "wait", coll.name, arrived, coll.start)
        record(rank, iteration, "comm", coll.name, coll.start, env.now)

    def run_iteration(self, rank, iteration, sample, slow, delay):
        """One iteration of `rank` (a SimPy generator): the plan's steps on the compute stream, its collectives on
        the rank's streams; records forward/backward/optimizer pieces and comm/wait intervals."""
        env, plan, sim = self.sim.env, self.plan, self.sim
        fwd, bwd = sim.compute.layer_forward_s[sample], sim.compute.layer_backward_s[sample]
        done: dict[int, object] = {}
        tails: dict[str, object] = {}
        communicators = self._communicator_tails.setdefault(rank, {})

        def launch(c):
            coll = plan.colls[c]
            after = done.get(coll.after) if coll.after is not None else None
            comm_prev = communicators.get(coll.group)
            if coll.stream == "compute":
                p = communicators[coll.group] = env.process(self._on_stream(rank, iteration, c, None, after,
                                                                            comm_prev))
                return p
            done[c] = tails[coll.stream] = communicators[coll.group] = env.process(
                self._on_stream(rank, iteration, c, tails.get(coll.stream), after, comm_prev))
            return None

        def hooks(pairs):
            for wait, c in pairs:
                if wait is not None and not done[wait].processed:
                    yield done[wait]
                blocking = launch(c)
                if blocking is not None:
                    yield blocking
                    done[c] = blocking

        last_forward = max(i for i, s in enumerate(plan.steps) if s.kind == "forward")
        for i, step in enumerate(plan.steps):
            for c in step.issue:
                launch(c)
            for c in step.need:
                if not done[c].processed:
                    yield done[c]
            times = fwd if step.kind == "forward" else bwd
            seconds = float(sum(times[j] for j in step.layers)) * slow + (delay if i == last_forward else 0.0)
            start = env.now
            yield env.timeout(seconds)
            sim.record(rank, iteration, step.kind, step.name, start, env.now)
            yield from hooks(step.hooks)
        yield from hooks(plan.epilogue)
        for event in list(done.values()):
            if not event.processed:
                yield event
        start = env.now
        c = sim.compute
        host = 0.0 if c.host_s is None else c.host_s[sample]  # host time (data loading, gaps) is not sharded
        yield env.timeout(((c.optimizer_s[sample] - host) / self.shards + host) * slow)
        sim.record(rank, iteration, "optimizer", "optimizer", start, env.now)
        for c in plan.after_optimizer:
            yield launch(c)

    # --- memory ---------------------------------------------------------------------------------------------------

    def _live_peak_elements(self, unit_layers) -> int:
        """The most parameter elements gathered (issued, not yet freed) at once, over the plan's steps."""
        live: set[int] = set()
        peak = 0
        for step in self.plan.steps:
            for c in step.issue:
                live.update(self.plan.colls[c].units)
            peak = max(peak, sum(self.elements[j] for u in live for j in unit_layers[u]))
            live.difference_update(step.free)
        return peak

    def _base_memory(self):
        from simfog.memory import DEFAULT_OPTIMIZER, activations_B, optimizer_states

        optimizer = getattr(self.sim.experiment.workload, "optimizer", DEFAULT_OPTIMIZER)
        return optimizer, optimizer_states(optimizer), activations_B(self.trace), float(self.trace.nbytes)


class FSDP(ShardedAlgorithm):
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
        return fsdp_plan(self.trace, self.units, self.comm, self.sizes, self.param_dtype, self.reduce_dtype,
                         hsdp=self.hsdp, group_size=self.group_size)

    def memory(self, activations: bool = True) -> Memory:
        """Peak memory per rank by walking FSDP2's allocations along the plan (simfog.algorithms.sharded.memory).
        `activations` False: as if the model kept none and computed no activation gradients (the validator's
        replay keeps none)."""
        from simfog.algorithms.sharded.memory import UnitBytes, walk
        from simfog.memory import gradient_bytes

        optimizer, states, acts, params_B = self._base_memory()
        N, trace, units = self.shards, self.trace, self.units
        b_p, b_r = dtype_bytes(self.param_dtype, trace), dtype_bytes(self.reduce_dtype, trace)
        b_o = dtype_bytes(None, trace)
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
                 "gradients: the sharded gradients reduced so far + the unit's unsharded ones at the peak",
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
                 "peak: FSDP2's allocations walked in order (simfog.algorithms.sharded.memory)")
        return walk(self.plan, unit_of_step, sizes, params_B / N, states * params_B / N, notes)


class HSDP(FSDP):
    """FSDP2 with a (Replicate, Shard) mesh: fsdp inside groups of hsdp_group ranks, gradients allreduced across."""

    hsdp = True
    symmetric_draws = False


class _Zero(ShardedAlgorithm):
    stage = 1

    def __init__(self, sim):
        super().__init__(sim)
        self.shards = self.n
        overlap = self.comm.overlap_comm
        self.overlap = (self.stage == 3) if overlap is None else overlap
        self.plan = self._build()

    def _build(self) -> Plan:
        return zero_plan(self.trace, self.comm, self.stage, self.overlap, self.param_dtype, self.reduce_dtype)

    def memory(self) -> Memory:
        from simfog.memory import activation_grads_B, activation_grads_note

        optimizer, states, acts, params_B = self._base_memory()
        act_grads = activation_grads_B(self.trace)
        N, trace, P = self.n, self.trace, self.trace.parameters
        b_p = dtype_bytes(self.param_dtype, trace)
        b_o = dtype_bytes(None, trace)
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


class Zero1(_Zero):
    """DeepSpeed ZeRO stage 1: optimizer states partitioned; bucketed gradient reduction, parameter all-gather."""

    stage = 1


class Zero2(_Zero):
    """DeepSpeed ZeRO stage 2: optimizer states and gradients partitioned; buckets reduced during backward."""

    stage = 2


class Zero3(_Zero):
    """DeepSpeed ZeRO stage 3: parameters partitioned too; per-module all-gathers with prefetch by bucket size."""

    stage = 3

    def _build(self) -> Plan:
        return zero3_plan(self.trace, self.comm, self.sizes, self.overlap, self.param_dtype, self.reduce_dtype)
