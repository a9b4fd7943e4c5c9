"""A layer's operators with their shapes (a trace's `layers[i].ops`): the input of the per-layer model of compute on
another GPU (simfog.gpu.layers). `simfog collect model` records them, `simfog collect ops` adds them to an older
trace of a zoo model (validate/collect/layer_ops.py: one forward pass on meta tensors, each call a program makes one
entry, charged to layers as the collector charges time).

Every entry is an object with `kind` (below), `op` (the call, e.g. "conv2d", "linear", "relu"), `dtype` (of its
output, e.g. "float32") and `grad` (whether its input needs a gradient: false for a first convolution on images,
whose backward then computes no input gradient), and the fields of its kind, all counts:

- conv (n, c, h, w, k, r, s, p, q, stride, pad, dilation, groups, bias): n images of c x h x w, k filters of
  c/groups x r x s, output p x q (1-D and 3-D convolutions folded into 2-D ones of the same arithmetic);
- matmul (b, m, n, k, bias): b products of (m x k)(k x n): F.linear (b = 1, m = its rows), torch.matmul, bmm;
- attention (b, tq, tk, d, dv, causal, dropout): fused scaled-dot-product attention, b = batch x heads;
- norm (type, elements, features): batch, layer, group, instance or rms normalisation over `elements`;
- softmax (elements, cols): softmax or log-softmax over rows of `cols`;
- loss (elements, cols): a loss over its logits (cross entropy: a log-softmax and an NLL);
- pool (type, elements_in, elements_out, window): max or avg pooling;
- embedding (indices, dim, vocab): a lookup of `indices` rows of `dim` in a table of `vocab` rows;
- copy (elements): torch.cat, stack, clone: read and write `elements`;
- elementwise (elements, inputs): an element-wise call writing `elements` and reading `inputs` tensors that size;
- other (elements): any other call, counted as reading and writing its output once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simfog.errors import ConfigError

OPS_FORMAT = "simfog.layer-ops/1"
COMMON = ("op", "dtype", "grad")
KINDS: dict[str, tuple[str, ...]] = {
    "conv": ("n", "c", "h", "w", "k", "r", "s", "p", "q", "stride", "pad", "dilation", "groups"),
    "matmul": ("b", "m", "n", "k"),
    "attention": ("b", "tq", "tk", "d", "dv"),
    "norm": ("type", "elements", "features"),
    "softmax": ("elements", "cols"),
    "loss": ("elements", "cols"),
    "pool": ("type", "elements_in", "elements_out", "window"),
    "embedding": ("indices", "dim", "vocab"),
    "copy": ("elements",),
    "elementwise": ("elements", "inputs"),
    "other": ("elements",),
}
TEXT_FIELDS = {"op", "dtype", "type"}
PAIR_FIELDS = {"stride", "pad", "dilation"}
FLAG_FIELDS = {"grad", "bias", "causal", "dropout"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "bool": 1,
               "int8": 1, "uint8": 1}


def check(raw: object, where: str) -> tuple[dict, ...]:
    """The validated entries of one layer's `ops` list (field names as in the module docstring). Raises ConfigError
    naming the first bad field, e.g. `layers[3].ops[0].m`."""
    allowed = f"a list of operator entries ({OPS_FORMAT}: objects with kind, op, dtype, grad and the kind's fields)"
    if not isinstance(raw, list):
        raise ConfigError(where, type(raw).__name__, allowed)
    out = []
    for i, entry in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(w, type(entry).__name__, allowed)
        kind = entry.get("kind")
        if kind not in KINDS:
            raise ConfigError(f"{w}.kind", kind if kind is not None else "(missing)", f"one of {', '.join(KINDS)}")
        for key in COMMON + KINDS[kind]:
            if key not in entry:
                raise ConfigError(f"{w}.{key}", "(missing)", f"a field of every {kind} entry")
        for key, value in entry.items():
            _check_field(f"{w}.{key}", key, value)
        out.append(dict(entry))
    return tuple(out)


def _check_field(where: str, key: str, value: object) -> None:
    if key == "kind":
        return
    if key in TEXT_FIELDS:
        if not isinstance(value, str):
            raise ConfigError(where, value, "a name (a string)")
    elif key in FLAG_FIELDS:
        if not isinstance(value, bool):
            raise ConfigError(where, value, "true or false")
    elif key in PAIR_FIELDS:
        if not (isinstance(value, list) and len(value) == 2 and all(_count(v) for v in value)):
            raise ConfigError(where, value, "two integers >= 0 (height, width)")
    elif not _count(value):
        raise ConfigError(where, value, "an integer >= 0 (2**53 at most)")


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**53


def itemsize(entry: Mapping) -> int:
    """Bytes per element of the entry's output (4 for an unknown dtype)."""
    return DTYPE_BYTES.get(str(entry.get("dtype")), 4)


def as_list(ops: Sequence[Mapping]) -> list[dict]:
    """Plain dicts (for JSON)."""
    return [dict(o) for o in ops]
