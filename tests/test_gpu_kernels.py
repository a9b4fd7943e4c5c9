"""simfog.gpu's kernel costs, host timeline and layer decomposition against answers worked out by hand."""

import math

import numpy as np
import pytest

from simfog.gpu import host as H
from simfog.gpu import kernels as K
from simfog.gpu import layers as L
from simfog.gpu.specs import DEVICES

# A made-up GPU of 4 SMs at 1 GHz, 1 TFLOP/s per SM, 1 TB/s, no L2 to speak of, and power to spare.
GPU = {"sms": np.array([4.0]), "clock": np.array([1e9]), "lanes": np.array([64.0]), "shared": np.array([False]),
       "power": np.array([1e6]), "major": np.array([8]), "bw": np.array([1e12]), "l2": np.array([1.0]),
       "peak": np.array([4e12])}
PARAMS = {"eff.simt": 0.5, "eff.shared": 1.0, "eff.tf32": 0.5, "eff.fp16": 0.5, "gemm.intensity_half": 64.0,
          "gemm.depth_half": 0.0, "gemm.saturation": 8.0, "memory.efficiency": 1.0, "kernel.fixed_s": 1e-6,
          "power.kappa": 1e-9, "power.gamma": 1.0, "stream.elementwise": 0.5}


def gemm(m, n, k, b=1):
    return K.tiled(GPU, b, m, n, k, ["simt"], 4, 4)


def test_tiles_and_waves_of_a_small_gemm():
    # 256 x 256 x 64 on 4 SMs. A 128 x 128 tile: 4 tiles, one per SM, 2 may share an SM (a wave is 2 tiles' work);
    # intensity 128*128/256 = 64 -> efficiency 0.5 x 64 / (64 + 64) = 0.25 of 1e12 per SM:
    # 2 x (2 x 128 x 128 x 64) / (1e12 x 0.25) = 16.78 us, + 1 us fixed. Smaller tiles lose more to intensity:
    # 128 x 64 (intensity 42.7, 0.2 of peak, 4 resident, 2 per SM): 4 x 2 x 128 x 64 x 64 / 2e11 = 20.97 us.
    t, d = K.predict(PARAMS, gemm(256, 256, 64), detail=True)
    assert (d["tm"][0], d["tn"][0], d["split"][0], d["waves"][0]) == (128, 128, 1, 1)
    assert d["efficiency"][0] == pytest.approx(0.25)
    assert t[0] == pytest.approx(2 * 2 * 128 * 128 * 64 / (1e12 * 0.25) + 1e-6, rel=1e-12)
    assert K.BOUNDS[d["bound"][0]] == "compute" and d["flops"][0] == 2 * 256 * 256 * 64
    assert d["bytes"][0] == 4 * (256 * 64 + 64 * 256 + 256 * 256)


def test_twice_the_tiles_take_two_waves():
    # 512 x 512: 16 tiles of 128 x 128 over 4 SMs, 2 at a time: 2 waves, twice the time of one.
    t, d = K.predict(PARAMS, gemm(512, 512, 64), detail=True)
    assert (d["tm"][0], d["tn"][0], d["waves"][0]) == (128, 128, 2)
    assert t[0] == pytest.approx(2 * 2 * 2 * 128 * 128 * 64 / (1e12 * 0.25) + 1e-6, rel=1e-12)


def test_a_partial_wave_below_saturation_costs_its_tiles_only():
    # With a saturation of 1 tile, one 128 x 128 tile alone on an SM costs one tile's work, not two.
    one = K.predict({**PARAMS, "gemm.saturation": 1.0}, gemm(256, 256, 64))[0]
    assert one == pytest.approx(2 * 128 * 128 * 64 / (1e12 * 0.25) + 1e-6, rel=1e-12)


def test_matrix_vector_products_are_memory_bound():
    t, d = K.predict(PARAMS, gemm(4096, 1, 4096), detail=True)
    nbytes = 4 * (4096 * 4096 + 4096 + 4096)
    assert t[0] == pytest.approx(nbytes / 1e12 + 1e-6, rel=1e-12) and K.BOUNDS[d["bound"][0]] == "memory"


