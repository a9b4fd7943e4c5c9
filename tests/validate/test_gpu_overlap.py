"""The one-GPU overlap stand-in (validate.collect.gpu_overlap): what it refuses without a GPU, and how a measurement
becomes a trace's comm_overheads (the kernel stand-in's ratio, clipped at 1, marked an estimate)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from validate.collect.collect_model import gpu_overlap_record  # noqa: E402
from validate.collect.gpu_overlap import measure_gpu_overlap  # noqa: E402


def _measurement(kernel_with_s: float, copy_with_s: float, alone_s: float = 0.010) -> dict:
    standins = {k: {"with_s": w, "raw": w / alone_s, "slowdown": max(1.0, w / alone_s), "launch_s": 1e-3,
                    "launches": 30, "how": f"{k} stand-in"} for k, w in (("kernel", kernel_with_s),
                                                                          ("copy", copy_with_s))}
    return {"alone_s": alone_s, "standins": standins, "repeats": 20, "ctas": 16, "model": "resnet50",
            "batch_size": 32, "device": "NVIDIA H200"}


def test_record_takes_the_kernel_stand_in_and_says_it_is_one():
    rec = gpu_overlap_record(_measurement(0.0125, 0.0104))
    assert rec["overlap_slowdown"] == pytest.approx(1.25) and rec["overlap_slowdown_raw"] == pytest.approx(1.25)
    assert rec["overlap_slowdown_estimated"] is True
    assert "stand-in" in rec["overlap_slowdown_how"] and "kernel stand-in" in rec["overlap_slowdown_how"]
    assert rec["overlap_backward_s"] == {"alone": 0.010, "with_comm": 0.0125}
    assert set(rec["overlap_standins"]) == {"kernel", "copy"}


def test_a_stand_in_that_speeds_backward_up_clips_at_one():
    rec = gpu_overlap_record(_measurement(0.0095, 0.0101))
    assert rec["overlap_slowdown"] == 1.0 and rec["overlap_slowdown_raw"] == pytest.approx(0.95)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so():
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        measure_gpu_overlap("mlp", batch_size=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_both_stand_ins_are_measured():
    m = measure_gpu_overlap("mlp", batch_size=256, repeats=4, rounds=2, warmup=1)
    assert set(m["standins"]) == {"kernel", "copy"} and m["alone_s"] > 0
    assert all(v["slowdown"] >= 1 and v["launches"] >= 2 for v in m["standins"].values())
