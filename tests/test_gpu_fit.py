"""Learning simfog.gpu's constants: a model learned from rows reproduces them, and leave-one-GPU-out never shows the
fit the GPU it predicts."""

import sys
from pathlib import Path

import numpy as np
import pytest

from simfog.gpu import fit as F
from simfog.gpu import kernels as K
from simfog.gpu.shapes import Corrections
from simfog.gpu.specs import DEVICES

GPUS = ("v100", "a100", "t4", "h100")
TRUE = {**{n: v[0] for n, v in F.PARAMETERS.items()}, "eff.simt": 0.8, "eff.fp16": 0.6, "gemm.intensity_half": 20.0,
        "gemm.depth_half": 50.0, "memory.efficiency": 0.7, "kernel.fixed_s": 4e-6, "power.gamma": 0.5,
        "stream.norm": 0.6, "conv.fwd": 0.7}


def synthetic(rng) -> dict:
    """GEMM, convolution and stream rows on four real GPUs, timed by the model itself at TRUE (no offsets)."""
    rows = {"gemm": [], "conv": [], "memory": []}
    for gpu in GPUS:
        for _ in range(40):
            m, n, k = (int(2 ** rng.uniform(6, 12)) for _ in range(3))
            prec = "fp16" if rng.random() < 0.3 else "fp32"
            rows["gemm"].append({"source": "vidur", "gpu": gpu, "precision": prec, "batch": 1, "m": m, "n": n, "k": k})
            c, kk = (int(2 ** rng.uniform(4, 9)) for _ in range(2))
            hw = int(2 ** rng.uniform(3, 6))
            rows["conv"].append({"source": "vidur", "gpu": gpu, "precision": "fp32", "pass": "fwd", "n": 16, "c": c,
                                 "h": hw, "w": hw, "k": kk, "r": 3, "s": 3, "stride_h": 1, "stride_w": 1, "pad_h": 1,
                                 "pad_w": 1, "dilation": 1, "groups": 1})
            rows["memory"].append({"source": "vidur", "gpu": gpu, "precision": "fp32", "op": "relu",
                                   "kind": "norm" if rng.random() < 0.5 else "elementwise",
                                   "rows": int(2 ** rng.uniform(8, 14)), "cols": 1024})
    tables = {}
    for family, items in rows.items():
        table = {key: [r[key] for r in items] for key in items[0]}
        table["time_s"] = list(K.predict(TRUE, F.kernels_of(family, table)))
        tables[family] = table
    return tables


def test_a_learned_model_reproduces_its_training_rows():
    tables = synthetic(np.random.default_rng(0))
    fitted = F.fit(tables, max_evaluations=60)
    for family, table in tables.items():
        err = np.abs(np.log(F.predict(fitted, family, table) / np.array(table["time_s"])))
        assert np.median(err) < 0.03, (family, np.median(err))
        assert np.quantile(err, 0.9) < 0.15, (family, np.quantile(err, 0.9))


def test_a_held_out_gpu_takes_its_sources_median_offset():
    fitted = F.Fitted({}, {("neusight", "t4", "gemm"): 1e-5, ("neusight", "v100", "gemm"): 3e-5,
                           ("neusight", "a100", "gemm"): 2e-5}, Corrections())
    assert fitted.offset("neusight", "t4", "gemm") == 1e-5
    assert fitted.offset("neusight", "h100", "gemm") == pytest.approx(2e-5)
    assert fitted.offset("vidur", "h100", "gemm") == 0.0


def test_leave_one_gpu_out_never_shows_the_fit_the_gpu_it_predicts(monkeypatch):
    """bench/retarget.py's split: every GPU is predicted by a fit that saw no row of it (the test fails if a fit is
    given one, or if a GPU's rows are predicted by another GPU's fit)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import retarget as bench

    tables = synthetic(np.random.default_rng(1))
    made = {}

    def spy_fit(train, start=None, **_):
        # the search may not start from a fit that saw the held-out GPU either (the fit on every GPU did)
        assert start is None, "a fold's search starts from another fit's constants"
        seen = {g for t in train.values() for g in t["gpu"]}
        missing = set(GPUS) - seen
        assert len(missing) == 1, f"a fold's fit saw {sorted(seen)}"
        gpu = missing.pop()
        made[gpu] = F.Fitted({**TRUE, "held_out": gpu}, {}, Corrections())
        return made[gpu]

    def spy_predict(fitted, family, table):
        assert set(table["gpu"]) == {fitted.params["held_out"]}, "a GPU predicted by a fit that saw it"
        return np.array(table["time_s"])

    monkeypatch.setattr(bench.F, "fit", spy_fit)
    monkeypatch.setattr(bench.F, "predict", spy_predict)
    fits, rows = bench.leave_one_gpu_out(tables, None, 0)
    assert sorted(fits) == sorted(GPUS) and sorted(made) == sorted(GPUS)
    assert len(rows) == sum(len(t["gpu"]) for t in tables.values())
    # the development GPUs alone (bench/retarget.py --dev): one fold each, the same rows of them
    some, _ = bench.leave_one_gpu_out(tables, None, 0, only=GPUS[:1])
    assert sorted(some) == list(GPUS[:1])


def test_shape_corrections_need_two_gpus_and_shrink():
    from simfog.gpu.shapes import learn

    g = K.device_rows([DEVICES.get("a100")] * 6)
    ks = K.streams(g, np.full(6, 1e6), ["elementwise"] * 6)
    one_gpu = learn(ks, np.log(np.full(6, 2.0)), ["x"] * 3 + ["y"] * 3, ["a100"] * 6)
    assert not one_gpu.lookup(ks)[0].any()  # a cell from one GPU corrects nothing
    # two GPUs, each centred on its own median: the cell's mean is 0 where both sides agree
    residual = np.log([1.0, 1.0, 2.0, 3.0, 3.0, 6.0])
    two = learn(ks, residual, ["x"] * 3 + ["y"] * 3, ["a100"] * 3 + ["v100"] * 3)
    corr, cells = two.lookup(ks)
    centred = residual - np.repeat([np.median(residual[:3]), np.median(residual[3:])], 3)
    assert corr[0] == pytest.approx(centred.mean() * 6 / (6 + 2)) and cells[0].startswith("1|elementwise")
