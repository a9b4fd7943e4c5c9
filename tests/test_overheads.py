"""Costs beyond the wire: bucket copies, per-collective overhead and overlap slowdown, against hand-checked numbers,
and where each input came from (experiment file, the trace's measurement, or unmeasured)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from simfog import experiment
from simfog.errors import ConfigError
from simfog.simulation import simulate

from .conftest import make_experiment, make_trace

# 2 layers: forward 1 ms each, backward 2 ms each, 250,000 float32 elements (1 MB) each; wfbp: one bucket per layer.
# Linear allreduce T(M) = 1 ms + 1 ns/B * 1 MB = 2 ms. Bucket 0 (layer 1's gradient) is ready 2 ms into backward,
# bucket 1 (layer 0's) at 4 ms. Without overheads: bucket 0 runs [2, 4], bucket 1 [4, 6]; iteration 2 + 6 = 8 ms.
F, B, N, ALPHA, BETA = 1e-3, 2e-3, 250_000, 1e-3, 1e-9
M = 4 * N
T = ALPHA + BETA * M


def _experiment(merge="wfbp", layers=2, **comm):
    trace = make_trace([F] * layers, [B] * layers, [N] * layers)
    return make_experiment(trace, nodes=1, gpus_per_node=2, merge=merge, alpha=ALPHA, beta=BETA, **comm)


def _iteration(exp) -> float:
    return simulate(exp).summary()["iteration_time_s"]


def test_baseline_is_the_closed_form():
    assert _iteration(_experiment()) == pytest.approx(2 * F + 3 * B, rel=1e-12)  # 8 ms


def test_bucket_copies_pack_before_and_unpack_after_each_collective():
    w, o = 1e9, 20e-6  # 1 GB/s: 1 ms per 1 MB copy
    c = M / w
    end0 = B + c + o + T + c                      # pack, launch, allreduce, unpack: 6.02 ms
    end1 = max(2 * B, end0) + c + o + T + c       # bucket 1 is ready at 4 ms but the stream is busy: 10.04 ms
    exp = _experiment(bucket_copy_Bps=w, collective_overhead_s=o)
    assert _iteration(exp) == pytest.approx(2 * F + end1, rel=1e-12)  # 12.04 ms
    names = set(simulate(exp).intervals().query("kind == 'comm' and iteration == 0 and rank == 0")["name"])
    assert names == {"bucket0", "bucket1", "bucket0.pack", "bucket0.overhead", "bucket0.unpack", "bucket1.pack",
                     "bucket1.overhead", "bucket1.unpack"}


@pytest.mark.parametrize("merge, collectives", [("wfbp", 2), ("single", 1)])
def test_overhead_adds_one_overhead_per_collective_on_the_critical_path(merge, collectives):
    o = 20e-6
    base = _iteration(_experiment(merge))
    assert _iteration(_experiment(merge, collective_overhead_s=o)) == pytest.approx(base + collectives * o, rel=1e-12)


def test_copies_with_several_streams_unpack_on_each_collective_s_stream():
    w = 1e9
    exp = _experiment(bucket_copy_Bps=w, streams=2)
    s = simulate(exp).summary()
    # Both buckets fit the two streams; bucket 1 (launched at 4 ms, after bucket 0's pack at [2, 3]) is the last:
    # channel sharing only slows bucket 0 (3-5 ms alone, shared from 5 ms), so the end is at least 4+1+2+1 ms.
    assert s["iteration_time_s"] >= 2 * F + 2 * B + 2 * M / w + T - 1e-12
    assert s["iteration_time_s"] > _iteration(_experiment(streams=2))


def test_overlap_slowdown_stretches_backward_after_the_first_launch():
    # Factor 1.5 from bucket 0's launch at 2 ms: layer 0's backward takes 3 ms, so it ends (and bucket 1 is ready)
    # at 5 ms; bucket 0 ran [2, 4]; bucket 1 runs [5, 7]; iteration 2 + 7 = 9 ms.
    assert _iteration(_experiment(overlap_slowdown=1.5)) == pytest.approx(2 * F + 2 * B + B * 1.5 - B + T, rel=1e-12)
    assert _iteration(_experiment(overlap_slowdown=1.5)) == pytest.approx(9e-3, rel=1e-12)
    # One bucket launched after backward: nothing overlaps, nothing slows.
    assert _iteration(_experiment("single", overlap_slowdown=1.5)) == _iteration(_experiment("single"))


@pytest.mark.parametrize("merge", ["wfbp", "ddp", "horovod"])
def test_defaults_leave_results_bit_identical(merge):
    samples = [([1e-3, 2e-3, 1e-3], [2e-3, 3e-3, 1e-3]), ([1.2e-3, 2e-3, 0.9e-3], [2.5e-3, 3e-3, 1.1e-3])]
    trace = make_trace([0] * 3, [0] * 3, [N, 10, N], samples=samples)
    plain = make_experiment(trace, merge=merge, compute="samples", iterations=4)
    explicit = plain.with_comm(overlap_slowdown=1.0, collective_overhead_s=0.0, bucket_copy_Bps=0.0)
    a, b = simulate(plain), simulate(explicit)
    pd.testing.assert_frame_equal(a.intervals(), b.intervals(), check_exact=True)
    sa, sb = a.summary(), b.summary()
    assert sa["overlap_slowdown_source"] == "unmeasured: 1" and sb["overlap_slowdown_source"] == "experiment file"
    strip = lambda s: {k: v for k, v in s.items() if not k.endswith("_source")}  # noqa: E731
    assert strip(sa) == strip(sb)


def test_horovod_fused_buffer_pays_copies_and_overhead():
    # One layer, backward 1.5 ms: the gradient is ready at 2.5 ms, the 1 ms cycle picks it up at 3 ms; then pack 1 ms,
    # overhead 20 us, allreduce 2 ms, unpack 1 ms: iteration 0 ends at 7.02 ms.
    trace = make_trace([F], [1.5e-3], [N])
    exp = make_experiment(trace, nodes=1, gpus_per_node=2, merge="horovod", alpha=ALPHA, beta=BETA, iterations=1,
                          cycle_time_s=1e-3, bucket_copy_Bps=1e9, collective_overhead_s=20e-6)
    assert _iteration(exp) == pytest.approx(3e-3 + 2e-3 + 20e-6 + T, rel=1e-9)


# ---- where each input comes from ----

def _measured_trace(**rec):
    trace = make_trace([F, F], [B, B], [N, N])
    return replace(trace, extra={"comm_overheads": {"how": "flat copy, median of 5", "device": "Test CPU", **rec}})


def test_sources_unmeasured_measured_and_experiment_file():
    s = simulate(_experiment()).summary()
    assert (s["bucket_copy_Bps"], s["bucket_copy_Bps_source"]) == (0.0, "unmeasured: 0")
    assert (s["collective_overhead_s"], s["collective_overhead_s_source"]) == (0.0, "unmeasured: 0")
    assert (s["overlap_slowdown"], s["overlap_slowdown_source"]) == (1.0, "unmeasured: 1")

    trace = _measured_trace(bucket_copy_Bps=1e9, overlap_slowdown=None)
    exp = make_experiment(trace, nodes=1, gpus_per_node=2, alpha=ALPHA, beta=BETA)
    s = simulate(exp).summary()
    assert s["bucket_copy_Bps"] == 1e9
    assert s["bucket_copy_Bps_source"].startswith("measured on Test CPU by the collector (flat copy")
    assert s["overlap_slowdown_source"] == "unmeasured: 1"
    c = M / 1e9
    assert s["iteration_time_s"] == pytest.approx(2 * F + max(2 * B, B + 2 * c + T) + 2 * c + T, rel=1e-12)

    s = simulate(exp.with_comm(bucket_copy_Bps=2e9)).summary()
    assert (s["bucket_copy_Bps"], s["bucket_copy_Bps_source"]) == (2e9, "experiment file")


def test_other_algorithms_say_they_do_not_model_the_overheads():
    trace = _measured_trace(bucket_copy_Bps=1e9)
    exp = make_experiment(trace, nodes=1, gpus_per_node=2, alpha=ALPHA, beta=BETA, algorithm="fp16")
    o = exp.overheads()
    assert o.bucket_copy_Bps == 0.0 and o.sources["bucket_copy_Bps"] == "not modelled by algorithm fp16: 0"


def test_a_bad_measured_value_in_the_trace_is_a_config_error():
    exp = make_experiment(_measured_trace(overlap_slowdown=0.5), alpha=ALPHA, beta=BETA)
    with pytest.raises(ConfigError, match="comm_overheads.overlap_slowdown"):
        exp.overheads()


# ---- the experiment file ----

BASE = """
[workload]
trace = "t.json"
compute = "mean"

