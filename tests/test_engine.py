"""The event engine against the closed-form recurrences of docs/ALGORITHMS.md §2, and its own invariants."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog.errors import Infeasible
from simfog.simulation import simulate

from .conftest import make_experiment, make_trace

ALPHA, BETA = 2e-3, 4e-9  # linear allreduce model T(M) = a + b*M (seconds, seconds per byte)


def wfbp_recurrence(t_f, t_b, nbytes, a, b):
    """MG-WFBP paper's WFBP timeline, written out independently of the engine."""
    L = len(t_b)
    t_c = [a + b * p for p in nbytes]
    tau_b = [0.0] * L
    for i in range(L - 2, -1, -1):
        tau_b[i] = tau_b[i + 1] + t_b[i + 1]
    tau_c = [0.0] * L
    tau_c[L - 1] = tau_b[L - 1] + t_b[L - 1]
    for i in range(L - 2, -1, -1):
        tau_c[i] = max(tau_c[i + 1] + t_c[i + 1], tau_b[i] + t_b[i])
    return sum(t_f) + tau_c[0] + t_c[0]


def test_wfbp_matches_recurrence_worked_example():
    # 4 layers; layer 3's gradient (8 MB) is ready first and its allreduce (34 ms) outlasts layer 2's backward.
    t_f, t_b = [0.01, 0.02, 0.01, 0.005], [0.02, 0.04, 0.01, 0.03]
    elements = [250_000, 1_000_000, 500, 2_000_000]
    trace = make_trace(t_f, t_b, elements)
    expected = wfbp_recurrence(t_f, t_b, [4 * e for e in elements], ALPHA, BETA)
    # By hand: t_c = [6, 18, 2.002, 34] ms; tau_b = [80, 40, 30, 0] ms; tau_c[3] = 30; tau_c[2] = max(64, 40) = 64;
    # tau_c[1] = max(66.002, 80) = 80; tau_c[0] = max(98, 100) = 100; t_iter = 45 + 100 + 6 = 151 ms.
    assert expected == pytest.approx(0.151, rel=1e-12)
    s = simulate(make_experiment(trace, alpha=ALPHA, beta=BETA)).summary()
    assert s["iteration_time_s"] == pytest.approx(expected, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-4, 0.05), st.floats(1e-4, 0.05), st.integers(1, 5_000_000)),
                min_size=1, max_size=12),
       st.floats(0, 5e-3), st.floats(1e-10, 1e-8))
def test_wfbp_matches_recurrence_property(layers, a, b):
    t_f, t_b, elements = (list(x) for x in zip(*layers))
    trace = make_trace(t_f, t_b, elements)
    s = simulate(make_experiment(trace, alpha=a, beta=b, iterations=2)).summary()
    expected = wfbp_recurrence(t_f, t_b, [4 * e for e in elements], a, b)
    assert s["iteration_time_s"] == pytest.approx(expected, rel=1e-12, abs=1e-15)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-4, 0.05), st.floats(1e-4, 0.05), st.integers(1, 5_000_000)),
                min_size=1, max_size=12))
def test_single_merge_matches_synceasgd(layers):
    t_f, t_b, elements = (list(x) for x in zip(*layers))
    trace = make_trace(t_f, t_b, elements)
    s = simulate(make_experiment(trace, merge="single", alpha=ALPHA, beta=BETA)).summary()
    expected = sum(t_f) + sum(t_b) + ALPHA + BETA * 4 * sum(elements)
    assert s["iteration_time_s"] == pytest.approx(expected, rel=1e-12)
    assert s["buckets"] == 1


def test_optimizer_step_waits_and_next_forward_waits_for_it():
    trace = make_trace([0.01], [0.02], [1000], optimizer=0.005)
    res = simulate(make_experiment(trace, merge="single", alpha=ALPHA, beta=BETA, iterations=3))
    expected = 0.01 + 0.02 + ALPHA + BETA * 4000 + 0.005
    assert res.summary()["iteration_time_s"] == pytest.approx(expected, rel=1e-12)
    df = res.intervals()
    r0 = df[df["rank"] == 0]
    fwd_starts = r0[r0.kind == "forward"].start_s.to_numpy()
    opt_ends = r0[r0.kind == "optimizer"].end_s.to_numpy()
    assert fwd_starts[1:] == pytest.approx(opt_ends[:-1], rel=0, abs=0)


