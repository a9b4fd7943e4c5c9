"""Retargeting: an estimated trace of the same model and batch on another GPU.

A trace whose layers carry their operators (`layers[i].ops`: `simfog collect model` records them, `simfog collect
ops` adds them to an older trace) is estimated by the per-layer model learned from public measurements
(simfog.gpu: each operator's kernels, forward and backward, costed from the GPU's specifications by tiles and waves
over its SMs, memory traffic and its power limit, corrected by what the libraries did with the same shapes on other
GPUs, and the host's dispatch of every launch; bench/retarget.py says how far it is from GPUs it never saw). A trace
without operators falls back to a roofline of each layer's FLOPs and bytes, and says so:
max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency)) plus a floor per layer and pass, backward twice
the forward.

Precision: by default ("torch") each layer gets what PyTorch runs an fp32 model's kernels in on the target when
nobody changes its settings (torch 2.13, as since 1.12): convolutions in TF32 on devices with TF32 tensor cores
(torch.backends.cudnn.allow_tf32 defaults to True), matrix multiplies in full fp32
(torch.backends.cuda.matmul.allow_tf32 defaults to False); "fp16" / "bf16" a model in 16 bits.

Everything about the result is an ESTIMATE and the trace says so (provenance.estimated = true), so every simulation
that uses it reports "estimated": true.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

from simfog.errors import ConfigError
from simfog.gpu.layers import PRECISIONS, TORCH_DEFAULT
from simfog.gpu.specs import DEVICES
from simfog.trace import ModelTrace, Provenance

DEFAULT_EFFICIENCY = 0.5   # the roofline's fraction of peak (traces without operators): an assumption, stated
DEFAULT_LAUNCH_S = 40e-6   # the roofline's floor per layer and pass (traces without operators)
OPTIMIZER_ACCESSES = 5     # the roofline's SGD momentum: read param, grad, momentum; write param, momentum


def layer_time_s(flops: float, nbytes: float, device, precision: str, efficiency: float, launch_s: float) -> float:
    """Roofline time of one pass of one layer (seconds)."""
    compute = flops / (device.peak_flops[precision] * efficiency)
    memory = nbytes / (device.memory_Bps * efficiency)
    return max(compute, memory) + launch_s


def is_convolution(name: str) -> bool:
    """Whether a layer known only by its module path is a convolution (the roofline's guess, for traces without
    operators): a part starting with "conv" or "downsample", or anything in torchvision's trunk "features"."""
    parts = name.split(".")
    return parts[0] == "features" or any(p.startswith(("conv", "downsample")) for p in parts)


def torch_default_precision(layer_name: str, device) -> str:
    """The roofline's precision of this fp32 layer on `device` by PyTorch's defaults (TF32 convolutions where the
    device has TF32 tensor cores, fp32 else)."""
    return "tf32" if device.has_tensor_cores("tf32") and is_convolution(layer_name) else "fp32"


def has_ops(trace: ModelTrace) -> bool:
    """Whether the trace's layers carry their operators (what the per-layer model needs)."""
    return any(layer.ops for layer in trace.layers)


def precision_note(trace: ModelTrace, device: str, precision: str) -> str:
    """How the layers' precisions were chosen, for people: "fp16", or for the default which kinds ran in what."""
    if precision != TORCH_DEFAULT:
        return precision
    dev = DEVICES.get(device, field="device")
    tf32 = dev.has_tensor_cores("tf32")
    if has_ops(trace):
        kinds = {op["kind"] for layer in trace.layers for op in layer.ops}
        if "conv" in kinds and tf32:
            return ("torch default: convolutions in tf32 (torch.backends.cudnn.allow_tf32 = True), matrix products "
                    "and attention in fp32 (torch.backends.cuda.matmul.allow_tf32 = False)")
        return "torch default: fp32" + ("" if tf32 else " (no TF32 on this device)")
    chosen = [torch_default_precision(layer.name, dev) for layer in trace.layers if layer.flops]
    n = chosen.count("tf32")
    if not n:
        return f"torch default: fp32 ({'no TF32 on this device' if not tf32 else 'no convolutions'})"
    return (f"torch default: {n} convolution layer(s) in tf32 (torch.backends.cudnn.allow_tf32 = True), "
            f"{len(chosen) - n} other layer(s) with FLOPs in fp32 (torch.backends.cuda.matmul.allow_tf32 = False)")


