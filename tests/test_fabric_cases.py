"""Hand-worked cases of flows sharing a fabric: each case's docstring works the numbers out; the test asserts that
simfog.fabric computes exactly them (==, no tolerance). `python bench/fabric.py` prints the same rows.

Each case returns rows (what, expected, computed). Rates in B/s: 100 Gbit/s = 12.5e9 B/s.
"""

from __future__ import annotations

import pytest

from simfog.cluster import Cluster, Link
from simfog.fabric import (
    Dragonfly,
    FatTree,
    Flat,
    Flows,
    RailOptimized,
    hierarchical_pattern,
    ring_pattern,
    shared_step_costs,
    step_cost,
    step_times,
)

G100 = 12.5e9  # 100 Gbit/s in B/s


def case_two_flows_through_one_oversubscribed_uplink():
    """Two leaves of two nodes, NICs 100 Gbit/s, each leaf one uplink of 50 Gbit/s (leaf oversubscription
    2 × 100 / 50 = 4). Flows A: node 0 -> node 2 and B: node 1 -> node 3 cross leaf 0's uplink (up) and leaf 1's
    (down); C: node 3 -> node 2 stays on leaf 1 and shares node 2's NIC (down) with A.

    Filling: leaf 0 up holds A and B: 50 / 2 = 25 Gbit/s; node 2's NIC holds A and C: 100 / 2 = 50. The uplink
    fills first: A = B = 25 Gbit/s = 3.125e9 B/s. C then takes what A leaves on node 2's NIC: 100 − 25 = 75 Gbit/s
    = 9.375e9 B/s. 1 GB each: A and B take 1e9 / 3.125e9 = 0.32 s, C 1e9 / 9.375e9 s. One uplink, so hash and
    split agree."""
    fabric = FatTree(nic_Bps=G100, nodes_per_leaf=2, leaves=2, leaf_uplinks=1, leaf_uplink_Bps=G100 / 2)
    flows = Flows.from_list([(0, 0, 2, 0, 1e9), (1, 0, 3, 0, 1e9), (3, 0, 2, 0, 1e9)])
    rows = [("leaf oversubscription", 4.0, fabric.leaf_oversubscription)]
    for ecmp in ("split", "hash"):
        st = step_times(fabric, flows, ecmp=ecmp)
        rows += [(f"{ecmp}: A rate", 3.125e9, st.rate_Bps[0]), (f"{ecmp}: B rate", 3.125e9, st.rate_Bps[1]),
                 (f"{ecmp}: C rate", 9.375e9, st.rate_Bps[2]), (f"{ecmp}: A time (s)", 0.32, st.time_s[0]),
                 (f"{ecmp}: C time (s)", 1e9 / 9.375e9, st.time_s[2])]
    return rows


def case_ring_crossing_a_spine_contiguous_vs_scattered():
    """Four leaves of four nodes (16 nodes), NICs 100 Gbit/s, one 100 Gbit/s uplink per leaf (4:1). A job of 8
    nodes, one rank each, ring allreduce of 8 MB: 2·(8 − 1) = 14 steps of 8 MB / 8 = 1 MB per flow.

    Contiguous, nodes 0..7: the ring 0→1→…→7→0 crosses leaves twice (3→4 up leaf 0, 7→0 up leaf 1): one flow per
    uplink, so every flow gets its NIC, 100 Gbit/s; a step takes 1e6 / 12.5e9 = 80 us.
    Scattered, nodes [0, 4, 8, 12, 1, 5, 9, 13] (round robin over the leaves): every hop crosses leaves, and leaf
    0's uplink carries 0→4 and 1→5: 50 Gbit/s each (so every leaf's: each holds two senders); a step takes
    1e6 / 6.25e9 = 160 us, the ring twice as slow."""
    fabric = FatTree(nic_Bps=G100, nodes_per_leaf=4, leaves=4, leaf_uplinks=1, leaf_uplink_Bps=G100)
    rows = []
    for label, nodes, rate, step in (("contiguous", list(range(8)), G100, 8e-5),
                                     ("scattered", [0, 4, 8, 12, 1, 5, 9, 13], G100 / 2, 1.6e-4)):
        cost = step_cost(fabric, ring_pattern(nodes, 8e6))
        rows += [(f"{label}: steps", 14, cost.steps), (f"{label}: bytes per flow", 1e6, cost.bytes_per_flow),
                 (f"{label}: slowest rate", rate, cost.slowest_Bps), (f"{label}: step (s)", step, cost.step_s)]
    return rows


