"""Compressed allreduce (ByteGrad, QAdam, fp16, PowerSGD): wire byte counts, codec time, and iteration times against
their α-β forms on hand-computed cases; the symmetric fast path equals the explicit engine."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from simfog.algorithms.allreduce.compressed import powersgd_sizes
from simfog.algorithms.codecs import CODEC_BANDWIDTH_Bps, minmax_uint8_bytes
from simfog.cluster import Link
from simfog.errors import ConfigError
from simfog.experiment import Heterogeneity
from simfog.simulation import new_simulation, simulate

from .conftest import make_experiment, make_trace
from .test_decentralized import load_with_comm

A, B = 1e-3, 1e-9        # linear collective: T(M) = 1 ms + M · 1 ns
M = 4_000_000            # one float32 tensor of 1e6 elements
T_F, T_B, T_OPT = 0.010, 0.020, 0.005
CODEC = 1e9              # comm.encode_bandwidth: 1 GB/s per pass


def run(algorithm, *, nodes=4, gpus=1, elements=(M // 4,), names=None, **comm):
    k = len(elements)
    trace = make_trace([T_F / k] * k, [T_B / k] * k, list(elements), optimizer=T_OPT)
    comm.setdefault("merge", "single")
    comm.setdefault("encode_bandwidth_Bps", CODEC)
    comm.setdefault("alpha", A)
    comm.setdefault("beta", B)
    exp = make_experiment(trace, nodes=nodes, gpus_per_node=gpus, algorithm=algorithm, **comm)
    res = simulate(exp)
    return res, res.summary()


def test_minmax_uint8_wire_bytes():
    # Per chunk: the uint8 values padded to 32 B, plus (min, max) padded to 32 B (bagua-core datatypes.rs).
    assert minmax_uint8_bytes(1000, 1) == 1024 + 32
    assert minmax_uint8_bytes(1000, 4) == 4 * (256 + 32)
    assert minmax_uint8_bytes(2**20, 8) == 2**20 + 8 * 32      # ≈ M/4 + 32 B per chunk for M = 4 MiB
    assert minmax_uint8_bytes(1, 1) == 64


def test_fp16_halves_the_bytes_and_pays_two_casts():
    # wire 2 MB: allreduce 1 + 2 = 3 ms; codec 2 passes x 4 MB at 1 GB/s = 8 ms; after backward (one layer).
    res, s = run("fp16")
    assert res.buckets[0]["wire_bytes"] == M // 2
    assert res.buckets[0]["codec_s"] == pytest.approx(2 * M / CODEC)
    assert s["iteration_time_s"] == pytest.approx(T_F + T_B + (A + B * M / 2) + 2 * M / CODEC + T_OPT, rel=1e-12)


def test_bytegrad_flat_is_two_compressed_ring_passes():
    # Not hierarchical, 4 ranks on 4 nodes, ring collective over NICs of 1 ms, 1 GB/s: wire = 4 chunks of
    # 250,000 B padded to 250,016 B, + 32 B of min/max each = 1,000,192 B; alltoall and allgather each cost a ring
    # allgather of it: 3 steps of (1 ms + 250,048 ns); codec (3 + 1/4) x 4 MB at 1 GB/s = 13 ms.
    res, s = run("bytegrad", collective="ring", nic=Link(1e-3, 1e9), hierarchical=False)
    wire = minmax_uint8_bytes(M // 4, 4)
    assert wire == 1_000_192 and res.buckets[0]["wire_bytes"] == wire
    comm = 2 * 3 * (1e-3 + wire / 4 / 1e9)
    assert res.buckets[0]["comm_s"] == pytest.approx(comm, rel=1e-12)
    assert s["iteration_time_s"] == pytest.approx(T_F + T_B + comm + 3.25 * M / CODEC + T_OPT, rel=1e-12)


def test_bytegrad_hierarchical_reduces_in_the_node_first():
    # 2 nodes x 2 ranks, linear collective: node reduce (1 + 4 ms) + broadcast (1 + 4 ms) + leaders' alltoall and
    # allgather of 2 chunks (2 x (1 ms + 1,000,064 ns)) + codec (3 + 1/2) x 4 MB / 1 GB/s = 14 ms.
    res, s = run("bytegrad", nodes=2, gpus=2)
    wire = minmax_uint8_bytes(M // 4, 2)
    expected = 2 * (A + B * M) + 2 * (A + B * wire) + 3.5 * M / CODEC
    assert res.buckets[0]["allreduce_s"] == pytest.approx(expected, rel=1e-12)
    assert s["iteration_time_s"] == pytest.approx(T_F + T_B + expected + T_OPT, rel=1e-12)
    # QAdam (after warm-up) sends the momentum the same way.
    assert run("qadam", nodes=2, gpus=2)[1]["iteration_time_s"] == s["iteration_time_s"]


def test_powersgd_sizes():
    assert powersgd_sizes(1_000_000, 1) == (1000, 1000, True)        # 1000 x 1000: 2000 elements instead of 1e6
    assert powersgd_sizes(1_000_000, 4) == (4000, 4000, True)
    assert powersgd_sizes(16, 1) == (0, 0, False)                     # 4 x 4: (4 + 4)·1·2 = 16, not < 16
    assert powersgd_sizes(25, 1) == (5, 5, True)                      # 5 x 5: 20 < 25
    assert powersgd_sizes(100, 4) == (0, 0, False)                    # 10 x 10 at rank 4: 160 >= 100
    assert powersgd_sizes(5000, 1, vector=True) == (0, 0, False)      # 1-D tensors stay whole


def test_powersgd_allreduces_uncompressed_then_p_then_q():
    # A 1e6-element weight compresses to P, Q of 1000 float32 each; a 1000-element bias stays whole (4000 B).
    # Three allreduces one after the other: (1 + 4e-3) + (1 + 4e-3) + (1 + 4e-3) ms; codec 5 passes over 4 MB.
    trace = make_trace([T_F / 2] * 2, [T_B / 2] * 2, [1000, M // 4], optimizer=T_OPT)
    trace = replace(trace, layers=(replace(trace.layers[0], params=(replace(trace.layers[0].params[0],
                                                                                 name="l0.bias"),)),
                                   trace.layers[1]), grad_ready_order=("l1.weight", "l0.bias"))
    exp = make_experiment(trace, nodes=4, gpus_per_node=1, algorithm="powersgd", merge="single",
                          encode_bandwidth_Bps=CODEC, alpha=A, beta=B)
    res = simulate(exp)
    b = res.buckets[0]
    assert b["wire_bytes"] == 4000 + 4000 + 4000
    assert b["comm_s"] == pytest.approx(3 * A + B * 12000, rel=1e-12)
    assert b["codec_s"] == pytest.approx(5 * M / CODEC, rel=1e-12)
    assert res.summary()["iteration_time_s"] == pytest.approx(T_F + T_B + b["allreduce_s"] + T_OPT, rel=1e-12)


def test_codec_is_scaled_by_the_slowest_rank():
    trace = make_trace([T_F], [T_B], [M // 4], optimizer=T_OPT)
    exp = make_experiment(trace, nodes=4, gpus_per_node=1, algorithm="fp16", merge="single",
                          encode_bandwidth_Bps=CODEC, alpha=A, beta=B)
    slow = replace(exp, heterogeneity=Heterogeneity(rank_slowdown=((2, 1.5),)))
    assert simulate(slow).buckets[0]["codec_s"] == pytest.approx(1.5 * simulate(exp).buckets[0]["codec_s"])


def test_default_codec_bandwidths_are_used():
    res, _ = run("fp16", encode_bandwidth_Bps=None)
    assert res.buckets[0]["codec_s"] == pytest.approx(2 * M / CODEC_BANDWIDTH_Bps["fp16"])


@pytest.mark.parametrize("algorithm", ["fp16", "bytegrad", "qadam", "powersgd"])
@pytest.mark.parametrize("merge", ["ddp", "wfbp", "mgwfbp"])
def test_symmetric_fast_path_equals_explicit_engine_exactly(algorithm, merge):
    rng = np.random.default_rng(3)
    n = 12
    trace = make_trace(rng.uniform(1e-3, 5e-3, n), rng.uniform(1e-3, 1e-2, n), rng.integers(1, 3_000_000, n),
                       optimizer=1e-3)
    exp = make_experiment(trace, nodes=4, gpus_per_node=2, algorithm=algorithm, merge=merge, collective="ring")
    fast, explicit = simulate(exp), simulate(exp, symmetric=False)
    assert fast.symmetric and not explicit.symmetric
    # Summaries agree to rounding (means over 1 rank vs 8 identical ranks); the intervals agree exactly.
    f, e = fast.summary(), explicit.summary()
    for key in f.keys() - {"symmetric_fast_path"}:
        assert f[key] == (pytest.approx(e[key], rel=1e-12) if isinstance(f[key], float) else e[key]), key
    a = fast.intervals().sort_values(["rank", "iteration", "start_s", "kind", "name"]).reset_index(drop=True)
    b = explicit.intervals().sort_values(["rank", "iteration", "start_s", "kind", "name"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_horovod_fusion_is_not_combined_with_compression():
    with pytest.raises(ConfigError, match="comm.merge"):
        run("bytegrad", merge="horovod")


def test_one_rank_costs_nothing():
    _, s = run("bytegrad", nodes=1)
    assert s["iteration_time_s"] == pytest.approx(T_F + T_B + T_OPT)


def test_compression_keys_parse(tmp_path):
    exp = load_with_comm(tmp_path, 'encode_bandwidth = "5GB/s"\npowersgd_rank = 4')
    assert exp.comm.encode_bandwidth_Bps == 5e9 and exp.comm.powersgd_rank == 4
    exp = replace(exp, comm=replace(exp.comm, algorithm="powersgd"))
    assert new_simulation(exp).run().summary()["ranks"] == 4
    for extra, field in (("encode_bandwidth = 5", "comm.encode_bandwidth"),
                         ('encode_bandwidth = "0GB/s"', "comm.encode_bandwidth"),
                         ("powersgd_rank = 0", "comm.powersgd_rank")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_with_comm(tmp_path, extra)
