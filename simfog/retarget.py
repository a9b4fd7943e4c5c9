"""Retargeting: estimate a trace for another device from each layer's FLOPs and bytes (a roofline).

A layer's forward time on the target is max(FLOPs / (peak · efficiency), bytes / (memory bandwidth · efficiency))
plus a kernel-launch floor; backward costs twice the forward FLOPs and bytes (gradients of inputs and weights).
The optimizer step (SGD with momentum) reads and writes parameters, gradients and momentum: ~5 accesses of each
parameter byte.

Precision: by default ("torch") each layer gets what PyTorch runs an fp32 model's kernels in on the target when
nobody changes its settings (torch 2.13, as since 1.12): convolutions in TF32 on devices with TF32 tensor cores
(torch.backends.cudnn.allow_tf32 defaults to True; cudnn.conv.fp32_precision "tf32"), matrix multiplies in full
fp32 (torch.backends.cuda.matmul.allow_tf32 defaults to False; float32_matmul_precision "highest"). Assuming fp32
everywhere made a ResNet-50 on an A100 2.7x slower than a real trace whose kernels were TF32.

Everything about the result is an ESTIMATE and the trace says so (provenance.estimated = true),
so every simulation that uses it reports "estimated": true.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from simfog.errors import ConfigError
from simfog.registry import Registry
from simfog.trace import ModelTrace, Provenance


@dataclass(frozen=True)
class Device:
    """Peak arithmetic (FLOP/s) per precision and memory bandwidth (B/s), with where the numbers come from."""

    name: str
    peak_flops: dict
    memory_Bps: float
    source: str


DEVICES: Registry[Device] = Registry("device")
for _d in (
    Device("v100", {"fp32": 15.7e12, "tf32": 15.7e12, "fp16": 125e12, "bf16": 15.7e12}, 900e9,
           "NVIDIA Tesla V100 SXM2 datasheet: 15.7 TFLOP/s FP32, 125 TFLOP/s FP16 tensor, 900 GB/s HBM2"),
    Device("a100", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12}, 1555e9,
           "NVIDIA A100 40GB SXM datasheet: 19.5 TFLOP/s FP32, 156 TF32 tensor, 312 FP16/BF16 tensor "
           "(dense), 1,555 GB/s HBM2"),
    Device("h100", {"fp32": 67e12, "tf32": 494.5e12, "fp16": 989.5e12, "bf16": 989.5e12}, 3.35e12,
           "NVIDIA H100 SXM5 datasheet: 67 TFLOP/s FP32, 494.5 TF32 tensor, 989.5 FP16/BF16 tensor "
           "(dense, half the sparse figures), 3.35 TB/s HBM3"),
    Device("h200", {"fp32": 67e12, "tf32": 494.5e12, "fp16": 989.5e12, "bf16": 989.5e12}, 4.8e12,
           "NVIDIA H200 SXM datasheet: the H100 SXM's tensor and FP32 peaks (67 FP32, 494.5 TF32, 989.5 FP16/BF16 "
           "dense), 4.8 TB/s HBM3e"),
):
    DEVICES.register(_d.name)(_d)

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
TORCH_DEFAULT = "torch"  # per layer kind, as PyTorch does by default (see the module docstring)
DEFAULT_EFFICIENCY = 0.5   # fraction of peak reached by real kernels: an assumption, stated in every output
DEFAULT_LAUNCH_S = 40e-6   # per layer and pass: launches and dispatch, learned across models (bench/compute_estimates)
OPTIMIZER_ACCESSES = 5     # SGD momentum: read param, grad, momentum; write param, momentum


def layer_time_s(flops: float, nbytes: float, device: Device, precision: str, efficiency: float,
                 launch_s: float) -> float:
    """Roofline time of one pass of one layer (seconds)."""
    compute = flops / (device.peak_flops[precision] * efficiency)
    memory = nbytes / (device.memory_Bps * efficiency)
    return max(compute, memory) + launch_s


def is_convolution(name: str) -> bool:
    """Whether a layer known by its module path is a convolution (traces record paths, not module types): a part
    starting with "conv" (conv1, features.conv0, branch1.conv) or "downsample" (ResNet's 1x1 shortcut), or
    anything in torchvision's convolutional trunk "features" (VGG, AlexNet, DenseNet, MobileNet). Only layers with
    FLOPs are affected; the rest are memory-bound whatever the precision."""
    parts = name.split(".")
    return parts[0] == "features" or any(p.startswith(("conv", "downsample")) for p in parts)


def torch_default_precision(layer_name: str, device: Device) -> str:
    """The precision PyTorch runs this fp32 layer in on `device` by default: TF32 for convolutions where the
    device has TF32 tensor cores (cuDNN's allow_tf32 is on by default), fp32 for everything else (matmul's is
    off)."""
    has_tf32 = device.peak_flops["tf32"] > device.peak_flops["fp32"]
    return "tf32" if has_tf32 and is_convolution(layer_name) else "fp32"


def precision_note(trace: ModelTrace, device: str, precision: str) -> str:
    """How the layers' precisions were chosen, for people: "fp16", or for the default e.g. "torch default:
    53 convolution layers in tf32 (cudnn.allow_tf32), matmul and the rest in fp32 (cuda.matmul.allow_tf32 off)"."""
    if precision != TORCH_DEFAULT:
        return precision
    dev = DEVICES.get(device, field="device")
    chosen = [torch_default_precision(layer.name, dev) for layer in trace.layers if layer.flops]
    tf32 = chosen.count("tf32")
    if not tf32:
        why = "no TF32 on this device" if dev.peak_flops["tf32"] <= dev.peak_flops["fp32"] else "no convolutions"
        return f"torch default: fp32 ({why})"
    return (f"torch default: {tf32} convolution layer(s) in tf32 (torch.backends.cudnn.allow_tf32 = True), "
            f"{len(chosen) - tf32} other layer(s) with FLOPs in fp32 (torch.backends.cuda.matmul.allow_tf32 = False)")


def retarget(trace: ModelTrace, device: str, *, precision: str = TORCH_DEFAULT,
             efficiency: float = DEFAULT_EFFICIENCY, launch_s: float = DEFAULT_LAUNCH_S) -> ModelTrace:
    """An estimated trace of the same model and batch on `device`, one sample per layer (no invented noise).
    `precision`: one of PRECISIONS for every layer, or "torch" (default) for what PyTorch runs each layer in by
    default (see the module docstring). Raises ConfigError for an unknown device or precision, a bad efficiency,
    or a trace without FLOPs/bytes."""
    dev = DEVICES.get(device, field="device")
    if precision not in PRECISIONS + (TORCH_DEFAULT,):
        raise ConfigError("precision", precision, f"one of {', '.join(PRECISIONS + (TORCH_DEFAULT,))}")
    if not 0 < efficiency <= 1:
        raise ConfigError("efficiency", efficiency, "a fraction of peak in (0, 1]")
    if not 0 <= launch_s < 1:
        raise ConfigError("launch", launch_s, "seconds >= 0 (and under 1 s) per layer and pass")
    missing = [layer.name for layer in trace.layers if layer.flops is None or layer.bytes_accessed is None]
    if missing:
        raise ConfigError("layers", missing[0], "layers with flops and bytes_accessed (collect the trace with "
                          "`simfog collect model`, which counts them)")
    layers = []
    for layer in trace.layers:
        p = torch_default_precision(layer.name, dev) if precision == TORCH_DEFAULT else precision
        fwd = layer_time_s(layer.flops, layer.bytes_accessed, dev, p, efficiency, launch_s)
        bwd = layer_time_s(2 * layer.flops, 2 * layer.bytes_accessed, dev, p, efficiency, launch_s)
        layers.append(replace(layer, forward_s=(fwd,), backward_s=(bwd,)))
    optimizer = OPTIMIZER_ACCESSES * trace.nbytes / (dev.memory_Bps * efficiency)
    notes = (f"ESTIMATED from {trace.model} ({trace.provenance.source} on {trace.device.get('name', '?')}) by a "
             f"roofline: {precision_note(trace, dev.name, precision)}; peak and memory bandwidth of {dev.name} "
             f"({dev.source}) at {efficiency:.0%} "
             f"efficiency, {launch_s * 1e6:g} us launch floor per layer and pass, backward = 2x forward FLOPs "
             f"and bytes. Original provenance: {trace.provenance.command}"
             + (f". The original's host time (host_s, mean {sum(trace.host_s) / len(trace.host_s) * 1e3:.3g} ms per "
                "step) is dropped: it belongs to the measured host, not to the device" if trace.host_s else ""))
    return replace(
        trace, device={"kind": "gpu", "name": dev.name, "estimated": True, "precision": precision},
        provenance=Provenance(command=f"simfog retarget {trace.model} --device {dev.name} --precision {precision} "
                              f"--efficiency {efficiency:g} --launch {launch_s * 1e6:g}us",
                              date=datetime.now(UTC).replace(microsecond=0).isoformat(),
                              host=trace.provenance.host, source="estimated", estimated=True, notes=notes),
        layers=tuple(layers), optimizer_s=(optimizer,), host_s=(),
        extra={"retargeted_from": {"device": dict(trace.device), "date": trace.provenance.date}})


def pin_step(trace: ModelTrace, step_s: float, source: str) -> ModelTrace:
    """`trace` with every layer's forward and backward and its optimizer times scaled by one factor, so that one
    step (their means, summed) takes `step_s`: the step a user measured (one GPU's throughput: batch / samples per
    second), its split over layers the trace's (typically a roofline estimate). The trace stays estimated; its notes
    say what it was pinned to (`source`), and `extra["pinned_step_s"]` marks it, so that its interval's compute part
    is the error of such pinned estimates (simfog.run_bands), not that of a roofline's total. Raises
    ConfigError for a step that is not a positive time, or a trace without compute."""
    import math

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
