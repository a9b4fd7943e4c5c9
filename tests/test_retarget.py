"""Retargeting: the roofline of a trace without operators (closed-form layer times), the per-layer model of one
with them, and the result marked estimated everywhere."""

from dataclasses import replace

import pytest

from simfog.errors import ConfigError
from simfog.retarget import DEVICES, retarget
from simfog.simulation import simulate

from .conftest import make_experiment, make_trace


def _trace():
    t = make_trace([0.5, 0.5], [1.0, 1.0], [1000, 0])
    conv = replace(t.layers[0], flops=1.57e12, bytes_accessed=1e6)     # compute-bound on a V100
    relu = replace(t.layers[1], flops=0.0, bytes_accessed=900e6)       # memory-bound
    return replace(t, layers=(conv, relu))


def test_roofline_times_on_v100():
    out = retarget(_trace(), "v100", efficiency=0.5, launch_s=0.0)
    # conv: 1.57e12 / (15.7e12 * 0.5) = 0.2 s forward, 0.4 s backward; relu: 900e6 / (900e9 * 0.5) = 2 ms, 4 ms.
    assert out.layers[0].forward_s == pytest.approx((0.2,)) and out.layers[0].backward_s == pytest.approx((0.4,))
    assert out.layers[1].forward_s == pytest.approx((0.002,)) and out.layers[1].backward_s == pytest.approx((0.004,))
    assert out.optimizer_s == pytest.approx((5 * 4000 / (900e9 * 0.5),))


def test_tensor_cores_and_launch_floor():
    fp16 = retarget(_trace(), "v100", precision="fp16", efficiency=1.0, launch_s=5e-6)
    assert fp16.layers[0].forward_s[0] == pytest.approx(1.57e12 / 125e12 + 5e-6)


def test_result_is_estimated_and_simulation_says_so():
    out = retarget(_trace(), "a100")
    assert out.provenance.estimated and out.provenance.source == "estimated"
    assert "ESTIMATED" in out.provenance.notes and DEVICES.get("a100").source in out.provenance.notes
    assert simulate(make_experiment(out)).summary()["estimated"] is True
    assert simulate(make_experiment(_trace())).summary()["estimated"] is False


