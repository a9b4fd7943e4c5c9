"""Max-min fair sharing on every kind of fabric, as properties over random fabrics and flows (hypothesis):

- no link carries more than its capacity;
- max-min fairness: every flow has a bottleneck link, full, on which no flow runs faster than it (so no flow can
  get more without taking from a flow of an equal or smaller rate);
- permutation invariance: reordering the flows reorders their rates and changes nothing else;
- the closed form (slowest_rate) is the slowest flow of the full filling, and coupled groups share one rate.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog.errors import ConfigError
from simfog.fabric import (
    Dragonfly,
    FatTree,
    Flat,
    Flows,
    RailOptimized,
    max_min_rates,
    slowest_rate,
    step_times,
)
from simfog.fabric.links import ecmp_hash

RATES = [1e9, 2.5e9, 12.5e9, 5e10]
EPS = 1e-9


@st.composite
def fabrics(draw):
    kind = draw(st.sampled_from(["flat", "fat2", "fat3", "rail", "rail_only", "dragonfly"]))
    common = dict(nic_Bps=draw(st.sampled_from(RATES)), nics_per_node=draw(st.integers(1, 3)),
                  ecmp=draw(st.sampled_from(["split", "hash"])))
    rate = st.sampled_from(RATES)
    if kind == "flat":
        return Flat(nodes=draw(st.integers(2, 8)), oversubscription=draw(st.sampled_from([1.0, 1.5, 4.0])), **common)
    if kind == "fat2":
        return FatTree(nodes_per_leaf=draw(st.integers(1, 3)), leaves=draw(st.integers(2, 4)),
                       leaf_uplinks=draw(st.integers(1, 3)), leaf_uplink_Bps=draw(rate), **common)
    if kind == "fat3":
        spines = draw(st.integers(1, 2))
        return FatTree(nodes_per_leaf=draw(st.integers(1, 2)), leaves=2 * draw(st.integers(1, 3)), leaves_per_pod=2,
                       leaf_uplinks=spines * draw(st.integers(1, 2)), leaf_uplink_Bps=draw(rate),
                       spines_per_pod=spines, spine_uplinks=draw(st.integers(1, 2)), spine_uplink_Bps=draw(rate),
                       **common)
    if kind == "rail":
        return RailOptimized(nodes_per_group=draw(st.integers(1, 3)), groups=draw(st.integers(1, 3)),
                             rail_uplinks=draw(st.integers(1, 2)), rail_uplink_Bps=draw(rate), **common)
    if kind == "rail_only":
        return RailOptimized(nodes_per_group=draw(st.integers(2, 5)), **common)
    groups = draw(st.integers(2, 4))
    return Dragonfly(groups=groups, routers_per_group=draw(st.integers(1, 3)), nodes_per_router=draw(st.integers(1, 2)),
                     local_Bps=draw(rate), global_Bps=draw(rate), global_links_per_pair=draw(st.integers(1, 2)),
                     routing=draw(st.sampled_from(["minimal", "valiant"] if groups >= 3 else ["minimal"])), **common)


@st.composite
def fabric_and_flows(draw):
    fabric = draw(fabrics())
    n = draw(st.integers(1, 14))
    node, nic = st.integers(0, fabric.nodes - 1), st.integers(0, fabric.nics_per_node - 1)
    items = [(draw(node), draw(nic), draw(node), draw(nic), draw(st.sampled_from([1.0, 1e6, 3e6])))
             for _ in range(n)]
    return fabric, Flows.from_list(items)


def solved(case, **kw):
    """(flows, routes, max-min rates, which flows cross a link) of a drawn case."""
    fabric, flows = case
    routes = fabric.route(flows)
    return flows, routes, max_min_rates(routes, **kw), np.isin(np.arange(len(flows)), routes.flow)


def _bottlenecked(routes, rates) -> list[int]:
    """Flows that cross a link and have no bottleneck link (full, and none faster than them on it)."""
    load, cap = routes.load(np.where(np.isfinite(rates), rates, 0.0)), routes.capacity
    missing = []
    for f in np.unique(routes.flow):
        ok = False
        for link in np.unique(routes.link[routes.flow == f]):
            on = np.unique(routes.flow[routes.link == link])
            if load[link] >= cap[link] * (1 - EPS) and rates[f] >= rates[on].max() * (1 - EPS):
                ok = True
                break
        if not ok:
            missing.append(int(f))
    return missing


@settings(max_examples=300, deadline=None)
@given(fabric_and_flows())
def test_links_never_carry_more_than_their_capacity_and_every_flow_has_a_bottleneck(case):
    flows, routes, rates, crossing = solved(case)
    assert np.isfinite(rates[crossing]).all() and (rates[crossing] > 0).all()
    assert (routes.load(np.where(crossing, rates, 0.0)) <= routes.capacity * (1 + EPS)).all()
    assert _bottlenecked(routes, rates) == []
    # a flow inside one node crosses nothing; every flow between nodes crosses its two NICs at least
    assert (crossing == (flows.src_node != flows.dst_node)).all()


@settings(max_examples=200, deadline=None)
@given(fabric_and_flows(), st.randoms(use_true_random=False))
def test_rates_do_not_depend_on_the_order_of_the_flows(case, rnd):
    fabric, flows = case
    perm = np.array(rnd.sample(range(len(flows)), len(flows)))
    shuffled = Flows(*(getattr(flows, f)[perm] for f in ("src_node", "src_nic", "dst_node", "dst_nic", "nbytes")))
    a, b = step_times(fabric, flows), step_times(fabric, shuffled)
    np.testing.assert_allclose(b.rate_Bps, a.rate_Bps[perm], rtol=1e-12)
    np.testing.assert_allclose(b.time_s, a.time_s[perm], rtol=1e-12)
    assert (b.routes.hops == a.routes.hops[perm]).all()


@settings(max_examples=200, deadline=None)
@given(fabric_and_flows())
def test_the_closed_form_is_the_slowest_flow_of_the_filling(case):
    flows, routes, rates, crossing = solved(case)
    expected = rates[crossing].min() if crossing.any() else np.inf
    assert slowest_rate(routes) == expected
    # all flows coupled into one group run at that same rate
    one = max_min_rates(routes, groups=np.zeros(len(flows), dtype=int))
    assert (one[crossing] == expected).all()


@settings(max_examples=200, deadline=None)
@given(fabric_and_flows(), st.data())
def test_coupled_groups_share_one_rate_within_capacity(case, data):
    n = len(case[1])
    groups = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    flows, routes, rates, crossing = solved(case, groups=groups)
    for g in np.unique(groups[crossing]):
        members = rates[crossing & (groups == g)]
        assert (members == members[0]).all()
    assert (routes.load(np.where(crossing, rates, 0.0)) <= routes.capacity * (1 + EPS)).all()
    # each group as its own flow: the same as no groups
    singles = max_min_rates(routes, groups=np.arange(len(flows)))
    assert (singles == max_min_rates(routes)).all()


@settings(max_examples=100, deadline=None)
@given(fabric_and_flows(), st.sampled_from([1e8, 1e9, 1e10]))
def test_a_flow_cap_bounds_every_rate_and_keeps_the_links_within_capacity(case, cap):
    flows, routes, rates, crossing = solved(case, max_Bps=cap)
    assert (rates <= cap * (1 + EPS)).all()
    assert (routes.load(np.where(crossing, rates, 0.0)) <= routes.capacity * (1 + EPS)).all()
    # a flow below its cap is held back by a full link
    uncapped = crossing & (rates < cap * (1 - EPS))
    load = routes.load(np.where(crossing, rates, 0.0))
    for f in np.flatnonzero(uncapped):
        links = np.unique(routes.link[routes.flow == f])
        assert (load[links] >= routes.capacity[links] * (1 - EPS)).any()


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 4), st.integers(1, 3), st.sampled_from(RATES), st.data())
def test_hash_and_split_agree_where_every_tier_has_one_path(leaves, per_leaf, rate, data):
    fabric = FatTree(nic_Bps=12.5e9, nodes_per_leaf=per_leaf, leaves=2 * leaves, leaf_uplinks=1, leaf_uplink_Bps=rate,
                     leaves_per_pod=2, spines_per_pod=1, spine_uplinks=1, spine_uplink_Bps=rate)
    node = st.integers(0, fabric.nodes - 1)
    items = data.draw(st.lists(st.tuples(node, st.just(0), node, st.just(0), st.just(1e6)), min_size=1, max_size=10))
    flows = Flows.from_list(items)
    split, hashed = step_times(fabric, flows, ecmp="split"), step_times(fabric, flows, ecmp="hash")
    assert (split.rate_Bps == hashed.rate_Bps).all()


def test_hash_spreads_flows_over_uplinks_and_is_fixed():
    """Static ECMP: 4 uplinks, many flows: each uplink gets some (a hash that sent all to one would be no hash), and
    the same flow always takes the same path (the hash's values are pinned here: a change of hash is a change of
    every ECMP result and must be deliberate)."""
    fabric = FatTree(nic_Bps=1e9, nodes_per_leaf=64, leaves=2, leaf_uplinks=4, leaf_uplink_Bps=1e9, ecmp="hash")
    flows = Flows.of(np.arange(64), np.arange(64, 128), 1.0)
    routes = fabric.route(flows)
    up = routes.link[np.isin(routes.link, fabric.link_table().ids("leaf up", 0, np.arange(4)))]
    counts = np.bincount(up - up.min(), minlength=4)
    assert (counts > 0).all() and counts.sum() == 64
    assert ecmp_hash(np.array([0]), np.array([0]), np.array([1]), np.array([0]))[0] == np.uint64(7108066972471032027)
    assert (fabric.route(flows).link == routes.link).all()


def test_flows_outside_the_fabric_are_config_errors():
    fabric = Flat(nodes=4, nic_Bps=1e9, nics_per_node=2)
    with pytest.raises(ConfigError, match=r"flows\.dst_node = 4: an index in 0\.\.3"):
        fabric.route(Flows.from_list([(0, 0, 4, 0, 1.0)]))
    with pytest.raises(ConfigError, match=r"flows\.src_nic = 2"):
        fabric.route(Flows.from_list([(0, 2, 1, 0, 1.0)]))
    with pytest.raises(ConfigError, match=r"flows\.nbytes"):
        Flows.from_list([(0, 0, 1, 0, -1.0)])
    with pytest.raises(ConfigError, match=r"flows\.src_node"):
        Flows.of([0.5], [1], 1.0)


def test_a_flow_inside_a_node_crosses_nothing_and_costs_nothing_here():
    st_ = step_times(Flat(nodes=2, nic_Bps=1e9, nics_per_node=2), Flows.from_list([(1, 0, 1, 1, 5.0)]),
                     latency_s=1e-6)
    assert st_.rate_Bps[0] == np.inf and st_.time_s[0] == 0.0 and st_.makespan_s == 0.0
