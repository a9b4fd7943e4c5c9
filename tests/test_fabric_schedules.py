"""Ring, tree and hierarchical step patterns on a fabric: their flows follow the job's node order and NCCL's
trees, and on a flat fabric their costs are today's collective costs (simfog.collectives)."""

from __future__ import annotations

import numpy as np
import pytest

from simfog.cluster import Cluster, Link
from simfog.collectives import CostModel
from simfog.errors import ConfigError
from simfog.fabric import (
    FatTree,
    Flat,
    Placement,
    hierarchical_pattern,
    pattern,
    ring_pattern,
    shared_step_costs,
    step_cost,
    tree_pattern,
)
from simfog.fabric.schedules import double_binary_tree_edges

NIC = Link(5e-6, 3.125e9)


def nccl_btree_parent(nranks: int, rank: int) -> int:
    """NCCL's ncclGetBtree (src/graph/trees.cc), its parent, step by step as written there."""
    bit = 1
    while bit < nranks:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    return up


def nccl_dtree_parents(nranks: int, rank: int) -> tuple[int, int]:
    """ncclGetDtree: the btree, and its mirror (even count) or its shift by one (odd count)."""
    first = nccl_btree_parent(nranks, rank)
    if nranks % 2:
        u = nccl_btree_parent(nranks, (rank - 1 + nranks) % nranks)
        return first, -1 if u == -1 else (u + 1) % nranks
    u = nccl_btree_parent(nranks, nranks - 1 - rank)
    return first, -1 if u == -1 else nranks - 1 - u


@pytest.mark.parametrize("m", range(2, 70))
def test_double_binary_tree_is_nccl_s(m):
    child, parent = double_binary_tree_edges(m)
    assert len(child) == 2 * (m - 1)
    for k, tree in enumerate((slice(0, m - 1), slice(m - 1, None))):
        want = {(r, nccl_dtree_parents(m, r)[k]) for r in range(m) if nccl_dtree_parents(m, r)[k] >= 0}
        assert set(zip(child[tree].tolist(), parent[tree].tolist())) == want
    for tree in (slice(0, m - 1), slice(m - 1, None)):  # each a spanning tree of at most two children per node
        up = dict(zip(child[tree].tolist(), parent[tree].tolist()))
        assert max(np.bincount(parent[tree])) <= 2
        for r in range(m):
            seen = set()
            while r in up:
                assert r not in seen
                seen.add(r)
                r = up[r]


@pytest.mark.parametrize("nodes, over", [(2, 1.0), (3, 1.0), (8, 1.0), (8, 2.0), (37, 1.5)])
@pytest.mark.parametrize("op", ["allreduce", "reduce_scatter", "allgather"])
def test_ring_on_a_flat_fabric_is_today_s_ring_bit_for_bit(nodes, over, op):
    cluster = Cluster(nodes=nodes, ranks_per_node=1, intra=Link(1e-6, 1e11), nic=NIC, oversubscription=over)
    fabric = Flat(nodes=nodes, nic_Bps=NIC.bandwidth_Bps, oversubscription=over)
    cost = step_cost(fabric, ring_pattern(range(nodes), 3e6, op=op), latency_s=NIC.latency_s)
    assert cost.total_s == CostModel(cluster, "ring").time(op, 3e6)


@pytest.mark.parametrize("nodes", [4, 5, 8, 13, 64])
def test_tree_on_a_flat_fabric_is_today_s_tree(nodes):
    """Every node sends on its NIC at most 4 flows (up to its parent in both trees, down to two children in the
    one where it is interior), M/2 each: (M/2)/(nic/4) = 2M/nic, plus 2·⌈log2 m⌉·α: today's 2D + 2Mβ."""
    cluster = Cluster(nodes=nodes, ranks_per_node=1, intra=Link(1e-6, 1e11), nic=NIC)
    cost = step_cost(Flat(nodes=nodes, nic_Bps=NIC.bandwidth_Bps), tree_pattern(range(nodes), 3e6),
                     latency_s=NIC.latency_s)
    assert cost.slowest_Bps == NIC.bandwidth_Bps / 4
    assert cost.total_s == pytest.approx(CostModel(cluster, "tree").time("allreduce", 3e6), rel=1e-12)