CONFIGS = [
    dict(merge="ddp", collective="ring"), dict(merge="wfbp", collective="tree"),
    dict(merge="single", collective="hierarchical"), dict(merge="horovod", collective="ring"),
    dict(merge="bagua", collective="ps"), dict(merge="mgwfbp", collective="linear"),
    dict(merge="threshold", collective="ring", threshold_bytes=3e6),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["merge"] + "-" + c["collective"])
def test_symmetric_fast_path_equals_explicit_engine_exactly(config):
    rng = np.random.default_rng(3)
    n = 20
    trace = make_trace(rng.uniform(1e-3, 5e-3, n), rng.uniform(1e-3, 1e-2, n),
                       rng.integers(1, 3_000_000, n), optimizer=1e-3)
    exp = make_experiment(trace, nodes=4, gpus_per_node=2, **config)
    fast, explicit = simulate(exp), simulate(exp, symmetric=False)
    assert fast.symmetric and not explicit.symmetric
    assert fast.summary() | {"symmetric_fast_path": None} == explicit.summary() | {"symmetric_fast_path": None}
    a = fast.intervals().sort_values(["rank", "iteration", "start_s", "kind", "name"]).reset_index(drop=True)
    b = explicit.intervals().sort_values(["rank", "iteration", "start_s", "kind", "name"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def _sampled_trace():
    rng = np.random.default_rng(0)
    n, k = 6, 7
    samples = [(list(rng.uniform(1e-3, 4e-3, n)), list(rng.uniform(1e-3, 8e-3, n) * (1 + 3 * (i == 2))))
               for i in range(k)]
    return make_trace([0] * n, [0] * n, [400_000] * n, samples=samples)


def test_samples_mode_is_deterministic_per_seed_and_not_symmetric():
    trace = _sampled_trace()
    a = simulate(make_experiment(trace, compute="samples", seed=5, merge="ddp", collective="ring"))
    b = simulate(make_experiment(trace, compute="samples", seed=5, merge="ddp", collective="ring"))
    c = simulate(make_experiment(trace, compute="samples", seed=6, merge="ddp", collective="ring"))
    assert not a.symmetric
    pd.testing.assert_frame_equal(a.intervals(), b.intervals(), check_exact=True)
    assert not a.intervals().equals(c.intervals())


def test_collective_starts_when_last_participant_launches():
    exp = make_experiment(_sampled_trace(), compute="samples", seed=1, merge="wfbp", collective="ring", iterations=4)
    df = simulate(exp).intervals()
    comm = df[df.kind == "comm"]
    # Every rank sees the same start and end for a collective...
    spread = comm.groupby(["iteration", "name"])[["start_s", "end_s"]].agg(lambda x: x.max() - x.min())
    assert (spread.to_numpy() == 0).all()
    # ...and it starts when the last rank launched it: some rank never waited (it arrived last).
    waits = df[df.kind == "wait"].set_index(["iteration", "name", "rank"])
    for (it, name), group in comm.groupby(["iteration", "name"]):
        waited = {r for r in group["rank"] if (it, name, r) in waits.index}
        assert len(waited) < exp.ranks
        for r in waited:
            assert waits.loc[(it, name, r)].end_s == group.start_s.iloc[0]


def test_stragglers_from_samples_slow_the_iteration():
    trace = _sampled_trace()
    sampled = simulate(make_experiment(trace, compute="samples", nodes=8, gpus_per_node=4, alpha=0, beta=0))
    mean = simulate(make_experiment(trace, compute="mean", nodes=8, gpus_per_node=4, alpha=0, beta=0))
    # Free communication: the mean-mode run is perfectly efficient, the sampled one waits for the slowest rank.
    assert mean.summary()["scaling_efficiency"] == pytest.approx(1.0, rel=1e-12)
    assert sampled.summary()["iteration_time_s"] > mean.summary()["iteration_time_s"]
    assert sampled.summary()["idle_s"] > 0


def test_one_rank_has_no_communication():
    trace = make_trace([0.01, 0.01], [0.02, 0.02], [1000, 1000])
    s = simulate(make_experiment(trace, nodes=1, gpus_per_node=1, collective="ring")).summary()
    assert s["comm_s"] == 0 and s["scaling_efficiency"] == pytest.approx(1.0)


@pytest.mark.parametrize("ranks", [1, 3, 6, 7, 100, 8192])
def test_any_rank_count(ranks):
    trace = make_trace([0.01] * 3, [0.02] * 3, [10_000] * 3)
    exp = make_experiment(trace, nodes=ranks, gpus_per_node=1, collective="ring", merge="ddp", iterations=1)
    s = simulate(exp, symmetric=False).summary()
    assert s["ranks"] == ranks and s["iteration_time_s"] >= 0.09


def test_power_of_two_algorithms_say_so():
    trace = make_trace([0.01], [0.02], [1000])
    with pytest.raises(Infeasible, match="power of two"):
        simulate(make_experiment(trace, nodes=6, gpus_per_node=1, collective="rhd"))


def test_exposed_comm_and_overlap_accounting():
    # One layer: nothing overlaps, everything after backward is exposed communication.
    trace = make_trace([0.01], [0.02], [1_000_000])
    s = simulate(make_experiment(trace, merge="single", alpha=ALPHA, beta=BETA)).summary()
    t_c = ALPHA + BETA * 4e6
    assert s["comm_s"] == pytest.approx(t_c) and s["comm_exposed_s"] == pytest.approx(t_c)
    assert s["overlap_fraction"] == pytest.approx(0.0, abs=1e-12) and s["idle_s"] == pytest.approx(0, abs=1e-15)


def _hetero_exp(trace, **h):
    from dataclasses import replace

    from simfog.experiment import Heterogeneity

    exp = make_experiment(trace, merge="single", alpha=ALPHA, beta=BETA)
    return replace(exp, heterogeneity=Heterogeneity(**h))


def test_slow_rank_sets_the_pace():
    trace = make_trace([0.01, 0.01], [0.02, 0.02], [1000, 1000])
    s = simulate(_hetero_exp(trace, rank_slowdown=((3, 1.5),))).summary()
    assert s["iteration_time_s"] == pytest.approx(1.5 * 0.06 + ALPHA + BETA * 8000, rel=1e-12)
    s = simulate(_hetero_exp(trace, node_slowdown=((0, 2.0),))).summary()
    assert s["iteration_time_s"] == pytest.approx(2.0 * 0.06 + ALPHA + BETA * 8000, rel=1e-12)


def test_fixed_stragglers_add_their_delay():
    trace = make_trace([0.01], [0.02], [1000])
    res = simulate(_hetero_exp(trace, straggler_rate=1.0, straggler_delay_s=0.05, straggler_distribution="fixed"))
    assert not res.symmetric
    assert res.summary()["iteration_time_s"] == pytest.approx(0.03 + 0.05 + ALPHA + BETA * 4000, rel=1e-12)


def test_degraded_nic_slows_ring_to_its_bandwidth():
    from dataclasses import replace

    from simfog.cluster import Link

    trace = make_trace([0.01], [0.02], [10_000_000])
    exp = make_experiment(trace, merge="single", collective="ring", nodes=4, gpus_per_node=1)
    slow_everywhere = make_experiment(trace, merge="single", collective="ring", nodes=4, gpus_per_node=1,
                                      nic=Link(10e-6, 0.25e9))
    degraded = replace(exp, cluster=replace(exp.cluster, degraded_nics=((2, 0.25e9),)))
    assert simulate(degraded).summary()["iteration_time_s"] == pytest.approx(
        simulate(slow_everywhere).summary()["iteration_time_s"], rel=1e-12)
    assert simulate(degraded).summary()["iteration_time_s"] > simulate(exp).summary()["iteration_time_s"]


def test_horovod_fused_buffers_are_named_in_order_every_iteration():
    rng = np.random.default_rng(1)
    trace = make_trace(rng.uniform(1e-3, 2e-3, 12), rng.uniform(1e-3, 4e-3, 12), rng.integers(1, 2_000_000, 12))
    res = simulate(make_experiment(trace, merge="horovod", collective="ring", iterations=3))
    comm = res.intervals().query("kind == 'comm' and rank == 0")
    for _, names in comm.groupby("iteration")["name"]:
        assert list(names) == [f"fused{k}" for k in range(len(names))]
    assert [b["bucket"] for b in res.buckets] == list(range(len(res.buckets)))


@pytest.mark.parametrize("streams, expected_comm", [(1, 4 * 0.01), (2, 2 * 0.01), (4, 0.01)])
def test_several_streams_overlap_latency_bound_collectives(streams, expected_comm):
    # Four tensors ready almost at once, each allreduce costing alpha = 10 ms and no bandwidth term: with k
    # streams, k collectives run side by side (latency is not shared).
    trace = make_trace([0.0] * 4, [1e-9] * 4, [1000] * 4)
    s = simulate(make_experiment(trace, alpha=0.01, beta=0.0, streams=streams)).summary()
    assert s["iteration_time_s"] == pytest.approx(expected_comm, abs=1e-8)


@pytest.mark.parametrize("streams", [1, 2, 3])
def test_several_streams_share_bandwidth(streams):
    # No latency: concurrent collectives share the links, so the total time is the same as one after another.
    trace = make_trace([0.0] * 4, [1e-9] * 4, [1_000_000] * 4)
    s = simulate(make_experiment(trace, alpha=0.0, beta=1e-9, streams=streams)).summary()
    assert s["iteration_time_s"] == pytest.approx(4 * 4e6 * 1e-9, abs=1e-8)
    assert s["comm_exposed_s"] <= s["iteration_time_s"] + 1e-12  # overlapping streams counted once


def test_two_streams_fast_path_equals_explicit():
    rng = np.random.default_rng(5)
    trace = make_trace(rng.uniform(1e-3, 2e-3, 10), rng.uniform(1e-3, 4e-3, 10), rng.integers(1, 2_000_000, 10))
    exp = make_experiment(trace, merge="wfbp", collective="gloo_ring", streams=2)
    a, b = simulate(exp), simulate(exp, symmetric=False)
    assert a.summary()["iteration_time_s"] == b.summary()["iteration_time_s"]


def test_host_time_is_added_to_the_step_after_communication():
    from dataclasses import replace

    trace = make_trace([1e-3, 1e-3], [2e-3, 2e-3], [1000, 1000], optimizer=0.5e-3)
    base = simulate(make_experiment(trace, nodes=1, gpus_per_node=1)).summary()["iteration_time_s"]
    hosted = simulate(make_experiment(replace(trace, host_s=(0.1,)), nodes=1, gpus_per_node=1)).summary()
    assert hosted["iteration_time_s"] == pytest.approx(base + 0.1)     # one rank: nothing to overlap
    assert base == pytest.approx(1e-3 * 2 + 2e-3 * 2 + 0.5e-3)


def test_recorded_ranks_keep_their_own_compute_iteration_by_iteration():
    """A trace of 2 recorded ranks x 2 iterations (sample_ranks 0, 0, 1, 1): every simulated iteration takes one
    recorded iteration k on all ranks, rank r recorded rank r mod 2's sample of it; replay takes k = i mod 2."""
    from dataclasses import replace

    from simfog.simulation import new_simulation

    samples = [([1e-3], [1e-3]), ([2e-3], [2e-3]), ([5e-3], [5e-3]), ([7e-3], [7e-3])]
    trace = replace(make_trace([0], [0], [1000], samples=samples), sample_ranks=(0, 0, 1, 1))
    replayed = new_simulation(make_experiment(trace, nodes=2, gpus_per_node=2, iterations=3, compute="replay"))
    assert replayed.draws.tolist() == [[0, 2, 0, 2], [1, 3, 1, 3], [0, 2, 0, 2]]
    drawn = new_simulation(make_experiment(trace, nodes=2, gpus_per_node=2, iterations=50, compute="samples", seed=3))
    assert set(map(tuple, drawn.draws.tolist())) == {(0, 2, 0, 2), (1, 3, 1, 3)}
    means = new_simulation(make_experiment(trace, nodes=1, gpus_per_node=2, compute="mean"))
    assert means.compute.forward_s.tolist() == pytest.approx([1.5e-3, 6e-3])     # each recorded rank its own means
    assert means.draws.tolist() == [[0, 1]] * 3 and not means.symmetric
    # one node, 2 ranks, a 1000-element gradient: the slower recorded rank sets the pace
    alone = simulate(make_experiment(replace(trace, sample_ranks=()), nodes=1, gpus_per_node=1, compute="replay",
                                     iterations=2)).summary()["iteration_time_s"]
    assert alone == pytest.approx((2e-3 + 4e-3) / 2)                   # no sample_ranks: recorded order 0, 1
    pair = means.run().summary()["iteration_time_s"]
    assert pair > 12e-3                                                # rank 1's 6 + 6 ms, plus the allreduce
