"""What one GPU kernel costs on a device, from the device's specifications and a few learned constants: pure
functions over numpy arrays (one row per kernel), so that a whole trace, or every measurement a fit learns from, is
one call.

Two families, each with the figures a reader needs to see why:

- **Tiled products** (GEMMs, implicit-GEMM convolutions, fused attention): the output of b products of m x n is cut
  into tiles of tm x tn (the candidates a library has: cuBLAS/cuDNN's SIMT tiles, and larger ones on tensor cores),
  optionally split along k (split-K, its partial sums reduced by a second kernel). Tiles run in waves over the SMs,
  `resident` at a time per SM; a wave takes `resident` tiles' arithmetic at the SM's share of the peak, times an
  efficiency that falls for small tiles (arithmetic intensity tm*tn/(tm+tn) against `gemm.intensity_half`) and for
  short products (k per tile against `gemm.depth_half`). The time is the larger of that and the bytes moved at the
  memory bandwidth (`memory.efficiency`), and the library is taken to pick the fastest candidate. A product with
  m or n of 4 or less runs as a matrix-vector kernel (memory-bound). 3x3 stride-1 convolutions on CUDA cores may
  run as Winograd (arithmetic / `conv.winograd`, plus transform traffic), as cuDNN picks them; convolutions on
  tensor cores reach `conv.tc` of the products' efficiency and move `conv.layout` more passes over their input and
  output (NCHW to NHWC and back).
- **Streams** (element-wise, normalisation, softmax, pooling, embedding, copies, optimizer steps): bytes over the
  memory bandwidth at the kind's efficiency, the part that fits in L2 at `memory.l2_boost` times that.

Every kernel adds `kernel.fixed_s` (launch latency and tail on the GPU, not the host's dispatch: simfog.gpu.host).
A GPU whose board power cannot feed all its lanes at the boost clock runs compute-bound kernels at a lower clock:
min(1, (power / (kappa x FP32 lanes x SMs x clock))^(1/3)) (dynamic power grows about as the cube of the clock),
kappa per architecture generation where learned (`power.kappa.<major>`), else `power.kappa`.

The constants are learned from public measurements (simfog.gpu.fit, bench/retarget.py) and shipped in
simfog/data/gpu_model.toml; nothing here reads a GPU's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

SIMT_TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128), (64, 32), (32, 64), (32, 32),
              (128, 16), (16, 128), (64, 16), (16, 64))
TC_TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64), (64, 32), (32, 64), (128, 16))
SPLITS = (1, 2, 4, 8, 16)
MIN_SPLIT_DEPTH = 128  # split-K only where each split still reduces over this many
GEMV_WIDTH = 4  # a product with m or n at most this runs as a matrix-vector (memory-bound) kernel
MATH = ("simt", "tf32", "fp16")  # arithmetic: CUDA cores, TF32 tensor cores, FP16/BF16 tensor cores
CONV_PASSES = ("none", "fwd", "dgrad", "wgrad")
STREAMS = ("elementwise", "norm", "softmax", "pool", "embedding", "copy", "reduce", "optimizer")
BOUNDS = ("compute", "memory", "launch")


@dataclass(frozen=True)
class Kernels:
    """Many kernels as arrays of one length R (a row per kernel); build with `tiled` / `streams`, join with
    `concat`. `gpu` rows: the device features of each row (simfog.gpu.kernels.device_rows)."""

    tiled: np.ndarray       # bool: a tiled product (else a stream)
    b: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    math: np.ndarray        # index into MATH (tiled rows)
    in_size: np.ndarray     # bytes per input element
    out_size: np.ndarray    # bytes per output element
    conv: np.ndarray        # index into CONV_PASSES
    winograd: np.ndarray    # bool: may run as Winograd
    fused_bytes: np.ndarray  # bytes a fused tiled kernel moves (attention), else 0 (from its shapes)
    nbytes: np.ndarray      # stream rows: bytes moved
    stream: np.ndarray      # index into STREAMS (stream rows)
    gpu: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.tiled)


def device_rows(gpus: Sequence, math: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Per-row device features: sms, clock, lanes, shared (FP32 lanes shared with INT32), power, major (compute
    capability), bandwidth, l2, and the peak of each row's math (`math`: MATH names, default "simt")."""
    math = list(math) if math is not None else ["simt"] * len(gpus)
    prec = {"simt": "fp32", "tf32": "tf32", "fp16": "fp16"}
    return {"sms": np.array([g.sms for g in gpus], float), "clock": np.array([g.clock_Hz for g in gpus], float),
            "lanes": np.array([g.fp32_lanes for g in gpus], float),
            "shared": np.array([g.shared_fp32_lanes for g in gpus], bool),
            "power": np.array([g.power_W for g in gpus], float),
            "major": np.array([int(g.compute_capability.split(".")[0]) for g in gpus]),
            "bw": np.array([g.memory_Bps for g in gpus], float), "l2": np.array([g.l2_bytes for g in gpus], float),
            "peak": np.array([g.peak_flops[prec[x]] for g, x in zip(gpus, math, strict=True)], float)}