def test_hierarchical_on_a_flat_fabric_is_today_s_inter_node_part():
    """L = 4 rings share each NIC: (m − 1)·(α + L·(M/L/m)/nic) per pass, two passes: today's inter part
    (Link.time with L flows)."""
    m, L, M = 6, 4, 8e6
    cost = step_cost(Flat(nodes=m, nic_Bps=NIC.bandwidth_Bps), hierarchical_pattern(range(m), M, ranks_per_node=L),
                     latency_s=NIC.latency_s)
    assert (cost.steps, cost.slowest_Bps) == (2 * (m - 1), NIC.bandwidth_Bps / L)
    assert cost.total_s == pytest.approx(2 * (m - 1) * NIC.time(M / L / m, flows=L), rel=1e-12)


def test_ring_follows_the_node_order_and_spreads_over_the_nics():
    p = ring_pattern([5, 1, 3], 12e6, ranks_per_node=2, nics=2)
    f = p.flows
    assert list(zip(f.src_node, f.dst_node, f.src_nic, f.dst_nic)) == [
        (5, 1, 0, 0), (5, 1, 1, 1), (1, 3, 0, 0), (1, 3, 1, 1), (3, 5, 0, 0), (3, 5, 1, 1)]
    # 6 ranks: 2·(6 − 1) steps of 12 MB / 6 per rank, split over 2 channels
    assert (p.steps, p.bytes_per_flow, p.latencies) == (10, 1e6, 1)
    assert (f.nbytes == 1e6).all()
    # on a flat fabric with 2 NICs each channel owns its NIC
    assert step_cost(Flat(nodes=6, nic_Bps=1e9, nics_per_node=2), p).slowest_Bps == 1e9


def test_hierarchical_rings_take_their_local_rank_s_rail():
    """Local rank l's ring crosses on NIC l mod K (NCCL's rails): 4 local rings on 2 NICs use NICs 0, 1, 0, 1, so
    each NIC carries two of them."""
    p = hierarchical_pattern([0, 1], 8e6, ranks_per_node=4, nics=2)
    assert p.flows.src_nic.tolist() == [0, 0, 1, 1, 0, 0, 1, 1] and (p.flows.src_nic == p.flows.dst_nic).all()
    assert step_cost(Flat(nodes=2, nic_Bps=1e9, nics_per_node=2), p).slowest_Bps == 1e9 / 2


def test_one_node_has_no_fabric_flows():
    for p in (ring_pattern([3], 1e6, ranks_per_node=4), tree_pattern([3], 1e6),
              hierarchical_pattern([3], 1e6, ranks_per_node=4)):
        cost = step_cost(Flat(nodes=4, nic_Bps=1e9), p)
        assert len(p.flows) == 0 and cost.step_s == 0.0 and cost.slowest_Bps == np.inf


def test_one_job_shared_with_nobody_costs_what_it_costs_alone():
    fabric = FatTree(nic_Bps=1e9, nodes_per_leaf=4, leaves=8, leaf_uplinks=2, leaf_uplink_Bps=1e9, ecmp="hash")
    for p in (ring_pattern(Placement.scattered(12, 32, seed=3).nodes, 1e6), tree_pattern(range(0, 32, 3), 1e6)):
        assert shared_step_costs(fabric, [p], latency_s=1e-6) == [step_cost(fabric, p, latency_s=1e-6)]


def test_two_jobs_never_run_faster_together_than_alone():
    fabric = FatTree(nic_Bps=1e9, nodes_per_leaf=4, leaves=8, leaf_uplinks=1, leaf_uplink_Bps=2e9)
    a = Placement.scattered(16, 32, seed=1)
    b = Placement.given([v for v in range(32) if v not in a.nodes], 32, taken=a.nodes)
    jobs = [ring_pattern(a.nodes, 1e6), tree_pattern(b.nodes, 1e6)]
    together = shared_step_costs(fabric, jobs)
    for job, shared in zip(jobs, together):
        alone = step_cost(fabric, job)
        assert shared.slowest_Bps <= alone.slowest_Bps and shared.step_s >= alone.step_s


def test_pattern_dispatch_and_bad_arguments():
    assert pattern("tree", range(4), 1e6, op="allgather").name == "ring allgather"  # NCCL: rings only
    assert pattern("hierarchical", range(4), 1e6, ranks_per_node=2).name == "hierarchical allreduce"
    with pytest.raises(ConfigError, match="algorithm = 'rhd'"):
        pattern("rhd", range(4), 1e6)
    with pytest.raises(ConfigError, match="op = 'broadcast'"):
        ring_pattern(range(4), 1e6, op="broadcast")
    with pytest.raises(ConfigError, match="each once"):
        ring_pattern([1, 1], 1e6)
    with pytest.raises(ConfigError, match="nics = 0"):
        ring_pattern([0, 1], 1e6, nics=0)
