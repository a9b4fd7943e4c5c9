"""The replay model: a trace's layers as waits of their traced durations, with parameters of the traced sizes.

`compute = "replay"` in a validation run swaps the real network for this module, so the network and the overlap
model are tested without the CPU contention of several ranks computing on a few cores: a waiting rank sleeps.

Structure: one submodule per traced layer (forward order), owning that layer's parameters (zeros, traced element
count and dtype). Forward applies, per layer, `_Attach` nodes for its parameters and then a `_Wait` node; backward
therefore runs the layers from last to first, each `_Wait` waiting for the layer's traced backward time, after
which the `_Attach` nodes hand out the layer's parameter gradients one by one in the trace's `grad_ready_order`
(an AccumulateGrad node runs before the next `_Attach`, so post-accumulate hooks and torch DDP see exactly that
order). A parameter's gradient is thus ready when its layer's backward ends, as `simfog.engine.compute` assumes.
Each backward wait first allocates its layer's gradients afresh (zeros), inside the layer's traced time, and the
`_Attach` nodes hand those over unreferenced, so that AccumulateGrad takes them as they are, as it takes a real
layer's fresh gradient; a gradient kept and handed out every iteration was cloned by AccumulateGrad after the
last deadline (the MLP's 0.8 MB first layer: 0.12 ms alone, 0.2-0.5 ms on 8 ranks of 2 cores), a backward that
the trace does not have, which made every replayed MLP step that much late.

Waits go to absolute deadlines on `time.perf_counter`: layer k of a pass ends at pass start + the traced times of
layers up to k, so a late wake-up never accumulates. A wait sleeps until `spin_s` before its deadline and spins
the rest (sleep overshoots by tens of microseconds; spinning only the end keeps waiting ranks off the CPU).

Layer times per recorded iteration come from `LayerTimes`, built exactly as `simfog.engine.compute.ComputeModel` builds
its totals ("samples": one recorded iteration per rank and iteration; "mean": layer means), so the validator can
replay the very draws the simulator uses. Torch-only module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from simfog.errors import ConfigError
from simfog.trace import ModelTrace

SPIN_S = 2e-4  # spin the last 0.2 ms of a wait: Linux sleeps overshoot by ~50-100 us (timer slack + wake-up)


def wait_until(deadline_s: float, spin_s: float = SPIN_S) -> float:
    """Block until time.perf_counter() >= `deadline_s`: sleep, then spin the last `spin_s` seconds. Returns the
    perf_counter time at return (>= deadline_s). Returns at once for a deadline in the past."""
    now = time.perf_counter()
    left = deadline_s - now
    if left > spin_s:
        time.sleep(left - spin_s)
    while now < deadline_s:
        now = time.perf_counter()
    return now


@dataclass(frozen=True)
class LayerTimes:
    """Per recorded iteration (row) and layer (column, forward order): forward and backward seconds; optimizer
    seconds per row. Rows and their means follow `simfog.engine.compute.ComputeModel.from_trace` exactly."""

    forward_s: np.ndarray    # (S, L)
    backward_s: np.ndarray   # (S, L)
    optimizer_s: np.ndarray  # (S,)

    @staticmethod
    def from_trace(trace: ModelTrace, mode: str) -> LayerTimes:
        """"samples" and "replay": every recorded iteration; "mean": one row of means (one per recorded rank for a
        trace with sample_ranks). Raises ConfigError for another mode."""
        if mode not in ("samples", "mean", "replay"):
            raise ConfigError("workload.compute", mode, "samples, mean or replay")
        fwd = np.array([layer.forward_s for layer in trace.layers], dtype=float).T
        bwd = np.array([layer.backward_s for layer in trace.layers], dtype=float).T
        opt = np.asarray(trace.optimizer_s, dtype=float)
        if opt.size != fwd.shape[0]:
            opt = np.full(fwd.shape[0], opt.mean() if opt.size else 0.0)
        ranks = np.asarray(getattr(trace, "sample_ranks", ()), dtype=int)
        if mode == "mean" and ranks.size:
            rows = [np.flatnonzero(ranks == r) for r in np.unique(ranks)]
            fwd, bwd, opt = (np.array([x[r].mean(0) for r in rows]) for x in (fwd, bwd, opt))
        elif mode == "mean":
            fwd, bwd, opt = fwd.mean(0, keepdims=True), bwd.mean(0, keepdims=True), opt.mean(keepdims=True)
        return LayerTimes(fwd, bwd, opt)

    @property
    def samples(self) -> int:
        return self.forward_s.shape[0]


class _Clock:
    """The current iteration's schedule and what happened, shared by the autograd nodes of one ReplayModel."""

    def __init__(self, layers: int, spin_s: float, grads: Sequence[Sequence[tuple]]):
        self.spin_s = spin_s
        self.grads = grads  # per layer, (elements, dtype, device) of each parameter's gradient
        self.fresh: list[list] = [[] for _ in grads]  # per layer, the gradients its _Attach nodes hand out next
        self.fwd_end = np.zeros(layers)   # deadlines relative to the pass start (cumulative traced times)
        self.bwd_end = np.zeros(layers)
        self.fwd_origin: float | None = None
        self.bwd_origin: float | None = None
        self.events: list[tuple[int, str, float, float]] | None = None  # (layer, phase, start, end) when recording
        self.backward_done_s: float | None = None

    def wait(self, layer: int, phase: str) -> None:
        now = time.perf_counter()
        if phase == "forward":
            if self.fwd_origin is None:
                self.fwd_origin = now
            end = wait_until(self.fwd_origin + self.fwd_end[layer], self.spin_s)
        else:
            if self.bwd_origin is None:
                self.bwd_origin = now
            # inside the layer's traced time: the wait below absorbs the allocation
            self.fresh[layer] = [torch.zeros(n, dtype=d, device=where) for n, d, where in self.grads[layer]]
            end = wait_until(self.bwd_origin + self.bwd_end[layer], self.spin_s)
            if layer == 0:
                self.backward_done_s = end
        if self.events is not None:
            self.events.append((layer, phase, now, end))


