"""Fluid sharing of point-to-point messages (simfog.p2p.fluid_times, comm.p2p_sharing = "fluid"): messages that
overlap in time share a resource equally at each instant; messages that start together cost what the start-together
model charges, bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simfog.cluster import Cluster, Link
from simfog.errors import ConfigError
from simfog.experiment import from_dict
from simfog.p2p import fluid_times, message_times
from simfog.simulation import simulate
from tests.conftest import make_experiment
from tests.test_analytic import TRACES

NIC = Link(1e-4, 1e8)     # 100 µs, 100 MB/s: 1 MB alone takes X = 10 ms
INTRA = Link(1e-6, 1e10)
M = 1e6
X = M / 1e8


@pytest.mark.parametrize("delay", [0.0, 0.2 * X, 0.5 * X, X, 2 * X])
def test_two_staggered_flows_on_one_nic(delay):
    # Hand-worked: A alone for d, then both at half rate; A has X − d left, so leaves at d + 2(X − d) = 2X − d;
    # B has done (X − d)·... = X − d by then and drains its last d alone: leaves at 2X. Both took 2X − d
    # (d >= X: no overlap, X each). Plus the latency.
    c = Cluster(2, 2, INTRA, NIC)
    t = fluid_times(c, [0, 1], [2, 3], M, [0.0, delay])
    want = NIC.latency_s + 2 * X - min(delay, X)
    assert t == pytest.approx([want, want], rel=1e-12)


def test_three_flows_arriving_one_after_another():
    # Hand-worked processor sharing, arrivals at 0, X/2, X of X each on one NIC (3 ranks per node send off-node):
    # A alone to X/2 (X/2 left); A, B at 1/2 to X (A X/4 left, B 3X/4); all three at 1/3: A leaves at 7X/4
    # (B X/2 left, C 3X/4); B, C at 1/2: B leaves at 11X/4 (C X/4 left); C alone: leaves at 3X.
    c = Cluster(2, 3, INTRA, NIC)
    t = fluid_times(c, [0, 1, 2], [3, 4, 5], M, [0.0, X / 2, X])
    drain = np.array([7 / 4, 11 / 4 - 1 / 2, 3 - 1]) * X
    assert t == pytest.approx(NIC.latency_s + drain, rel=1e-12)


def test_a_flow_cap_limits_each_flow_alone():
    # Cap 60 MB/s on a 100 MB/s NIC: two flows at once get 50 each, one alone 60: the second, 0.5 X later, shares
    # from then on. A: 0.5X·0.6 = 0.3X of work alone, 0.7X left at rate 0.5 -> leaves at 0.5X + 1.4X = 1.9X;
    # B: 0.7X done by then, 0.3X left alone at 0.6 -> leaves at 1.9X + 0.5X = 2.4X, took 1.9X.
    c = Cluster(2, 2, INTRA, Link(1e-4, 1e8, 6e7))
    t = fluid_times(c, [0, 1], [2, 3], M, [0.0, X / 2])
    assert t == pytest.approx(1e-4 + np.array([1.9, 1.9]) * X, rel=1e-12)


pairs = st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), min_size=1, max_size=24)


@given(pairs, st.floats(0, 1e7), st.floats(-1.0, 1.0), st.sampled_from([None, 3e7, 2e8]))
def test_starting_together_is_the_start_together_model_bit_for_bit(raw, nbytes, start, cap):
    c = Cluster(3, 4, INTRA, Link(2e-5, 1e8, cap))
    src, dst = np.array(raw).T
    assert np.array_equal(fluid_times(c, src, dst, nbytes, np.full(len(src), start)),
                          message_times(c, src, dst, nbytes))


@given(pairs, st.lists(st.floats(0, 0.05), min_size=24, max_size=24), st.floats(1e3, 1e7),
       st.sampled_from([None, 3e7]))
def test_overlapping_less_never_costs_more(raw, starts, nbytes, cap):
    # Between a flow alone (its cap or the link) and every flow of the step on its resources at once.
    c = Cluster(3, 4, INTRA, Link(2e-5, 1e8, cap))
    src, dst = np.array(raw).T
    t = fluid_times(c, src, dst, nbytes, np.array(starts[:len(src)]))
    together = message_times(c, src, dst, nbytes)
    lat = np.where(src // 4 == dst // 4, INTRA.latency_s, 2e-5)
    alone = np.where(src // 4 == dst // 4, nbytes / INTRA.bandwidth_Bps, nbytes / min(1e8, cap or 1e8))
    live = src != dst
    assert (t[~live] == 0).all()
    assert (t[live] <= together[live] * (1 + 1e-9)).all()
    assert (t[live] >= (lat + alone)[live] * (1 - 1e-9)).all()


def _one_peer(sharing, compute="mean"):
    exp = make_experiment(TRACES["fixed" if compute == "mean" else "sampled"], nodes=4, gpus_per_node=2,
                          nic=NIC, intra=INTRA, algorithm="neighbor", topology="one_peer_exp2", negotiate=False,
                          buffered_sends=True, collective="ring", iterations=9, compute=compute,
                          p2p_sharing=sharing)
    return simulate(exp)


def test_ranks_that_drift_apart_use_the_nic_one_after_the_other():
    # One-peer exp2 on 4 nodes x 2 ranks, buffered sends (the validator's mlp-neighbor-8r-4x2 row): at shift 1 the
    # odd ranks receive from their own node and finish first, so at shifts 2 and 4 a node's two flows start apart
    # and overlap only in part; the start-together model charges both flows at half rate every time.
    fluid, together = _one_peer("fluid"), _one_peer("together")
    f, t = fluid.summary()["iteration_time_s"], together.summary()["iteration_time_s"]
    assert f < 0.95 * t
    assert fluid.path == "analytic"


def test_a_symmetric_exchange_is_the_same_under_both_models():
    # exp2 on one rank per node, every rank identical: all messages of a step start together.
    runs = [simulate(make_experiment(TRACES["fixed"], nodes=8, gpus_per_node=1, nic=NIC, algorithm="neighbor",
                                     collective="ring", iterations=3, p2p_sharing=s)) for s in ("fluid", "together")]
    assert runs[0].summary()["iteration_time_s"] == runs[1].summary()["iteration_time_s"]


def test_the_event_engine_refuses_fluid_sharing_and_bad_values_are_named():
    exp = make_experiment(TRACES["fixed"], nodes=2, gpus_per_node=2, algorithm="neighbor", collective="ring")
    with pytest.raises(ValueError, match="p2p_sharing"):
        simulate(exp, path="events")
    trace = Path(__file__).resolve().parents[1] / "traces" / "resnet20-cpu-b32.json.gz"
    d = {"workload": {"trace": str(trace)}, "cluster": {"nodes": 2, "gpus_per_node": 1, "nic_bandwidth": "1Gbit/s"},
         "comm": {"algorithm": "neighbor", "p2p_sharing": "maxmin"}}
    with pytest.raises(ConfigError) as err:
        from_dict(d, source="exp.toml")
    assert "comm.p2p_sharing" in str(err.value) and "maxmin" in str(err.value) and "fluid" in str(err.value)