def case_rail_local_vs_cross_rail():
    """Rail-optimized: 4 nodes of 2 NICs (400 Gbit/s = 5e10 B/s each) in one group, so two rail switches; each
    rail switch has one 400 Gbit/s uplink to the spine (4 NICs : 1 uplink, 4:1).

    Rail-local, (0,0)→(1,0), (1,1)→(2,1), (2,0)→(3,0), (3,1)→(0,1): each crosses only its rail switch (1 switch)
    and owns its NICs: 400 Gbit/s each.
    Cross-rail, (0,0)→(1,1) and (2,0)→(3,1): both go up rail 0's uplink and down rail 1's (3 switches): 400 / 2 =
    200 Gbit/s = 2.5e10 B/s each.
    Rail-only (no spine): the same two flows leave through NIC 1 of their node (PXN: over NVLink to the GPU on the
    destination's rail first), then cross rail 1 only: 400 Gbit/s each, 1 switch."""
    nic = 5e10
    spine = RailOptimized(nic_Bps=nic, nics_per_node=2, nodes_per_group=4, rail_uplinks=1, rail_uplink_Bps=nic)
    rail_only = RailOptimized(nic_Bps=nic, nics_per_node=2, nodes_per_group=4)
    local = step_times(spine, Flows.from_list([(0, 0, 1, 0, 1.0), (1, 1, 2, 1, 1.0), (2, 0, 3, 0, 1.0),
                                               (3, 1, 0, 1, 1.0)]))
    cross_flows = Flows.from_list([(0, 0, 1, 1, 1.0), (2, 0, 3, 1, 1.0)])
    cross, pxn = step_times(spine, cross_flows), step_times(rail_only, cross_flows)
    rows = [("rail oversubscription", 4.0, spine.oversubscription)]
    rows += [(f"rail-local flow {i} rate", nic, local.rate_Bps[i]) for i in range(4)]
    rows += [(f"rail-local flow {i} switches", 1, local.routes.hops[i]) for i in range(4)]
    rows += [(f"cross-rail flow {i} rate", nic / 2, cross.rate_Bps[i]) for i in range(2)]
    rows += [(f"cross-rail flow {i} switches", 3, cross.routes.hops[i]) for i in range(2)]
    rows += [(f"rail-only cross-rail flow {i} rate", nic, pxn.rate_Bps[i]) for i in range(2)]
    rows += [(f"rail-only cross-rail flow {i} switches", 1, pxn.routes.hops[i]) for i in range(2)]
    return rows


def case_dragonfly_global_link_shared_by_several_groups():
    """Dragonfly of 3 groups, one router each with 2 nodes (nodes 0-1 group 0, 2-3 group 1, 4-5 group 2), one
    global link per ordered pair of groups, NICs and global links 100 Gbit/s.

    Flows: A node 0 → node 4 (group 0 → 2), B node 2 → node 5 (1 → 2), C node 1 → node 3 (0 → 1); no two share a
    NIC.
    Valiant (the only intermediate is the third group): A crosses 0→1 then 1→2; B 1→0 then 0→2; C 0→2 then 2→1.
    Global link 0→2 carries B (from group 1, passing through) and C (from group 0): 50 Gbit/s each. A shares no
    link: 100 Gbit/s. Each flow crosses 3 routers.
    Minimal: A on 0→2, B on 1→2, C on 0→1, nothing shared: 100 Gbit/s each, 2 routers."""
    flows = Flows.from_list([(0, 0, 4, 0, 1.0), (2, 0, 5, 0, 1.0), (1, 0, 3, 0, 1.0)])
    rows = []
    for routing, want, hops in (("valiant", (G100, G100 / 2, G100 / 2), 3), ("minimal", (G100,) * 3, 2)):
        fabric = Dragonfly(nic_Bps=G100, groups=3, routers_per_group=1, nodes_per_router=2, local_Bps=G100,
                           global_Bps=G100, routing=routing)
        st = step_times(fabric, flows)
        rows += [(f"{routing}: {name} rate", w, st.rate_Bps[i]) for i, (name, w) in enumerate(zip("ABC", want))]
        rows += [(f"{routing}: {name} routers", hops, st.routes.hops[i]) for i, name in enumerate("ABC")]
    return rows