@pytest.mark.parametrize("kwargs, field", [
    (dict(device="tpu"), "device"), (dict(device="v100", precision="fp8"), "precision"),
    (dict(device="v100", efficiency=0), "efficiency"),
])
def test_bad_arguments(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        retarget(_trace(), **kwargs)


def test_needs_flops():
    with pytest.raises(ConfigError, match="flops"):
        retarget(make_trace([0.1], [0.2], [10]), "v100")


def test_launch_floor_is_refused_when_negative_and_named_in_the_provenance(tmp_path):
    with pytest.raises(ConfigError, match="launch"):
        retarget(_trace(), "v100", launch_s=-1e-6)
    out = retarget(_trace(), "v100", efficiency=0.5, launch_s=25e-6)
    assert out.layers[1].forward_s == pytest.approx((0.002 + 25e-6,))
    assert out.provenance.command.endswith("--launch 25us")
    from simfog import cli
    from simfog.trace import load_model_trace

    src = tmp_path / "t.json.gz"
    _trace().save(src)
    assert cli.main(["retarget", str(src), "--device", "v100", "--efficiency", "0.5", "--launch", "25us",
                     "-o", str(tmp_path / "o.json.gz")]) == 0
    assert load_model_trace(tmp_path / "o.json.gz").layers[1].forward_s == pytest.approx((0.002 + 25e-6,))


def test_pinned_estimate_takes_the_measured_step_and_the_pinned_error(tmp_path):
    """pin_step scales every layer and the optimizer by one factor so the mean step is the measured one; the split
    over layers is the estimate's; saved and loaded it stays marked, and its compute part is the pinned estimates'
    error (the table's pinned_scores), not the roofline's."""
    import math

    from simfog.bands import conformal_quantile
    from simfog.retarget import pin_step
    from simfog.run_bands import compute_part, estimate_scores, step_samples
    from simfog.trace import load_model_trace

    est = retarget(_trace(), "v100", efficiency=0.5, launch_s=0.0)  # 0.2 + 0.4 + 0.002 + 0.004 + optimizer
    step = float(step_samples(est).mean())
    pinned = pin_step(est, 2 * step, "a measured 1 GPU run")
    assert float(step_samples(pinned).mean()) == pytest.approx(2 * step, rel=1e-12)
    ratio = [p.forward_s[0] / e.forward_s[0] for p, e in zip(pinned.layers, est.layers, strict=True)]
    assert ratio == pytest.approx([2.0, 2.0], rel=1e-12)
    assert pinned.provenance.estimated and "PINNED" in pinned.provenance.notes
    pinned.save(tmp_path / "p.json.gz")
    back = load_model_trace(tmp_path / "p.json.gz")
    assert back.extra["pinned_step_s"] == pytest.approx(2 * step)
    part = compute_part(back, 0.9)
    assert part.below == pytest.approx(conformal_quantile(estimate_scores(key="pinned_scores"), 0.9))
    assert part.below < compute_part(est, 0.9).below and "pinned" in part.source
    for bad in (0.0, -1.0, math.inf, True):
        with pytest.raises(ConfigError, match="step"):
            pin_step(est, bad, "x")


def test_cli_pins_to_a_measured_throughput(tmp_path, capsys):
    from simfog import cli
    from simfog.run_bands import step_samples
    from simfog.trace import load_model_trace

    src = tmp_path / "t.json.gz"
    _trace().save(src)
    assert cli.main(["retarget", str(src), "--device", "v100", "--samples-per-s", "2", "-o",
                     str(tmp_path / "o.json.gz")]) == 0
    out = load_model_trace(tmp_path / "o.json.gz")
    assert float(step_samples(out).mean()) == pytest.approx(out.batch_size / 2, rel=1e-12)
    assert "--samples-per-s 2" in out.extra["pinned_to"]
    assert cli.main(["retarget", str(src), "--device", "v100", "--samples-per-s", "0", "-o",
                     str(tmp_path / "z.json")]) != 0
    assert "--samples-per-s = 0.0" in capsys.readouterr().err and not (tmp_path / "z.json").exists()


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def _zoo(name):
    from simfog.trace import load_model_trace

    return load_model_trace(REPO / "traces" / f"{name}.json.gz")


def test_a_trace_with_operators_takes_the_per_layer_model_and_says_why():
    mlp = _zoo("mlp-cpu-b1024")
    explain = []
    out = retarget(mlp, "h200", explain=explain)
    assert out.extra["retarget_method"] == "per-layer model" and "per-layer model" in out.provenance.notes
    assert out.provenance.command.endswith("--device h200 --precision torch")
    # every launch says its bound and figures; the layers' passes add up to the launches' contributions
    assert {r["bound"] for r in explain} <= {"compute", "memory", "launch", "host"}
    total = sum(layer.forward_s[0] + layer.backward_s[0] for layer in out.layers) + out.optimizer_s[0]
    assert total == pytest.approx(sum(r["added_s"] for r in explain), rel=1e-12)
    assert {r["layer_name"] for r in explain} == {layer.name for layer in mlp.layers} | {"optimizer"}
    # without operators: the roofline, and it says so
    bare = replace(mlp, layers=tuple(replace(layer, ops=()) for layer in mlp.layers))
    assert "carry no operators" in retarget(bare, "h200").provenance.notes


def test_the_host_decides_a_small_model_and_can_be_set():
    """An MLP of batch 1024 is host-bound on an H200: twice the dispatch time per operator, nearly twice the step."""
    mlp = _zoo("mlp-cpu-b1024")
    step = lambda t: sum(x.forward_s[0] + x.backward_s[0] for x in t.layers)  # noqa: E731
    base = {"host.forward_op_s": 20e-6, "host.backward_op_s": 20e-6}
    slow = {"host.forward_op_s": 40e-6, "host.backward_op_s": 40e-6}
    a, b = step(retarget(mlp, "h200", host=base)), step(retarget(mlp, "h200", host=slow))
    assert 1.7 < b / a <= 2.0
    with pytest.raises(ConfigError, match="host.forward_op_s"):
        retarget(mlp, "h200", host={"host.forward_op_s": -1.0})


def test_precision_per_operator_kind():
    """torch's defaults: convolutions in TF32 where the GPU has it, matrix products in FP32; a 16-bit model runs
    its products on tensor cores."""
    r50 = _zoo("resnet50-cpu-b32")
    for device, conv_math in (("a100", "tf32"), ("v100", "simt")):
        explain = []
        retarget(r50, device, explain=explain)
        assert {r["math"] for r in explain if "conv2d" in r["what"] and r["math"]} == {conv_math}
        assert {r["math"] for r in explain if "linear" in r["what"] and r["math"]} == {"simt"}
    half, full = (retarget(r50, "a100", precision=p) for p in ("fp16", "fp32"))
    step = lambda t: sum(x.forward_s[0] + x.backward_s[0] for x in t.layers)  # noqa: E731
    assert step(half) < step(full)


def test_cli_explains_and_sets_the_host(tmp_path, capsys):
    from simfog import cli

    out = tmp_path / "o.json.gz"
    assert cli.main(["retarget", str(REPO / "traces" / "mlp-cpu-b1024.json.gz"), "--device", "NVIDIA H200",
                     "--host-op", "30us", "--explain", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bound" in text and "step by bound:" in text and "ESTIMATED (per-layer model)" in text
    assert "30.0 us per forward" in __import__("simfog.trace", fromlist=["x"]).load_model_trace(out).provenance.notes


def test_the_h200_coverage_is_computed_from_the_shipped_scores():
    """The 90 % interval of a retargeted step (conformal on the shipped held-out scores) is checked on the H200 runs
    the model never learned from: the fraction inside is computed here from the shipped model's estimates, and is
    what the model's provenance reports (bench/retarget.py, part 4)."""
    import json
    import math

    import numpy as np

    from simfog.bands import conformal_quantile
    from simfog.gpu.model import MODEL
    from simfog.run_bands import estimate_scores
    from simfog.trace import load_model_trace

    scores = estimate_scores()
    pairs = __import__("tomllib").loads((REPO / "simfog" / "data" / "compute_estimates.toml").read_text())
    assert len(pairs["estimates"]["pairs"]) == len(scores) and min(scores) >= 0
    q = conformal_quantile(scores, 0.9)
    inside = []
    for cpu in sorted((REPO / "traces").glob("*-cpu-*.json.gz")):
        model, batch = cpu.name.removesuffix(".json.gz").split("-cpu-")
        est = retarget(load_model_trace(cpu), "h200")
        predicted = sum(x.forward_s[0] + x.backward_s[0] for x in est.layers) + est.optimizer_s[0]
        for run in sorted((REPO / "traces" / "h200").glob(f"{model}-h200-{batch}-run*.json.gz")):
            real = load_model_trace(run)
            measured = (np.median(np.array([x.forward_s for x in real.layers]).sum(0))
                        + np.median(np.array([x.backward_s for x in real.layers]).sum(0)) + np.median(real.optimizer_s))
            inside.append(abs(math.log(measured / predicted)) <= q)
    assert len(inside) == 14
    shipped = json.loads(MODEL.read_text())["provenance"]["held_out"]["h200_coverage90"]
    assert sum(inside) / len(inside) == pytest.approx(shipped)


def test_every_gpu_of_the_table_in_every_precision():
    import math

    from simfog.gpu.specs import DEVICES as TABLE

    r20 = _zoo("resnet20-cpu-b32")
    for name in TABLE.names():
        steps = {}
        for precision in ("torch", "fp32", "tf32", "fp16", "bf16"):
            out = retarget(r20, name, precision=precision)
            steps[precision] = sum(x.forward_s[0] + x.backward_s[0] for x in out.layers) + out.optimizer_s[0]
            assert math.isfinite(steps[precision]) and steps[precision] > 0, (name, precision)
        assert steps["fp16"] <= steps["fp32"] * 1.001, name  # 16 bits never costs more than 32
