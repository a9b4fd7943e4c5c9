"""The [fabric] table: each kind built in SI from human units, counts and rates derived, and every bad value refused
with the file, the field, the value and what is allowed."""

from __future__ import annotations

import tomllib

import pytest

from simfog.errors import ConfigError
from simfog.fabric import Dragonfly, FatTree, Flat, RailOptimized, from_table

G400 = 5e10  # 400 Gbit/s in B/s


def parse(text: str, nodes: int = 64, nics: int = 1, nic: float = G400, source: str | None = "exp.toml"):
    return from_table(tomllib.loads(text).get("fabric"), nodes=nodes, nic_Bps=nic, nics_per_node=nics, source=source)


def test_no_table_is_todays_flat_fabric():
    f = from_table(None, nodes=8, nic_Bps=1e9)
    assert f == Flat(nodes=8, nic_Bps=1e9) and f.oversubscription == 1.0 and f.ecmp == "split"
    f = parse('[fabric]\nkind = "flat"\noversubscription = 2\nswitch_latency = "1us"', nodes=8)
    assert (f.nodes, f.oversubscription, f.switch_latency_s) == (8, 2.0, 1e-6)


def test_two_tier_fat_tree_derives_the_uplink_rate_from_the_oversubscription():
    # 16 nodes x 1 NIC of 400 Gbit/s per leaf = 6.4 Tbit/s down; 8 uplinks at 2:1 carry 3.2 Tbit/s: 400 Gbit/s each
    f = parse('[fabric]\nkind = "fat_tree"\nnodes_per_leaf = 16\nleaf_uplinks = 8\nleaf_oversubscription = 2.0',
              nodes=100)
    assert isinstance(f, FatTree) and f.tiers == 2
    assert (f.leaves, f.leaf_uplinks, f.leaf_uplink_Bps, f.leaf_oversubscription) == (7, 8, G400, 2.0)
    assert f.nodes == 112  # the fewest leaves that hold 100 nodes


def test_fat_tree_derives_the_uplink_count_or_the_oversubscription():
    # rate and oversubscription: 4 nodes x 2 NICs x 400 Gbit/s = 3.2 Tbit/s down; at 2:1 the uplinks carry
    # 1.6 Tbit/s: two of 800 Gbit/s
    f = parse('[fabric]\nkind = "fat_tree"\nnodes_per_leaf = 4\nleaf_uplink_bandwidth = "800Gbit/s"\n'
              'leaf_oversubscription = 2', nodes=8, nics=2)
    assert (f.leaf_uplinks, f.leaf_uplink_Bps) == (2, 1e11)
    # count and rate: the oversubscription follows
    f = parse('[fabric]\nkind = "fat_tree"\nnodes_per_leaf = 4\nleaf_uplinks = 1\nleaf_uplink_bandwidth = "400Gbit/s"',
              nodes=8)
    assert f.leaf_oversubscription == 4.0
    # nothing: non-blocking, one uplink per NIC at the NIC's rate
    f = parse('[fabric]\nkind = "fat_tree"\nnodes_per_leaf = 4', nodes=8, nics=2)
    assert (f.leaf_uplinks, f.leaf_uplink_Bps, f.leaf_oversubscription) == (8, G400, 1.0)


def test_three_tier_fat_tree():
    text = """
    [fabric]
    kind = "fat_tree"
    tiers = 3
    ecmp = "hash"
    nodes_per_leaf = 4
    leaves_per_pod = 8
    leaf_uplinks = 8
    leaf_uplink_bandwidth = "400Gbit/s"
    spine_uplinks = 4
    spine_oversubscription = 2.0
    """
    f = parse(text, nodes=100, nics=2)
    # a pod: 8 leaves x 4 nodes = 32 nodes; 100 nodes need 4 pods. A spine receives 8 leaves x 1 link x 400 Gbit/s
    # = 3.2 Tbit/s; at 2:1 its 4 uplinks carry 1.6 Tbit/s: 400 Gbit/s each
    assert (f.tiers, f.pods, f.leaves, f.spines_per_pod, f.spine_uplinks) == (3, 4, 32, 8, 4)
    assert (f.spine_uplink_Bps, f.spine_oversubscription, f.leaf_oversubscription, f.ecmp) == (G400, 2.0, 1.0, "hash")


def test_rail_and_rail_only():
    f = parse('[fabric]\nkind = "rail"\nnodes_per_group = 32\nrail_uplinks = 16\n'
              'rail_uplink_bandwidth = "400Gbit/s"', nodes=64, nics=8)
    assert isinstance(f, RailOptimized) and (f.groups, f.oversubscription, f.rail_only) == (2, 2.0, False)
    f = parse('[fabric]\nkind = "rail"\nrail_only = true', nodes=16, nics=8)
    assert f.rail_only and (f.groups, f.nodes_per_group, f.oversubscription) == (1, 16, None)