class _Wait(torch.autograd.Function):
    """Identity on a one-element tensor whose forward and backward wait for a layer's traced time."""

    @staticmethod
    def forward(ctx, x, clock: _Clock, layer: int):
        ctx.clock, ctx.layer = clock, layer
        clock.wait(layer, "forward")
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.wait(ctx.layer, "backward")
        return grad, None, None


class _Attach(torch.autograd.Function):
    """Identity that gives parameter `p` in backward the gradient (zeros) its layer's _Wait allocated, keeping no
    reference to it (AccumulateGrad then takes it without a copy)."""

    @staticmethod
    def forward(ctx, x, p, clock: _Clock, layer: int, k: int):
        ctx.clock, ctx.layer, ctx.k = clock, layer, k
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        fresh = ctx.clock.fresh[ctx.layer]
        grad, fresh[ctx.k] = fresh[ctx.k], None
        return g, grad, None, None, None


class ReplayLayer(nn.Module):
    """One traced layer: its parameters, in the trace's order."""

    def __init__(self, params: Sequence[nn.Parameter]):
        super().__init__()
        self.params = nn.ParameterList(params)


class ReplayUnit(nn.Module):
    """Consecutive traced layers called as one module (an FSDP unit: `validate.ranks.fsdp` applies `fully_shard` to it).
    `forward(x)` runs `run(i, x)` for each of its layer indices `index`, in order."""

    def __init__(self, layers: Sequence[ReplayLayer], index: Sequence[int], run):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.index = tuple(index)
        self._run = run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in self.index:
            x = self._run(i, x)
        return x