def retarget(trace: ModelTrace, device: str, *, precision: str = TORCH_DEFAULT,
             efficiency: float = DEFAULT_EFFICIENCY, launch_s: float = DEFAULT_LAUNCH_S, model=None,
             host: dict | None = None, explain: list | None = None) -> ModelTrace:
    """An estimated trace of the same model and batch on `device` (a name or alias of `simfog list devices`), one
    sample per layer (no invented noise). `precision`: one of PRECISIONS for every layer, or "torch" (module
    docstring). With operators, the per-layer model (`model`: a simfog.gpu.model.GpuModel, default the shipped one;
    `host`: host figures to use instead of its own, simfog.gpu.host.HOST_KEYS); `explain`, when given, receives one
    dict per launch (layer, phase, what, kernel_s, added_s, bound, figures). Without, the roofline
    (`efficiency`, `launch_s`). Raises ConfigError for an unknown device or precision, a bad efficiency, launch or
    host figure, or a trace with neither operators nor FLOPs and bytes."""
    dev = DEVICES.get(device, field="device")
    if precision not in PRECISIONS + (TORCH_DEFAULT,):
        raise ConfigError("precision", precision, f"one of {', '.join(PRECISIONS + (TORCH_DEFAULT,))}")
    if not 0 < efficiency <= 1:
        raise ConfigError("efficiency", efficiency, "a fraction of peak in (0, 1]")
    if not 0 <= launch_s < 1:
        raise ConfigError("launch", launch_s, "seconds >= 0 (and under 1 s) per layer and pass")
    for key, value in (host or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value)
                                                                                 and 0 <= value < 1):
            raise ConfigError(key, value, "seconds >= 0 (and under 1 s) per launch")
    if has_ops(trace):
        layers, optimizer, how = _learned(trace, dev, precision, model, host, explain)
    else:
        layers, optimizer, how = _roofline(trace, dev, precision, efficiency, launch_s)
    dropped = (f". The original's host time (host_s, mean {sum(trace.host_s) / len(trace.host_s) * 1e3:.3g} ms per "
               "step) is dropped: it belongs to the measured host" if trace.host_s else "")
    notes = (f"ESTIMATED from {trace.model} ({trace.provenance.source} on {trace.device.get('name', '?')}) {how}; "
             f"{precision_note(trace, dev.name, precision)}; {dev.source}. Original provenance: "
             f"{trace.provenance.command}{dropped}")
    command = f"simfog retarget {trace.model} --device {dev.name} --precision {precision}" + (
        "" if has_ops(trace) else f" --efficiency {efficiency:g} --launch {launch_s * 1e6:g}us")
    return replace(
        trace, device={"kind": "gpu", "name": dev.name, "estimated": True, "precision": precision},
        provenance=Provenance(command=command, date=datetime.now(UTC).replace(microsecond=0).isoformat(),
                              host=trace.provenance.host, source="estimated", estimated=True, notes=notes),
        layers=tuple(layers), optimizer_s=(optimizer,), host_s=(),
        extra={"retargeted_from": {"device": dict(trace.device), "date": trace.provenance.date},
               "retarget_method": "per-layer model" if has_ops(trace) else "roofline"})


