"""Retargeting by roofline: closed-form layer times, and the result is marked estimated everywhere."""

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