[cluster]
nodes = 1
gpus_per_node = 2
nic_bandwidth = "25Gbit/s"

[comm]
"""


@pytest.fixture
def folder(tmp_path):
    make_trace([F, F], [B, B], [N, N]).save(tmp_path / "t.json")
    return tmp_path


def _load(folder, text):
    path = folder / "e.toml"
    path.write_text(BASE + text)
    return experiment.load(path)


def test_experiment_keys_in_human_units(folder):
    exp = _load(folder, 'bucket_copy_bandwidth = "10GB/s"\ncollective_overhead = "20us"\noverlap_slowdown = 1.25\n')
    assert (exp.comm.bucket_copy_Bps, exp.comm.collective_overhead_s, exp.comm.overlap_slowdown) == (1e10, 2e-5, 1.25)
    assert set(exp.overheads().sources.values()) == {"experiment file"}
    exp = _load(folder, "")
    assert (exp.comm.bucket_copy_Bps, exp.comm.collective_overhead_s, exp.comm.overlap_slowdown) == (None,) * 3


@pytest.mark.parametrize("line, field", [
    ("bucket_copy_bandwidth = 10", "comm.bucket_copy_bandwidth"),
    ('bucket_copy_bandwidth = "10us"', "comm.bucket_copy_bandwidth"),
    ('collective_overhead = "-1us"', "comm.collective_overhead"),
    ('collective_overhead = "20"', "comm.collective_overhead"),
    ("overlap_slowdown = 0.9", "comm.overlap_slowdown"),
    ('overlap_slowdown = "1.5"', "comm.overlap_slowdown"),
    ("overlap_slowdown = true", "comm.overlap_slowdown"),
    ('algorithm = "neighbor"\ncollective_overhead = "20us"', "comm.collective_overhead"),
])
def test_bad_values_name_field_value_and_allowed(folder, line, field):
    with pytest.raises(ConfigError) as e:
        _load(folder, line + "\n")
    assert e.value.field == field and str(folder / "e.toml") in str(e.value)


def test_an_input_s_own_how_note_wins_over_the_record_s():
    trace = _measured_trace(bucket_copy_Bps=1e9, overlap_slowdown=1.25, overlap_slowdown_how="backward beside gloo")
    o = make_experiment(trace, nodes=1, gpus_per_node=2, alpha=ALPHA, beta=BETA).overheads()
    assert o.overlap_slowdown == 1.25
    assert o.sources["overlap_slowdown"] == "measured on Test CPU by the collector (backward beside gloo)"
    assert o.sources["bucket_copy_Bps"] == "measured on Test CPU by the collector (flat copy, median of 5)"
