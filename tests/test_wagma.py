"""WAGMA-SGD: group and global costs against log2(S)·(α + M·β) and log2(P)·(α + M·β), recursive-doubling groups that
alternate, the first member starting a group, late members not waited for, and stragglers against allreduce-SGD."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from simfog.cluster import Link
from simfog.errors import ConfigError, Infeasible
from simfog.experiment import Heterogeneity
from simfog.simulation import new_simulation

from .conftest import make_experiment, make_trace
from .test_decentralized import load_with_comm

A, BW = 1e-3, 1e9
M = 4_000_000                  # α + M·β = 5 ms per recursive-doubling round
T_F, T_OPT = 0.010, 0.005
PLAIN = Heterogeneity()


def sim_of(ranks, *, t_b=0.002, iterations=4, hetero=PLAIN, algorithm="wagma", **comm):
    trace = make_trace([T_F], [t_b], [M // 4], optimizer=T_OPT)
    exp = make_experiment(trace, nodes=ranks, gpus_per_node=1, nic=Link(A, BW), iterations=iterations,
                          algorithm=algorithm, merge="single", **comm)
    return new_simulation(replace(exp, heterogeneity=hetero))


def test_group_and_global_costs_are_log2_rounds_of_alpha_plus_m_beta():
    # P = 8, S = 4, a global step every 2 iterations (1 and 3): group 2 rounds = 10 ms, global 3 rounds = 15 ms.
    sim = sim_of(8, group_size=4, global_every=2)
    res = sim.run()
    b = res.buckets[0]
    assert b["group_s"] == pytest.approx(2 * (A + M / BW)) and b["global_s"] == pytest.approx(3 * (A + M / BW))
    it = res.iterations()
    times = it[it["rank"] == 0].iteration_s.to_numpy()
    # Group iterations: 10 + max(2, 10) + 5 = 25 ms; global ones: 10 + max(2, 15) + 5 = 30 ms.
    assert times == pytest.approx([0.025, 0.030, 0.025, 0.030], rel=1e-12)
    assert res.summary()["iteration_time_s"] == pytest.approx(0.0275, rel=1e-12)


def test_collective_overhead_lengthens_every_group_and_global_operation():
    # As above with 2 ms of host work per operation (simfog.overheads, e.g. the validator's measured in-step excess):
    # group 10 + 2 = 12 ms, global 15 + 2 = 17 ms; iterations 10 + 12 + 5 = 27 ms and 10 + 17 + 5 = 32 ms.
    sim = sim_of(8, group_size=4, global_every=2, collective_overhead_s=2e-3)
    assert sim.experiment.overheads().sources["collective_overhead_s"] == "experiment file"
    res = sim.run()
    b = res.buckets[0]
    assert b["group_s"] == pytest.approx(2 * (A + M / BW) + 2e-3) and b["global_s"] == pytest.approx(
        3 * (A + M / BW) + 2e-3)
    it = res.iterations()
    assert it[it["rank"] == 0].iteration_s.to_numpy() == pytest.approx([0.027, 0.032, 0.027, 0.032], rel=1e-12)


def test_intra_node_partners_use_the_intra_link():
    # 2 nodes x 4 ranks, S = 8: rounds 0 and 1 stay in the node (1 us + 4 MB at 100 GB/s = 41 us), round 2 crosses
    # the NIC with the 4 ranks of the node sharing it: 1 ms + 4 x 4 ms = 17 ms.
    trace = make_trace([T_F], [0.002], [M // 4], optimizer=T_OPT)
    exp = make_experiment(trace, nodes=2, gpus_per_node=4, nic=Link(A, BW), iterations=1, algorithm="wagma",
                          group_size=8)
    b = new_simulation(exp).run().buckets[0]
    assert b["group_s"] == pytest.approx(2 * (1e-6 + M / 1e11) + A + 4 * M / BW, rel=1e-12)


def test_groups_alternate_and_start_when_their_first_member_arrives():
    # P = 16, S = 4: iteration 0 groups are blocks of 4 consecutive ranks, iteration 1 the stride-4 groups.
    # Distinct compute speeds make every rank arrive at its own time; a group starts at its earliest arrival.
    slow = tuple((r, 1 + 0.003 * ((7 * r) % 16)) for r in range(16))
    res = sim_of(16, group_size=4, iterations=2, hetero=Heterogeneity(rank_slowdown=slow)).run()
    df = res.intervals()
    arrive = df[df.kind == "backward"].set_index(["iteration", "rank"])["start_s"]
    start = df[(df.kind == "comm") & (df.name == "group")].set_index(["iteration", "rank"])["start_s"]
    for it, group_of in ((0, lambda r: r // 4), (1, lambda r: r % 4)):
        for r in range(16):
            members = [q for q in range(16) if group_of(q) == group_of(r)]
            assert start.loc[(it, r)] == min(arrive.loc[(it, q)] for q in members)
    assert start.loc[0].nunique() == 4 and start.loc[1].nunique() == 4


@pytest.mark.parametrize("factor, opt_start", [(3.0, 0.036), (1.5, 0.020)])
def test_late_members_are_not_waited_for_and_wait_only_for_what_is_left(factor, opt_start):
    # One group of 4 (P = S = 4). Ranks 0, 1, 3 arrive at 10 ms and run the group op over [10, 20] ms.
    # Rank 2 at 3x: arrives at 30 ms, the op is over: its optimizer starts when its backward ends (36 ms).
    # Rank 2 at 1.5x: arrives at 15 ms, backward to 18 ms, waits for the op to end at 20 ms.
    res = sim_of(4, group_size=4, iterations=1, global_every=100,
                 hetero=Heterogeneity(rank_slowdown=((2, factor),))).run()
    df = res.intervals()
    opt = df[df.kind == "optimizer"].set_index("rank")["start_s"]
    assert opt.loc[2] == pytest.approx(opt_start, rel=1e-12)
    assert [opt.loc[r] for r in (0, 1, 3)] == pytest.approx([0.020] * 3, rel=1e-12)
    group = df[(df.kind == "comm") & (df["rank"] == 2)]
    assert group.start_s.min() == pytest.approx(0.010) and group.end_s.max() == pytest.approx(0.020)


def _others_idle_per_iteration(algorithm, hetero, iterations, straggler=None, **comm):
    it = sim_of(16, t_b=0.020, iterations=iterations, hetero=hetero, algorithm=algorithm, **comm).run().iterations()
    if straggler is not None:
        it = it[it["rank"] != straggler]
    return float(it.idle_s.mean())


def test_a_straggler_stalls_allreduce_but_not_wagma_between_global_steps():
    # 16 ranks, compute 10 + 20 + 5 ms, rank 5 twice as slow, 10 iterations (no global step: it is every 11th).
    # Allreduce-SGD: every other rank waits for rank 5 every iteration: 30 ms in the first (its longer forward and
    # backward), 35 ms in each later one (its optimizer step is slower too): 34.5 ms on average. WAGMA: groups
    # start with their first member and do not wait for rank 5: the others lose nothing.
    h = Heterogeneity(rank_slowdown=((5, 2.0),))
    allreduce = _others_idle_per_iteration("allreduce", h, 10, straggler=5)
    wagma = _others_idle_per_iteration("wagma", h, 10, straggler=5, group_size=4)
    assert allreduce == pytest.approx(0.0345, rel=1e-9)
    assert wagma == 0.0
    assert wagma < 0.25 * allreduce


def test_random_stragglers_cost_wagma_far_less_than_allreduce():
    # 16 ranks, each iteration each rank is delayed 30 ms with probability 0.1 (seed 0), 33 iterations, so three
    # global steps (iterations 10, 21, 32) where WAGMA does wait for the most delayed rank. Mean idle per rank and
    # iteration measured: allreduce 18.07 ms, WAGMA 2.92 ms (16 %).
    h = Heterogeneity(straggler_rate=0.1, straggler_delay_s=0.03, straggler_distribution="fixed")
    allreduce = _others_idle_per_iteration("allreduce", h, 33)
    wagma = _others_idle_per_iteration("wagma", h, 33, group_size=4)
    assert allreduce == pytest.approx(0.01807, abs=1e-5) and wagma == pytest.approx(0.00292, abs=1e-5)
    assert wagma < 0.25 * allreduce


def test_a_persistent_straggler_is_only_deferred_to_the_global_step():
    # Bounded staleness has its price: over three global periods rank 5's accumulated lag is waited for at each
    # global step; the others lose 32.4 ms per iteration against allreduce's (30 + 32 x 35) / 33 = 34.8 ms (93 %).
    h = Heterogeneity(rank_slowdown=((5, 2.0),))
    allreduce = _others_idle_per_iteration("allreduce", h, 33, straggler=5)
    wagma = _others_idle_per_iteration("wagma", h, 33, straggler=5, group_size=4)
    assert allreduce == pytest.approx(0.034848, abs=1e-6) and wagma == pytest.approx(0.032424, abs=1e-6)


@pytest.mark.parametrize("ranks, group_size, global_every, k", [(16, 4, 11, 2), (8, 4, 11, 2), (8, 2, 11, 3),
                                                                (64, 8, 11, 2), (8, 2, 1, 1), (32, 2, 3, 3)])
def test_mixing_reaches_the_exact_average_after_log_s_p_iterations(ranks, group_size, global_every, k):
    s = sim_of(ranks, iterations=1, group_size=group_size, global_every=global_every).run().summary()
    assert s["iterations_to_consensus"] == k and s["spectral_gap"] == 1.0
    assert s["topology"] == f"wagma groups of {group_size}"


def test_invalid_sizes():
    with pytest.raises(Infeasible, match="power of two"):
        sim_of(6)
    with pytest.raises(ConfigError, match="comm.group_size"):
        sim_of(8, group_size=3)
    with pytest.raises(ConfigError, match="comm.group_size"):
        sim_of(8, group_size=16)


def test_default_group_size_is_at_most_the_rank_count():
    assert sim_of(4).run().buckets[0]["group_size"] == 4
    assert sim_of(16).run().buckets[0]["group_size"] == 8


def test_wagma_keys_parse(tmp_path):
    exp = load_with_comm(tmp_path, "group_size = 2\nglobal_every = 3")
    assert exp.comm.group_size == 2 and exp.comm.global_every == 3
    for extra, field in (("group_size = 1", "comm.group_size"), ("global_every = 0", "comm.global_every")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_with_comm(tmp_path, extra)


def test_2048_ranks_complete():
    trace = make_trace([0.01] * 4, [0.02] * 4, [200_000] * 4, optimizer=1e-3)
    exp = make_experiment(trace, nodes=256, gpus_per_node=8, collective="ring", iterations=12, algorithm="wagma")
    s = new_simulation(exp).run().summary()
    assert s["ranks"] == 2048 and s["iterations_to_consensus"] == 4   # 11 bits in layouts of 3
    assert np.isfinite(s["iteration_time_s"])


def test_blocking_groups_wait_for_their_last_member_and_global_step_can_use_the_collective():
    # A straggler (rank 1, 20 ms late every iteration) in a group of 2: wait-avoiding WAGMA leaves rank 0 alone,
    # a blocking group (wait_for_group, what gloo subgroups run) makes rank 0 wait for it.
    late = Heterogeneity(straggler_rate=1.0, straggler_delay_s=0.0, rank_slowdown=((1, 3.0),))
    free = sim_of(4, group_size=2, global_every=100, iterations=3, hetero=late).run().iterations()
    held = sim_of(4, group_size=2, global_every=100, iterations=3, hetero=late, wait_for_group=True).run()
    held_it = held.iterations()
    fast_free = free[free["rank"] == 0].iteration_s.mean()
    fast_held = held_it[held_it["rank"] == 0].iteration_s.mean()
    assert fast_held > fast_free + 0.01
    # global_collective: the global step costs comm.collective's allreduce (linear here: alpha + beta M).
    sim = sim_of(8, group_size=2, global_every=1, collective="linear", alpha=0.002, beta=1e-9,
                 global_collective=True)
    assert sim.run().buckets[0]["global_s"] == pytest.approx(0.002 + 1e-9 * M, rel=1e-12)


def test_group_collective_costs_the_gloo_ring_of_the_group():
    # group_collective: each group op is a ring allreduce among its S members, 2(S-1) steps of M/S.
    # S = 2 on 8 single-rank nodes: 2 x (1 ms + 2 MB / 1 GB/s) = 6 ms (recursive doubling: 5 ms).
    # S = 4: 6 x (1 ms + 1 MB / 1 GB/s) = 12 ms (recursive doubling: 2 rounds, 10 ms).
    for s, want in ((2, 2 * (A + M / 2 / BW)), (4, 6 * (A + M / 4 / BW))):
        b = sim_of(8, group_size=s, global_every=100, iterations=1, group_collective=True).run().buckets[0]
        assert b["group_s"] == pytest.approx(want, rel=1e-12)
    # 2 nodes x 4 ranks, S = 2 with partners across nodes (layout bits 2: r and r ^ 4): in each step the 4 ranks of
    # a node send off-node at once and share the NIC: 2 x (1 ms + 4 x 2 MB / 1 GB/s) = 18 ms.
    trace = make_trace([T_F], [0.002], [M // 4], optimizer=T_OPT)
    exp = make_experiment(trace, nodes=2, gpus_per_node=4, nic=Link(A, BW), iterations=1, algorithm="wagma",
                          group_size=2, group_collective=True)
    alg = new_simulation(exp).algorithm
    assert alg.group_seconds(2) == pytest.approx(np.full(8, 2 * (A + 4 * M / 2 / BW)), rel=1e-12)
