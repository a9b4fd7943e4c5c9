"""Fluid sharing of point-to-point messages over the whole run (simfog.algorithms.dataflow.fluid,
comm.p2p_sharing = "fluid"): hand-worked processor sharing, agreement with the start-together model where ranks run in
step, the NIC never carrying more than its rate, and the refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog.cluster import Cluster, Link
from simfog.engine.sharing import SharedLinks
from simfog.errors import ConfigError
from simfog.experiment import Comm, Experiment, Workload, from_dict
from simfog.simulation import simulate
from simfog.trace import load_model_trace
from tests.conftest import make_experiment
from tests.test_analytic import TRACES

REPO = Path(__file__).resolve().parents[1]
B = 1e8      # bytes/s
M = 1e6      # bytes: X = 10 ms alone
X = M / B


def _drain(arrivals, cap=math.inf, sizes=None):
    """Drain times of jobs on one resource arriving at `arrivals` (SharedLinks alone)."""
    links, out = SharedLinks(), {}
    events = sorted((t, j) for j, t in enumerate(arrivals))
    while events or links.next_time() < math.inf:
        if events and events[0][0] <= links.next_time():
            t, j = events.pop(0)
            links.add(t, j, 0, (sizes or [M] * len(arrivals))[j], B, cap)
        else:
            t = links.next_time()
            for j, _ in links.pop(t):
                out[j] = t
    return [out[j] - arrivals[j] for j in range(len(arrivals))]


@pytest.mark.parametrize("delay", [0.0, 0.2 * X, 0.5 * X, X, 2 * X])
def test_two_staggered_flows(delay):
    # A alone for d, then both at half rate: A has X − d left, leaves at d + 2(X − d) = 2X − d; B has done X − d by
    # then and drains its last d alone, leaving at 2X. Both took 2X − d (no overlap when d >= X: X each).
    assert _drain([0.0, delay]) == pytest.approx([2 * X - min(delay, X)] * 2, rel=1e-12)


def test_three_flows_arriving_one_after_another():
    # A alone to X/2 (X/2 left); A, B at 1/2 to X (A X/4 left, B 3X/4); all three at 1/3: A leaves at 7X/4
    # (B X/2 left, C 3X/4); B, C at 1/2: B leaves at 11X/4 (C X/4 left); C alone: leaves at 3X.
    assert _drain([0.0, X / 2, X]) == pytest.approx(np.array([7 / 4, 11 / 4 - 1 / 2, 3 - 1]) * X, rel=1e-12)


def test_a_flow_cap_and_unequal_sizes():
    # Cap 60 MB/s on 100 MB/s: alone a flow gets 60, two get 50 each. A (1 MB) at 0, B (0.5 MB) at X/2: A alone
    # 0.3 MB by X/2; both at 50 MB/s: B drains 0.5 MB in 10 ms (leaves at 15 ms, took X); A has 0.2 MB left, alone at
    # 60 MB/s: 3.33 ms more, leaves at 18.33 ms.
    got = _drain([0.0, X / 2], cap=6e7, sizes=[M, M / 2])
    assert got == pytest.approx([0.015 + 0.2e6 / 6e7, X], rel=1e-12)


def _mlp_exchange(sharing, nic_bps, nodes=4, ranks_per_node=2, iterations=20):
    """The validate bench's neighbour rows: MLP, BlueFog one-peer exp2 without negotiation, buffered sends (gloo),
    a NIC whose one flow reaches 92 % of its rate."""
    trace = load_model_trace(REPO / "traces" / "mlp-cpu-b1024.json.gz")
    cluster = Cluster(nodes, ranks_per_node, Link(5e-5, 5.8e9), Link(3e-4, nic_bps, 0.92 * nic_bps))
    comm = Comm(algorithm="neighbor", topology="one_peer_exp2", negotiate=False, buffered_sends=True,
                collective="gloo_ring", p2p_sharing=sharing)
    return Experiment(1, iterations, Workload(trace, "mlp", "samples"), cluster, comm)


def test_drifting_ranks_take_turns_on_the_nic():
    # At 1 Gbit/s the odd ranks (whose shift-1 peer is on their own node) run ahead, so at shifts 2 and 4 a node's
    # two flows overlap only in part: faster than charging both at half rate from the same instant.
    # (1 Gbit/s of TCP payload as the bench's emulated NIC carries it, 119.55 MB/s.)
    fluid, together = (simulate(_mlp_exchange(s, 1.1955e8)) for s in ("fluid", "together"))
    assert fluid.path == "fluid" and together.path == "analytic"
    assert fluid.summary()["iteration_time_s"] < 0.97 * together.summary()["iteration_time_s"]


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([2.5e7, 1.25e8, 1e9]), st.sampled_from([(4, 2), (2, 2), (2, 4)]))
def test_a_nic_never_carries_more_than_its_rate(nic_bps, shape):
    # Over the run, every node's NIC sends its ranks' off-node bytes: the busiest node's bytes / rate bound the
    # time the run takes (here from the first iteration's start to the last one's end on every rank).
    exp = _mlp_exchange("fluid", nic_bps, *shape, iterations=8)
    result = simulate(exp)
    it = result.iterations()
    span = it.end_s.max() - it.start_s.min()
    nodes, L = shape
    n = nodes * L
    nbytes = exp.workload.trace.nbytes
    # one-peer exp2: iteration k sends to rank + 2^(k mod log2 n); a node's off-node bytes per iteration
    shifts = [2 ** (k % int(math.log2(n))) for k in range(exp.iterations)]
    off = max(sum(nbytes for s in shifts for r in range(u * L, (u + 1) * L) if (r + s) % n // L != u)
              for u in range(nodes))
    assert span >= off / nic_bps * (1 - 1e-9)


def test_in_lockstep_fluid_is_the_start_together_model():
    # exp2 on one rank per node with identical ranks: every message of a step starts at the same instant.
    runs = [simulate(make_experiment(TRACES["fixed"], nodes=8, gpus_per_node=1, algorithm="neighbor",
                                     collective="ring", iterations=3, p2p_sharing=s)) for s in ("fluid", "together")]
    assert runs[0].path == "fluid"
    assert runs[0].summary()["iteration_time_s"] == pytest.approx(runs[1].summary()["iteration_time_s"], rel=1e-12)


def test_the_event_engine_refuses_fluid_sharing_and_bad_values_are_named():
    exp = make_experiment(TRACES["fixed"], nodes=2, gpus_per_node=2, algorithm="neighbor", collective="ring",
                          p2p_sharing="fluid")
    with pytest.raises(ValueError, match="p2p_sharing"):
        simulate(exp, path="events")
    d = {"workload": {"trace": str(REPO / "traces" / "resnet20-cpu-b32.json.gz")},
         "cluster": {"nodes": 2, "gpus_per_node": 1, "nic_bandwidth": "1Gbit/s"},
         "comm": {"algorithm": "neighbor", "p2p_sharing": "maxmin"}}
    with pytest.raises(ConfigError) as err:
        from_dict(d, source="exp.toml")
    assert "comm.p2p_sharing" in str(err.value) and "maxmin" in str(err.value) and "fluid" in str(err.value)


def test_every_dataflow_option_runs_and_negotiated_exchanges_are_in_lockstep():
    # BlueFog's negotiation starts every message of a step at one instant, after all of the step before have ended:
    # fluid sharing then gives the start-together times (same operations in another order: equal to rounding).
    from dataclasses import replace

    from simfog.experiment import Heterogeneity
    from tests.test_analytic_flow import OPTIONS, SHAPES, _experiment, _runs

    ran = 0
    for algorithm, options in OPTIONS:
        for k, (nodes, gpus) in enumerate(SHAPES):
            exp = replace(_experiment(algorithm, options, nodes, gpus, "mean", 3, 2 * k, k % 2 == 1),
                          heterogeneity=Heterogeneity())
            if not _runs(exp):
                continue
            fluid = simulate(replace(exp, comm=replace(exp.comm, p2p_sharing="fluid")))
            f, t = fluid.summary()["iteration_time_s"], simulate(exp).summary()["iteration_time_s"]
            assert f > 0 and fluid.iterations().comm_s.ge(0).all()
            lockstep = algorithm in ("neighbor", "hierarchical_neighbor") and options.get("negotiate", True)
            if lockstep:
                assert f == pytest.approx(t, rel=1e-9)
                ran += 1
    assert ran >= 10
