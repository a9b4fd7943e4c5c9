"""The learned model of compute on a GPU (simfog/data/gpu_model.json: written by `python bench/retarget.py --write`)
and what it says of a trace's layers on a device: per layer and pass the kernels, what each costs on the device
(simfog.gpu.kernels, corrected by the shapes' corrections of simfog.gpu.shapes), what the host adds
(simfog.gpu.host), and why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

from simfog.errors import ConfigError
from simfog.gpu import host as H
from simfog.gpu import kernels as K
from simfog.gpu import layers as L
from simfog.gpu.shapes import Corrections

MODEL = Path(__file__).resolve().parents[1] / "data" / "gpu_model.json"


@dataclass(frozen=True)
class GpuModel:
    """The learned constants: `params` of the kernels (simfog.gpu.kernels), the shape `corrections`, the `host`
    figures (simfog.gpu.host), and `provenance` (what they were learned from and how well they did held out)."""

    params: Mapping[str, float]
    corrections: Corrections
    host: Mapping[str, float]
    provenance: Mapping[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"format": "simfog.gpu-model/1", "params": {k: float(v) for k, v in sorted(self.params.items())},
                "host": {k: float(v) for k, v in sorted(self.host.items())}, "provenance": dict(self.provenance),
                "corrections": self.corrections.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping, source: str = "(dict)") -> GpuModel:
        if not isinstance(d, Mapping) or d.get("format") != "simfog.gpu-model/1":
            raise ConfigError("format", d.get("format") if isinstance(d, Mapping) else type(d).__name__,
                              '"simfog.gpu-model/1" (bench/retarget.py --write)', source=source)
        missing = [k for k in H.HOST_KEYS if k not in d.get("host", {})]
        if missing:
            raise ConfigError(f"host.{missing[0]}", "(missing)", "every figure of simfog.gpu.host", source=source)
        return cls(dict(d["params"]), Corrections.from_dict(d.get("corrections", {})), dict(d["host"]),
                   dict(d.get("provenance", {})))

    def save(self, path: str | Path) -> None:
        """JSON, a shape correction per line (thousands of them: one line each keeps the file readable)."""
        d = self.to_dict()
        cells = d.pop("corrections")
        head = json.dumps(d, indent=1, sort_keys=True)[:-2]
        body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in cells.items())
        Path(path).write_text(f'{head},\n "corrections": {{\n{body}\n }}\n}}\n')


@cache
def load(path: Path = MODEL) -> GpuModel:
    """The shipped model (read once). Raises ConfigError naming the file when it is missing or malformed."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError("gpu model", str(path), f"a readable model file ({e})", source=str(path)) from None
    return GpuModel.from_dict(data, str(path))


@dataclass(frozen=True)
class Estimate:
    """A trace's layers on a device: per layer forward and backward seconds, the optimizer step's, and each launch
    with what decided its time (`launches`: dicts of layer, phase, what, kernel_s, added_s, bound, and the kernel's
    figures)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    optimizer_s: float
    launches: list[dict]

    @property
    def step_s(self) -> float:
        return float(self.forward_s.sum() + self.backward_s.sum() + self.optimizer_s)


def program(ops_per_layer: Sequence[Sequence[Mapping]], params_per_layer: Sequence[Sequence[int]], precision: str,
            gpu, *, optimizer_bytes: int = 4) -> list[L.Launch]:
    """The launches of one training step in program order: forward layer by layer, backward in reverse (each
    layer's operators in reverse), then the optimizer over every parameter tensor."""
    per_layer = [[x for j, op in enumerate(ops) for x in L.op_launches(op, i, j, precision, gpu)]
                 for i, ops in enumerate(ops_per_layer)]
    forward = [x for launches in per_layer for x in launches if x.phase == "forward"]
    backward = []
    for launches in reversed(per_layer):
        by_op: dict[int, list] = {}
        for x in launches:
            if x.phase == "backward":
                by_op.setdefault(x.op, []).append(x)
        for j in sorted(by_op, reverse=True):
            backward += by_op[j]
    tensors = [n for sizes in params_per_layer for n in sizes]
    return forward + backward + L.optimizer_launches(tensors, optimizer_bytes)


def kernel_times(model: GpuModel, launches: Sequence[L.Launch], gpu) -> tuple[np.ndarray, dict, list[str]]:
    """(seconds per launch on `gpu`, the kernels' figures per launch, the correction cell each took)."""
    if not launches:
        return np.zeros(0), {}, []
    ks = L.to_kernels(launches, gpu)
    t, detail = K.predict(model.params, ks, detail=True)
    corr, cells = model.corrections.lookup(ks)
    where = L.order(launches)
    detail = {key: np.asarray(v)[where] for key, v in detail.items()}
    detail["correction"] = np.exp(corr[where])
    fixed = model.params["kernel.fixed_s"]
    seconds = (t[where] - fixed) * detail["correction"] + fixed
    return seconds, detail, [cells[i] for i in where]


def estimate(model: GpuModel, ops_per_layer: Sequence[Sequence[Mapping]], params_per_layer: Sequence[Sequence[int]],
             precision: str, gpu, *, host: Mapping[str, float] | None = None, optimizer_bytes: int = 4) -> Estimate:
    """Per-layer times of one training step on `gpu` (module docstring). `host` overrides the model's host figures
    (any of simfog.gpu.host.HOST_KEYS)."""
    launches = program(ops_per_layer, params_per_layer, precision, gpu, optimizer_bytes=optimizer_bytes)
    seconds, detail, cells = kernel_times(model, launches, gpu)
    figures = {**model.host, **(host or {})}
    added, waited = H.timeline(seconds, H.issue_gaps(launches, figures))
    n = len(ops_per_layer)
    fwd, bwd, opt = np.zeros(n), np.zeros(n), 0.0
    rows = []
    for i, x in enumerate(launches):
        if x.phase == "forward":
            fwd[x.layer] += added[i]
        elif x.phase == "backward":
            bwd[x.layer] += added[i]
        else:
            opt += added[i]
        rows.append({"layer": x.layer, "phase": x.phase, "what": x.what, "math": x.shape[4] if x.tiled else "",
                     "kernel_s": float(seconds[i]),
                     "added_s": float(added[i]),
                     "bound": "host" if waited[i] else K.BOUNDS[int(detail["bound"][i])],
                     **{key: float(v[i]) for key, v in detail.items() if key != "bound"}, "cell": cells[i]})
    return Estimate(fwd, bwd, float(opt), rows)
