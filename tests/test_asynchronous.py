"""Asynchronous averaging: BlueFog win_put (one-sided puts, a rank waits only for its own puts) and BAGUA async (a
background allreduce every async_period that training never waits for): costs, independence from stragglers,
averaging rounds per iteration."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simfog.cluster import Link
from simfog.errors import ConfigError
from simfog.experiment import Heterogeneity
from simfog.simulation import new_simulation
from simfog.topology import topology

from .conftest import make_experiment, make_trace
from .test_decentralized import load_with_comm

A, BW = 1e-3, 1e9
M = 4_000_000
T_F, T_OPT = 0.010, 0.005
PLAIN = Heterogeneity()


def sim_of(algorithm, *, nodes=4, t_f=T_F, t_b=0.002, t_opt=T_OPT, iterations=4, hetero=PLAIN, **comm):
    trace = make_trace([t_f], [t_b], [M // 4], optimizer=t_opt)
    exp = make_experiment(trace, nodes=nodes, gpus_per_node=1, nic=Link(A, BW), iterations=iterations,
                          algorithm=algorithm, **comm)
    return new_simulation(replace(exp, heterogeneity=hetero))


@pytest.mark.parametrize("t_b, expected", [(0.002, 0.024), (0.020, 0.035)])
def test_win_put_waits_only_for_its_own_puts(t_b, expected):
    # exp2 on 4 ranks: puts to i+1 and i+2 at once, the NIC shared 2 ways: 1 ms + 2 x 4 ms = 9 ms from the end of
    # forward; step() waits for them (win_wait): 10 + max(t_b, 9) + 5 ms.
    s = sim_of("win_put", t_b=t_b).run().summary()
    assert s["iteration_time_s"] == pytest.approx(expected, rel=1e-12)
    assert s["iteration_time_s"] == pytest.approx(T_F + max(t_b, A + 2 * M / BW) + T_OPT, rel=1e-12)
    assert s["spectral_gap"] == pytest.approx(topology("exp2", 4).spectral_gap(), rel=1e-12)
    assert s["averaging_rounds_per_iteration"] == 1.0


def test_win_put_ranks_do_not_wait_for_a_straggler():
    plain = sim_of("win_put").run().iterations()
    sim = sim_of("win_put", hetero=Heterogeneity(rank_slowdown=((2, 3.0),)))
    slow = sim.run()
    it = slow.iterations()
    others = it["rank"] != 2
    assert it[others].end_s.to_numpy() == pytest.approx(plain[plain["rank"] != 2].end_s.to_numpy(), rel=1e-12)
    assert (it.idle_s == 0).all()
    # Puts leave when their sender launches them, whatever the receiver is doing.
    df = slow.intervals()
    launch = df[df.kind == "backward"].set_index(["rank", "iteration"])["start_s"]
    msgs = sim.algorithm.messages()
    assert all(m.start_s == launch.loc[(m.src, m.iteration)] for m in msgs.itertuples())


def test_win_put_needs_a_rank_level_graph():
    trace = make_trace([T_F], [0.002], [M // 4], optimizer=T_OPT)
    exp = make_experiment(trace, nodes=4, gpus_per_node=2, algorithm="win_put", topology="machine_one_peer_exp2")
    with pytest.raises(ConfigError, match="comm.topology"):
        new_simulation(exp)


def test_bagua_async_training_never_waits_and_averages_every_period():
    # Iteration: 30 + 60 + 10 ms = 0.1 s, 20 iterations: training ends at 2.0 s. A round: a 1-byte broadcast and an
    # allreduce of the weights, 50 ms each (linear collective, beta 0) = 0.1 s, then 0.5 s of sleep: rounds end at
    # 0.1, 0.7, 1.3, 1.9 s: 4 rounds in 20 iterations, one exact average every 5 iterations.
    sim = sim_of("async", t_f=0.03, t_b=0.06, t_opt=0.01, iterations=20, alpha=0.05, beta=0.0)
    res = sim.run()
    s = res.summary()
    assert s["iteration_time_s"] == pytest.approx(0.1, rel=1e-12) and s["idle_s"] == 0
    assert s["averaging_rounds_per_iteration"] == pytest.approx(0.2)
    assert s["iterations_to_consensus"] == 5 and s["spectral_gap"] == 1.0
    assert s["comm_s"] == pytest.approx(4 * 0.1 / 20, rel=1e-9) and s["comm_exposed_s"] == 0
    assert res.buckets[0]["round_s"] == pytest.approx(0.1)
    # Round intervals are cut at iteration boundaries: none reaches past its iteration's end.
    it = res.iterations()
    assert it.iteration_s.to_numpy() == pytest.approx([0.1] * len(it), rel=1e-9)


def test_bagua_async_ignores_a_straggler():
    plain = sim_of("async", iterations=6).run().iterations()
    it = sim_of("async", iterations=6, hetero=Heterogeneity(rank_slowdown=((1, 2.5),))).run().iterations()
    keep = it["rank"] != 1
    assert it[keep].end_s.to_numpy() == pytest.approx(plain[plain["rank"] != 1].end_s.to_numpy(), rel=1e-12)


def test_async_period_parses(tmp_path):
    assert load_with_comm(tmp_path, 'async_period = "1s"').comm.async_period_s == 1.0
    for bad in ('async_period = "0ms"', "async_period = 0.5"):
        with pytest.raises(ConfigError, match=r"comm\.async_period"):
            load_with_comm(tmp_path, bad)
