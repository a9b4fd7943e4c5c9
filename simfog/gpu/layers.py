"""A layer's operators (simfog.gpu.ops) as the kernels a GPU runs for them, forward and backward, in a precision.

Forward: a convolution is one implicit GEMM (m = n·p·q output pixels, n = k filters, k = c·r·s per group; a 3x3
stride-1 one may run as Winograd), a matrix product one GEMM (plus its bias in the epilogue), attention one fused
kernel (two products, q·k^T and p·v, the causal half skipped; it reads q, k, v and writes the output), everything
else one stream of the bytes it reads and writes. Backward, as autograd runs it:

- convolution: the input gradient (an implicit GEMM of n·h·w x c x k·r·s, when the input needs one) and the weight
  gradient (k x c·r·s x n·p·q), plus the bias's reduction;
- matrix product: the input gradient (m x k x n, when needed), the weight gradient (n x k x m) and the bias's
  reduction over m rows;
- attention: five products of the forward's size (q·k^T recomputed, dv, dp, dq, dk), as flash-style backward runs;
- normalisation: one kernel reading the input and the gradient and writing the input gradient (and the parameter
  gradients' reduction); softmax and losses: one kernel of three streams; pooling: a zeroed input gradient and a
  scatter; embedding: a zeroed table gradient and an index-add of the gradient rows;
- element-wise: one kernel of three streams (gradient, saved input, input gradient) per input that needs a gradient,
  none for an addition (autograd passes the gradient on), none for calls on no gradient (fills, index arithmetic);
- concatenation: each input's slice of the gradient added to that input's gradient (one add per input).

The optimizer step (SGD with momentum, PyTorch's foreach kernels): three passes over the parameters (momentum x
0.9, + gradient, parameter - lr x momentum): 8 accesses of each parameter element, launched per chunk of
FOREACH_CHUNK tensors.

Precision (`precision`): "torch" is what PyTorch runs an fp32 model in by default (convolutions in TF32 where the
GPU has TF32 tensor cores, matrix products and attention in FP32); "fp32", "tf32" every product in that; "fp16" and
"bf16" the whole model in 16 bits (products on tensor cores where the GPU has them, every stream at 2 bytes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simfog.gpu import kernels as K
from simfog.gpu.ops import itemsize

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
TORCH_DEFAULT = "torch"
FOREACH_CHUNK = 110  # tensors per launch of a foreach kernel (torch's multi_tensor_apply depth-3 list size)
OPTIMIZER_ACCESSES = 8
NO_BACKWARD = {"arange", "zeros", "ones", "full", "empty", "fill_", "zero_", "zeros_like", "ones_like", "full_like",
               "add_"}  # add_: BatchNorm's num_batches_tracked += 1
PASS_THROUGH = {"add", "__add__", "__radd__", "__iadd__", "sub", "__sub__", "__rsub__", "sub_"}


@dataclass(frozen=True)
class Launch:
    """One kernel of one operator of one layer in one pass: its shape in the terms of simfog.gpu.kernels."""

    layer: int
    phase: str          # "forward", "backward" or "optimizer"
    op: int             # index of the operator in the layer (-1: the optimizer step)
    what: str           # e.g. "conv2d fwd", "linear dgrad"
    tiled: bool
    shape: tuple        # tiled: (b, m, n, k, math, in_size, out_size, conv pass, winograd, fused bytes)
    nbytes: float = 0.0  # stream
    stream: str = ""


def op_precision(kind: str, precision: str, gpu) -> str:
    """The precision a product of `kind` (conv, matmul, attention) runs in under `precision` (module docstring)."""
    if precision == TORCH_DEFAULT:
        return "tf32" if kind == "conv" and gpu.has_tensor_cores("tf32") else "fp32"
    return precision


def element_bytes(op: Mapping, precision: str) -> int:
    """Bytes per element of an operator's streams: 2 in a 16-bit model for floating-point data, else its dtype's."""
    size = itemsize(op)
    return 2 if precision in ("fp16", "bf16") and op.get("dtype", "float32").startswith("float") else size


def _gemm(layer, phase, i, what, b, m, n, k, math, size, conv="none", wino=False, fused=0.0) -> Launch:
    return Launch(layer, phase, i, what, True, (b, m, n, k, math, size, size, conv, wino, fused))


def _stream(layer, phase, i, what, nbytes, kind) -> Launch:
    return Launch(layer, phase, i, what, False, (), float(nbytes), kind)


def op_launches(op: Mapping, layer: int, i: int, precision: str, gpu) -> list[Launch]:
    """The forward and backward kernels of one operator (module docstring)."""
    kind, name = op["kind"], op["op"]
    size = element_bytes(op, precision)
    grad = bool(op.get("grad", True))
    f, bw = "forward", "backward"
    out: list[Launch] = []
    if kind in ("conv", "matmul", "attention"):
        math = K.math_of(gpu, op_precision(kind, precision, gpu))
    if kind == "conv":
        g = op["groups"]
        n, c, h, w, k, r, s, p, q = (op[x] for x in ("n", "c", "h", "w", "k", "r", "s", "p", "q"))
        wino = r == 3 and s == 3 and op["stride"] == [1, 1] and op["dilation"] == [1, 1] and g == 1
        out.append(_gemm(layer, f, i, f"{name} fwd", g, n * p * q, k // g, c // g * r * s, math, size, "fwd", wino))
        if grad:
            out.append(_gemm(layer, bw, i, f"{name} dgrad", g, n * h * w, c // g, k // g * r * s, math, size, "dgrad",
                             wino))
        out.append(_gemm(layer, bw, i, f"{name} wgrad", g, k // g, c // g * r * s, n * p * q, math, size, "wgrad"))
        if op.get("bias"):
            out.append(_stream(layer, bw, i, f"{name} bias grad", size * n * k * p * q, "reduce"))
    elif kind == "matmul":
        b, m, n, k = op["b"], op["m"], op["n"], op["k"]
        out.append(_gemm(layer, f, i, f"{name}", b, m, n, k, math, size))
        if grad:
            out.append(_gemm(layer, bw, i, f"{name} dgrad", b, m, k, n, math, size))
        out.append(_gemm(layer, bw, i, f"{name} wgrad", b, n, k, m, math, size))
        if op.get("bias"):
            out.append(_stream(layer, bw, i, f"{name} bias grad", size * b * m * n, "reduce"))
    elif kind == "attention":
        b, tq, tk, d, dv = op["b"], op["tq"], op["tk"], op["d"], op["dv"]
        keep = 0.5 if op.get("causal") else 1.0  # flash-style kernels skip the masked half
        io = size * b * (tq * d + tk * d + tk * dv + tq * dv)
        out.append(_gemm(layer, f, i, "attention fwd", b, tq, tk * keep, d + dv, math, size, fused=io))
        out.append(_gemm(layer, bw, i, "attention bwd", b, tq, tk * keep, 2.5 * (d + dv), math, size, fused=2 * io))
    elif kind == "norm":
        e = op["elements"]
        out.append(_stream(layer, f, i, f"{op['type']} norm fwd", 3 * size * e, "norm"))
        out.append(_stream(layer, bw, i, f"{op['type']} norm bwd", 4 * size * e, "norm"))
    elif kind in ("softmax", "loss"):
        e = op["elements"]
        out.append(_stream(layer, f, i, f"{name} fwd", (2 if kind == "softmax" else 3) * size * e, "softmax"))
        out.append(_stream(layer, bw, i, f"{name} bwd", 3 * size * e, "softmax"))
    elif kind == "pool":
        ein, eout = op["elements_in"], op["elements_out"]
        out.append(_stream(layer, f, i, f"{op['type']} pool fwd", size * (ein + eout), "pool"))
        if grad:
            out.append(_stream(layer, bw, i, f"{op['type']} pool bwd", size * (2 * ein + eout), "pool"))
    elif kind == "embedding":
        rows, dim, vocab = op["indices"], op["dim"], op["vocab"]
        out.append(_stream(layer, f, i, "embedding fwd", 2 * size * rows * dim, "embedding"))
        if grad:
            out.append(_stream(layer, bw, i, "embedding bwd", size * (vocab * dim + 2 * rows * dim), "embedding"))
    elif kind == "copy":
        e, inputs = op["elements"], op.get("inputs", 1)
        out.append(_stream(layer, f, i, f"{name} fwd", 2 * size * e, "copy"))
        if grad:
            out += [_stream(layer, bw, i, f"{name} bwd", 3 * size * e / max(1, inputs), "elementwise")
                    for _ in range(max(1, inputs))]
    else:  # elementwise, other
        e = op["elements"]
        inputs = op.get("inputs", 1)
        out.append(_stream(layer, f, i, f"{name} fwd", size * e * (inputs + 1), "elementwise"))
        if grad and name not in NO_BACKWARD and name not in PASS_THROUGH:
            out += [_stream(layer, bw, i, f"{name} bwd", 3 * size * e, "elementwise") for _ in range(inputs)]
    return out


def optimizer_launches(layer_params: Sequence[int], element_size: int) -> list[Launch]:
    """The optimizer step over parameter tensors of `layer_params` elements each (module docstring)."""
    total = sum(layer_params)
    chunks = -(-len(layer_params) // FOREACH_CHUNK)
    per = OPTIMIZER_ACCESSES * element_size * total / (3 * chunks) if chunks else 0.0
    return [_stream(-1, "optimizer", -1, "SGD momentum (foreach)", per, "optimizer") for _ in range(3 * chunks)]


def to_kernels(launches: Sequence[Launch], gpu) -> K.Kernels:
    """The launches as kernel rows on `gpu` (tiled rows first, then streams: `order` maps back)."""
    tiled = [x for x in launches if x.tiled]
    streamed = [x for x in launches if not x.tiled]
    parts = []
    if tiled:
        cols = list(zip(*(x.shape for x in tiled), strict=True))
        b, m, n, k, math, isz, osz, conv, wino, fused = cols
        parts.append(K.tiled(K.device_rows([gpu] * len(tiled), list(math)), np.array(b, float), np.array(m, float),
                             np.array(n, float), np.array(k, float), list(math), np.array(isz, float),
                             np.array(osz, float), conv=list(conv), winograd=list(wino),
                             fused_bytes=np.array(fused, float)))
    if streamed:
        parts.append(K.streams(K.device_rows([gpu] * len(streamed)), np.array([x.nbytes for x in streamed]),
                               [x.stream for x in streamed]))
    return K.concat(parts)


def order(launches: Sequence[Launch]) -> np.ndarray:
    """For each launch (in the given order), its row in `to_kernels(launches)`."""
    tiled = [i for i, x in enumerate(launches) if x.tiled]
    streamed = [i for i, x in enumerate(launches) if not x.tiled]
    where = np.empty(len(launches), int)
    where[tiled] = np.arange(len(tiled))
    where[streamed] = len(tiled) + np.arange(len(streamed))
    return where
