"""The experiment file: parsing, units, unknown keys, and clear errors naming file, field and value."""

from __future__ import annotations

import pytest

from simfog import experiment
from simfog.errors import ConfigError

from .conftest import make_trace

BASE = """
seed = 3
iterations = 2

[workload]
trace = "t.json"
compute = "mean"

[cluster]
nodes = 2
gpus_per_node = 4
intra_bandwidth = "100GB/s"
intra_latency = "2us"
nic_bandwidth = "25Gbit/s"
nic_latency = "10us"

[comm]
algorithm = "allreduce"
collective = "ring"
merge = "ddp"
"""


@pytest.fixture
def folder(tmp_path):
    make_trace([0.01, 0.02], [0.02, 0.03], [1000, 2000]).save(tmp_path / "t.json")
    return tmp_path


def _write(folder, text):
    path = folder / "exp.toml"
    path.write_text(text)
    return path


def test_loads_with_si_units(folder):
    exp = experiment.load(_write(folder, BASE))
    assert exp.ranks == 8 and exp.seed == 3 and exp.iterations == 2
    assert exp.cluster.nic.bandwidth_Bps == 25e9 / 8 and exp.cluster.nic.latency_s == 10e-6
    assert exp.cluster.intra.bandwidth_Bps == 100e9
    assert exp.workload.trace.parameters == 3000 and exp.comm.merge == "ddp"


@pytest.mark.parametrize("old, new, field, value", [
    ('nic_bandwidth = "25Gbit/s"', "nic_bandwidth = 25", "cluster.nic_bandwidth", "25"),
    ('nic_latency = "10us"', 'nic_latency = "10 parsecs"', "cluster.nic_latency", "10 parsecs"),
    ('merge = "ddp"', 'merge = "ddpp"', "comm.merge", "ddpp"),
    ('collective = "ring"', 'collective = "torus"', "comm.collective", "torus"),
    ("nodes = 2", "nodes = 0", "cluster.nodes", "0"),
    ("nodes = 2", "nodes = 2\nnic_bandwith = \"1GB/s\"", "cluster.nic_bandwith", "1GB/s"),
    ('compute = "mean"', 'compute = "median"', "workload.compute", "median"),
    ('trace = "t.json"', 'trace = "missing.json"', "workload.trace", "missing.json"),
    ('merge = "ddp"', 'merge = "threshold"', "comm.threshold", "(missing)"),
    ('collective = "ring"', 'collective = "linear"', "comm.alpha", "(missing)"),
])
def test_bad_input_names_file_field_and_value(folder, old, new, field, value):
    path = _write(folder, BASE.replace(old, new))
    with pytest.raises(ConfigError) as err:
        experiment.load(path)
    msg = str(err.value)
    assert str(path) in msg and field in msg and value in msg


def test_bad_trace_inside_names_the_trace_file(folder):
    (folder / "t.json").write_text('{"format": "simfog.model-trace/1", "layers": []}')
    with pytest.raises(ConfigError, match=r"t\.json.*layers"):
        experiment.load(_write(folder, BASE))


def test_invalid_toml(folder):
    with pytest.raises(ConfigError, match="exp.toml.*valid TOML"):
        experiment.load(_write(folder, BASE + "\n[comm\n"))


def test_with_ranks_keeps_node_shape(folder):
    exp = experiment.load(_write(folder, BASE))
    assert exp.with_ranks(32).cluster.nodes == 8
    assert exp.with_ranks(2).cluster.nodes == 1 and exp.with_ranks(2).cluster.ranks_per_node == 2
    with pytest.raises(ConfigError, match="multiple of gpus_per_node"):
        exp.with_ranks(6)


def test_linear_model_keys(folder):
    text = BASE.replace('collective = "ring"', 'collective = "linear"\nalpha = "50us"\nbeta = "0.8ns/B"')
    exp = experiment.load(_write(folder, text))
    assert exp.comm.alpha_s == pytest.approx(50e-6) and exp.comm.beta_s_per_B == pytest.approx(0.8e-9)


def test_heterogeneity_section(folder):
    text = BASE + """
[heterogeneity]
rank_slowdown = { "3" = 1.5 }
node_slowdown = { "1" = 1.2 }
straggler_rate = 0.05
straggler_delay = "20ms"
degraded_nics = { "1" = "10Gbit/s" }
"""
    exp = experiment.load(_write(folder, text))
    h = exp.heterogeneity
    assert h.rank_slowdown == ((3, 1.5),) and h.node_slowdown == ((1, 1.2),)
    assert h.straggler_rate == 0.05 and h.straggler_delay_s == pytest.approx(0.02)
    assert exp.cluster.degraded_nics == ((1, 10e9 / 8),) and not exp.homogeneous


@pytest.mark.parametrize("line, field", [
    ('rank_slowdown = { "8" = 1.5 }', "heterogeneity.rank_slowdown"),
    ('rank_slowdown = { "2" = 0 }', "heterogeneity.rank_slowdown.2"),
    ("straggler_rate = 0.1", "heterogeneity.straggler_delay"),
    ("straggler_rate = 2", "heterogeneity.straggler_rate"),
    ('degraded_nics = { "0" = 10 }', "heterogeneity.degraded_nics.0"),
])
def test_bad_heterogeneity(folder, line, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        experiment.load(_write(folder, BASE + "\n[heterogeneity]\n" + line + "\n"))


def test_network_trace_calibrates_the_links(folder):
    from simfog import files

    # allreduce ring on 2 ranks of one node: T = 2(n-1)a + 2(n-1)/n M b = 2a + M b with a = 20 us, b = 1 ns/B.
    rows = [{"collective": "allreduce", "ranks": 2, "nodes": 1, "bytes": m, "time_s": [2 * 20e-6 + m * 1e-9]}
            for m in (1024, 65536, 1 << 20, 1 << 24)]
    files.write_json(folder / "net.json", {
        "format": "simfog.network-trace/1", "backend": "gloo", "transport": "tcp",
        "provenance": {"command": "test", "date": "d", "host": "h", "source": "measured", "estimated": False},
        "measurements": rows})
    text = BASE.replace('nic_latency = "10us"', 'nic_latency = "10us"\nnetwork_trace = "net.json"')
    exp = experiment.load(_write(folder, text))
    assert exp.cluster.intra.latency_s == pytest.approx(20e-6, rel=1e-6)
    assert exp.cluster.intra.bandwidth_Bps == pytest.approx(1e9, rel=1e-6)
    assert exp.cluster.nic.bandwidth_Bps == 25e9 / 8  # no inter-node data: kept from the file
    assert exp.network_trace.endswith("net.json")