def case_flat_ring_step_equals_todays_model():
    """Flat fabric of 4 nodes, one NIC of 25 Gbit/s (3.125e9 B/s) and 10 us each: a ring step of 4 ranks on a
    4 MB buffer sends 1 MB from every node to the next. Each NIC carries one flow each way, so every flow gets
    exactly the NIC rate, and the step takes 10e-6 + 1e6 / 3.125e9 s, which is what simfog's cluster model
    (Cluster.inter.time, the ring collective's step) gives, bit for bit. With oversubscription 2 both sides see
    the NIC at 3.125e9 / 2, again bit for bit."""
    nic = Link(10e-6, 3.125e9)
    rows = []
    for over in (1.0, 2.0):
        cluster = Cluster(nodes=4, ranks_per_node=1, intra=Link(1e-6, 1e11), nic=nic, oversubscription=over)
        fabric = Flat(nodes=4, nic_Bps=nic.bandwidth_Bps, oversubscription=over)
        step = ring_pattern(range(4), 4e6)
        st = step_times(fabric, step.flows, latency_s=nic.latency_s)
        cost = step_cost(fabric, step, latency_s=nic.latency_s)
        rows += [(f"oversubscription {over:g}: flow {i} rate", cluster.inter.bandwidth_Bps, st.rate_Bps[i])
                 for i in range(4)]
        rows += [(f"oversubscription {over:g}: flow time = Link.time", cluster.inter.time(1e6), st.time_s[0]),
                 (f"oversubscription {over:g}: step = Link.time", cluster.inter.time(1e6), cost.step_s)]
    return rows


def case_two_jobs_share_an_uplink():
    """Two leaves of four nodes, NICs 100 Gbit/s, one 150 Gbit/s uplink per leaf. Job A: ring over nodes [0, 4]
    (one rank each), 0→4 and 4→0, both crossing leaves. Job B: hierarchical on nodes [1, 5], two ranks per node,
    one NIC: two inter-node rings, 1→5 twice and 5→1 twice.

    Alone: A has one flow per uplink and NIC: 100 Gbit/s. B has 2 flows on node 1's NIC (50 each) and 2 on leaf
    0's uplink (75 each): 50 Gbit/s.
    Together, each job's flows at one rate: leaf 0's uplink holds A's 0→4 and B's two 1→5: 150 / 3 = 50 for each;
    node 1's NIC holds B's two: 100 / 2 = 50. Both fill at 50 Gbit/s = 6.25e9 B/s: A runs at half its rate alone
    (slowdown 2), B as fast as alone (it was held back by its own NIC)."""
    fabric = FatTree(nic_Bps=G100, nodes_per_leaf=4, leaves=2, leaf_uplinks=1, leaf_uplink_Bps=1.5 * G100)
    a = ring_pattern([0, 4], 2e6)
    b = hierarchical_pattern([1, 5], 2e6, ranks_per_node=2)
    alone = [step_cost(fabric, a), step_cost(fabric, b)]
    together = shared_step_costs(fabric, [a, b])
    return [("A alone", G100, alone[0].slowest_Bps), ("B alone", G100 / 2, alone[1].slowest_Bps),
            ("A together", G100 / 2, together[0].slowest_Bps), ("B together", G100 / 2, together[1].slowest_Bps),
            ("A slowdown", 2.0, together[0].step_s / alone[0].step_s),
            ("B slowdown", 1.0, together[1].step_s / alone[1].step_s)]


CASES = [case_two_flows_through_one_oversubscribed_uplink, case_ring_crossing_a_spine_contiguous_vs_scattered,
         case_rail_local_vs_cross_rail, case_dragonfly_global_link_shared_by_several_groups,
         case_flat_ring_step_equals_todays_model, case_two_jobs_share_an_uplink]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.removeprefix("case_") for c in CASES])
def test_hand_worked_case(case):
    rows = case()
    assert rows
    wrong = [(what, expected, computed) for what, expected, computed in rows if computed != expected]
    assert not wrong, wrong