def test_dragonfly():
    f = parse('[fabric]\nkind = "dragonfly"\nrouters_per_group = 4\nnodes_per_router = 2\n'
              'local_bandwidth = "200Gbit/s"\nglobal_bandwidth = "100Gbit/s"\nrouting = "valiant"', nodes=30)
    assert isinstance(f, Dragonfly)
    assert (f.groups, f.nodes, f.local_Bps, f.global_Bps, f.routing) == (4, 32, 2.5e10, 1.25e10, "valiant")


@pytest.mark.parametrize("text, field, allowed", [
    ('kind = "torus"', "fabric.kind", "one of flat, fat_tree, rail, dragonfly"),
    ('kind = "flat"\nleaves = 4', "fabric.leaves", "not a key of a flat fabric"),
    ('kind = "fat_tree"\nnodes_per_leaf = 4\nspine_uplinks = 2', "fabric.spine_uplinks", "only with tiers = 3"),
    ('kind = "fat_tree"', "fabric.nodes_per_leaf", "an integer >= 1"),
    ('kind = "fat_tree"\nnodes_per_leaf = 0', "fabric.nodes_per_leaf", "an integer >= 1"),
    ('kind = "fat_tree"\nnodes_per_leaf = 4\nleaves = 2', "fabric.leaves", "at least 64 nodes"),
    ('kind = "fat_tree"\nnodes_per_leaf = 4\nleaf_uplink_bandwidth = "400"', "fabric.leaf_uplink_bandwidth",
     "with its unit"),
    ('kind = "fat_tree"\nnodes_per_leaf = 4\nleaf_uplinks = 2\nleaf_uplink_bandwidth = "400Gbit/s"\n'
     'leaf_oversubscription = 3.0', "fabric.leaf_oversubscription", "2, what 2 uplinks"),
    ('kind = "fat_tree"\nnodes_per_leaf = 4\nleaf_uplink_bandwidth = "300Gbit/s"', "fabric.leaf_uplink_bandwidth",
     "a whole number of uplinks"),
    ('kind = "fat_tree"\ntiers = 4\nnodes_per_leaf = 4', "fabric.tiers", "one of 2, 3"),
    ('kind = "fat_tree"\ntiers = 3\nnodes_per_leaf = 4\nleaves_per_pod = 4\nleaf_uplinks = 3\nspines_per_pod = 2',
     "fabric.leaf_uplinks", "a multiple of spines_per_pod"),
    ('kind = "flat"\noversubscription = 0.5', "fabric.oversubscription", ">= 1"),
    ('kind = "flat"\necmp = "random"', "fabric.ecmp", "one of split, hash"),
    ('kind = "flat"\nswitch_latency = 5', "fabric.switch_latency", "a time with its unit"),
    ('kind = "rail"\nrail_only = true\nrail_uplinks = 2', "fabric.rail_uplinks", "none with rail_only"),
    ('kind = "rail"\nrail_only = "yes"', "fabric.rail_only", "true or false"),
    ('kind = "rail"\nnodes_per_group = 8\nrail_only = true', "fabric.groups", "1 on a rail-only fabric"),
    ('kind = "dragonfly"\nrouters_per_group = 4\nnodes_per_router = 16\nlocal_bandwidth = "1Gbit/s"\n'
     'global_bandwidth = "1Gbit/s"\nrouting = "valiant"', "fabric.routing", "minimal with 1 groups"),
    ('kind = "dragonfly"\nrouters_per_group = 4\nnodes_per_router = 2\nlocal_bandwidth = "1Gbit/s"',
     "fabric.global_bandwidth", "a bandwidth with its unit"),
])
def test_bad_tables_name_the_file_field_value_and_what_is_allowed(text, field, allowed):
    with pytest.raises(ConfigError) as err:
        parse("[fabric]\n" + text)
    assert err.value.source == "exp.toml" and err.value.field == field
    assert allowed in str(err.value), str(err.value)


@pytest.mark.parametrize("build, field", [
    (lambda: Flat(nodes=0, nic_Bps=1e9), "fabric.nodes"),
    (lambda: Flat(nodes=2, nic_Bps=-1.0), "fabric.nic_bandwidth"),
    (lambda: Flat(nodes=2, nic_Bps=1e9, nics_per_node=65), "fabric.nics_per_node"),
    (lambda: FatTree(nic_Bps=1e9, nodes_per_leaf=2, leaves=3, leaf_uplinks=1, leaf_uplink_Bps=1e9, leaves_per_pod=2,
                     spines_per_pod=1, spine_uplinks=1, spine_uplink_Bps=1e9), "fabric.leaves"),
    (lambda: FatTree(nic_Bps=1e9, nodes_per_leaf=2, leaves=4, leaf_uplinks=1, leaf_uplink_Bps=1e9, leaves_per_pod=2,
                     spines_per_pod=1, spine_uplinks=1), "fabric.spine_uplink_bandwidth"),
    (lambda: RailOptimized(nic_Bps=1e9, nodes_per_group=2, rail_uplinks=1), "fabric.rail_uplink_bandwidth"),
    (lambda: Dragonfly(nic_Bps=1e9, groups=2, routers_per_group=1, nodes_per_router=1, local_Bps=1e9,
                       global_Bps=float("inf")), "fabric.global_bandwidth"),
])
def test_dataclasses_check_their_fields(build, field):
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == field