def math_of(gpu, precision: str) -> str:
    """The arithmetic a product in `precision` runs in on `gpu`: its tensor cores where it has them for that
    precision (TF32, FP16, BF16), else CUDA cores ("simt")."""
    if precision in ("tf32", "fp16", "bf16") and gpu.has_tensor_cores(precision):
        return "tf32" if precision == "tf32" else "fp16"
    return "simt"


def _ints(x, size) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    return np.broadcast_to(a, (size,)).astype(float) if a.ndim == 0 else a


def tiled(gpu: Mapping, b, m, n, k, math, in_size, out_size, conv=None, winograd=None, fused_bytes=None) -> Kernels:
    """Tiled-product rows (math: MATH names; conv: CONV_PASSES names or None)."""
    size = len(np.atleast_1d(m))
    z = np.zeros(size)
    conv_idx = np.zeros(size, int) if conv is None else np.array([CONV_PASSES.index(c) for c in conv])
    return Kernels(tiled=np.ones(size, bool), b=_ints(b, size), m=_ints(m, size), n=_ints(n, size), k=_ints(k, size),
                   math=np.array([MATH.index(x) for x in math]), in_size=_ints(in_size, size),
                   out_size=_ints(out_size, size), conv=conv_idx,
                   winograd=np.zeros(size, bool) if winograd is None else np.asarray(winograd, bool),
                   fused_bytes=z if fused_bytes is None else _ints(fused_bytes, size), nbytes=z,
                   stream=np.zeros(size, int), gpu=gpu)


def streams(gpu: Mapping, nbytes, kind) -> Kernels:
    """Stream rows (kind: STREAMS names)."""
    size = len(np.atleast_1d(nbytes))
    z, one = np.zeros(size), np.ones(size)
    return Kernels(tiled=np.zeros(size, bool), b=one, m=one, n=one, k=one, math=np.zeros(size, int), in_size=one * 4,
                   out_size=one * 4, conv=np.zeros(size, int), winograd=np.zeros(size, bool), fused_bytes=z,
                   nbytes=_ints(nbytes, size), stream=np.array([STREAMS.index(x) for x in kind]), gpu=gpu)


def concat(parts: Sequence[Kernels]) -> Kernels:
    fields = [f for f in Kernels.__dataclass_fields__ if f != "gpu"]
    return Kernels(**{f: np.concatenate([getattr(p, f) for p in parts]) for f in fields},
                   gpu={key: np.concatenate([p.gpu[key] for p in parts]) for key in parts[0].gpu})


def _p(params: Mapping[str, float], key: str, default: float | None = None) -> float:
    if key in params:
        return float(params[key])
    if default is None:
        raise KeyError(key)
    return default


def by_major(params: Mapping[str, float], key: str, g: Mapping[str, np.ndarray]) -> np.ndarray:
    """`params[key.<major>]` per row (the row's architecture generation, learned where the data had one), else
    `params[key]`."""
    return np.array([_p(params, f"{key}.{major}", _p(params, key)) for major in g["major"]])