class ReplayModel(nn.Module):
    """The trace's layers as waits, with the trace's parameter tensors (see the module docstring).

    `tensor_names[p]` is the trace name of parameter p (`named_tensors()` gives name -> parameter). Call
    `set_iteration(forward_s, backward_s)` (seconds per layer, forward order) before each forward. `forward(x)`
    takes a one-element tensor that requires grad and returns one. `device`: where the parameters and gradients
    live (a GPU for NCCL runs; the waits stay on the host). `units`: tuples of consecutive layer indices covering
    every layer; the layers are then grouped under one `ReplayUnit` submodule each (`self.units`), called in turn,
    so that a framework can wrap each unit (FSDP2's fully_shard); without, the layers are `self.layers` directly.
    Parameters are found by position, not identity, so a wrapper may swap them (FSDP2's sharded and unsharded
    parameters). Raises ConfigError for an unsupported dtype or units that do not cover the layers in order."""

    def __init__(self, trace: ModelTrace, *, spin_s: float = SPIN_S, device: torch.device | str = "cpu",
                 units: Sequence[Sequence[int]] | None = None):
        super().__init__()
        self.trace = trace
        ready_pos = {n: i for i, n in enumerate(trace.grad_ready_order)}
        layers, grads_of, self._where = [], [], {}  # _where: trace name -> (layer, position): no references
        for i, layer in enumerate(trace.layers):
            params, grads = [], []
            for k, t in enumerate(layer.params):
                dtype = getattr(torch, t.dtype, None)
                if not isinstance(dtype, torch.dtype):
                    raise ConfigError(f"tensor {t.name}.dtype", t.dtype, "a torch dtype")
                p = nn.Parameter(torch.zeros(t.elements, dtype=dtype, device=device))
                self._where[t.name] = (i, k)
                grads.append((t.elements, dtype, p.device))
                params.append(p)
            layers.append(ReplayLayer(params))
            grads_of.append(grads)
        self._layer_list = layers  # a plain list: the modules are registered once, under layers or units
        if units is None:
            self.layers = nn.ModuleList(layers)
            self.units = None
        else:
            units = [tuple(u) for u in units]
            if [i for u in units for i in u] != list(range(len(layers))) or not all(units):
                raise ConfigError("units", units, f"non-empty tuples of consecutive layer indices covering "
                                  f"0..{len(layers) - 1} in order")
            self.units = nn.ModuleList(ReplayUnit([layers[i] for i in u], u, self._layer_forward) for u in units)
        # _Attach nodes in reverse ready order: backward meets them, and hands out gradients, in ready order.
        self._attach_order = [sorted(range(len(traced.params)), key=lambda k, ts=traced.params: ready_pos[ts[k].name],
                                     reverse=True) for traced in trace.layers]
        self.clock = _Clock(len(layers), spin_s, grads_of)

    @property
    def tensor_names(self) -> dict[nn.Parameter, str]:
        return {p: n for n, p in self.named_tensors().items()}

    def named_tensors(self) -> dict[str, nn.Parameter]:
        """Trace tensor name -> parameter."""
        return {n: self._layer_list[i].params[k] for n, (i, k) in self._where.items()}

    def set_iteration(self, forward_s: Sequence[float], backward_s: Sequence[float], *,
                      start_s: float | None = None, record: bool = False) -> None:
        """Schedule the next forward and backward: per-layer seconds in forward order. The forward deadlines count
        from `start_s` (perf_counter; default: when the first layer runs). `record` keeps per-layer
        (layer, phase, start, end) perf_counter intervals in `clock.events`."""
        fwd, bwd = np.asarray(forward_s, dtype=float), np.asarray(backward_s, dtype=float)
        n = len(self._layer_list)
        if fwd.shape != (n,) or bwd.shape != fwd.shape:
            raise ConfigError("layer times", fwd.shape, f"one time per layer ({n})")
        c = self.clock
        c.fwd_end = np.cumsum(fwd)
        c.bwd_end = np.cumsum(bwd[::-1])[::-1]  # layer l's backward ends after all layers >= l (engine's rule)
        c.fwd_origin, c.bwd_origin, c.backward_done_s = start_s, None, None
        c.events = [] if record else None

    def blocked(self, seconds: float) -> None:
        """The rank was blocked `seconds` inside the current pass (waiting for communication it needs before its
        next layer, e.g. an FSDP all-gather): the pass's remaining deadlines move by as much, so that the wait
        delays the replayed compute instead of being absorbed by the next layer's deadline."""
        c = self.clock
        if c.bwd_origin is not None:
            c.bwd_origin += seconds
        elif c.fwd_origin is not None:
            c.fwd_origin += seconds

    def start_backward(self, when_s: float | None = None) -> None:
        """Anchor the backward deadlines at `when_s` (perf_counter; default now) instead of at the first node."""
        self.clock.bwd_origin = time.perf_counter() if when_s is None else when_s

    def _layer_forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        params = self._layer_list[i].params  # whatever parameter objects the layer holds now
        for k in self._attach_order[i]:
            x = _Attach.apply(x, params[k], self.clock, i, k)
        return _Wait.apply(x, self.clock, i)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.units is not None:
            for unit in self.units:
                x = unit(x)
            return x
        for i in range(len(self._layer_list)):
            x = self._layer_forward(i, x)
        return x

    def wait_optimizer(self, seconds: float) -> float:
        """The optimizer step: wait `seconds` from now. Returns the perf_counter time at its end."""
        return wait_until(time.perf_counter() + seconds, self.clock.spin_s)
