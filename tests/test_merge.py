"""Gradient-merging policies: hand-computed buckets, properties over random models, and the MG-WFBP authors'
real GoogLeNet trace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import example as hypothesis_example
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog import merge
from simfog.errors import ConfigError
from simfog.merge import Bucket, GradTensor, MergeSettings, plan
from simfog.trace import Layer, ModelTrace, Provenance, Tensor

from .conftest import REF

MGWFBP = REF / "mgwfbp-googlenet"

MiB = 1 << 20


def tensors(sizes, ready=None, dtypes=None):
    """t0, t1, ... in ready order; ready times 1 ms apart unless given (seconds)."""
    ready = ready or [1e-3 * (i + 1) for i in range(len(sizes))]
    dtypes = dtypes or ["float32"] * len(sizes)
    return [GradTensor(f"t{i}", n, r, d) for i, (n, r, d) in enumerate(zip(sizes, ready, dtypes, strict=True))]


def groups(buckets):
    return [list(b.tensors) for b in buckets]


def linear(a, b):
    return lambda nbytes: a + b * nbytes


# ---- simple policies ----

def test_wfbp_one_bucket_per_tensor_and_single_one_bucket():
    ts = tensors([10, 20, 30])
    assert plan("wfbp", ts) == (Bucket(("t0",), 10), Bucket(("t1",), 20), Bucket(("t2",), 30))
    assert plan("single", ts) == (Bucket(("t0", "t1", "t2"), 60),)


def test_threshold_adds_then_closes_at_or_above_the_threshold():
    # threshold 100 B: 40+50 = 90 < 100, +30 = 120 >= 100 closes; 100 >= 100 closes alone; 5 is the remainder.
    ts = tensors([40, 50, 30, 100, 5])
    assert groups(plan("threshold", ts, MergeSettings(threshold_bytes=100))) == [
        ["t0", "t1", "t2"], ["t3"], ["t4"]]


def test_errors_name_the_field():
    ts = tensors([1, 2])
    with pytest.raises(ConfigError, match="comm.merge"):
        plan("nccl-magic", ts)
    with pytest.raises(ConfigError, match="comm.threshold"):
        plan("threshold", ts)
    with pytest.raises(ConfigError, match="mgwfbp"):
        plan("mgwfbp", ts)
    with pytest.raises(ConfigError, match="unique"):
        plan("wfbp", [GradTensor("x", 1, 0.0), GradTensor("x", 2, 0.0)])
    with pytest.raises(ConfigError, match="comm.cycle_time"):
        MergeSettings(cycle_time_s=0)
    with pytest.raises(ConfigError, match="comm.threshold"):
        MergeSettings(threshold_bytes=-1)
    with pytest.raises(ConfigError, match="dtype"):
        GradTensor("x", 4, 0.0, "float31")


def test_every_policy_is_registered_with_a_one_line_docstring():
    assert set(merge.POLICIES.names()) == {"wfbp", "single", "threshold", "ddp", "horovod", "bagua", "mgwfbp",
                                           "optimal"}
    assert all(doc for _, doc in merge.POLICIES.describe())
    assert merge.DYNAMIC == {"horovod"}


def test_grad_tensors_ready_when_the_owning_layer_backward_ends():
    # Backward over layers 2, 1, 0 from t = 0 with mean times 3, 2 (no params) and 1 ms (two samples: 0.5, 1.5):
    # layer 2's tensor is ready at 3 ms, layer 0's two tensors at 3 + 2 + 1 = 6 ms.
    layers = (Layer("l0", (1.0, 1.0), (0.5e-3, 1.5e-3), (Tensor("w0", 10), Tensor("b0", 2, "float16"))),
              Layer("l1", (1.0, 1.0), (2e-3, 2e-3)),
              Layer("l2", (1.0, 1.0), (3e-3, 3e-3), (Tensor("w2", 5),)))
    trace = ModelTrace("t", 1, "float32", {}, {}, Provenance("c", "d", "h"), layers, ("w2", "b0", "w0"))
    got = merge.grad_tensors(trace)
    assert [(t.name, t.nbytes, t.dtype) for t in got] == [("w2", 20, "float32"), ("b0", 4, "float16"),
                                                          ("w0", 40, "float32")]
    assert [t.ready_s for t in got] == pytest.approx([3e-3, 6e-3, 6e-3])


# ---- PyTorch DDP (torch 2.13 reducer rules) ----

def test_ddp_default_first_bucket_1mib_then_25mib_with_overshoot():
    sizes = [524_288, 600_000, 20 * MiB, 6 * MiB, 100, 1 * MiB]
    # first limit 1,048,576: 524,288 + 600,000 = 1,124,288 >= limit -> bucket 0 overshoots by 75,712 B
    # then 26,214,400: 20,971,520 + 6,291,456 = 27,262,976 >= limit -> bucket 1
    # remainder: 100 + 1,048,576 = 1,048,676 (below 25 MiB) -> bucket 2
    got = plan("ddp", tensors(sizes))
    assert groups(got) == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"]]
    assert [b.nbytes for b in got] == [1_124_288, 27_262_976, 1_048_676]


def test_ddp_bucket_exactly_at_the_limit_closes():
    assert groups(plan("ddp", tensors([MiB, 5]))) == [["t0"], ["t1"]]


def test_ddp_explicit_cap_also_caps_the_first_bucket():
    sizes = [524_288, 600_000, 20 * MiB, 6 * MiB, 100, 1 * MiB]
    # cap 2 MiB = 2,097,152 for every bucket: 1,124,288 < cap, + 20,971,520 = 22,095,808 -> bucket 0;
    # 6,291,456 alone >= cap -> bucket 1; 100 + 1,048,576 = 1,048,676 -> bucket 2
    got = plan("ddp", tensors(sizes), MergeSettings(threshold_bytes=2 * MiB))
    assert groups(got) == [["t0", "t1", "t2"], ["t3"], ["t4", "t5"]]
    assert [b.nbytes for b in got] == [22_095_808, 6_291_456, 1_048_676]


def test_ddp_groups_per_dtype_each_with_its_own_first_bucket():
    ts = tensors([800_000, 600_000, 300_000, 600_000, 10],
                 dtypes=["float32", "float16", "float32", "float16", "float32"])
    # float32: 800,000 + 300,000 = 1,100,000 >= 1 MiB closes at t2; float16: 600,000 + 600,000 closes at t3;
    # t4 (float32) is left open and comes last.
    assert groups(plan("ddp", ts)) == [["t0", "t2"], ["t1", "t3"], ["t4"]]


# ---- BAGUA ----

def test_bagua_10mib_buckets_closed_at_or_above_the_size():
    sizes = [4 * MiB, 4 * MiB, 2 * MiB, 3 * MiB, 8 * MiB, 1 * MiB]
    # 4 + 4 + 2 = 10 MiB >= 10 MiB closes; 3 + 8 = 11 MiB closes; 1 MiB is the remainder
    got = plan("bagua", tensors(sizes))
    assert groups(got) == [["t0", "t1", "t2"], ["t3", "t4"], ["t5"]]
    assert [b.nbytes for b in got] == [10 * MiB, 11 * MiB, 1 * MiB]
    assert groups(plan("bagua", tensors(sizes), MergeSettings(threshold_bytes=8 * MiB))) == [
        ["t0", "t1"], ["t2", "t3", "t4"], ["t5"]]


def test_bagua_visits_float16_before_float32_without_resetting_the_bucket():
    # split_bucket_by_bucket_size: dtype names sorted ("f16" < "f32"), open bucket carried across dtypes:
    # t1 (f16, 6 MiB), then t0 (f32): 12 MiB >= 10 MiB closes; t2 alone.
    ts = tensors([6 * MiB, 6 * MiB, 6 * MiB], dtypes=["float32", "float16", "float32"])
    assert groups(plan("bagua", ts)) == [["t0", "t1"], ["t2"]]


# ---- Horovod ----

def test_horovod_fuse_follows_fuse_responses():
    # threshold 100 B: 30 + 50 = 80 fits, 40 would make 120 and ends the look-ahead (80 + 40 > 100);
    # 40 + 10 = 50, then 200 cannot be skipped (50 + 200 > 100); 200 > threshold goes alone; then 5.
    got = merge.horovod_fuse(tensors([30, 50, 40, 10, 200, 5]), 100)
    assert groups(got) == [["t0", "t1"], ["t2", "t3"], ["t4"], ["t5"]]
    assert merge.horovod_fuse(tensors([30, 50]), 0) == [Bucket(("t0",), 30), Bucket(("t1",), 50)]


def test_horovod_fuse_looks_ahead_past_other_dtypes():
    # f32 30; f16 20 skipped (30 + 20 <= 100); f32 40 joins (70); f16 10 skipped (70 + 20 + 10 = 100 <= 100);
    # the skipped float16 tensors then fuse together.
    ts = tensors([30, 20, 40, 10], dtypes=["float32", "float16", "float32", "float16"])
    assert groups(merge.horovod_fuse(ts, 100)) == [["t0", "t2"], ["t1", "t3"]]


def test_horovod_cycles_hand_computed():
    # cycle 1 ms, threshold 100 B, T(M) = 1 ms + 10 us/B. Ready (ms): t0 0.3, t1 0.8, t2 1.6, t3 2.2, t4 2.4, t5 5.9.
    ts = tensors([40, 40, 40, 55, 10, 50], ready=[0.3e-3, 0.8e-3, 1.6e-3, 2.2e-3, 2.4e-3, 5.9e-3])
    s = MergeSettings(threshold_bytes=100, cycle_time_s=1e-3)
    # tick 0: nothing ready. tick 1.0: {t0, t1} -> [t0 t1] (80 B), busy T(80) = 1.8 ms -> next tick 2.8.
    # tick 2.8: {t2, t3, t4}: 40 + 55 = 95, +10 = 105 > 100 -> [t2 t3], [t4]; busy 1.95 + 1.1 = 3.05 -> 5.85.
    # tick 5.85: t5 (5.9) not ready -> tick 6.85: [t5].
    assert groups(plan("horovod", ts, s, linear(1e-3, 1e-5))) == [["t0", "t1"], ["t2", "t3"], ["t4"], ["t5"]]
    # Without a cost model the ticks are 0, 1, 2, 3, ... ms: [t0 t1] at 1, [t2] at 2, [t3 t4] at 3, [t5] at 6.
    assert groups(plan("horovod", ts, s)) == [["t0", "t1"], ["t2"], ["t3", "t4"], ["t5"]]


def test_horovod_defaults_fuse_everything_ready_together():
    # 128 MiB threshold, 1 ms cycle: all ready by 0.5 ms -> one fused bucket at tick 1 ms.
    ts = tensors([10 * MiB, 20 * MiB, 30 * MiB], ready=[0.1e-3, 0.2e-3, 0.5e-3])
    assert groups(plan("horovod", ts)) == [["t0", "t1", "t2"]]


# ---- MG-WFBP ----

# Worked example, times in ms, a = 1 ms, b = 1 ms/MB (1e-9 s/B). Layers l = 0..4 in forward order:
#   t_b = [1, 1.5, 0.5, 2.5, 1], p = [2, 0.5, 1, 3, 1] MB, so t_c = a + b p = [3, 1.5, 2, 4, 2].
#   τ_b = [5.5, 4, 3.5, 1, 0]; ready = τ_b + t_b = [6.5, 5.5, 4, 3.5, 1].
# l=4: τ_c[4] = 1, ends 3 <= e = ready[3] = 3.5 -> no merge; group [4]. τ_c[3] = max(3, 3.5) = 3.5.
# l=3: ends 3.5 + 4 = 7.5 > e = 4; not started before e, but wait 4 - 3.5 = 0.5 < a -> merge:
#      p[2] = 4 MB, t_c[2] = 5, t_c[3] = 0; τ_c[2] = max(3.5 + 0, 4) = 4.
# l=2: ends 4 + 5 = 9 > e = ready[1] = 5.5; wait 1.5 >= a -> no merge; group [3, 2]. τ_c[1] = max(9, 5.5) = 9.
# l=1: ends 9 + 1.5 = 10.5 > e = 6.5 and τ_c[1] = 9 > 6.5 (not started) -> merge: p[0] = 2.5 MB, t_c[0] = 3.5.
# Groups [[4], [3, 2], [1, 0]]; τ_c[0] = max(9, 6.5) = 9, so communication ends at 12.5 ms.
# WFBP: ends 3, 7.5, 9.5, 11, 14 -> 14 ms. SyncEASGD: 6.5 + T(7.5 MB) = 6.5 + 8.5 = 15 ms.
TB_MS = [1, 1.5, 0.5, 2.5, 1]
P_MB = [2, 0.5, 1, 3, 1]
READY_MS = [6.5, 5.5, 4, 3.5, 1]


def example():
    """The worked example as GradTensors in ready order (t4 first)."""
    return [GradTensor(f"t{i}", int(P_MB[i] * 1e6), READY_MS[i] * 1e-3) for i in range(4, -1, -1)]


def test_mgwfbp_worked_example_recurrence():
    got = merge.mgwfbp_groups([t * 1e-3 for t in TB_MS], [p * 1e6 for p in P_MB], 1e-3, 1e-9)
    assert got == [[4], [3, 2], [1, 0]]


def test_mgwfbp_worked_example_plan_and_predicted_times():
    cost = linear(1e-3, 1e-9)
    ts = example()
    got = plan("mgwfbp", ts, allreduce_time=cost)
    assert groups(got) == [["t4"], ["t3", "t2"], ["t1", "t0"]]
    assert merge.predicted_comm_end_s(ts, got, cost) == pytest.approx(12.5e-3)
    assert merge.predicted_comm_end_s(ts, plan("wfbp", ts), cost) == pytest.approx(14e-3)
    assert merge.predicted_comm_end_s(ts, plan("single", ts), cost) == pytest.approx(15e-3)


def test_mgwfbp_small_tensor_option_merges_small_groups():
    # small_tensor_elements = 300,000: t4 (250,000 elements) is merged although the rule keeps it alone; then
    # l=3: p = 4 MB, t_c = 5, τ_c[3] = 3.5, wait 0.5 < a -> merge (p[2] = 5 MB, τ_c[2] = 4); l=2: e = 5.5,
    # wait 1.5 -> no merge (1.25M elements, not small); l=1: τ_c[1] = 10 > 6.5 -> merge.
    got = plan("mgwfbp", example(), MergeSettings(small_tensor_elements=300_000), linear(1e-3, 1e-9))
    assert groups(got) == [["t4", "t3", "t2"], ["t1", "t0"]]


def test_mgwfbp_huge_startup_merges_everything():
    assert groups(plan("mgwfbp", example(), allreduce_time=linear(1e3, 1e-9))) == [["t4", "t3", "t2", "t1", "t0"]]


def test_mgwfbp_fast_network_and_no_startup_is_wfbp():
    # a = 0 and every allreduce (b p <= 3 us) ends before the next gradient is ready (>= 0.5 ms later).
    assert groups(plan("mgwfbp", example(), allreduce_time=linear(0.0, 1e-12))) == [
        ["t4"], ["t3"], ["t2"], ["t1"], ["t0"]]


def test_linear_cost_of_an_affine_cost_is_exact():
    # Closed form: T = a + b·M is its own least-squares line over any range (residuals 0).
    assert merge.linear_cost(linear(2e-3, 3e-9), 256, 5e7) == pytest.approx((2e-3, 3e-9), rel=1e-9)
    assert merge.linear_cost(linear(0.0, 3e-9), 256, 5e7) == pytest.approx((0.0, 3e-9), abs=1e-15)
    # one size: the secant from the empty message, exact for an affine cost
    assert merge.linear_cost(linear(2e-3, 3e-9), 1e6, 1e6) == pytest.approx((2e-3, 3e-9), rel=1e-9)
    assert merge.linear_cost(linear(0.0, 0.0), 1, 1e6) == (0.0, 0.0)
    # subnormal times (beta = 5e-324, found by hypothesis through tune) count as 0, not as an SVD failure
    assert merge.linear_cost(linear(0.0, 5e-324), 4, 4e6) == (0.0, 0.0)


def rendezvous(m):
    """An MPI-like allreduce: 20 us + 1 ns/B below 64 KiB (eager), 1 ms + 1 ns/B above (rendezvous)."""
    return (20e-6 if m < 65536 else 1e-3) + 1e-9 * m


def test_linear_cost_is_fitted_over_the_sizes_mgwfbp_merges():
    # The worked example's gradients are 0.5-3 MB (7.5 MB in all), all above the 64 KiB switch: over that range
    # the cost is exactly 1 ms + 1 ns/B, the worked example's a and b, and so is the plan. The old secant from
    # T(0) = 20 us to T(7.5 MB) had a = 20 us: at l = 3 the wait of 0.5 ms for t2 is then not worth a start-up,
    # so t3 went alone although it saves 1 ms (t2, t1, t0 are merged only because their allreduces queue up).
    assert merge.linear_cost(rendezvous, 0.5e6, 7.5e6) == pytest.approx((1e-3, 1e-9), rel=1e-9)
    assert groups(plan("mgwfbp", example(), allreduce_time=rendezvous)) == [["t4"], ["t3", "t2"], ["t1", "t0"]]
    secant = (rendezvous(7.5e6) - rendezvous(0)) / 7.5e6
    assert merge.mgwfbp_groups([t * 1e-3 for t in TB_MS], [p * 1e6 for p in P_MB], rendezvous(0), secant) == [
        [4], [3], [2, 1, 0]]


def test_linear_cost_of_a_curved_cost_stays_non_negative():
    a, b = merge.linear_cost(lambda m: 1e-12 * m ** 1.3, 256, 5e7)  # convex from 0: the free line has a < 0
    assert a == 0.0 and b > 0
    a, b = merge.linear_cost(lambda m: 1e-3 + 1e-6 * m ** 0.5, 256, 5e7)  # concave: a > 0, b > 0
    assert a > 1e-3 and b > 0
    with pytest.raises(ConfigError, match="points"):
        merge.linear_cost(rendezvous, 1, 10, points=1)


# ---- properties over random models ----

DTYPES = ["float32", "float16"]


@st.composite
def models(draw, mixed=True):
    n = draw(st.integers(1, 25))
    sizes = draw(st.lists(st.integers(0, 40 * MiB), min_size=n, max_size=n))
    gaps = draw(st.lists(st.floats(0, 5e-3), min_size=n, max_size=n))
    dtypes = draw(st.lists(st.sampled_from(DTYPES if mixed else DTYPES[:1]), min_size=n, max_size=n))
    ready, t = [], 0.0
    for g in gaps:
        t += g
        ready.append(t)
    rows = zip(sizes, ready, dtypes, strict=True)
    return [GradTensor(f"t{i}", 2 * (s // 2), r, d) for i, (s, r, d) in enumerate(rows)]


COST = linear(50e-6, 1e-9)
THRESHOLDS = st.sampled_from([None, 0, 1, 64 * 1024, 4 * MiB, 30 * MiB])


@settings(max_examples=60, deadline=None)
@given(ts=models(), threshold=THRESHOLDS, policy=st.sampled_from(merge.POLICIES.names()))
def test_every_tensor_exactly_once_each_bucket_in_ready_order(ts, threshold, policy):
    s = MergeSettings(threshold_bytes=threshold if threshold is not None or policy != "threshold" else 1.0)
    got = plan(policy, ts, s, COST)
    names = [n for b in got for n in b.tensors]
    assert sorted(names) == sorted(t.name for t in ts)
    position = {t.name: i for i, t in enumerate(ts)}
    size = {t.name: t.nbytes for t in ts}
    for b in got:
        assert b.tensors
        assert [position[n] for n in b.tensors] == sorted(position[n] for n in b.tensors)
        assert b.nbytes == sum(size[n] for n in b.tensors)
    if policy in ("ddp", "horovod"):  # these never mix dtypes in a bucket
        dtype = {t.name: t.dtype for t in ts}
        assert all(len({dtype[n] for n in b.tensors}) == 1 for b in got)


@settings(max_examples=60, deadline=None)
@given(ts=models(mixed=False), threshold=THRESHOLDS, policy=st.sampled_from(merge.POLICIES.names()))
def test_one_dtype_buckets_are_consecutive_runs_in_ready_order(ts, threshold, policy):
    s = MergeSettings(threshold_bytes=threshold if threshold is not None or policy != "threshold" else 1.0)
    got = plan(policy, ts, s, COST)
    assert [n for b in got for n in b.tensors] == [t.name for t in ts]


@settings(max_examples=60, deadline=None)
@given(ts=models(mixed=False), threshold=st.sampled_from([0, 1000, MiB, 8 * MiB]))
def test_horovod_buckets_stay_within_the_threshold_unless_alone(ts, threshold):
    for b in merge.horovod_fuse(ts, threshold):
        assert b.nbytes <= threshold or len(b.tensors) == 1


@settings(max_examples=80, deadline=None)
@given(ts=models(mixed=False), a=st.floats(0, 5e-3), b=st.floats(1e-12, 1e-8))
@hypothesis_example(ts=[GradTensor("t0", 456000, 0.0), GradTensor("t1", 0, 0.00390625)], a=0.0, b=8.566374148196766e-09)
@hypothesis_example(ts=[GradTensor("t0", 0, 0.0), GradTensor("t1", 456000, 0.00390625)], a=0.0, b=8.566374148196766e-09)
def test_mgwfbp_never_slower_than_wfbp_and_free_merges_only_when_a_is_zero(ts, a, b):
    cost = linear(a, b)
    end_wfbp = merge.predicted_comm_end_s(ts, plan("wfbp", ts), cost)
    end_mg = merge.predicted_comm_end_s(ts, plan("mgwfbp", ts, allreduce_time=cost), cost)
    assert end_mg <= end_wfbp * (1 + 1e-9) + 1e-15
    # With a = 0 a merge only happens when the earlier allreduce could not even start before the next gradient
    # is ready, so it changes nothing: the end is WFBP's, and a tensor whose allreduce ends before the next
    # gradient is ready always closes its bucket.
    zero = linear(0.0, b)
    got = plan("mgwfbp", ts, allreduce_time=zero)
    assert merge.predicted_comm_end_s(ts, got, zero) == pytest.approx(
        merge.predicted_comm_end_s(ts, plan("wfbp", ts), zero), rel=1e-9, abs=1e-15)
    end, last = 0.0, {bk.tensors[-1] for bk in got}
    for i, t in enumerate(ts[:-1]):
        end = max(end, t.ready_s) + zero(t.nbytes)  # this tensor's allreduce under WFBP
        if end < ts[i + 1].ready_s - 1e-12:  # margin: the two timelines may round differently
            assert t.name in last


# ---- the MG-WFBP authors' real GoogLeNet trace (B-Caffe, 8 nodes, 10GbE; see PROVENANCE.md there) ----

def _caffe_rows(path: Path) -> list[list[float]]:
    """[param_id, elements, compute_us, comm_us, merged_us] from DistManager::print_overheads glog lines."""
    rows = []
    for line in path.read_text().splitlines():
        m = re.search(r"\] \[([^\]]*)\]\s*$", line)
        if m:
            rows.append([float(x) for x in m.group(1).split(",")])
    return rows


def _osu(path: Path) -> tuple[list[int], list[float]]:
    """OSU allreduce latency rows: bytes (after an optional "<procs>,") and average latency in us."""
    sizes, lat = [], []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            size, us = line.split()
            sizes.append(int(size.split(",")[-1]))
            lat.append(float(us))
    return sizes, lat


def test_mgwfbp_on_the_authors_googlenet_trace():
    np = pytest.importorskip("numpy")
    dump1 = _caffe_rows(MGWFBP / "tmp8comm.log")[:128]
    # Golden values from PROVENANCE.md: 128 blobs (64 layers x weight + bias), 13,379,136 elements, weight and
    # bias rows carry their layer's backward time, per-layer sum of compute 205.334 ms.
    assert [int(r[0]) for r in dump1] == list(range(128))
    assert sum(int(r[1]) for r in dump1) == 13_379_136
    assert all(dump1[2 * k][2] == dump1[2 * k + 1][2] for k in range(64))
    backward_s = [dump1[2 * k][2] * 1e-6 for k in range(64)]
    assert sum(backward_s) == pytest.approx(0.205334, abs=1e-6)

    ready, end = {}, 0.0
    for k in range(63, -1, -1):  # Caffe backward runs from the last layer to the first
        end += backward_s[k]
        ready[k] = end
    ts = [GradTensor(f"p{pid}", int(dump1[pid][1]) * 4, ready[pid // 2]) for pid in range(127, -1, -1)]

    sizes, lat_us = _osu(MGWFBP / "allreduce8.log")
    assert len(sizes) == 266
    b_us, a_us = np.polyfit(sizes, lat_us, 1)  # the authors fit T = a + b*M to measured allreduce times
    cost = linear(a_us * 1e-6, b_us * 1e-6)
    assert 0 < a_us * 1e-6 < 2e-3 and 0 < b_us * 1e-6 < 1e-8

    got = plan("mgwfbp", ts, allreduce_time=cost)
    assert 1 < len(got) < len(ts)
    assert sorted(n for b in got for n in b.tensors) == sorted(t.name for t in ts)
    end_mg = merge.predicted_comm_end_s(ts, got, cost)
    end_wfbp = merge.predicted_comm_end_s(ts, plan("wfbp", ts), cost)
    end_single = merge.predicted_comm_end_s(ts, plan("single", ts), cost)
    assert end < end_mg <= end_wfbp
    assert end_mg <= end_single
    # (The authors' own merged run, tmp8ocomm.log dump 2, shows 30 groups; their a, b and build differ, so the
    # grouping is not expected to match and is not asserted.)