def power_factor(params: Mapping[str, float], g: Mapping[str, np.ndarray]) -> np.ndarray:
    """The fraction of the boost clock compute-bound kernels run at: min(1, (power / (kappa x FP32 lanes x SMs x
    clock in GHz))^gamma), kappa in W per lane-GHz by architecture generation (module docstring)."""
    demand = by_major(params, "power.kappa", g) * g["lanes"] * g["sms"] * g["clock"] / 1e9
    return np.minimum(1.0, (g["power"] / demand) ** _p(params, "power.gamma"))


def simt_efficiency(params: Mapping[str, float], g: Mapping[str, np.ndarray]) -> np.ndarray:
    """The best fraction of the FP32 peak a SIMT tile reaches: `eff.simt` (by architecture generation), times
    `eff.shared` where half of the 128 FP32 lanes also run INT32 (simfog.gpu.specs.Gpu.shared_fp32_lanes)."""
    return by_major(params, "eff.simt", g) * np.where(g["shared"], _p(params, "eff.shared"), 1.0)


def predict(params: Mapping[str, float], ks: Kernels, *, detail: bool = False):
    """Seconds per kernel row; with `detail`, also a dict of arrays naming what decided each: bound (index into
    BOUNDS), tile (tm, tn; 0 for streams), split, waves, efficiency, flops, bytes, power (clock fraction)."""
    g = ks.gpu
    size = len(ks)
    fixed = _p(params, "kernel.fixed_s")
    t = np.full(size, np.inf)
    out = {key: np.zeros(size) for key in ("tm", "tn", "split", "waves", "efficiency", "flops", "bytes")}
    out["bound"] = np.full(size, BOUNDS.index("memory"))
    phi = power_factor(params, g)
    out["power"] = np.ones(size)
    # streams
    s = ~ks.tiled
    if s.any():
        eff = np.array([_p(params, f"stream.{STREAMS[i]}", _p(params, "stream.elementwise"))
                        for i in ks.stream[s]])
        # what fits in L2 streams at `memory.l2_boost` x the DRAM bandwidth (a producer's output read by the next
        # kernel, a measurement's input read again)
        in_l2 = np.minimum(1.0, g["l2"][s] / np.maximum(ks.nbytes[s], 1.0))
        rate = g["bw"][s] * _p(params, "memory.efficiency") * eff
        t[s] = ks.nbytes[s] * (in_l2 / _p(params, "memory.l2_boost", 1.0) + 1 - in_l2) / rate
        out["bytes"][s] = ks.nbytes[s]
        out["efficiency"][s] = eff
    if ks.tiled.any():
        _tiled(params, ks, t, out, phi)
    out["bound"] = np.where(t < fixed, BOUNDS.index("launch"), out["bound"])
    seconds = t + fixed
    return (seconds, out) if detail else seconds


