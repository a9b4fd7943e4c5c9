"""`simfog plan` on a catalogue option with a fabric: the option's runs on its switches and placement, and each row
says what they cost against a non-blocking fabric of the same NICs (`fabric_cost`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simfog import cli
from simfog.errors import ConfigError
from simfog.plan import load_catalogue, plan, workload_experiment
from simfog.simulation import simulate
from simfog.sweeps import Point

from .conftest import make_trace

CATALOGUE = """
currency = "EUR"

[[option]]
name = "{name}"
gpus_per_node = 1
max_nodes = 8
intra_bandwidth = "100GB/s"
nic_bandwidth = "1GB/s"
nic_latency = "10us"
price_per_gpu_hour = 1.0
collectives = ["ring"]
merges = ["single"]
{fabric}
"""
# two leaves of four nodes at 4:1, the nodes alternating between them: every ring hop crosses the uplinks
ALTERNATE = ('fabric = { kind = "fat_tree", nodes_per_leaf = 4, leaf_oversubscription = 4, '
             'placement = [0, 4, 1, 5, 2, 6, 3, 7] }')


@pytest.fixture
def trace(tmp_path):
    make_trace([0.02, 0.03], [0.02, 0.03], [2_500_000, 5_000_000]).save(tmp_path / "t.json")
    return tmp_path / "t.json"


def catalogue(tmp_path, text: str):
    path = tmp_path / "cat.toml"
    path.write_text(text)
    return load_catalogue(path)


def test_each_row_says_what_the_fabric_and_placement_cost(tmp_path, trace):
    exp = workload_experiment(trace)
    cat = catalogue(tmp_path, CATALOGUE.format(name="alt", fabric=ALTERNATE))
    rows = plan(exp, cat, target_samples_per_s=150).candidates
    assert "fabric_cost" in rows and rows.gpus.max() >= 4
    base = replace(exp, cluster=cat.options[0].cluster())
    flat_base = replace(base, cluster=replace(base.cluster, fabric=None))
    for r in rows.itertuples():
        point = Point(r.gpus, "single", "ring", None)
        on_fabric = simulate(point.apply(base)).summary()["iteration_time_s"]
        flat = simulate(point.apply(flat_base)).summary()["iteration_time_s"]
        assert r.iteration_time_s == on_fabric
        assert r.fabric_cost == on_fabric / flat - 1.0
        # nodes 0, 4, 1, 5, ...: from four nodes on, two hops leave a leaf through uplinks of one NIC's rate
        assert (r.fabric_cost > 0.0) == (r.gpus >= 4)


def test_a_contiguous_ring_on_the_same_fabric_costs_nothing(tmp_path, trace):
    cat = catalogue(tmp_path, CATALOGUE.format(name="contig", fabric=ALTERNATE.replace(
        "placement = [0, 4, 1, 5, 2, 6, 3, 7]", 'placement = "contiguous"')))
    rows = plan(workload_experiment(trace), cat, target_samples_per_s=100).candidates
    assert (rows.fabric_cost == 0.0).all()


def test_the_table_shows_the_fabric_column(tmp_path, trace, capsys):
    path = tmp_path / "cat.toml"
    path.write_text(CATALOGUE.format(name="alt", fabric=ALTERNATE))
    assert cli.main(["plan", str(trace), "--catalogue", str(path), "--target-samples-per-s", "100", "-o",
                     str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "fabric" in out.splitlines()[2] and "%" in out.splitlines()[3]


def test_a_bad_fabric_in_an_option_names_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        catalogue(tmp_path, CATALOGUE.format(name="bad", fabric='fabric = { kind = "torus" }'))
    assert err.value.field == "option[0] (bad).fabric.kind" and err.value.source.endswith("cat.toml")
