"""Per-flow caps of the point-to-point model in files: the network file's [p2p] section and [cluster]
nic_flow_bandwidth / intra_flow_bandwidth of an experiment (simfog.network_file, simfog.experiment)."""

from __future__ import annotations

import pytest

from simfog import experiment, nccl, network_file
from simfog.errors import ConfigError
from simfog.network_file import FlowCaps

from .conftest import make_trace

NET = nccl.NcclNetwork(intra_bus_Bps=230e9, inter_bus_Bps=12e9, latency_inter_s=4e-6)
NCCL = '[nccl]\nintra_bus_bandwidth = "230GB/s"\ninter_bus_bandwidth = "12GB/s"\n'


@pytest.mark.parametrize("caps", [FlowCaps(nic_Bps=105.69e6), FlowCaps(nic_Bps=1e9 / 3, intra_Bps=1.2673e9),
                                  FlowCaps(intra_Bps=7e10)])
def test_flow_caps_round_trip_exactly(tmp_path, caps):
    path = tmp_path / "network.toml"
    network_file.save(path, NET, {"fitted_from": "sendrecv"}, caps)
    loaded = network_file.load(path)
    assert loaded.flows == caps                       # the same floats, not approximately
    assert "[p2p]" in path.read_text()
    assert loaded.provenance == {"fitted_from": "sendrecv"}


def test_a_file_without_caps_has_no_p2p_section(tmp_path):
    path = tmp_path / "network.toml"
    network_file.save(path, NET)
    assert "[p2p]" not in path.read_text()
    assert network_file.load(path).flows == FlowCaps()


@pytest.mark.parametrize("body,field,value,allowed", [
    ('nic_flow_bandwidth = "0Gbit/s"', "p2p.nic_flow_bandwidth", "'0Gbit/s'", "a bandwidth > 0 with its unit"),
    ('nic_flow_bandwidth = "-5Gbit/s"', "p2p.nic_flow_bandwidth", "'-5Gbit/s'", "not negative"),
    ("nic_flow_bandwidth = 850", "p2p.nic_flow_bandwidth", "850", "a number without a unit is not accepted"),
    ('intra_flow_bandwidth = "fast"', "p2p.intra_flow_bandwidth", "'fast'", "a bandwidth with its unit"),
    ('intra_flow_bandwidth = "5ms"', "p2p.intra_flow_bandwidth", "'5ms'", "a bandwidth with its unit"),
    ('flow_bandwidth = "1Gbit/s"', "p2p.flow_bandwidth", "'1Gbit/s'",
     "one of nic_flow_bandwidth, intra_flow_bandwidth")])
def test_a_bad_flow_cap_names_file_field_value_and_what_is_allowed(tmp_path, body, field, value, allowed):
    path = tmp_path / "bad.toml"
    path.write_text(f"{NCCL}[p2p]\n{body}\n")
    with pytest.raises(ConfigError) as e:
        network_file.load(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {field} = {value}: ") and allowed in msg, msg


def test_a_p2p_section_that_is_not_a_table_is_refused(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(f'p2p = "1Gbit/s"\n{NCCL}')
    with pytest.raises(ConfigError, match=r"bad.toml: p2p = '1Gbit/s': a table with nic_flow_bandwidth"):
        network_file.load(path)


def test_flow_caps_refuse_bad_values_in_python():
    with pytest.raises(ConfigError, match="p2p.nic_flow_bandwidth"):
        FlowCaps(nic_Bps=0.0)
    with pytest.raises(ConfigError, match="p2p.intra_flow_bandwidth"):
        FlowCaps(intra_Bps=float("inf"))


def _experiment(folder, cluster_extra="", network=None):
    make_trace([0.01], [0.02], [1000]).save(folder / "t.json")
    if network is not None:
        (folder / "network.toml").write_text(network)
        cluster_extra += '\nnetwork = "network.toml"'
    path = folder / "exp.toml"
    path.write_text('[workload]\ntrace = "t.json"\n[cluster]\nnodes = 2\ngpus_per_node = 2\nnic_bandwidth = "1Gbit/s"\n'
                    f'{cluster_extra}\n[comm]\nalgorithm = "neighbor"\ntopology = "one_peer_exp2"\n')
    return path


def test_experiment_cluster_keys_set_the_links_caps(tmp_path):
    exp = experiment.load(_experiment(tmp_path, 'nic_flow_bandwidth = "400Mbit/s"\nintra_flow_bandwidth = "2GB/s"'))
    assert exp.cluster.nic.flow_bandwidth_Bps == 50e6 and exp.cluster.nic.bandwidth_Bps == 125e6
    assert exp.cluster.intra.flow_bandwidth_Bps == 2e9
    assert experiment.load(_experiment(tmp_path)).cluster.nic.flow_bandwidth_Bps is None


def test_experiment_takes_the_network_files_caps(tmp_path):
    exp = experiment.load(_experiment(tmp_path, network=f'{NCCL}[p2p]\nnic_flow_bandwidth = "3GB/s"\n'))
    assert exp.cluster.nic.flow_bandwidth_Bps == 3e9 and exp.cluster.nic.bandwidth_Bps == 12e9
    assert exp.cluster.intra.flow_bandwidth_Bps is None


def test_a_cap_in_both_places_is_refused(tmp_path):
    path = _experiment(tmp_path, 'nic_flow_bandwidth = "1GB/s"', network=f'{NCCL}[p2p]\nnic_flow_bandwidth = "3GB/s"\n')
    with pytest.raises(ConfigError, match=r"exp.toml: cluster.nic_flow_bandwidth = '1GB/s': either here or in the "
                                          r"network file's \[p2p\] section"):
        experiment.load(path)


@pytest.mark.parametrize("value,allowed", [('"0Gbit/s"', "a bandwidth > 0"), ("5", "a number without a unit")])
def test_a_bad_cluster_cap_names_the_field(tmp_path, value, allowed):
    with pytest.raises(ConfigError, match=r"exp.toml: cluster.nic_flow_bandwidth = .*" + allowed):
        experiment.load(_experiment(tmp_path, f"nic_flow_bandwidth = {value}"))


def test_a_plan_option_takes_its_network_files_caps(tmp_path):
    from simfog.plan import load_catalogue

    network_file.save(tmp_path / "net.toml", NET, flows=FlowCaps(nic_Bps=1e9, intra_Bps=5e10))
    cat = tmp_path / "cat.toml"
    cat.write_text('currency = "EUR"\n[[option]]\nname = "a"\ngpus_per_node = 8\nmax_nodes = 2\n'
                   'price_per_gpu_hour = 1.0\nnetwork = "net.toml"\n')
    (option,) = load_catalogue(cat).options
    assert (option.nic.flow_bandwidth_Bps, option.nic.bandwidth_Bps) == (1e9, 12e9)
    assert option.intra.flow_bandwidth_Bps == 5e10
