"""Shape corrections: what the libraries do that the tile-and-wave arithmetic of simfog.gpu.kernels does not see
(cuDNN choosing an FFT or a slow implicit GEMM for some convolutions, cuBLAS a 128 x 128 tile for a batch of tiny
matrices), learned from measurements of the same shapes on other GPUs.

A kernel falls in a cell of its shape: its family (tiled product: pass, CUDA or tensor cores, Winograd-eligible,
fused, batched; stream: kind) and the octave (floor of log2) of each dimension. A cell holds the mean of the
measured-over-modelled log ratios of the public measurements in it, each first centred on its own GPU and source
(the GPU's overall bias is the physics' to explain, not the shape's). A kernel takes the correction of the finest of
three cell sizes (1, 2 and 4 octaves) that holds at least MIN_COUNT measurements from at least MIN_GPUS GPUs, shrunk
towards none by count / (count + SHRINK); a kernel in no such cell is not corrected. When a GPU is held out, none of
its measurements are in the cells that predict it (simfog.gpu.fit, bench/retarget.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from simfog.gpu.kernels import CONV_PASSES, MATH, STREAMS, Kernels

LEVELS = (1, 2, 4)  # octaves per cell side, finest first
MIN_COUNT = 3
MIN_GPUS = 2
SHRINK = 2.0


def _octave(x: np.ndarray, width: int) -> np.ndarray:
    return np.floor(np.log2(np.maximum(x, 1.0)) / width).astype(int)


def cell_keys(ks: Kernels, width: int) -> list[str]:
    """Each row's cell at `width` octaves per side (module docstring)."""
    keys = []
    m, n, k, b = (_octave(getattr(ks, x), width) for x in ("m", "n", "k", "b"))
    nbytes = _octave(ks.nbytes, width)
    for i in range(len(ks)):
        if ks.tiled[i]:
            keys.append(f"{width}|{CONV_PASSES[ks.conv[i]]}|{MATH[ks.math[i]]}|w{int(ks.winograd[i])}|"
                        f"f{int(ks.fused_bytes[i] > 0)}|{b[i]}|{m[i]}|{n[i]}|{k[i]}")
        else:
            keys.append(f"{width}|{STREAMS[ks.stream[i]]}|{nbytes[i]}")
    return keys


@dataclass(frozen=True)
class Corrections:
    """Cells -> (mean centred log ratio, measurements, GPUs): the learned shape corrections."""

    cells: Mapping[str, tuple[float, int, int]] = field(default_factory=dict)

    def lookup(self, ks: Kernels) -> tuple[np.ndarray, list[str]]:
        """(log correction per row, the cell each took, "" for none)."""
        out, used = np.zeros(len(ks)), [""] * len(ks)
        done = np.zeros(len(ks), bool)
        for width in LEVELS:
            for i, key in enumerate(cell_keys(ks, width)):
                if done[i] or key not in self.cells:
                    continue
                mean, count, gpus = self.cells[key]
                if count >= MIN_COUNT and gpus >= MIN_GPUS:
                    out[i] = mean * count / (count + SHRINK)
                    used[i] = key
                    done[i] = True
        return out, used

    def to_dict(self) -> dict:
        return {key: [round(v[0], 5), int(v[1]), int(v[2])] for key, v in sorted(self.cells.items())}

    @classmethod
    def from_dict(cls, d: Mapping) -> Corrections:
        return cls({key: (float(v[0]), int(v[1]), int(v[2])) for key, v in d.items()})


def learn(ks: Kernels, residual: np.ndarray, groups: Sequence[str], gpus: Sequence[str]) -> Corrections:
    """Corrections from measured rows: `residual` = log(measured / modelled) per row, centred here on the median of
    its `groups` entry (one per source, GPU and family), `gpus` naming each row's GPU."""
    residual = np.asarray(residual, float)
    groups = np.asarray(groups)
    centred = residual.copy()
    for grp in np.unique(groups):
        sel = groups == grp
        centred[sel] -= np.median(residual[sel])
    cells: dict[str, list] = {}
    for width in LEVELS:
        for key, r, gpu in zip(cell_keys(ks, width), centred, gpus, strict=True):
            acc = cells.setdefault(key, [0.0, 0, set()])
            acc[0] += r
            acc[1] += 1
            acc[2].add(gpu)
    return Corrections({key: (total / count, count, len(names)) for key, (total, count, names) in cells.items()})
