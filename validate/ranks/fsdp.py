"""Real runs of FSDP2 (`torch.distributed.fsdp.fully_shard`) for the validator, replay or model mode, gloo on CPU.

The replay model (`validate.ranks.replay.ReplayModel` with `units`) has one `ReplayUnit` submodule per unit of the
experiment's `comm.fsdp_unit` (simfog.algorithms.sharded.plan.fsdp_units, the same layer groups the simulator uses);
`make` applies `fully_shard(unit, reshard_after_forward=...)` to each unit, in forward order, then to the root (the
ReplayModel, which owns no parameters of its own: nothing of it is gathered). In model mode the unit is the list of
the real model's modules its layers name (trace layer names are module paths), those with parameters, sharded as one
FSDP2 group (`fully_shard([modules])`); a unit without parameters (a ReLU) too, all its modules, a state that gathers
nothing but whose hooks issue the plan's prefetches at that unit. The optimizer is made after sharding.

FSDP2 ON CPU IS SYNCHRONOUS. Its streams are torch.cpu.Stream stand-ins that order nothing, and it calls its
collectives with async_op=False (the pre-forward/pre-backward unshard, `unshard_async_op` defaults to False; the
reduce-scatter in foreach_reduce has no async_op at all), so on gloo every all-gather and reduce-scatter blocks the
rank's only thread and nothing overlaps: not the model simfog makes of FSDP2 on GPUs (all-gather and
reduce-scatter streams beside compute). To run FSDP2's own schedule with that overlap, `make` uses two of FSDP2's
own extension points (torch 2.13, _fully_shard/_fully_shard.py):

- `_set_unshard_async_op(True)`: unshards issue `all_gather_single(async_op=True)` and wait for it where FSDP2
  waits for its all-gather stream (wait_for_unshard); all-gathers then run on gloo's threads while the rank waits
  out its replayed compute. As its docstring says, overlap then needs explicit prefetching: the mapping below.
- `set_custom_all_gather` / `set_custom_reduce_scatter` (per unit): `TimedAllGather` stamps each all-gather's
  launch and completion; `TimedReduceScatter` first waits for the unit before's reduce-scatter (FSDP2's
  post_backward waits on the previous reduce-scatter's event; simfog's plan does the same), then issues this one
  asynchronously and returns. `FSDPComm.finish` waits for all of them before the optimizer step
  (finalize_backward's wait on the post-reduce events). FSDP2 divides the reduce-scatter output in place right
  after the call (_div_if_needed), i.e. before gloo has written it: harmless in replay (the gradients are
  constants whose values nobody reads); in model mode FSDP2's division is switched off
  (set_force_sum_reduction_for_comms, set_gradient_divide_factor(1.0)) and the comm divides its input by the group
  size before summing, so the sharded gradient is the mean, written by gloo alone.
- One collective at a time (CPUs): gloo runs two collectives of a process group at once (two worker threads), so
  the root's prefetched all-gathers of units 0 and 1 shared the link and unit 0's ended twice as late as on NCCL,
  which runs a communicator's collectives one at a time in issue order (simfog's model). On CPUs `FSDPComm.issue`
  therefore hands each collective to an issuing thread that starts it once every collective issued before it has
  completed, stamps its real start and completion, and lets FSDP2 wait on it (`_InOrder`); on GPUs (NCCL) the
  collective is issued as FSDP2 issues it. Measured effect (ResNet-20, 300 kB units, 4 ranks, 200 Mbit/s): -8.4 %
  -> -3.9 %; per-layer units then showed FSDP2's host work per collective, which validate.host_calibration
  measures before the runs and simfog adds to each collective (`collective_overhead_s`).
- Waits in the rank's thread for a collective (an all-gather FSDP2 needs before a unit, the previous
  reduce-scatter) are timed and move the replay's remaining deadlines of the pass by as much
  (`ReplayModel.blocked`): the replay waits to absolute deadlines, which would otherwise absorb an exposed
  all-gather into the next layer's wait. FSDP2's own CPU work (copy-in, copy-out, hooks) is not shifted: it is
  absorbed where it fits in a layer's replayed time (simfog does not model it either).

Prefetch depth k (`comm.prefetch`, simfog: when the compute reaches unit u, the all-gathers of units u..u+k are
issued) mapped onto FSDP2's explicit prefetching (`prefetch_lists`):

- forward: the root `set_modules_to_forward_prefetch(units 0..k)` (its pre-forward, with no parameters of its own,
  issues them before unit 0 waits) and each unit u `set_modules_to_forward_prefetch(units u+1..u+k)`, issued in
  unit u's pre-forward after its own all-gather is waited for (FSDPState._pre_forward); under the FIFO all-gather
  stream of simfog's model the order is the same. k = 0: no lists (each unit gathers itself in its pre-forward).
  FSDP2's implicit forward prefetch (k = 1 on GPUs, where the CPU runs ahead of the kernels) does not exist on CPU.
- backward (with reshard_after_forward): unit u `set_modules_to_backward_prefetch(units u-1..u-k)`, issued in its
  pre-backward after its own re-gather. k = 1 is exactly FSDP2's default (_backward_prefetch: the unit before in
  post-forward order), set explicitly here. k = 0: the list [u] itself, because an empty list means "use the
  default" (FSDPState._pre_backward: default_prefetch = len(...) == 0); prefetching an unsharded unit is a no-op.

Measured (bench fsdp rows, 200 Mbit/s, 2/4/8 ranks; `simfog validate --bench --repeat 3`, idle machine,
2026-11-26): the 14 rows the rig can emulate median 3.0 / 3.8 / 3.3 %, worst -11.3 / -11.2 / -13.9 % (mlp 300 kB
units with reshard on 2 ranks, -11 to -14 % in every run: simfog faster); per-layer rows on 8 ranks are host-limited
(-20 to -25 %). Before the collectives ran one at a time and FSDP2's host work per collective was measured
(validate.host_calibration): median 7.0 / 8.1 / 6.7 %, simfog faster on every 4- and 8-rank row (ResNet-20 per
layer on 4 ranks: measured communication 0.48 s per iteration against 0.23 s predicted over ~120 collectives).
Memory: simfog's walk of FSDP2's allocations (simfog.algorithms.sharded.memory) against the allocator's peak of one
profiled iteration (`MemoryProfile`, gloo's own temporaries left out): all 24 rows within 6.1 % in each of those
three runs (most to the byte; a host-limited 8-rank per-layer row was once -30 %, in 2026-11-25's runs). The
earlier model, the sum of each part's own peak, over-predicted by 14 to 53 %.

Collectives are recorded under the simulator's names (simfog.algorithms.sharded.program.FSDP: "allgather.fwd.<unit>",
"allgather.bwd.<unit>", "reduce_scatter.<unit>"), indexed as the simulated plan's collectives, so measured and
predicted intervals join. Not run: hsdp, mixed precision (param_dtype / reduce_dtype), nccl. Model mode on this
2-core machine is host-limited (two ranks computing for real beside FSDP2's and gloo's threads: first runs 2-3x slower
than the traced compute predicts on a loaded machine, -13 % on an idle one, MLP 2 ranks at 1 Gbit/s). Its memory
peak (input batch, activations, backward's activation gradients: simfog's walk counts them from activation_bytes
and output_bytes) on MLP 2 ranks per layer: 7,831,080 B predicted, 7,839,280 B measured (-0.1 %: the targets, held
past the loss) in every run at 1 Gbit/s and 200 Mbit/s (-18 to -28 % before activation gradients were counted);
MLP and ResNet-20 on 1 and 2 ranks, units of a layer, 300 kB or the model, with and without reshard: -1.6 to +0.8 %.

torch is imported inside the functions that need it: the mapping and the checks run without torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simfog.errors import ConfigError
from validate.ranks.fsdp_comm import FSDPComm, comms

FSDP_NOTE = ("fsdp: FSDP2 fully_shard per unit on gloo, all-gathers async (_set_unshard_async_op) with explicit "
             "prefetch, reduce-scatters async through a custom comm; plain FSDP2 on CPU would block on each")


# --- the mapping and the configuration (no torch) ---------------------------------------------------------------------

def prefetch_lists(units: int, k: int) -> dict:
    """FSDP2 explicit prefetch lists realising simfog's prefetch depth `k` over `units` units (see the module
    docstring): {"root_forward": [unit], "forward": [[unit] per unit], "backward": [[unit] per unit]}. Raises
    ConfigError for a negative depth."""
    if k < 0:
        raise ConfigError("comm.prefetch", k, "an integer >= 0")
    root = list(range(min(units, k + 1))) if k >= 1 else []
    forward = [list(range(u + 1, min(units, u + k + 1))) for u in range(units)]
    backward = [list(range(u - 1, max(-1, u - k - 1), -1)) if k >= 1 else [u] for u in range(units)]
    return {"root_forward": root, "forward": forward, "backward": backward}


def check_sharded(exp, mode: str, backend: str, algorithm: str, *, why_replay: str = "",
                  why_one_dtype: str = "", modes: tuple[str, ...] = ("replay",)) -> None:
    """Raise ConfigError for what the validator's sharded rank programs (fsdp, zero2) cannot run: a mode not in
    `modes`, another backend than gloo, one rank, mixed precision, parameters of several dtypes."""
    src, comm = exp.source, exp.comm
    if mode not in modes:
        raise ConfigError("mode", mode, f"{' or '.join(modes)} for algorithm {algorithm}{why_replay}", source=src)
    if backend != "gloo":
        raise ConfigError("--backend", backend, f"gloo for algorithm {algorithm}", source=src)
    if exp.cluster.ranks < 2:
        raise ConfigError("cluster", f"{exp.cluster.ranks} rank", f"at least 2 ranks for algorithm {algorithm}",
                          source=src)
    if comm.param_dtype is not None or comm.reduce_dtype is not None:
        raise ConfigError("comm.param_dtype", comm.param_dtype or comm.reduce_dtype, f"unset for algorithm "
                          f"{algorithm} (the validator runs no mixed precision)", source=src)
    dtypes = {t.dtype for t in exp.workload.trace.tensors.values()}
    if len(dtypes) > 1:
        raise ConfigError("workload.trace", sorted(dtypes), f"parameters of one dtype{why_one_dtype}", source=src)


def check_experiment(exp, mode: str, backend: str) -> None:
    """Raise ConfigError for an fsdp experiment the validator cannot run (see the module docstring)."""
    check_sharded(exp, mode, backend, "fsdp", why_one_dtype=" (FSDP2 needs one per unit)", modes=("replay", "model"))


def worker_fields(sim) -> dict:
    """The worker configuration fields of an fsdp experiment from `sim` (a simfog.simulation.Simulation of it):
    "algorithm", "units" (layer indices per unit), "reshard_after_forward", "prefetch", "collectives" (the simulated
    plan's collective names, in plan order: the worker records under these indices), "unit_names" and
    "optimizer_shards" (the replayed optimizer step is divided by it, as simfog divides the trace's)."""
    alg, comm = sim.algorithm, sim.experiment.comm
    return {"algorithm": "fsdp", "units": [list(u) for u in alg.units],
            "layer_names": [layer.name for layer in sim.experiment.workload.trace.layers],
            "reshard_after_forward": bool(comm.reshard_after_forward), "prefetch": int(comm.prefetch),
            "collectives": [c.name for c in alg.plan.colls], "unit_names": _unit_names(sim),
            "optimizer_shards": alg.shards}


def _unit_names(sim) -> list[str]:
    from simfog.algorithms.sharded.plan import unit_name

    return [unit_name(sim.experiment.workload.trace, u) for u in sim.algorithm.units]


def communication_matches(cfg: Mapping, per_rank: Sequence[Mapping]) -> bool:
    """True when every rank launched exactly the simulated plan's collectives, in plan order, every iteration."""
    want = list(range(len(cfg["collectives"])))
    return all(len(r["iterations"]) == cfg["iterations"] and all(d["launch_order"] == want for d in r["iterations"])
               for r in per_rank)


# --- the real run (torch) ---------------------------------------------------------------------------------------------

def make(model, cfg: Mapping, clock=None) -> FSDPComm:
    """Apply FSDP2 to `model` as the module docstring says; returns the FSDPComm that records its collectives.
    `model`: a ReplayModel built with cfg["units"] (replay mode), or the real model of the trace (model mode: each
    unit is the list of the modules its layers name, those with parameters, sharded as one group; a unit without
    any is the list of all its modules)."""
    from torch.distributed.fsdp import fully_shard

    replay = hasattr(model, "blocked")
    recorder = FSDPComm(cfg["collectives"], clock, model.blocked if replay else (lambda seconds: None))
    reshard = bool(cfg["reshard_after_forward"])
    if replay:
        units = list(model.units)
    else:
        names = cfg["layer_names"]
        modules = [[model.get_submodule(names[i]) for i in layer_ids] for layer_ids in cfg["units"]]
        # a unit without parameters too, for its hooks' prefetches (see the module docstring)
        units = [[m for m in unit if _has_params(m)] or unit for unit in modules]
    handles = []  # per unit: the module FSDP2's prefetch lists name
    for unit, name in zip(units, cfg["unit_names"], strict=True):
        sharded = fully_shard(unit, reshard_after_forward=reshard)
        handle = sharded[0] if isinstance(sharded, list) else sharded
        handles.append(handle)
        if _has_params(unit):  # a unit without parameters gathers nothing: no collectives
            ag, rs = comms(name, recorder, predivide=not replay)
            handle.set_custom_all_gather(ag)
            handle.set_custom_reduce_scatter(rs)
            if not replay:
                # FSDP2 would divide the output in place when the call returns, while gloo still writes it
                # (the reduce-scatter is asynchronous here): sum only, the comm divides its input first
                handle.set_force_sum_reduction_for_comms(True)
                handle.set_gradient_divide_factor(1.0)
    fully_shard(model, reshard_after_forward=reshard)
    lists = prefetch_lists(len(units), int(cfg["prefetch"]))

    def named(ids):
        return [handles[v] for v in ids]

    model.set_modules_to_forward_prefetch(named(lists["root_forward"]))
    for u, handle in enumerate(handles):
        handle.set_modules_to_forward_prefetch(named(lists["forward"][u]))
        handle.set_modules_to_backward_prefetch(named(lists["backward"][u]))
    model._set_unshard_async_op(True)
    return recorder


def _has_params(unit) -> bool:  # unit: a module or a list of modules
    return any(True for m in (unit if isinstance(unit, list) else [unit]) for _ in m.parameters())


def local_bytes(model) -> int:
    """Bytes of the parameters this rank holds between iterations (FSDP2's sharded DTensors' local shards)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


class MemoryProfile:
    """The memory of one iteration of `model`, from torch's CPU allocator events (torch.profiler with
    profile_memory: every allocation and free the allocator reports, with its address and the op that made it).
    Created at the iteration's start; `stop()` returns (bytes):

    - "resident_B": the local shards held at the start, plus `batch_B` (model mode: the input batch, allocated once
      before the iterations and kept, which simfog counts as the first layer's activations);
    - "peak_delta_B": the highest sum of the blocks allocated during the iteration and not yet freed;
    - "backend_peak_delta_B": the same without the blocks that the process group's own ops allocate (an op named
      c10d::* or gloo:* among the allocation's callers): gloo's temporaries, e.g. the copy of the whole input that
      its reduce_scatter_tensor allreduces, which NCCL does not make and simfog does not model;
    - "peak_B" = resident_B + peak_delta_B and "framework_peak_B" = resident_B + backend_peak_delta_B.

    Frees of blocks allocated before are not counted (the blocks were not counted either); a block whose address is
    handed out again without a reported free counts as freed then. Frees in other threads go unreported (torch.profiler
    sees the thread that started it): the collectives' buffers are freed in the rank's (`_let_go`)."""

    def __init__(self, model, batch_B: int = 0):
        from torch.profiler import ProfilerActivity, profile

        self.resident_B = local_bytes(model) + batch_B
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.start()

    def stop(self) -> dict:
        from torch._C._profiler import _EventType

        self._prof.stop()
        events = []
        stack = [(e, False) for e in self._prof.profiler.kineto_results.experimental_event_tree()]
        while stack:
            e, in_backend = stack.pop()
            in_backend = in_backend or e.name.startswith(("c10d::", "gloo:"))
            stack.extend((c, in_backend) for c in e.children)
            if e.typed[0] == _EventType.Allocation:
                f = e.typed[1]
                events.append((e.start_time_ns, f.alloc_size, f.ptr, in_backend))
        peaks = [_peak(events, lambda b: True), _peak(events, lambda b: not b)]
        return {"resident_B": self.resident_B, "peak_delta_B": peaks[0], "peak_B": self.resident_B + peaks[0],
                "framework_peak_delta_B": peaks[1], "framework_peak_B": self.resident_B + peaks[1]}


def _peak(events, keep) -> int:
    """The highest sum of live blocks over (time, size (+ allocated, - freed), address, in_backend) events,
    counting the blocks allocated where keep(in_backend)."""
    live: dict[int, int] = {}
    total = peak = 0
    for _, size, ptr, in_backend in sorted(events):
        if size > 0:
            total -= live.pop(ptr, 0)
            if keep(in_backend):
                live[ptr] = size
                total += size
        elif ptr in live:
            total -= live.pop(ptr)
        peak = max(peak, total)
    return peak
