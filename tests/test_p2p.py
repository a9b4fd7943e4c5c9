"""Point-to-point traffic shares the sender's and receiver's NIC; intra-node messages use the intra link; a per-flow
cap bounds each message (flow level)."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simfog.cluster import Cluster, Link
from simfog.errors import ConfigError
from simfog.p2p import Message, exchange_makespan, exchange_times, flow_rates

NIC, INTRA = Link(10e-6, 1e9), Link(1e-6, 1e11)


def cluster(nodes, per_node):
    return Cluster(nodes, per_node, INTRA, NIC)


def test_single_message_is_alpha_beta():
    assert exchange_times(cluster(2, 1), [Message(0, 1, 1e6)]) == [pytest.approx(10e-6 + 1e6 / 1e9)]


def test_sender_with_d_peers_divides_its_nic():
    c = cluster(4, 1)
    msgs = [Message(0, 1, 1e6), Message(0, 2, 1e6), Message(0, 3, 1e6)]
    assert exchange_times(c, msgs) == [pytest.approx(10e-6 + 3 * 1e6 / 1e9)] * 3


def test_receiver_side_is_shared_too():
    c = cluster(4, 1)
    msgs = [Message(1, 0, 1e6), Message(2, 0, 1e6)]
    assert exchange_makespan(c, msgs) == pytest.approx(10e-6 + 2e6 / 1e9)


def test_ranks_of_a_node_share_its_nic_but_not_intra_links():
    c = cluster(2, 4)
    off_node = [Message(r, r + 4, 1e6) for r in range(4)]  # 4 flows through node 0's NIC
    assert exchange_makespan(c, off_node) == pytest.approx(10e-6 + 4e6 / 1e9)
    on_node = [Message(0, 1, 1e6), Message(2, 3, 1e6)]
    assert exchange_times(c, on_node) == [pytest.approx(1e-6 + 1e6 / 1e11)] * 2


def test_one_peer_ring_exchange_has_no_contention():
    n = 8
    c = cluster(n, 1)
    msgs = [Message(r, (r + 1) % n, 5e6) for r in range(n)]
    assert exchange_times(c, msgs) == [pytest.approx(10e-6 + 5e6 / 1e9)] * n


@given(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15), st.floats(0, 1e8)), max_size=30))
def test_never_faster_than_alone(raw):
    c = cluster(4, 4)
    msgs = [Message(a, b, m) for a, b, m in raw]
    for m, t in zip(msgs, exchange_times(c, msgs)):
        alone = exchange_times(c, [m])[0]
        assert t >= alone - 1e-15


# --- flow level: a per-flow cap below the NIC's bandwidth ------------------------------------------------------------

A, C, M = 1e-3, 100e6, 1e6          # NIC: 1 ms, 100 MB/s in all; 1 MB messages


def capped(nodes, per_node, cap, intra_cap=None):
    return Cluster(nodes, per_node, Link(1e-6, 1e9, intra_cap), Link(A, C, cap))


@pytest.mark.parametrize("cap,want", [(80e6, A + 2 * M / C),   # cap above C/2: the NIC binds, 2M/C = 20 ms
                                      (50e6, A + 2 * M / C),   # exactly C/2: both bounds agree
                                      (30e6, A + M / 30e6)])   # cap below C/2: each flow at its cap, 33.3 ms
def test_two_flows_on_one_nic(cap, want):
    c = capped(2, 2, cap)
    msgs = [Message(0, 2, M), Message(1, 3, M)]  # both ranks of node 0 send to node 1: 2 flows each way
    assert exchange_times(c, msgs) == [pytest.approx(want, rel=1e-12)] * 2
    assert flow_rates(c, msgs) == [pytest.approx(min(cap, C / 2), rel=1e-12)] * 2


def test_one_flow_runs_at_its_cap_alone():
    c = capped(2, 1, 30e6)
    assert exchange_times(c, [Message(0, 1, M)]) == [pytest.approx(A + M / 30e6, rel=1e-12)]
    # a cap above the NIC's bandwidth changes nothing: one flow cannot beat the NIC
    assert exchange_times(capped(2, 1, 3 * C), [Message(0, 1, M)]) == [A + M / C]


def test_intra_and_inter_messages_use_their_own_link_and_cap():
    c = capped(2, 2, 30e6, intra_cap=2e8)
    msgs = [Message(0, 1, M), Message(1, 2, M)]  # intra (rank 0 -> 1), inter (node 0 -> node 1)
    intra, inter = exchange_times(c, msgs)
    assert intra == pytest.approx(1e-6 + M / 2e8, rel=1e-12)   # the intra cap, below the intra link's 1 GB/s
    assert inter == pytest.approx(A + M / 30e6, rel=1e-12)


def test_no_cap_gives_the_shared_link_numbers_bit_for_bit():
    # Without a cap: α + flows·M/bandwidth exactly as before the cap existed (same float operations).
    c = cluster(2, 4)
    msgs = [Message(r, r + 4, 1e6 + 7 * r) for r in range(4)] + [Message(5, 6, 3e6)]
    want = [NIC.latency_s + 4 * m.nbytes / NIC.bandwidth_Bps for m in msgs[:4]]
    want.append(INTRA.latency_s + 1 * 3e6 / INTRA.bandwidth_Bps)
    assert exchange_times(c, msgs) == want
    degraded = replace(c, degraded_nics=((1, 2e8),))
    assert exchange_times(degraded, msgs[:4]) == [NIC.latency_s + 4 * m.nbytes / 2e8 for m in msgs[:4]]


def test_a_degraded_nic_keeps_the_cap():
    c = replace(capped(2, 1, 30e6), degraded_nics=((1, 20e6),))
    assert exchange_times(c, [Message(0, 1, M)]) == [pytest.approx(A + M / 20e6, rel=1e-12)]  # the slower NIC binds


def _loads(c, msgs):
    """Independent count: the most concurrent messages on a resource each message crosses."""
    def res(m):
        a, b = c.node_of(m.src), c.node_of(m.dst)
        return [("i-out", m.src), ("i-in", m.dst)] if a == b else [("n-out", a), ("n-in", b)]
    count = {}
    for m in msgs:
        if m.src != m.dst:
            for r in res(m):
                count[r] = count.get(r, 0) + 1
    return [0 if m.src == m.dst else max(count[r] for r in res(m)) for m in msgs]


message_lists = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15), st.floats(0, 1e8)), max_size=30)


@given(message_lists, st.floats(1e6, 1e9), st.floats(1e6, 1e9))
def test_flow_level_bounds(raw, cap, intra_cap):
    # Never faster than one flow alone at its cap, nor than the flows' equal shares of the link.
    c = capped(4, 4, cap, intra_cap)
    msgs = [Message(a, b, m) for a, b, m in raw]
    for m, k, t in zip(msgs, _loads(c, msgs), exchange_times(c, msgs)):
        if m.src == m.dst:
            assert t == 0.0
            continue
        link = c.link_between(m.src, m.dst)
        assert t >= link.latency_s + m.nbytes / link.flow_bandwidth_Bps - 1e-15
        assert t >= link.latency_s + m.nbytes * k / link.bandwidth_Bps - 1e-15


@given(message_lists, st.tuples(st.integers(0, 15), st.integers(0, 15), st.floats(0, 1e8)), st.floats(1e6, 1e9))
def test_more_flows_never_speed_a_message_up(raw, extra, cap):
    c = capped(4, 4, cap)
    msgs = [Message(a, b, m) for a, b, m in raw]
    before = exchange_times(c, msgs)
    after = exchange_times(c, [*msgs, Message(*extra)])[:-1]
    assert all(a >= b for a, b in zip(after, before))


def test_link_flow_cap_is_checked_and_sets_beta():
    with pytest.raises(ConfigError, match="flow_bandwidth"):
        Link(0.0, 1e9, 0.0)
    assert Link(0.0, 1e9, 2.5e8).beta_s_per_B == 1 / 2.5e8   # one flow alone: the cap
    assert Link(0.0, 1e9, 4e9).beta_s_per_B == 1 / 1e9       # a cap above the link: the link
    assert Link(0.0, 1e9).beta_s_per_B == 1 / 1e9
