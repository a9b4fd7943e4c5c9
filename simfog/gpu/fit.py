"""Learning simfog.gpu's constants from public measurements of kernels on GPUs (bench/data/kernels, read by
bench/retarget.py): a robust least-squares fit of the kernel constants (simfog.gpu.kernels) to the log of the
measured times, then the shape corrections (simfog.gpu.shapes) from what is left.

Measurements are rows of a table (a dict of equal-length columns) in the common format of bench/data/kernels:
gemm (batch, m, n, k), conv (pass, n, c, h, w, k, r, s, strides, pads, groups) or memory (op, kind, rows, cols), each
with source, gpu, precision and time_s. Sources that time an operator from the host (NeuSight, KernelBench: a CUDA
event before and after one call) or with an old harness (DeepBench) include a constant of their machine: each
(source, GPU, family) gets its own offset while learning; a GPU held out gets its source's median offset.

The fit runs in three stages, each on its own rows with the earlier stages' constants fixed: products (gemm rows:
efficiencies, tile constants, memory efficiency, the power model), convolutions (their passes' efficiencies,
Winograd, TF32), streams (each kind's efficiency). Constants by architecture generation (`name.<major>`) are shrunk
towards the generation-free one, so a generation with little data stays near it, and one with none uses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simfog.gpu import kernels as K
from simfog.gpu.shapes import Corrections, learn
from simfog.gpu.specs import DEVICES

# name: (start, lowest, highest)
PARAMETERS: dict[str, tuple[float, float, float]] = {
    "eff.simt": (0.85, 0.2, 1.0), "eff.shared": (0.75, 0.2, 1.0), "eff.tf32": (0.6, 0.05, 1.0),
    "eff.fp16": (0.7, 0.05, 1.0), "gemm.intensity_half": (16.0, 1.0, 100.0), "gemm.depth_half": (32.0, 1.0, 2000.0),
    "gemm.saturation": (2.0, 1.0, 8.0), "memory.efficiency": (0.75, 0.2, 1.0), "kernel.fixed_s": (3e-6, 5e-7, 2e-5),
    "power.kappa": (0.03, 0.003, 0.3), "power.gamma": (0.7, 0.2, 1.5), "conv.fwd": (0.8, 0.05, 1.0),
    "conv.dgrad": (0.7, 0.05, 1.0), "conv.wgrad": (0.6, 0.05, 1.0), "conv.winograd": (2.0, 1.0, 4.0),
    "conv.tc": (0.6, 0.05, 1.0), "conv.layout": (1.0, 0.01, 4.0),
    "memory.l2_boost": (1.5, 1.0, 5.0), **{f"stream.{s}": (0.9, 0.05, 1.5) for s in K.STREAMS},
}
BY_MAJOR = ("eff.simt", "power.kappa")  # learned per architecture generation where the data has one
STAGES = {
    "gemm": ("eff.simt", "eff.shared", "eff.fp16", "gemm.intensity_half", "gemm.depth_half", "gemm.saturation",
             "memory.efficiency", "kernel.fixed_s", "power.kappa", "power.gamma"),
    "conv": ("conv.fwd", "conv.dgrad", "conv.wgrad", "conv.winograd", "eff.tf32", "conv.tc", "conv.layout"),
    "memory": tuple(f"stream.{s}" for s in ("elementwise", "norm", "softmax", "pool")) + ("memory.l2_boost",),
}
OFFSET_SOURCES = ("neusight", "kernelbench", "deepbench")
OFFSET_RANGE = (1e-7, 2e-3)
SHRINK_WEIGHT = 1.0  # how hard a generation's constant is pulled to the generation-free one (log units)


@dataclass(frozen=True)
class Fitted:
    """The constants learned, the per-(source, GPU) offsets, and the shape corrections."""

    params: dict
    offsets: dict
    corrections: Corrections

    def offset(self, source: str, gpu: str, family: str) -> float:
        """The offset of (source, GPU, family); for a GPU not learned from, the median over its source's GPUs (0 for
        a source without offsets)."""
        if (source, gpu, family) in self.offsets:
            return self.offsets[(source, gpu, family)]
        same = [v for (s, _, f), v in self.offsets.items() if s == source and f == family]
        return float(np.median(same)) if same else 0.0


def _col(table: Mapping[str, Sequence], key: str, kind=float) -> np.ndarray:
    return np.array([kind(v) for v in table[key]])


def kernels_of(family: str, table: Mapping[str, Sequence]) -> K.Kernels:
    """The measured rows of `family` (gemm, conv or memory) as kernel rows (module docstring)."""
    gpus = [DEVICES.get(g) for g in table["gpu"]]
    precision = list(table["precision"])
    size = np.array([2.0 if p in ("fp16", "bf16") else 4.0 for p in precision])
    if family == "memory":
        rows, cols = _col(table, "rows"), _col(table, "cols")
        op, kind = list(table["op"]), list(table["kind"])
        binary = np.array([o in ("add", "mul", "div", "pow") for o in op])
        factor = np.array([3.0 if b else 2.0 for b in binary])
        factor = np.where(np.array(kind) == "norm", 3.0, np.where(np.array(kind) == "pool", 1.25, factor))
        streams = [k if k in K.STREAMS else "elementwise" for k in kind]
        return K.streams(K.device_rows(gpus), rows * cols * size * factor, streams)
    math = [K.math_of(g, p) for g, p in zip(gpus, precision, strict=True)]
    dev = K.device_rows(gpus, math)
    if family == "gemm":
        return K.tiled(dev, _col(table, "batch"), _col(table, "m"), _col(table, "n"), _col(table, "k"), math, size,
                       size)
    n, c, h, w, k, r, s = (_col(table, x) for x in ("n", "c", "h", "w", "k", "r", "s"))
    sh, sw, ph, pw, g = (_col(table, x) for x in ("stride_h", "stride_w", "pad_h", "pad_w", "groups"))
    p, q = np.floor((h + 2 * ph - r) / sh) + 1, np.floor((w + 2 * pw - s) / sw) + 1
    passes = list(table["pass"])
    ps = np.array(passes)
    m_ = np.where(ps == "fwd", n * p * q, np.where(ps == "dgrad", n * h * w, k / g))
    n_ = np.where(ps == "fwd", k / g, np.where(ps == "dgrad", c / g, c / g * r * s))
    k_ = np.where(ps == "fwd", c / g * r * s, np.where(ps == "dgrad", k / g * r * s, n * p * q))
    wino = (r == 3) & (s == 3) & (sh == 1) & (sw == 1) & (g == 1) & (ps != "wgrad")
    return K.tiled(dev, g, m_, n_, k_, math, size, size, conv=passes, winograd=wino)


def _names(stage: str, majors: Iterable[int]) -> list[str]:
    names = list(STAGES[stage])
    return names + [f"{b}.{m}" for b in BY_MAJOR if b in names for m in sorted(set(majors))]


def _bounds(name: str) -> tuple[float, float, float]:
    return PARAMETERS[name] if name in PARAMETERS else PARAMETERS[name.rsplit(".", 1)[0]]


def fit_stage(stage: str, table: Mapping[str, Sequence], params: Mapping[str, float], *, max_evaluations: int = 40,
              start: Mapping[str, float] | None = None) -> tuple[dict, dict]:
    """Learn the constants of `stage` (and the offsets of the table's (source, GPU) pairs) from `table`, the other
    constants fixed at `params`; `start` (e.g. an earlier fit) is where the search begins. Returns (params,
    offsets)."""
    from scipy.optimize import least_squares

    ks = kernels_of(stage, table)
    y = np.log(_col(table, "time_s"))
    majors = [int(DEVICES.get(g).compute_capability.split(".")[0]) for g in table["gpu"]]
    names = _names(stage, majors)
    keys = sorted({(s, g) for s, g in zip(table["source"], table["gpu"], strict=True) if s in OFFSET_SOURCES})
    where = np.array([keys.index((s, g)) if (s, g) in keys else -1
                      for s, g in zip(table["source"], table["gpu"], strict=True)])
    pairs = [(i, names.index(n.rsplit(".", 1)[0])) for i, n in enumerate(names) if n.rsplit(".", 1)[0] in names]
    weight = SHRINK_WEIGHT * np.sqrt(len(y) / 50)
    begin = {**params, **(start or {})}
    lo = np.log([_bounds(n)[1] for n in names] + [OFFSET_RANGE[0]] * len(keys))
    hi = np.log([_bounds(n)[2] for n in names] + [OFFSET_RANGE[1]] * len(keys))
    x0 = np.log([begin.get(n, begin.get(n.rsplit(".", 1)[0], _bounds(n)[0])) for n in names]
                + [1.5e-5] * len(keys))
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def residuals(x):
        p = {**params, **dict(zip(names, np.exp(x[:len(names)]), strict=True))}
        offsets = np.exp(x[len(names):])
        t = K.predict(p, ks) + (np.where(where >= 0, offsets[np.maximum(where, 0)], 0.0) if keys else 0.0)
        shrink = [weight * (x[i] - x[j]) for i, j in pairs]
        return np.concatenate([np.log(t) - y, shrink])

    # which residual each unknown moves: a constant by generation only its generation's rows, an offset only its
    # (source, GPU) rows; least squares then estimates many columns per evaluation (far fewer evaluations)
    major_of = np.array(majors)
    sparsity = np.zeros((len(y) + len(pairs), len(names) + len(keys)), bool)
    for i, name in enumerate(names):
        base, _, tail = name.rpartition(".")
        sparsity[:len(y), i] = major_of == int(tail) if base in BY_MAJOR and tail.isdigit() else True
    for j in range(len(keys)):
        sparsity[:len(y), len(names) + j] = where == j
    for r, (i, j) in enumerate(pairs):
        sparsity[len(y) + r, [i, j]] = True
    found = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.15, max_nfev=max_evaluations,
                          jac_sparsity=sparsity, method="trf", x_scale="jac")
    learned = {**params, **dict(zip(names, np.exp(found.x[:len(names)]), strict=True))}
    return learned, dict(zip(keys, np.exp(found.x[len(names):]), strict=True))


def modelled(table: Mapping[str, Sequence], family: str, params: Mapping[str, float]) -> np.ndarray:
    """The kernel constants' time of each row (no offset, no correction)."""
    return K.predict(params, kernels_of(family, table))


def fit(tables: Mapping[str, Mapping[str, Sequence]], *, start: Mapping[str, float] | None = None,
        max_evaluations: int = 40, corrections_from: Mapping[str, Mapping[str, Sequence]] | None = None) -> Fitted:
    """Learn every constant, offset and shape correction from `tables` ({"gemm": ..., "conv": ..., "memory": ...};
    module docstring). `start`: constants to begin the search from (e.g. the fit on every GPU, when one is held
    out). `corrections_from`: more rows of the same GPUs for the shape corrections (an average, cheap where the
    constants' search is not)."""
    params = {n: v[0] for n, v in PARAMETERS.items()}
    params.update(start or {})
    offsets: dict = {}
    for stage in ("gemm", "conv", "memory"):
        if stage in tables and len(tables[stage]["gpu"]):
            params, found = fit_stage(stage, tables[stage], params, max_evaluations=max_evaluations)
            offsets.update({(s, g, stage): v for (s, g), v in found.items()})
    fitted = Fitted(params, offsets, Corrections())
    return Fitted(params, offsets, corrections(corrections_from or tables, fitted))


def corrections(tables: Mapping[str, Mapping[str, Sequence]], fitted: Fitted) -> Corrections:
    """Shape corrections from every row's log(measured - offset) - log(modelled) (simfog.gpu.shapes.learn)."""
    parts, residual, groups, gpus = [], [], [], []
    for family, table in tables.items():
        if not len(table["gpu"]):
            continue
        ks = kernels_of(family, table)
        t = K.predict(fitted.params, ks)
        off = np.array([fitted.offset(s, g, family) for s, g in zip(table["source"], table["gpu"], strict=True)])
        measured = np.maximum(_col(table, "time_s") - off, 0.2 * _col(table, "time_s"))
        parts.append(ks)
        residual.append(np.log(measured / t))
        groups += [f"{s}|{g}|{family}|{'tc' if m else 'simt'}"
                   for s, g, m in zip(table["source"], table["gpu"], ks.math > 0, strict=True)]
        gpus += list(table["gpu"])
    if not parts:
        return Corrections()
    return learn(K.concat(parts), np.concatenate(residual), groups, gpus)


def predict(fitted: Fitted, family: str, table: Mapping[str, Sequence]) -> np.ndarray:
    """Predicted seconds of measured rows: corrected kernel time plus the row's (source, GPU) offset."""
    ks = kernels_of(family, table)
    fixed = fitted.params["kernel.fixed_s"]
    corr, _ = fitted.corrections.lookup(ks)
    t = (K.predict(fitted.params, ks) - fixed) * np.exp(corr) + fixed
    return t + np.array([fitted.offset(s, g, family) for s, g in zip(table["source"], table["gpu"], strict=True)])


def select(table: Mapping[str, Sequence], keep: np.ndarray) -> dict:
    """The rows of `table` where `keep`."""
    keep = np.asarray(keep, bool)
    return {key: [v for v, k in zip(values, keep, strict=True) if k] for key, values in table.items()}