def _learned(trace: ModelTrace, dev, precision: str, model, host, explain):
    from simfog.gpu import model as M

    gm = model if model is not None else M.load()
    est = M.estimate(gm, [layer.ops for layer in trace.layers],
                     [[t.elements for t in layer.params] for layer in trace.layers], precision, dev, host=host,
                     optimizer_bytes=2 if precision in ("fp16", "bf16") else 4)
    if explain is not None:
        explain.extend(dict(r, layer_name=trace.layers[r["layer"]].name if r["layer"] >= 0 else "optimizer")
                       for r in est.launches)
    layers = [replace(layer, forward_s=(float(f),), backward_s=(float(b),))
              for layer, f, b in zip(trace.layers, est.forward_s, est.backward_s, strict=True)]
    figures = {**gm.host, **(host or {})}
    held = gm.provenance.get("held_out", {}) if isinstance(gm.provenance, dict) else {}
    how = (f"by simfog's per-layer model (simfog.gpu: kernels by tiles, waves and memory traffic, shape corrections "
           f"from public measurements of other GPUs, host dispatch {figures['host.forward_op_s'] * 1e6:.1f} us per "
           f"forward and {figures['host.backward_op_s'] * 1e6:.1f} us per backward operator"
           + (f"; held out on GPUs it never saw: kernels {held['op_median']:.0%} median, whole steps "
              f"{held['public_step_median']:.0%} median" if "op_median" in held else "") + ")")
    return layers, est.optimizer_s, how


def _roofline(trace: ModelTrace, dev, precision: str, efficiency: float, launch_s: float):
    missing = [layer.name for layer in trace.layers if layer.flops is None or layer.bytes_accessed is None]
    if missing:
        raise ConfigError("layers", missing[0], "layers with ops (simfog collect ops) or with flops and "
                          "bytes_accessed (collect the trace with `simfog collect model`, which records both)")
    layers = []
    for layer in trace.layers:
        p = torch_default_precision(layer.name, dev) if precision == TORCH_DEFAULT else precision
        fwd = layer_time_s(layer.flops, layer.bytes_accessed, dev, p, efficiency, launch_s)
        bwd = layer_time_s(2 * layer.flops, 2 * layer.bytes_accessed, dev, p, efficiency, launch_s)
        layers.append(replace(layer, forward_s=(fwd,), backward_s=(bwd,)))
    optimizer = OPTIMIZER_ACCESSES * trace.nbytes / (dev.memory_Bps * efficiency)
    how = (f"by a roofline (the trace's layers carry no operators: `simfog collect ops` adds them, and the per-layer "
           f"model then applies) at {efficiency:.0%} of peak, {launch_s * 1e6:g} us per layer and pass, backward = 2x "
           "forward FLOPs and bytes")
    return layers, optimizer, how


def pin_step(trace: ModelTrace, step_s: float, source: str) -> ModelTrace:
    """`trace` with every layer's forward and backward and its optimizer times scaled by one factor, so that one
    step (their means, summed) takes `step_s`: the step a user measured (one GPU's throughput: batch / samples per
    second), its split over layers the trace's (typically an estimate). The trace stays estimated; its notes say
    what it was pinned to (`source`), and `extra["pinned_step_s"]` marks it, so that its interval's compute part
    is the error of such pinned estimates (simfog.run_bands), not that of an estimate's total. Raises ConfigError for
    a step that is not a positive time, or a trace without compute."""
    if isinstance(step_s, bool) or not isinstance(step_s, int | float) or not (math.isfinite(step_s) and step_s > 0):
        raise ConfigError("step", step_s, "a measured step time in seconds > 0")

    def mean(x) -> float:
        return sum(x) / len(x) if len(x) else 0.0

    now = sum(mean(layer.forward_s) + mean(layer.backward_s) for layer in trace.layers) \
        + mean(trace.optimizer_s) + mean(trace.host_s)
    if not now > 0:
        raise ConfigError("trace", trace.model, "a trace with compute times > 0 to pin")
    factor = step_s / now

    def times(x):
        return tuple(v * factor for v in x)

    layers = tuple(replace(layer, forward_s=times(layer.forward_s), backward_s=times(layer.backward_s))
                   for layer in trace.layers)
    notes = (f"{trace.provenance.notes} PINNED to a measured step of {step_s * 1e3:.4g} ms ({source}): every layer "
             f"and the optimizer x {factor:.4g}; the split over layers stays as estimated.")
    return replace(trace, layers=layers, optimizer_s=times(trace.optimizer_s), host_s=times(trace.host_s),
                   provenance=replace(trace.provenance, estimated=True, source="estimated", notes=notes.strip()),
                   extra={**dict(trace.extra), "pinned_step_s": float(step_s), "pinned_to": source})
