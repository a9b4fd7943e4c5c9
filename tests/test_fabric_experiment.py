"""[fabric] in the experiment file, and the collectives' cost on it: parsed with placement, NICs from the network
file onto rails, every bad value refused by file, field and value; on a flat fabric today's numbers bit for bit;
on a fabric, each collective's inter-node β slowed by its step pattern's slowest flow (hand-worked), and the
closed form equal to the event engine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simfog import experiment
from simfog.errors import ConfigError, Infeasible
from simfog.fabric import FatTree, Placement, RailOptimized
from simfog.fabric.job import JobFabric, Traffic, inter_slowdown
from simfog.simulation import simulate

from .conftest import make_trace
from .test_analytic import assert_same

NIC = 25e9 / 8  # 25 Gbit/s

BASE = """
seed = 3
iterations = 2

[workload]
trace = "t.json"
compute = "mean"

[cluster]
nodes = 8
gpus_per_node = 1
intra_bandwidth = "100GB/s"
nic_bandwidth = "25Gbit/s"
nic_latency = "10us"

[comm]
collective = "ring"
merge = "ddp"
"""

# two leaves of four nodes, each leaf's uplinks carrying a quarter of what its NICs send
TWO_LEAVES = '[fabric]\nkind = "fat_tree"\nnodes_per_leaf = 4\nleaves = 2\nleaf_oversubscription = 4\n'
ALTERNATE = "placement = [0, 4, 1, 5, 2, 6, 3, 7]\n"


@pytest.fixture
def folder(tmp_path):
    make_trace([0.01, 0.02, 0.01], [0.02, 0.03, 0.02], [300_000, 2_000_000, 700_000]).save(tmp_path / "t.json")
    return tmp_path


def load(folder, text: str, base: str = BASE):
    path = folder / "exp.toml"
    path.write_text(base + text)
    return experiment.load(path)


def test_a_fat_tree_and_its_placement_are_read(folder):
    exp = load(folder, TWO_LEAVES + ALTERNATE)
    view = exp.cluster.fabric
    assert isinstance(view, JobFabric) and isinstance(view.fabric, FatTree)
    assert (view.fabric.nodes, view.fabric.nic_Bps, view.fabric.leaf_oversubscription) == (8, NIC, 4.0)
    assert view.nodes(8).nodes == (0, 4, 1, 5, 2, 6, 3, 7)
    contiguous = load(folder, TWO_LEAVES).cluster.fabric
    assert contiguous.nodes(8).nodes == tuple(range(8))


def test_a_scattered_placement_is_the_seeded_draw(folder):
    text = TWO_LEAVES.replace("leaves = 2", "leaves = 8") + 'placement = "scattered"\nplacement_seed = 5\n'
    view = load(folder, text).cluster.fabric
    assert view.nodes(8) == Placement.scattered(8, 32, seed=5)
    assert view.nodes(8) == load(folder, text).cluster.fabric.nodes(8)  # the same on every load


def test_nics_per_node_of_the_network_file_map_onto_rails(folder):
    (folder / "net.toml").write_text('[nccl]\nintra_bus_bandwidth = "230GB/s"\ninter_bus_bandwidth = "100GB/s"\n'
                                     "nics_per_node = 4\n")
    base = BASE.replace('nic_bandwidth = "25Gbit/s"\n', 'network = "net.toml"\n').replace("gpus_per_node = 1",
                                                                                          "gpus_per_node = 8")
    view = load(folder, '[fabric]\nkind = "rail"\nnodes_per_group = 4\ngroups = 2\n', base).cluster.fabric
    rails = view.fabric
    assert isinstance(rails, RailOptimized)
    assert (rails.nics_per_node, rails.nic_Bps, rails.leaf_count) == (4, 25e9, 8)  # the node's 100 GB/s on 4 NICs


def test_a_flat_fabric_is_todays_cluster_bit_for_bit(folder):
    plain = load(folder, "")
    assert plain.cluster.fabric is None
    flat = load(folder, '[fabric]\nkind = "flat"\n')
    assert flat.cluster == plain.cluster
    assert simulate(flat).summary() == simulate(plain).summary()
    over = load(folder, '[fabric]\nkind = "flat"\noversubscription = 2\n')
    same = load(folder, "", BASE.replace("[comm]", "oversubscription = 2\n[comm]", 1))
    assert over.cluster.fabric is None and over.cluster == same.cluster
    assert simulate(over).summary() == simulate(same).summary()


@pytest.mark.parametrize("text,field,value", [
    ('[fabric]\nkind = "torus"\n', "fabric.kind", "torus"),
    (TWO_LEAVES + 'placement = "nowhere"\n', "fabric.placement", "nowhere"),
    (TWO_LEAVES + "placement = [0, 1, 2]\n", "fabric.placement", [0, 1, 2]),
    (TWO_LEAVES + "placement = [0, 1, 2, 3, 4, 5, 6, 9]\n", "fabric.placement", 9),
    (TWO_LEAVES + "placement = [0, 1, 2, 3, 4, 5, 6, 6]\n", "fabric.placement", 6),
    (TWO_LEAVES + "placement_seed = -1\n", "fabric.placement_seed", -1),
    ('[fabric]\nkind = "flat"\nplacement = "scattered"\n', "fabric.placement", "scattered"),
    (TWO_LEAVES + "colour = 3\n", "fabric.colour", 3),
    ('fabric = 3\n', "fabric", 3),
])
def test_bad_fabric_values_name_file_field_and_value(folder, text, field, value):
    with pytest.raises(ConfigError) as err:
        load(folder, text) if not text.startswith("fabric =") else load(folder, "", text + BASE)
    e = err.value
    assert (e.field, e.value) == (field, value) and e.source.endswith("exp.toml") and e.allowed


def test_a_fabric_refuses_the_clusters_global_oversubscription(folder):
    with pytest.raises(ConfigError) as err:
        load(folder, TWO_LEAVES, BASE.replace("[comm]", "oversubscription = 2\n[comm]", 1))
    assert err.value.field == "cluster.oversubscription" and "tiers" in err.value.allowed


# -- costs -------------------------------------------------------------------------------------------------------

def test_contiguous_on_a_non_blocking_tree_costs_what_the_flat_cluster_does(folder):
    """Leaves at 1:1: every flow gets its NIC's rate, so the slowdown is exactly 1 and the costs are today's."""
    exp = load(folder, TWO_LEAVES.replace("leaf_oversubscription = 4", "leaf_oversubscription = 1"))
    plain = load(folder, "")
    for collective in ("ring", "tree", "hierarchical", "gloo_ring", "nccl"):
        a, b = (replace(e.comm, collective=collective) for e in (exp, plain))
        assert replace(exp, comm=a).cost_model().allreduce(8e6) == replace(plain, comm=b).cost_model().allreduce(8e6)


def test_a_ring_whose_every_hop_crosses_an_oversubscribed_leaf_runs_at_a_quarter(folder):
    """Placement 0, 4, 1, 5, 2, 6, 3, 7 on two leaves of four nodes: every ring hop crosses between the leaves, so
    each leaf's uplinks (a quarter of its four NICs: B in all) carry four flows, B/4 each, where a non-blocking
    fabric gives each its NIC's B: the ring's β is 4·β_n. Ring allreduce of M = 8 MB over n = 8 ranks:
    2(n−1)·(α + (M/n)·4/B) = 14 · (10 us + 1e6 · 4 / 3.125e9 s) = 14 · 1.29 ms = 18.06 ms."""
    exp = load(folder, TWO_LEAVES + ALTERNATE)
    t = exp.cost_model().allreduce(8e6)
    assert t == pytest.approx(14 * (10e-6 + 1e6 * 4 / NIC), rel=1e-12)
    assert inter_slowdown(exp.cluster.fabric, "ring", "allreduce", 8, 8, 1).factor == 4.0
    # contiguous: only one hop leaves each leaf, at the uplink's full rate = one NIC's: today's ring
    contiguous = load(folder, TWO_LEAVES)
    assert contiguous.cost_model().allreduce(8e6) == load(folder, "").cost_model().allreduce(8e6)


def test_switches_crossed_add_to_each_steps_latency(folder):
    """Contiguous on two leaves, 1 us per switch: hops between leaves cross leaf, spine, leaf (3 switches), so
    each ring step pays α + 3 us: 14 · (13 us + 1e6 / 3.125e9 s)."""
    exp = load(folder, TWO_LEAVES.replace("oversubscription = 4", "oversubscription = 1") + 'switch_latency = "1us"\n')
    assert exp.cost_model().allreduce(8e6) == pytest.approx(14 * (13e-6 + 1e6 / NIC), rel=1e-12)


def test_a_collective_without_a_step_pattern_is_infeasible_on_a_fabric(folder):
    exp = load(folder, TWO_LEAVES)
    with pytest.raises(Infeasible, match="rhd"):
        replace(exp, comm=replace(exp.comm, collective="rhd")).cost_model().allreduce(1e6)
    linear = replace(exp, comm=replace(exp.comm, collective="linear", alpha_s=1e-4, beta_s_per_B=1e-9))
    assert linear.cost_model().allreduce(1e6) == 1e-4 + 1e-9 * 1e6  # a fitted line stays as fitted


def test_a_calibrated_nccl_network_is_slowed_too(folder):
    (folder / "net.toml").write_text('[nccl]\nintra_bus_bandwidth = "230GB/s"\ninter_bus_bandwidth = "12GB/s"\n')
    base = BASE.replace('nic_bandwidth = "25Gbit/s"\n', 'network = "net.toml"\n').replace('collective = "ring"',
                                                                                     'collective = "nccl"')
    plain, alt = load(folder, "", base), load(folder, TWO_LEAVES + ALTERNATE, base)
    slow, fast = alt.cost_model().allreduce(1e9), plain.cost_model().allreduce(1e9)
    assert 3.5 < slow / fast <= 4.0  # bandwidth-bound at 1 GB: nearly the ring's factor 4


def test_other_jobs_slow_a_step_by_their_duty_cycle():
    """Two rings on two leaves of two nodes, uplinks at 1:2 (one NIC's rate per leaf): job A on nodes 0, 2 and job
    B on nodes 1, 3 each cross between the leaves with one flow each way. Alone a flow gets the NIC's rate; both at
    once share each uplink: B/2 each. B communicating half the time: E[B/rate] = 0.5·1 + 0.5·2 = 1.5."""
    fabric = FatTree(nic_Bps=NIC, nodes_per_leaf=2, leaves=2, leaf_uplinks=1, leaf_uplink_Bps=NIC)
    b = Traffic((1, 3), "ring", 1, 1, 0.5)
    view = JobFabric(fabric, (0, 2), taken=(1, 3), others=(b,))
    assert inter_slowdown(view, "ring", "allreduce", 2, 2, 1).factor == 1.5
    assert inter_slowdown(replace(view, others=(replace(b, duty=1.0),)), "ring", "allreduce", 2, 2, 1).factor == 2.0
    assert inter_slowdown(replace(view, others=(replace(b, duty=0.0),)), "ring", "allreduce", 2, 2, 1).factor == 1.0


@pytest.mark.parametrize("collective", ["ring", "tree", "hierarchical", "nccl"])
@pytest.mark.parametrize("algorithm", ["allreduce", "fsdp"])
def test_closed_form_equals_the_event_engine_on_a_fabric(folder, collective, algorithm):
    base = BASE.replace("gpus_per_node = 1", "gpus_per_node = 2").replace('collective = "ring"',
                                                                          f'collective = "{collective}"')
    base = base.replace("[comm]\n", f'[comm]\nalgorithm = "{algorithm}"\n')
    if algorithm == "fsdp":
        base = base.replace('merge = "ddp"\n', "")
    exp = load(folder, TWO_LEAVES + ALTERNATE, base)
    a, _ = assert_same(exp)
    assert a.summary() != simulate(load(folder, "", base)).summary()  # the fabric did cost something


def test_a_job_fabric_survives_pickling_with_a_fresh_hash(folder):
    """Sweeps send experiments to worker processes: the view is rebuilt there, equal to the original."""
    import pickle

    view = load(folder, TWO_LEAVES + ALTERNATE).cluster.fabric
    back = pickle.loads(pickle.dumps(view))
    assert back == view and hash(back) == hash(view) and back.nodes(8) == view.nodes(8)


def test_more_ranks_than_the_placement_or_fabric_holds_name_the_placement(folder):
    exp = load(folder, TWO_LEAVES + ALTERNATE)
    with pytest.raises(ConfigError) as err:
        exp.with_ranks(16).cost_model().allreduce(1e6)  # 16 nodes, a list of 8
    assert err.value.field == "fabric.placement" and "16" in err.value.allowed
    with pytest.raises(Infeasible, match="fabric.placement: 16 nodes asked of a fabric of 8"):
        load(folder, TWO_LEAVES).with_ranks(16).cost_model().allreduce(1e6)
