"""The analytic path of the dataflow algorithms (simfog.algorithms.dataflow.closed_form) equals the event engine bit
for bit: every algorithm and option it takes, on one and several nodes, mean and sampled compute, slowdowns and
stragglers, capped flows, oversubscription and degraded NICs, over several iterations and seeds. Both time messages as
if a step's all started together (comm.p2p_sharing = "together", the default); fluid sharing has its own evaluation in
time order (simfog.algorithms.dataflow.fluid, tests/test_p2p_fluid.py)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from simfog.cluster import Cluster, Link
from simfog.experiment import Heterogeneity
from simfog.simulation import new_simulation, simulate, why_events
from tests.conftest import make_experiment
from tests.test_analytic import TRACES, assert_same

OPTIONS = [
    ("neighbor", {}),                                   # exp2, awc, negotiated
    ("neighbor", {"negotiate": False}),
    ("neighbor", {"negotiate": False, "buffered_sends": True, "topology": "one_peer_exp2"}),  # as the validator
    ("neighbor", {"combine": "atc", "threshold_bytes": 3e6, "buffered_sends": True}),
    ("neighbor", {"combine": "atc", "threshold_bytes": 3e6}),  # several fused buffers, launched during backward
    ("neighbor", {"combine": "atc", "negotiate": False}),
    ("neighbor", {"topology": "ring"}),
    ("neighbor", {"topology": "one_peer_exp2"}),        # dynamic: a phase per iteration
    ("neighbor", {"topology": "star"}),                 # uneven load on one rank
    ("neighbor", {"topology": "inner_outer_exp2"}),
    ("neighbor", {"topology": "machine_one_peer_exp2"}),  # hierarchical: node average, leaders, broadcast
    ("hierarchical_neighbor", {}),
    ("hierarchical_neighbor", {"topology": "ring", "negotiate": False}),
    ("decentralized", {}),                              # full: hierarchical allreduce
    ("decentralized", {"hierarchical": False}),
    ("decentralized", {"topology": "shift_one"}),
    ("decentralized", {"topology": "shift_one", "hierarchical": False}),
    ("decentralized", {"topology": "shift_one", "hierarchical": False, "buffered_sends": True}),
    ("low_precision_decentralized", {}),
    ("low_precision_decentralized", {"hierarchical": False}),
    ("win_put", {}),                                    # one-sided puts to exp2's out-neighbours, not negotiated
    ("win_put", {"negotiate": True}),
    ("win_put", {"topology": "ring", "threshold_bytes": 3e6}),  # several fused buffers: one latency each
    ("win_put", {"topology": "one_peer_exp2"}),         # dynamic: a phase per iteration
    ("win_put", {"topology": "star"}),                  # uneven load on one rank
]
SHAPES = [(1, 4), (2, 2), (4, 2), (2, 4)]
NIC = Link(5e-6, 2e9, 6e8)  # a flow cap below the NIC: flows add up until they fill it
HETERO = Heterogeneity(rank_slowdown=((1, 1.7),), node_slowdown=((0, 1.2),), straggler_rate=0.3,
                       straggler_delay_s=4e-3, straggler_distribution="exponential")


def _experiment(algorithm, options, nodes, gpus, compute, iterations, seed, network=False):
    exp = make_experiment(TRACES["sampled" if compute == "samples" else "fixed"], nodes=nodes, gpus_per_node=gpus,
                          algorithm=algorithm, compute=compute, iterations=iterations, seed=seed,
                          collective="ring", **options)
    exp = replace(exp, heterogeneity=HETERO if seed % 2 else Heterogeneity())
    if network:
        c = exp.cluster
        exp = replace(exp, cluster=Cluster(c.nodes, c.ranks_per_node, c.intra, NIC, oversubscription=1.5,
                                           degraded_nics=((nodes - 1, 5e8),)))
    return exp


def _runs(exp) -> bool:
    """Whether the configuration exists (some graphs need an even number of nodes or several ranks per node)."""
    from simfog.errors import Infeasible

    try:
        new_simulation(exp)
    except Infeasible:
        return False
    return True


@pytest.mark.parametrize("algorithm,options", OPTIONS, ids=[f"{a}-{'-'.join(map(str, o.values())) or 'default'}"
                                                           for a, o in OPTIONS])
@pytest.mark.parametrize("compute", ["mean", "samples"])
def test_dataflow_analytic_equals_events(algorithm, options, compute):
    ran = 0
    for k, (nodes, gpus) in enumerate(SHAPES):
        for iterations, seed, network in ((1, 2 * k, False), (3, 2 * k + 1, k % 2 == 1)):
            exp = _experiment(algorithm, options, nodes, gpus, compute, iterations, seed, network)
            if not _runs(exp):
                continue
            a, b = assert_same(exp)
            assert a.summary()["iteration_time_s"] > 0
            assert (a.iterations().comm_s > 0).any() and (a.iterations().wait_s >= 0).all()
            ran += 1
    assert ran >= 2


def test_messages_are_the_engines():
    exp = _experiment("neighbor", {"combine": "atc", "negotiate": False}, 2, 2, "samples", 2, 3, True)
    sims = [new_simulation(exp), new_simulation(exp, path="events")]
    for sim in sims:
        sim.run()
    a, b = (sim.algorithm.messages().sort_values(["iteration", "src", "dst", "start_s"], kind="stable")
            .reset_index(drop=True) for sim in sims)
    assert len(a) > 0
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_one_rank_and_the_path_taken():
    for algorithm, _ in OPTIONS[::4]:
        one = make_experiment(TRACES["sampled"], nodes=1, gpus_per_node=1, algorithm=algorithm, compute="samples")
        assert_same(one)
    sim = new_simulation(_experiment("decentralized", {}, 2, 2, "samples", 2, 1))
    assert why_events(sim) is None
    result = sim.run()
    assert result.path == "analytic" and result.summary()["path"] == "analytic" and result.records is None
    win_put = new_simulation(_experiment("win_put", {}, 2, 2, "mean", 1, 0))  # one-sided puts: a fixed Plan too
    assert why_events(win_put) is None
    assert simulate(win_put.experiment).path == "analytic"


@pytest.mark.parametrize("variation", ["draw", "expected"])
@pytest.mark.parametrize("algorithm,options", [o for o in OPTIONS if o[0] != "win_put" or o[1]][::2],
                         ids=lambda o: str(o))
def test_per_call_variation_analytic_equals_events(algorithm, options, variation):
    """Messages, node collectives and allreduces drawn per call (or at their expected slowest): the closed form
    multiplies the very operands the engine's Runs multiply, so both agree bit for bit, messages included (where
    the two message logs agree without variation: not with buffered sends, and no log for BAGUA's allreduce)."""
    from tests.test_analytic import with_spread

    ran = 0
    for k, (nodes, gpus) in enumerate(SHAPES):
        exp = _experiment(algorithm, options, nodes, gpus, "samples", 3, 2 * k + 1, k % 2 == 1)
        exp = with_spread(exp, variation=variation)
        if not _runs(exp):
            continue
        a, b = assert_same(exp)
        ran += 1
        if options.get("buffered_sends") or algorithm == "decentralized" and options.get("topology") is None:
            continue
        sims = [new_simulation(exp), new_simulation(exp, path="events")]
        for s in sims:
            s.run()
        m, e = (s.algorithm.messages().sort_values(["iteration", "src", "dst", "start_s"], kind="stable")
                .reset_index(drop=True) for s in sims)
        pd.testing.assert_frame_equal(m, e, check_exact=True)
    assert ran >= 2