def _tiled(params: Mapping[str, float], ks: Kernels, t: np.ndarray, out: dict, phi: np.ndarray) -> None:
    """Fill `t` and `out` for the tiled rows (module docstring)."""
    g = ks.gpu
    rows = np.flatnonzero(ks.tiled)
    b, m, n, k = ks.b[rows], ks.m[rows], ks.n[rows], ks.k[rows]
    math = ks.math[rows]
    tc = math > 0
    gr = {key: v[rows] for key, v in g.items()}
    e_max = np.where(math == 1, by_major(params, "eff.tf32", gr), by_major(params, "eff.fp16", gr))
    e_max = np.where(tc, e_max, simt_efficiency(params, gr))
    conv = ks.conv[rows]
    e_max = e_max * np.choose(conv, [1.0] + [_p(params, f"conv.{p}", 1.0) for p in CONV_PASSES[1:]])
    e_max = e_max * np.where((conv > 0) & tc, _p(params, "conv.tc", 1.0), 1.0)
    sms, bw = g["sms"][rows], g["bw"][rows] * _p(params, "memory.efficiency")
    per_sm = g["peak"][rows] * phi[rows] / sms
    isz, osz = ks.in_size[rows], ks.out_size[rows]
    fused = ks.fused_bytes[rows]
    flops = 2 * b * m * n * k
    base_bytes = np.where(fused > 0, fused, isz * b * (m * k + k * n) + osz * b * m * n)
    # tensor-core convolutions of NCHW tensors: cuDNN transposes them to NHWC and back (conv.layout passes over the
    # input and the output; its nchwToNhwc kernels in a profile)
    base_bytes = base_bytes + np.where((conv > 0) & tc, _p(params, "conv.layout", 0.0) * (isz * b * m * k / 9 +
                                                                                           osz * b * m * n), 0.0)
    i0, k0 = _p(params, "gemm.intensity_half"), _p(params, "gemm.depth_half")
    best = np.full(len(rows), np.inf)
    pick = {key: np.zeros(len(rows)) for key in ("tm", "tn", "split", "waves", "efficiency", "bound")}

    def consider(time, tm, tn, split, waves, eff, bound, ok):
        better = ok & (time < best)
        best[better] = time[better]
        for key, v in (("tm", tm), ("tn", tn), ("split", split), ("waves", waves), ("efficiency", eff),
                       ("bound", bound)):
            pick[key][better] = np.broadcast_to(v, best.shape)[better]

    sat = _p(params, "gemm.saturation", 8.0)
    for tiles, on_tc in ((SIMT_TILES, False), (TC_TILES, True)):
        use = tc == on_tc
        if not use.any():
            continue
        for tm, tn in tiles:
            resident = max(1, min(4 if on_tc else 8, (2 * 128 * 128) // (tm * tn)))
            intensity = tm * tn / (tm + tn)
            work = 2 * tm * tn
            for split in SPLITS:
                depth = np.ceil(k / split)
                ok = use & ((split == 1) | (depth >= MIN_SPLIT_DEPTH))
                tiles_n = b * np.ceil(m / tm) * np.ceil(n / tn) * split
                per_sm_tiles = np.ceil(tiles_n / sms)
                full, rest = np.floor(per_sm_tiles / resident), np.mod(per_sm_tiles, resident)
                # a partial wave of `rest` tiles runs as if min(resident, max(rest, sat)) shared the SM
                slots = full * resident + np.where(rest > 0, np.minimum(resident, np.maximum(rest, sat)), 0)
                eff = e_max * intensity / (intensity + i0) * depth / (depth + k0)
                compute = slots * work * depth / (per_sm * eff)
                traffic = base_bytes + (split > 1) * split * b * m * n * 8.0
                memory = traffic / bw
                time = np.maximum(compute, memory) + (split > 1) * _p(params, "kernel.fixed_s")
                consider(time, tm, tn, split, np.ceil(per_sm_tiles / resident), eff,
                         np.where(compute >= memory, 0, 1), ok)
    # Winograd (cuDNN, CUDA cores, 3x3 stride 1): the arithmetic / conv.winograd, the transforms' traffic added
    wino = ks.winograd[rows] & ~tc
    if wino.any():
        cut = _p(params, "conv.winograd", 1.0)
        compute = flops / (per_sm * sms * e_max * cut)
        memory = (base_bytes + 2 * isz * b * (m * k + m * n)) / bw
        consider(np.maximum(compute, memory) + _p(params, "kernel.fixed_s"), 0, 0, 1, 1, e_max * cut,
                 np.where(compute >= memory, 0, 1), wino)
    # matrix-vector products: memory-bound
    gemv = np.minimum(m, n) <= GEMV_WIDTH
    consider(base_bytes / bw, 0, 0, 1, 1, 0.0, 1, gemv)
    t[rows] = best
    for key in ("tm", "tn", "split", "waves", "efficiency"):
        out[key][rows] = pick[key]
    out["bound"][rows] = pick["bound"]
    out["flops"][rows] = flops
    out["bytes"][rows] = base_bytes
    out["power"][rows] = phi[rows]
