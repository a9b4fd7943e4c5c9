"""Each layer's operators with their shapes, as a GPU would run them: what simfog.gpu's per-layer model of compute
on another device needs (the kind of each operator, its shapes, whether its input needs a gradient).

One forward pass (and the loss) of the model on "meta" tensors (shapes only, no arithmetic) under a
`TorchFunctionMode`, which sees every torch function and tensor method at the level a program calls them:
`F.conv2d`, `F.linear`, `F.scaled_dot_product_attention`, `F.batch_norm`, `torch.cat`, `x + y`. That is the level at
which PyTorch on a GPU picks its libraries (cuDNN for a convolution, cuBLAS for a linear layer, a fused kernel for
attention), so each call becomes one entry. Calls made inside another call (the log-softmax inside
`F.cross_entropy`) are not seen separately: the mode is off while its handler runs.

Calls are charged to layers as `simfog collect model` charges time (validate/collect/collect_model.py, `_charge`):
what runs between two leaf modules' forward hooks belongs to the later one (a residual add to the next block's first
layer, attention to the projection after it), and what runs after the last hook (the loss) to the last layer. The
entries' format is simfog.gpu.ops's (its docstring lists the kinds and their fields).

This module is torch-only and imports torch at module level; `simfog` never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from simfog.gpu.ops import OPS_FORMAT

# torch functions and tensor methods that launch no kernel (views, metadata); attribute reads (`x.shape`) are
# "__get__" and are dropped with them.
VIEWS = {"view", "view_as", "reshape", "flatten", "unflatten", "transpose", "permute", "t", "unsqueeze", "squeeze",
         "expand", "expand_as", "split", "chunk", "narrow", "select", "__getitem__", "size", "dim", "numel",
         "contiguous", "detach", "requires_grad_", "is_contiguous", "stride", "type_as", "to", "float",
         "unbind", "movedim", "as_strided", "__get__", "__len__", "__iter__", "__bool__", "__index__",
         "is_floating_point", "element_size", "data_ptr", "storage_offset"}
ELEMENTWISE = {"relu", "relu_", "gelu", "tanh", "sigmoid", "silu", "hardtanh", "leaky_relu", "elu", "selu",
               "softplus", "hardswish", "hardsigmoid", "mish", "dropout", "add", "add_", "__add__", "__radd__",
               "__iadd__", "sub", "sub_", "__sub__", "__rsub__", "mul", "mul_", "__mul__", "__rmul__", "__imul__",
               "div", "div_", "__truediv__", "__rtruediv__", "pow", "__pow__", "sqrt", "rsqrt", "exp", "log", "neg",
               "__neg__", "abs", "clamp", "clamp_", "where", "masked_fill", "masked_fill_", "zeros_like",
               "ones_like", "full_like", "arange", "zeros", "ones", "full", "empty", "fill_", "zero_", "copy_"}
NORMS = {"batch_norm": "batch", "layer_norm": "layer", "group_norm": "group", "instance_norm": "instance",
         "rms_norm": "rms"}
POOLS = {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
         "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool2d", "max_pool2d_with_indices"}
LOSSES = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy_with_logits", "smooth_l1_loss"}
SOFTMAX = {"softmax", "log_softmax", "_softmax"}
COPIES = {"cat", "stack", "clone", "concat", "concatenate"}
MATMULS = {"linear", "matmul", "__matmul__", "mm", "bmm", "addmm", "baddbmm", "einsum"}


def _tensors(args) -> list[torch.Tensor]:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += [x for x in a if isinstance(x, torch.Tensor)]
    return out


def _pair(v, n: int = 2) -> list[int]:
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] * n


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def describe(name: str, args: tuple, kwargs: dict, out) -> dict | None:
    """The entry of one call `name(*args, **kwargs)` that returned `out`, or None for one that launches no kernel
    on a GPU (views, metadata, calls on no tensor)."""
    if name in VIEWS or name.startswith("_") and name not in {"_softmax"} and not name.startswith("__"):
        return None
    inputs = _tensors(args) + _tensors(kwargs.values())
    outs = _tensors(out if isinstance(out, (list, tuple)) else [out])
    if not outs:
        return None
    y = outs[0]
    x = inputs[0] if inputs else y
    base = {"op": name, "dtype": _dtype(y), "grad": bool(x.requires_grad)}
    if name in {"conv1d", "conv2d", "conv3d"}:
        w = args[1] if len(args) > 1 else kwargs["weight"]
        get = (lambda i, key, default: args[i] if len(args) > i else kwargs.get(key, default))
        dims = x.dim() - 2
        stride, pad, dil = (_pair(get(i, k, d), dims) for i, k, d in ((3, "stride", 1), (4, "padding", 0),
                                                                      (5, "dilation", 1)))
        if isinstance(get(4, "padding", 0), str):  # "same" / "valid"
            pad = [(int(w.shape[2 + i]) - 1) // 2 for i in range(dims)] if get(4, "padding", 0) == "same" \
                else [0] * dims
        # 1-D and 3-D convolutions as 2-D ones of the same arithmetic: depth folded into the batch of output rows
        space_in, space_out, kern = list(x.shape[2:]), list(y.shape[2:]), list(w.shape[2:])
        while len(space_in) < 2:
            space_in, space_out, kern, stride, pad, dil = [1] + space_in, [1] + space_out, [1] + kern, \
                [1] + stride, [0] + pad, [1] + dil
        fold = math.prod(space_out[:-2]) * (math.prod(kern[:-2]) if len(kern) > 2 else 1)
        return {"kind": "conv", **base, "n": int(x.shape[0]) * fold, "c": int(x.shape[1]),
                "h": int(space_in[-2]), "w": int(space_in[-1]), "k": int(y.shape[1]), "r": int(kern[-2]),
                "s": int(kern[-1]), "p": int(space_out[-2]), "q": int(space_out[-1]), "stride": stride[-2:],
                "pad": pad[-2:], "dilation": dil[-2:], "groups": int(get(6, "groups", 1)),
                "bias": get(2, "bias", None) is not None}
    if name in MATMULS:
        if name == "linear":
            w = args[1] if len(args) > 1 else kwargs["weight"]
            bias = (args[2] if len(args) > 2 else kwargs.get("bias")) is not None
            k, n = int(w.shape[1]), int(w.shape[0])
            return {"kind": "matmul", **base, "b": 1, "m": y.numel() // n, "n": n, "k": k, "bias": bias}
        if name == "einsum" or len(inputs) < 2:
            return {"kind": "other", **base, "elements": y.numel()}
        a, bmat = (inputs[1], inputs[2]) if name in {"addmm", "baddbmm"} else (inputs[0], inputs[1])
        k = int(a.shape[-1])
        n = int(y.shape[-1]) if y.dim() else 1
        m = int(y.shape[-2]) if y.dim() >= 2 else 1
        batch = y.numel() // max(1, m * n)
        if bmat.dim() <= 2 and batch > 1:  # (B, M, K) x (K, N): one GEMM of B*M rows, as cuBLAS runs it
            m, batch = m * batch, 1
        return {"kind": "matmul", **base, "b": batch, "m": m, "n": n, "k": k,
                "bias": name in {"addmm", "baddbmm"}, "grad": any(t.requires_grad for t in inputs)}
    if name == "scaled_dot_product_attention":
        q, key, v = inputs[:3]
        get = (lambda i, k, d: args[i] if len(args) > i else kwargs.get(k, d))
        return {"kind": "attention", **base, "b": math.prod(q.shape[:-2]), "tq": int(q.shape[-2]),
                "tk": int(key.shape[-2]), "d": int(q.shape[-1]), "dv": int(v.shape[-1]),
                "causal": bool(get(5, "is_causal", False)), "dropout": float(get(4, "dropout_p", 0.0)) > 0,
                "grad": any(t.requires_grad for t in (q, key, v))}
    if name in NORMS:
        features = int(x.shape[1]) if name in {"batch_norm", "group_norm", "instance_norm"} \
            else math.prod(_pair(args[1] if len(args) > 1 else kwargs["normalized_shape"], 1))
        return {"kind": "norm", **base, "type": NORMS[name], "elements": x.numel(), "features": features}
    if name in SOFTMAX:
        return {"kind": "softmax", **base, "elements": x.numel(), "cols": int(x.shape[-1]) if x.dim() else 1}
    if name in LOSSES:
        return {"kind": "loss", **base, "elements": x.numel(), "cols": int(x.shape[-1]) if x.dim() > 1 else 1}
    if name in POOLS:
        window = y.numel() and x.numel() // y.numel()
        if name.startswith(("max_pool", "avg_pool")):
            window = math.prod(_pair(args[1] if len(args) > 1 else kwargs["kernel_size"], x.dim() - 2))
        return {"kind": "pool", **base, "type": "max" if "max" in name else "avg", "elements_in": x.numel(),
                "elements_out": y.numel(), "window": int(window)}
    if name == "embedding":
        idx, weight = inputs[0], inputs[1]
        return {"kind": "embedding", **base, "indices": idx.numel(), "dim": int(weight.shape[1]),
                "vocab": int(weight.shape[0]), "grad": weight.requires_grad}
    if name in COPIES:
        return {"kind": "copy", **base, "elements": y.numel(), "inputs": max(1, len(inputs)),
                "grad": any(t.requires_grad for t in inputs)}
    if name in ELEMENTWISE:
        same = sum(1 for t in inputs if t.numel() == y.numel())
        return {"kind": "elementwise", **base, "elements": y.numel(), "inputs": max(1, same),
                "grad": any(t.requires_grad for t in inputs)}
    return {"kind": "other", **base, "elements": y.numel()}


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.pending: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "") or str(func)
        entry = describe(name, args, kwargs, out)
        if entry is not None:
            self.pending.append(entry)
        return out


def record(model: torch.nn.Module, inputs: tuple, loss: Callable | None = None,
           targets=None) -> tuple[list[str], dict[str, list[dict]]]:
    """(leaf modules in call order, {leaf name: its entries}) for one forward pass of `model` on `inputs` (and
    `loss(output, targets)` when given, charged to the last layer), charged as the module docstring says. `model`
    and `inputs` should be on the "meta" device (shapes only)."""
    leaves = {n: m for n, m in model.named_modules() if n and not any(True for _ in m.children())}
    order: list[str] = []
    ops: dict[str, list[dict]] = {}
    recorder = _Recorder()

    def hook(name: str):
        def after(_module, _args, _out):
            ops.setdefault(name, []).extend(recorder.pending)
            recorder.pending = []
            if name not in order:
                order.append(name)
        return after

    handles = [m.register_forward_hook(hook(n)) for n, m in leaves.items()]
    try:
        with recorder:
            out = model(*inputs)
            if loss is not None:
                loss(out, targets)
    finally:
        for h in handles:
            h.remove()
    if order:
        ops[order[-1]].extend(recorder.pending)
    return order, ops


def zoo_ops(name: str, batch_size: int) -> tuple[list[str], dict[str, list[dict]]]:
    """`record` for zoo model `name` at `batch_size`, in training mode, its loss included, on "meta" tensors."""
    from validate.collect.models import get

    entry = get(name)
    with torch.device("meta"):
        model = entry.build()
    model.train()
    inputs, targets = entry.make_inputs(batch_size, torch.Generator().manual_seed(0))
    return record(model, tuple(x.to("meta") for x in inputs), entry.loss, targets.to("meta"))


def ops_how() -> str:
    """What a trace's extra["ops_how"] says about its layers' `ops`."""
    return (f"{OPS_FORMAT}: one forward pass and the loss on meta tensors under torch.overrides.TorchFunctionMode "
            f"(torch {torch.__version__}), each call a program makes (F.conv2d, F.linear, attention, x + y, "
            "torch.cat) one entry, views left out; calls between two leaf modules charged to the later one, the "
            "loss to the last (validate/collect/layer_ops.py)")


def add_ops(trace):
    """`trace` (of a zoo model) with every layer's `ops` recorded by `zoo_ops` at its batch size; times and
    everything else unchanged, the method in extra["ops_how"]. Raises ConfigError when the trace's layers are not
    the zoo model's."""
    from dataclasses import replace

    from simfog.errors import ConfigError

    order, ops = zoo_ops(trace.model, trace.batch_size)
    unknown = [layer.name for layer in trace.layers if layer.name not in ops]
    if unknown:
        raise ConfigError("layers", unknown[0], f"layer names of zoo model {trace.model} (the trace was not collected "
                          "from it)")
    return replace(trace, layers=tuple(replace(layer, ops=tuple(ops[layer.name])) for layer in trace.layers),
                   extra={**trace.extra, "ops_how": ops_how() + " (added to this trace by `simfog collect ops`; its "
                          "times are unchanged)"})
