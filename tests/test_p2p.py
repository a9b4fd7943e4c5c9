"""Point-to-point traffic shares the sender's and receiver's NIC; intra-node messages use the intra link."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simfog.cluster import Cluster, Link
from simfog.p2p import Message, exchange_makespan, exchange_times

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
