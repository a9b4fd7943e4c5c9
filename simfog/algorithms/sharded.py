"""Sharded data parallelism: parameters, gradients and optimizer states split among ranks (FSDP2, HSDP, ZeRO 1-3).

Every rank holds 1/N of the state and gathers what it computes with just before it needs it, so communication gates
compute; each algorithm therefore runs whole iterations itself (`run_iteration`) from a static `Plan`: compute steps
(forward or backward of some layers), collectives issued when a step is reached (all-gathers, prefetches), collectives
a step waits for, and gradient hooks after a step. Each rank has separate communication streams, each running its
collectives in issue order (FIFO), beside the compute stream; a collective starts when every rank of its group has
issued it, its stream is free and its process group's previous collective has ended (one communicator runs one
collective at a time, in the order the rank issued them on any stream: NCCL serialises the kernels of a communicator,
see NVIDIA/nccl#1262, and FSDP2 and DeepSpeed issue all-gathers and reduce-scatters on the same process group; gloo
runs them on concurrent threads that share the link, which ends the last of them as late), and lasts the cluster
cost model's time (`CostModel.time(op, bytes, members)`, M the
full buffer: an all-gather's output, a reduce-scatter's input) plus `collective_overhead_s` (simfog.overheads: the
host's work per collective, 0 unless measured or given). Sources: torch 2.x FSDP2
(torch/distributed/fsdp/_fully_shard/: _fsdp_param_group.py, _fsdp_state.py, _fsdp_collectives.py, _fsdp_param.py,
_fully_shard.py) and DeepSpeed (deepspeed/runtime/zero/: config.py, stage_1_and_2.py, stage3.py,
partitioned_param_coordinator.py; runtime/utils.py), read in 2026.

## fsdp (FSDP2 `fully_shard`)

- Units: `comm.fsdp_unit` groups consecutive layers, as nested `fully_shard` calls do: "layer" (one per layer, the
  usual per-block wrapping), "model" (one unit), a list of layer counts, or a size ("50MB": layers are added to a
  unit until its parameter bytes reach the size). A unit's parameters are gathered in one all-gather and its
  gradients reduce-scattered in one collective (FSDPParamGroup: foreach_all_gather, foreach_reduce). A unit without
  parameters communicates nothing.
- Forward: unit u computes once its all-gather has finished (pre_forward: unshard + wait_for_unshard). `prefetch`
  = k: when the compute stream reaches unit u, the all-gathers of units u..u+k are issued (k = 1 is FSDP2's
  implicit prefetch, where the CPU issues unit u+1's all-gather while unit u's kernels run;
  set_modules_to_forward_prefetch gives more; k = 0: no overlap). After its forward a unit is resharded when
  `reshard_after_forward` (default true here for every unit; FSDP2's None default keeps the root unsharded).
- Backward, from the last unit: with reshard_after_forward, unit u's parameters are all-gathered again (pre_backward)
  and the all-gathers of units u-1..u-k are issued with it (_backward_prefetch, k = 1 by default); without it, the
  parameters are still there. After unit u's backward (post_backward) the compute stream first waits for the
  reduce-scatter of the unit before it (post_backward waits on comm_ctx.reduce_scatter_state.event), then issues
  unit u's reduce-scatter on the reduce-scatter stream. The optimizer step waits for every reduce-scatter
  (finalize_backward -> _wait_for_post_backward).
- Streams: all-gathers on the all-gather stream, reduce-scatters on the reduce-scatter stream (FSDPCommContext):
  both overlap compute; on the one process group they run one at a time (above).
- Mixed precision (MixedPrecisionPolicy; FSDPParam.init_dtype_attrs): all-gathers move `param_dtype` bytes,
  reduce-scatters `reduce_dtype` bytes (None: the gradients' dtype, i.e. param_dtype).
- The optimizer updates only the local shard: simfog scales the trace's optimizer time by the shard fraction 1/N
  (elementwise optimizers; per-tensor launch costs are not modelled).

## hsdp (FSDP2 with a 2-D mesh: Replicate, Shard)

fsdp inside groups of G = `hsdp_group` consecutive ranks (default gpus_per_node): all-gather and reduce-scatter
among the G ranks; after unit u's reduce-scatter, an allreduce of its 1/G shard among the ranks holding the same
shard in every group, on a separate all-reduce stream (foreach_reduce: all_reduce_stream waits on the reduce-scatter
stream). The optimizer waits for the all-reduces too; it updates 1/G of the model.

## zero1, zero2 (DeepSpeed stage_1_and_2.py, DeepSpeedZeroOptimizer)

- Gradient buckets of at most `reduce_bucket_size` elements (default 5e8), filled in the order gradients are ready;
  a bucket is reduced when a gradient that does not fit arrives (reduce_independent_p_g_buckets_and_remove_grads:
  `bucket.elements + param.numel() > reduce_bucket_size`), i.e. at that gradient's ready time, and the last one at
  the end of backward (independent_gradient_partition_epilogue). A tensor larger than a bucket goes alone.
- With `overlap_comm` (default false for stage 1 and 2, true for 3: config.py overlap_comm_valid) buckets are
  reduced on the reduction stream, and before a bucket is issued the compute stream waits for the earlier
  reductions (average_tensor: current_stream().wait_stream(reduction_stream)). Without it, zero2 reduces each bucket
  on the compute stream (backward stops while it runs) and zero1 reduces nothing during backward: every bucket,
  in parameter order, after it (reduce_gradients; process_gradients reduces in hooks only when partition_gradients
  or overlap_comm).
- The reduction (`zero_reduce`): "allreduce" of each bucket, DeepSpeed's default path (reduce_scatter = true and
  use_multi_rank_bucket_allreduce = true: allreduce_and_scatter -> allreduce_bucket, each rank keeps its slice) or
  "reduce" (use_multi_rank_bucket_allreduce = false: one reduce per owning rank, costed as a reduce-scatter of the
  bucket, the same bytes; the n launches are not costed separately).
- After the optimizer step (on 1/N of the parameters) the updated parameters are all-gathered on the compute
  stream: all_gather_dp_groups, in max(1, P // allgather_bucket_size) equal shards (default 5e8 elements). DeepSpeed
  does one all_gather_into_tensor when the backend has it, which is what the default gives for P < 1e9 elements.

## zero3 (DeepSpeed stage3.py, PartitionedParameterCoordinator)

- Modules = the trace's layers. Before a module runs (forward, then backward in reverse), its parameters are
  all-gathered unless already available (fetch_sub_module); then the parameters of the next modules in the recorded
  order are prefetched in one all-gather, those not available, until `stage3_prefetch_bucket_size` elements
  (default 5e7) are on the way (the one crossing it included) or stage3_max_live_parameters (1e9) would be exceeded.
- After its forward a module is released unless it is used again within stage3_max_reuse_distance (1e9) elements
  of parameters in the recorded order (__params_to_release: kept iff 2·(elements of later modules) < 1e9) or the
  prefetcher already skipped its next use; after its backward it is released. Without a release the backward needs
  no all-gather.
- Gradients: buckets as zero2 (`bucket.elements > 0` in the test), reduce-scattered (__avg_scatter_grads) on
  reduce_and_partition_stream when overlap_comm (default true), else on the compute stream; at most 3 in flight:
  before issuing bucket b the compute stream waits for bucket b-3 (max_param_reduce_events = 2).
- Steady state only: the first iteration, which records the module order and does not prefetch, is not modelled;
  neither is stage3_param_persistence_threshold (small parameters kept whole).

## Memory per rank (`memory()`)

P elements, b_o the trace's dtype bytes, b_p param_dtype, b_r reduce_dtype, k optimizer states, N shards (hsdp G):
fsdp/hsdp: the highest point of FSDP2's allocations walked in order along the plan (simfog.algorithms.fsdp_memory:
all-gather outputs until copied out, unsharded parameters until resharded, a unit's unsharded gradients until
copied into its reduce-scatter input, that input until the next reduce-scatter is issued, sharded gradients until
zero_grad, activations from forward to their layer's backward, a layer's output and input gradients while its
backward runs), with each part as it stands at that moment;
optimizer k·P·b_o/N throughout. zero*: parameters P·b_p (zero3: P·b_p/N + the live gathered modules), gradients P·b_p (zero1) or P·b_p/N,
optimizer (k + 1 if b_p != b_o: the fp32 master copy)·P·b_o/N, buffers reduce_bucket_size·b_p (twice with
overlap_comm in zero1/2: the double buffer of setup_buckets); activations the trace's, all alive at backward's start,
activation gradients the largest pair of one layer's (simfog.memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simfog.errors import ConfigError
from simfog.events import Collective
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


class _Sharded:
    """Base: runs a Plan (see the module docstring). Subclasses build `self.plan` and set `self.shards`."""

    symmetric = True
    shards = 1

    def __init__(self, sim):
        self.sim = sim
        exp = sim.experiment
        self.comm, self.trace = exp.comm, exp.workload.trace
        self.n = exp.ranks
        self.group_size = self.n
        self.elements = [sum(t.elements for t in layer.params) for layer in self.trace.layers]
        self._collectives: dict = {}
        # rank -> group -> the rank's last collective of that process group: one communicator runs its collectives
        # one at a time, in the order the rank issued them, whatever stream they were issued on (see the docstring)
        self._communicator_tails: dict = {}
        # per collective, on top of its network cost (simfog.overheads: FSDP2's and the issuing thread's host work)
        self.collective_overhead_s = exp.overheads().collective_overhead_s

    # --- sizes -------------------------------------------------------------------------------------------------

    def _bytes(self, layers, dtype: str | None) -> float:
        if dtype is None:
            return float(sum(t.nbytes for i in layers for t in self.trace.layers[i].params))
        return float(sum(self.elements[i] for i in layers) * DTYPE_BYTES[dtype])

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
            duration = self.collective_overhead_s + sim.cost.time(coll.op, coll.nbytes, members)
            obj = self._collectives[key] = Collective(sim.env, local, duration, coll.name)
        return key, obj

    def describe_buckets(self) -> list[dict]:
        return [{"bucket": i, "name": c.name, "collective": c.op, "bytes": c.nbytes, "tensors": len(c.units),
                 "group": c.group, "stream": c.stream} for i, c in enumerate(self.plan.colls)]

    def analytic_blocker(self) -> str | None:
        """None: the plan is fixed before the run and simfog.analytic_sharded solves this very program (these
        methods, unchanged) in closed form; else why the event engine must run it."""
        from simfog.analytic_sharded import blocker

        for method in ("run_iteration", "_on_stream", "_collective", "_members"):  # a subclass or patch changes it
            if getattr(getattr(self, method), "__func__", None) is not getattr(_Sharded, method):
                return f"algorithm {self.comm.algorithm!r} overrides {method}"
        return blocker(self)

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


def _dtype_bytes(dtype: str | None, trace) -> float:
    """Bytes per element of `dtype` (None: the trace's mean over its parameters)."""
    if dtype is not None:
        return float(DTYPE_BYTES[dtype])
    return trace.nbytes / trace.parameters if trace.parameters else float(DTYPE_BYTES[trace.dtype])
