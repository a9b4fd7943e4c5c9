"""Sharded data parallelism (simfog.algorithms.sharded): hand-worked iterations of fsdp, hsdp and ZeRO 1-3, the
sequential identity of one unit, memory per rank, config errors and an end-to-end CLI run.

Every example uses collective = "linear": each collective takes T(M) = 1 ms + 1 ns/B · M whatever its kind and
group, so the schedules below can be worked out with a pencil (a 4 MB buffer takes 5 ms, 8 MB 9 ms, 16 MB 17 ms).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog.errors import ConfigError
from simfog.experiment import from_dict
from simfog.simulation import new_simulation, simulate

from .conftest import make_experiment, make_trace

MS, MB, M = 1e-3, 10**6, 10**6


def _iteration(trace, algorithm, **comm):
    """Mean iteration time (s) on 2 nodes x 2 GPUs, linear cost 1 ms + 1 ns/B, fixed layer times."""
    exp = make_experiment(trace, algorithm=algorithm, alpha=1e-3, beta=1e-9, **comm)
    return simulate(exp).summary()["iteration_time_s"]


# Two layers: forward 10 and 20 ms, backward 20 and 40 ms, 1 M and 2 M float32 elements (4 MB, 8 MB):
# all-gathers and reduce-scatters of l0 take 5 ms, of l1 9 ms.
TWO = make_trace([0.01, 0.02], [0.02, 0.04], [M, 2 * M])


def test_fsdp_reshard_and_prefetch_one_by_hand():
    # ag stream: AG0 0-5, AG1 5-14 (prefetched when forward reaches l0). F0 5-15, F1 15-35.
    # Backward of l1 issues its all-gather and l0's: AG1' 35-44, AG0' 44-49. B1 44-84, then RS1 84-93;
    # B0 84-104 (AG0' done at 49), then wait RS1 (done) and RS0 104-109; the optimizer (0 s) waits: 109 ms.
    assert _iteration(TWO, "fsdp") == pytest.approx(0.109, rel=1e-12)


def test_fsdp_without_prefetch_by_hand():
    # AG0 0-5, F0 5-15; AG1 15-24, F1 24-44; AG1' 44-53, B1 53-93, RS1 93-102. B0's all-gather is issued at 93 on
    # its own stream, after RS1 on the same process group: one communicator runs one collective at a time, in issue
    # order (NCCL serialises a communicator's kernels), so AG0' 102-107 (not 93-98), B0 107-127, RS0 127-132.
    assert _iteration(TWO, "fsdp", prefetch=0) == pytest.approx(0.132, rel=1e-12)


def test_fsdp_without_reshard_after_forward_by_hand():
    # AG0 0-5, AG1 5-14, F0 5-15, F1 15-35; no all-gather in backward: B1 35-75, RS1 75-84, B0 75-95, RS0 95-100.
    assert _iteration(TWO, "fsdp", reshard_after_forward=False) == pytest.approx(0.100, rel=1e-12)


def test_fsdp_collective_overhead_lengthens_every_collective_by_hand():
    # 0.5 ms of host work per collective (simfog.overheads): AG0 0-5.5, F0 5.5-15.5; AG1 15.5-25, F1 25-45;
    # AG1' 45-54.5, B1 54.5-94.5, RS1 94.5-104; AG0' 104-109.5, B0 109.5-129.5, RS0 129.5-135 ms.
    assert _iteration(TWO, "fsdp", prefetch=0, collective_overhead_s=5e-4) == pytest.approx(0.135, rel=1e-12)
    exp = make_experiment(TWO, algorithm="fsdp", collective_overhead_s=5e-4)
    assert exp.overheads().sources["collective_overhead_s"] == "experiment file"
    assert exp.overheads().sources["bucket_copy_Bps"] == "not modelled by algorithm fsdp: 0"


def test_fsdp_backward_waits_for_the_previous_reduce_scatter():
    # Three layers of 0, 1 and 20 M elements (l1: 4 MB, 5 ms; l2: 80 MB, 81 ms), every layer 1 ms, no reshard.
    # F0 0-1 (no parameters), AG1 0-5, F1 5-6, AG2 5-86 (prefetched at F1), F2 86-87. B2 87-88, RS2 88-169.
    # B1 88-89; l1's post_backward waits for RS2 (169), then RS1 169-174; so B0 runs 169-170, not 89-90.
    # The optimizer waits for RS1: 174.
    trace = make_trace([1e-3] * 3, [1e-3] * 3, [0, M, 20 * M])
    exp = make_experiment(trace, algorithm="fsdp", alpha=1e-3, beta=1e-9, reshard_after_forward=False, iterations=1)
    df = simulate(exp).intervals()
    b0 = df[(df["rank"] == 0) & (df.kind == "backward") & (df.name == "l0")].iloc[0]
    assert b0.start_s == pytest.approx(0.169, rel=1e-12)
    assert df[df.kind == "optimizer"].start_s.max() == pytest.approx(0.174, rel=1e-12)


def test_fsdp_optimizer_updates_only_the_shard():
    # As the first example with an 8 ms optimizer step on 4 ranks: 2 ms more.
    trace = make_trace([0.01, 0.02], [0.02, 0.04], [M, 2 * M], optimizer=0.008)
    assert _iteration(trace, "fsdp") == pytest.approx(0.111, rel=1e-12)


def test_fsdp_mixed_precision_changes_bytes():
    exp = make_experiment(TWO, algorithm="fsdp", param_dtype="bfloat16")
    colls = new_simulation(exp).algorithm.describe_buckets()
    assert {c["bytes"] for c in colls if c["collective"] == "allgather"} == {2 * MB, 4 * MB}
    assert {c["bytes"] for c in colls if c["collective"] == "reduce_scatter"} == {2 * MB, 4 * MB}  # param_dtype
    exp = make_experiment(TWO, algorithm="fsdp", param_dtype="bfloat16", reduce_dtype="float32")
    colls = new_simulation(exp).algorithm.describe_buckets()
    assert {c["bytes"] for c in colls if c["collective"] == "reduce_scatter"} == {4 * MB, 8 * MB}


def test_fsdp_units_by_counts_and_size():
    trace = make_trace([1e-3] * 4, [1e-3] * 4, [M, M, M, M])
    units = lambda spec: new_simulation(make_experiment(trace, algorithm="fsdp", fsdp_unit=spec)).algorithm.units  # noqa: E731
    assert units("model") == [(0, 1, 2, 3)]
    assert units((1, 3)) == [(0,), (1, 2, 3)]
    assert units(8e6) == [(0, 1), (2, 3)]  # closes once the unit reaches 8 MB
    with pytest.raises(ConfigError, match="adding up"):
        units((1, 2))


def test_hsdp_by_hand():
    # Groups of 2 (one node). As the first fsdp example, plus the allreduce of each unit's 1/2 shard across the
    # nodes after its reduce-scatter: AR1 (4 MB) 93-98, AR0 (2 MB) after RS0 (104-109): 109-112.
    assert _iteration(TWO, "hsdp") == pytest.approx(0.112, rel=1e-12)


# Three layers: forward 10 ms each, backward 20, 20, 40 ms; 1 M, 1 M, 2 M elements; reduce_bucket_size 2 M.
THREE = make_trace([0.01] * 3, [0.02, 0.02, 0.04], [M, M, 2 * M])
BUCKET = {"reduce_bucket_size": 2 * M}


def test_zero2_reduces_in_the_compute_stream_without_overlap():
    # Ready order l2, l1, l0: bucket [l2] (8 MB, 9 ms) closes when l1's gradient is ready (70 + 20 = 90 ms),
    # bucket [l1, l0] (8 MB) at the end. Forward 0-30, B2 30-70, B1 70-90, bucket0 on compute 90-99, B0 99-119,
    # bucket1 119-128; optimizer; all-gather of the 16 MB of parameters 128-145.
    assert _iteration(THREE, "zero2", **BUCKET) == pytest.approx(0.145, rel=1e-12)


def test_zero2_with_overlap_comm():
    # bucket0 90-99 beside B0 90-110; bucket1 110-119; all-gather 119-136.
    assert _iteration(THREE, "zero2", overlap_comm=True, **BUCKET) == pytest.approx(0.136, rel=1e-12)


def test_zero1_reduces_after_backward_in_parameter_order():
    # Buckets [l0, l1], [l2] after backward (110): 110-119, 119-128, all-gather 128-145.
    assert _iteration(THREE, "zero1", **BUCKET) == pytest.approx(0.145, rel=1e-12)
    # allgather_bucket_size 1.5 M elements: 4 M // 1.5 M = 2 all-gathers of 8 MB: 1 ms more.
    assert _iteration(THREE, "zero1", allgather_bucket_size=1_500_000, **BUCKET) == pytest.approx(0.146, rel=1e-12)


def test_zero1_buckets_follow_ready_order_with_overlap():
    # With overlap_comm stage 1 reduces during backward like stage 2.
    assert _iteration(THREE, "zero1", overlap_comm=True, **BUCKET) == pytest.approx(0.136, rel=1e-12)


def test_zero3_by_hand():
    # Two-layer model: l0 fetched (5 ms) 0-5, then l1 prefetched (9 ms) 5-14. The defaults keep both gathered for
    # backward (their reuse comes within stage3_max_reuse_distance). F0 5-15, F1 15-35, B1 35-75, B0 75-95, one
    # bucket of 12 MB reduce-scattered 95-108.
    assert _iteration(TWO, "zero3") == pytest.approx(0.108, rel=1e-12)


@pytest.mark.parametrize("algorithm", ["fsdp", "hsdp", "zero1", "zero2", "zero3"])
def test_symmetric_fast_path_matches_every_rank(algorithm):
    exp = make_experiment(THREE, algorithm=algorithm, alpha=1e-3, beta=1e-9)
    fast, full = simulate(exp, symmetric=True), simulate(exp, symmetric=False)
    a, b = fast.iterations(), full.iterations()
    assert a.end_s.max() == pytest.approx(b.end_s.max(), rel=1e-12)
    assert (b.groupby("rank").end_s.max() == b.end_s.max()).all()


@settings(max_examples=25, deadline=None)
@given(fwd=st.lists(st.floats(1e-4, 0.05), min_size=1, max_size=4), data=st.data(),
       alpha=st.floats(0, 5e-3), beta=st.floats(0, 5e-9), reshard=st.booleans(), prefetch=st.integers(0, 2),
       optimizer=st.floats(0, 0.02), nodes=st.integers(1, 3), overhead=st.sampled_from([0.0, 3e-4]))
def test_one_unit_runs_everything_in_sequence(fwd, data, alpha, beta, reshard, prefetch, optimizer, nodes,
                                              overhead):
    n = len(fwd)
    bwd = data.draw(st.lists(st.floats(1e-4, 0.05), min_size=n, max_size=n))
    elements = data.draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n))
    trace = make_trace(fwd, bwd, elements, optimizer=optimizer)
    exp = make_experiment(trace, algorithm="fsdp", fsdp_unit="model", alpha=alpha, beta=beta, nodes=nodes,
                          reshard_after_forward=reshard, prefetch=prefetch, iterations=1,
                          collective_overhead_s=overhead)
    coll = overhead + alpha + beta * 4 * sum(elements)
    want = coll + sum(fwd) + (coll if reshard else 0.0) + sum(bwd) + coll + optimizer / exp.ranks
    assert simulate(exp).summary()["iteration_time_s"] == pytest.approx(want, rel=1e-9)


def _memory(algorithm, trace=THREE, **comm):
    exp = make_experiment(trace, algorithm=algorithm, **comm)
    exp = replace(exp, workload=replace(exp.workload, optimizer="adam"))
    return new_simulation(exp).memory


def test_fsdp_memory_adam_fp32():
    # P = 4 M float32 elements = 16 MB on N = 4 ranks (4 MB resident shards). Units l0, l1, l2 (4, 4, 8 MB), prefetch
    # 1, reshard_after_forward. FSDP2's allocations walked (MB): forward of l2 copies out while its all-gather output
    # is alive (4 + 8 params, 8 buffer: 20). Backward of l2 re-gathers (20), prefetches l1 (buffer 4) and adds its
    # gradients (8): 24; reshard and reduce-scatter (input 8, sharded gradient 2): 18. Backward of l1: copy-out
    # (params 4 + 4), prefetch l0 (buffer 4), l1's gradients (4) beside l2's sharded gradient (2) and l2's
    # reduce-scatter input still in flight (8): 8 + 6 + 12 = 26, the peak; l0's backward stays below.
    m = _memory("fsdp")
    assert (m.parameters_B, m.gradients_B, m.buffers_B) == (8 * MB, 6 * MB, 12 * MB)
    assert m.optimizer_B == 2 * 16 * MB / 4           # Adam: 8P/N
    assert m.peak_B == 26 * MB + 8 * MB
    # Without reshard_after_forward: forward of l2 copies out with every unit unsharded and its all-gather output
    # alive (4 + 16 params, 8 buffer = 28); backward of l2 reaches 28 again (20 params + 8 gradients), not higher.
    keep = _memory("fsdp", reshard_after_forward=False)
    assert (keep.parameters_B, keep.gradients_B, keep.buffers_B) == (20 * MB, 0, 8 * MB)


def test_fsdp_memory_walk_sees_the_activations_leave_in_backward():
    # Activations 3, 5, 7 MB per layer (15 MB), no prefetch, reshard: forward of l2 ends with all of them alive and
    # l2 unsharded (4 + 8 params + 15 = 27); backward of l2 re-gathers and copies out (params 12, buffer 8: 35),
    # frees the output (27) and adds l2's gradients (8: 35 again) before its 7 MB of activations leave. Peak 35 MB,
    # its parts as first reached.
    trace = make_trace([0.01] * 3, [0.02, 0.02, 0.04], [M, M, 2 * M])
    layers = tuple(replace(layer, activation_bytes=a) for layer, a in zip(trace.layers, (3 * MB, 5 * MB, 7 * MB)))
    m = _memory("fsdp", trace=replace(trace, layers=layers), prefetch=0)
    assert (m.parameters_B, m.gradients_B, m.buffers_B, m.activations_B) == (12 * MB, 0, 8 * MB, 15 * MB)
    exp = make_experiment(replace(trace, layers=layers), algorithm="fsdp", prefetch=0)
    without = new_simulation(exp).algorithm.memory(activations=False)
    # Without them the peak moves to l1's backward copy-out: params 4 + 4, l2's sharded gradient 2, l2's
    # reduce-scatter input 8 (still in flight) and l1's all-gather output 4 = 22 MB (+ 4 MB momentum).
    assert (without.parameters_B, without.gradients_B, without.buffers_B, without.activations_B) == \
        (8 * MB, 2 * MB, 12 * MB, 0)
    assert without.peak_B == 22 * MB + 4 * MB


def _with_activations(trace, acts, outs):
    return replace(trace, layers=tuple(replace(layer, activation_bytes=a, output_bytes=o)
                                       for layer, a, o in zip(trace.layers, acts, outs)))


def test_fsdp_memory_walk_counts_activation_gradients():
    # As above (activations 3, 5, 7 MB), outputs 2, 2, 1 MB. Backward of l2 starts with the loss's gradient w.r.t.
    # l2's output (1: 28), re-gathers and copies out (params 12, buffer 8: 36), frees the output (28); l2 computes
    # the gradient w.r.t. its input (l1's output, 2: 30) and its parameters' gradients (8: 38), then frees its
    # output's gradient and activations. Peak 38 MB: activation gradients 1 + 2.
    trace = _with_activations(THREE, (3 * MB, 5 * MB, 7 * MB), (2 * MB, 2 * MB, 1 * MB))
    m = _memory("fsdp", trace=trace, prefetch=0)
    assert (m.parameters_B, m.gradients_B, m.buffers_B, m.activations_B, m.activation_grads_B) == \
        (12 * MB, 8 * MB, 0, 15 * MB, 3 * MB)
    assert m.peak_B == 38 * MB + 8 * MB
    # One unit of all three layers: layer by layer in backward (each frees its activations and its output's
    # gradient before the layer before computes), so the highest point is the backward copy-out (params 4 + 16,
    # all-gather output 16, activations 15, the output's gradient 1: 52), not 16 MB of gradients beside every
    # activation and the largest gradient pair (55).
    whole = _memory("fsdp", trace=trace, prefetch=0, fsdp_unit="model")
    assert (whole.parameters_B, whole.gradients_B, whole.buffers_B, whole.activations_B,
            whole.activation_grads_B) == (20 * MB, 0, 16 * MB, 15 * MB, 1 * MB)
    # A trace without output_bytes: activation gradients unknown (None, counted as 0), the peak incomplete.
    unknown = _memory("fsdp", trace=_with_activations(THREE, (3 * MB, 5 * MB, 7 * MB), (None,) * 3), prefetch=0)
    assert unknown.activation_grads_B is None and not unknown.complete and unknown.peak_B == 35 * MB + 8 * MB
    # The validator's replay keeps no activations: neither part (0, not unknown).
    exp = make_experiment(trace, algorithm="fsdp", prefetch=0)
    without = new_simulation(exp).algorithm.memory(activations=False)
    assert (without.activations_B, without.activation_grads_B) == (0, 0)


def test_zero_counts_the_largest_pair_of_activation_gradients():
    # ZeRO adds each part's peak: every activation (15 MB) and the most activation gradients alive at once, l1's
    # output and input gradients (2 + 2 MB).
    trace = _with_activations(THREE, (3 * MB, 5 * MB, 7 * MB), (2 * MB, 2 * MB, 1 * MB))
    z2 = _memory("zero2", trace=trace, reduce_bucket_size=M)
    assert (z2.activations_B, z2.activation_grads_B) == (15 * MB, 4 * MB) and z2.complete


def test_zero_memory_adam_fp32():
    # reduce_bucket_size 1 M elements: a 4 MB bucket buffer (twice with overlap_comm).
    z1 = _memory("zero1", reduce_bucket_size=M)
    assert (z1.parameters_B, z1.gradients_B, z1.optimizer_B, z1.buffers_B) == (16 * MB, 16 * MB, 8 * MB, 4 * MB)
    z2 = _memory("zero2", reduce_bucket_size=M, overlap_comm=True)
    assert (z2.gradients_B, z2.buffers_B) == (4 * MB, 8 * MB)
    # zero3 gathers the whole model at the first module (prefetch 5e7 elements) and keeps it for backward.
    z3 = _memory("zero3", reduce_bucket_size=M)
    assert (z3.parameters_B, z3.gradients_B, z3.optimizer_B) == (4 * MB + 16 * MB, 4 * MB, 8 * MB)
    # bf16 parameters: half the parameter bytes, an fp32 master copy in the optimizer's partition.
    zb = _memory("zero2", reduce_bucket_size=M, param_dtype="bfloat16")
    assert (zb.parameters_B, zb.optimizer_B) == (8 * MB, 3 * 16 * MB / 4)


BASE = {"workload": {"trace": "t.json", "compute": "mean"}, "cluster": {"nodes": 2, "gpus_per_node": 2,
                                                                        "nic_bandwidth": "10Gbit/s"}}


@pytest.mark.parametrize("comm, field", [
    ({"algorithm": "fsdp", "fsdp_unit": "block"}, "comm.fsdp_unit"),
    ({"algorithm": "fsdp", "fsdp_unit": [2, 0]}, "comm.fsdp_unit"),
    ({"algorithm": "hsdp", "fsdp_unit": 5}, "comm.fsdp_unit"),  # a size without its unit (found by bench/fuzz.py)
    ({"algorithm": "fsdp", "fsdp_unit": [1, 2]}, "comm.fsdp_unit"),  # the trace has 2 layers
    ({"algorithm": "fsdp", "prefetch": -1}, "comm.prefetch"),
    ({"algorithm": "fsdp", "reshard_after_forward": "yes"}, "comm.reshard_after_forward"),
    ({"algorithm": "fsdp", "param_dtype": "fp8"}, "comm.param_dtype"),
    ({"algorithm": "hsdp", "hsdp_group": 3}, "comm.hsdp_group"),
    ({"algorithm": "allreduce", "prefetch": 2}, "comm.prefetch"),
    ({"algorithm": "fsdp", "reduce_bucket_size": 5}, "comm.reduce_bucket_size"),
    ({"algorithm": "zero2", "reduce_bucket_size": "5MB"}, "comm.reduce_bucket_size"),
    ({"algorithm": "zero3", "allgather_bucket_size": 5}, "comm.allgather_bucket_size"),
    ({"algorithm": "zero2", "zero_reduce": "scatter"}, "comm.zero_reduce"),
    ({"algorithm": "fsdp", "bucket_copy_bandwidth": "10GB/s"}, "comm.bucket_copy_bandwidth"),  # allreduce only
    ({"algorithm": "zero3", "overlap_slowdown": 1.2}, "comm.overlap_slowdown"),
])
def test_config_errors_name_field_and_value(tmp_path, comm, field):
    TWO.save(tmp_path / "t.json")
    with pytest.raises(ConfigError) as err:
        from_dict({**BASE, "comm": comm}, base_dir=tmp_path)
    assert err.value.field == field


def test_config_accepts_deepspeed_style_numbers(tmp_path):
    TWO.save(tmp_path / "t.json")
    exp = from_dict({**BASE, "comm": {"algorithm": "zero3", "reduce_bucket_size": 5e8,
                                      "stage3_prefetch_bucket_size": 5e7}}, base_dir=tmp_path)
    assert exp.comm.reduce_bucket_size == 500_000_000 and exp.comm.prefetch_bucket_size == 50_000_000
    exp = from_dict({**BASE, "comm": {"algorithm": "fsdp", "fsdp_unit": "50MB"}}, base_dir=tmp_path)
    assert exp.comm.fsdp_unit == 50e6
    exp = from_dict({**BASE, "comm": {"algorithm": "zero2", "collective_overhead": "250us"}}, base_dir=tmp_path)
    assert exp.overheads().collective_overhead_s == pytest.approx(2.5e-4)


EXP = """
seed = 1
iterations = 2
[workload]
trace = "t.json"
compute = "mean"
[cluster]
nodes = 2
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
[comm]
algorithm = "fsdp"
collective = "linear"
alpha = "1ms"
beta = "1ns/B"
"""


def test_cli_simulate_fsdp(tmp_path):
    # Layers: forward 10, 20 ms, backward 20, 30 ms, 1 MB and 2 MB of parameters (all-gathers 2 and 3 ms).
    # AG0 0-2, AG1 2-5, F0 2-12, F1 12-32; AG1' 32-35, AG0' 35-37; B1 35-65, RS1 65-68; B0 65-85, RS0 85-87.
    make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    (tmp_path / "exp.toml").write_text(EXP)
    out = subprocess.run([sys.executable, "-m", "simfog.cli", "simulate", str(tmp_path / "exp.toml"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["algorithm"] == "fsdp" and s["iteration_time_s"] == pytest.approx(0.087, rel=1e-12)
    # The peak is l1's backward: the 1/4 shard of 3 MB and l1 unsharded (2 MB), l1's unsharded gradients (2 MB) and
    # l0's all-gather output, prefetched when l1's backward began (1 MB).
    assert s["memory_parameters_B"] == pytest.approx(3 * MB / 4 + 2 * MB)
    assert (s["memory_gradients_B"], s["memory_buffers_B"]) == (pytest.approx(2 * MB), pytest.approx(1 * MB))