def test_streams_and_the_power_limit():
    s = K.streams(GPU, 1e6, ["elementwise"])
    assert K.predict(PARAMS, s)[0] == pytest.approx(1e6 / (1e12 * 0.5) + 1e-6, rel=1e-12)
    # 1 W for 64 lanes x 4 SMs x 1 GHz at kappa 0.01 W per lane-GHz (2.56 W): the clock at 1 / 2.56 (gamma 1)
    weak = {**GPU, "power": np.array([1.0])}
    phi = K.power_factor({**PARAMS, "power.kappa": 0.01}, weak)[0]
    assert phi == pytest.approx(1 / 2.56)
    slow = K.predict({**PARAMS, "power.kappa": 0.01}, K.tiled(weak, 1, 256, 256, 64, ["simt"], 4, 4))[0]
    fast = K.predict(PARAMS, gemm(256, 256, 64))[0]
    assert (slow - 1e-6) == pytest.approx((fast - 1e-6) / phi, rel=1e-12)


def test_host_timeline_by_hand():
    # kernels of 10, 1, 1 us issued after 5 us of host each: issued at 5, 10, 15; the first runs 5-15, the second
    # waits for it (15-16), the third is issued at 15 and starts at 16: the host never makes the GPU wait again.
    added, waited = H.timeline(np.array([10e-6, 1e-6, 1e-6]), np.array([5e-6, 5e-6, 5e-6]))
    assert added == pytest.approx([15e-6, 1e-6, 1e-6]) and list(waited) == [True, False, False]
    # slow kernels hide the host; a slow host makes every launch wait
    added, waited = H.timeline(np.array([1e-6] * 3), np.array([5e-6] * 3))
    assert added.sum() == pytest.approx(16e-6) and all(waited)


def test_a_convolution_becomes_its_implicit_gemms():
    conv = {"kind": "conv", "op": "conv2d", "dtype": "float32", "grad": True, "n": 8, "c": 64, "h": 56, "w": 56,
            "k": 128, "r": 3, "s": 3, "p": 56, "q": 56, "stride": [1, 1], "pad": [1, 1], "dilation": [1, 1],
            "groups": 1, "bias": False}
    a100 = DEVICES.get("a100")
    launches = L.op_launches(conv, 0, 0, "torch", a100)
    shapes = {x.what: x.shape[:5] for x in launches}
    assert shapes == {"conv2d fwd": (1, 8 * 56 * 56, 128, 64 * 9, "tf32"),
                      "conv2d dgrad": (1, 8 * 56 * 56, 64, 128 * 9, "tf32"),
                      "conv2d wgrad": (1, 128, 64 * 9, 8 * 56 * 56, "tf32")}
    # the first convolution of a network has no input gradient to compute; a V100 has no TF32
    first = L.op_launches({**conv, "grad": False}, 0, 0, "torch", DEVICES.get("v100"))
    assert [x.what for x in first] == ["conv2d fwd", "conv2d wgrad"] and first[0].shape[4] == "simt"


def test_additions_pass_their_gradient_on_and_the_optimizer_reads_each_parameter_eight_times():
    add = {"kind": "elementwise", "op": "add", "dtype": "float32", "grad": True, "elements": 1000, "inputs": 2}
    relu = {**add, "op": "relu", "inputs": 1}
    assert [x.phase for x in L.op_launches(add, 0, 0, "torch", DEVICES.get("a100"))] == ["forward"]
    relu_launches = L.op_launches(relu, 0, 0, "fp16", DEVICES.get("a100"))
    assert [(x.phase, x.nbytes) for x in relu_launches] == [("forward", 2 * 1000 * 2), ("backward", 3 * 2 * 1000)]
    opt = L.optimizer_launches([100] * 220, 4)  # 220 tensors: 2 chunks of 110, 3 foreach passes each
    assert len(opt) == 6 and sum(x.nbytes for x in opt) == pytest.approx(8 * 4 * 100 * 220)
    assert math.isclose(sum(x.nbytes for x in L.optimizer_launches([7], 2)), 8 * 2 * 7)
