"""A network file has one meaning wherever it is named (simfog.network_file.use: the experiment's [cluster]
network, a plan option's network, simfog collective --network), and inputs that do not fit it are named
(issue 26 point 2): another layout or GPU than it was calibrated on, a link key it overrides, a NetworkTrace
where a network file belongs. Every summary names the trace and network file it used."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from simfog import cli, experiment, nccl, network_file
from simfog.errors import ConfigError
from simfog.nccl.calibrated import Calibrated
from simfog.network_file import FlowCaps, NetworkFileWarning
from simfog.plan import load_catalogue

from .conftest import make_trace

NET = nccl.NcclNetwork(intra_bus_Bps=230e9, inter_bus_Bps=12e9, latency_inter_s=4e-6, gpu_arch="ampere",
                       nics_per_node=4)
ON_8 = Calibrated("2.21.5", ((1, 8), (2, 8)), 8, 2**30, ("allreduce",))


NO_CAPS = FlowCaps()


def _files(folder, *, gpus=8, cluster="", device=None, calibrated=ON_8, flows=NO_CAPS):
    trace = make_trace([0.01], [0.02], [1000])
    if device is not None:
        trace = dataclasses.replace(trace, device={"name": device})
    trace.save(folder / "t.json")
    network_file.save(folder / "net.toml", NET, flows=flows, calibrated=calibrated)
    path = folder / "exp.toml"
    path.write_text(f'[workload]\ntrace = "t.json"\n[cluster]\nnodes = 2\ngpus_per_node = {gpus}\n'
                    f'network = "net.toml"\nintra_latency = "1us"\n{cluster}')
    return path


def _load(path) -> tuple[experiment.Experiment, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exp = experiment.load(path)
    return exp, [str(w.message) for w in caught if issubclass(w.category, NetworkFileWarning)]


def test_the_files_links_are_the_clusters_in_an_experiment_and_a_plan_option(tmp_path):
    exp, said = _load(_files(tmp_path, flows=FlowCaps(nic_Bps=1e9)))
    assert said == []
    (tmp_path / "cat.toml").write_text('currency = "EUR"\n[[option]]\nname = "ib"\ngpus_per_node = 8\nmax_nodes = 2\n'
                                       'intra_latency = "1us"\nprice_per_gpu_hour = 1.0\nnetwork = "net.toml"\n')
    (option,) = load_catalogue(tmp_path / "cat.toml").options
    for intra, nic in ((exp.cluster.intra, exp.cluster.nic), (option.intra, option.nic)):
        assert (intra.latency_s, intra.bandwidth_Bps) == (1e-6, 230e9)  # the intra latency stays the cluster's
        assert (nic.latency_s, nic.bandwidth_Bps, nic.flow_bandwidth_Bps) == (4e-6, 12e9, 1e9)
    assert exp.comm.collective == "nccl" and option.collectives == ("nccl",)


def test_a_link_key_beside_the_file_is_ignored_with_a_warning_naming_both(tmp_path):
    exp, said = _load(_files(tmp_path, cluster='nic_bandwidth = "25Gbit/s"\n'))
    assert exp.cluster.nic.bandwidth_Bps == 12e9  # the file's, in the experiment ...
    (line,) = said
    assert "cluster.nic_bandwidth = '25Gbit/s' is ignored" in line and "net.toml" in line
    assert "nccl.inter_bus_bandwidth" in line and "\n" not in line
    (tmp_path / "cat.toml").write_text('currency = "EUR"\n[[option]]\nname = "ib"\ngpus_per_node = 8\nmax_nodes = 2\n'
                                       'nic_bandwidth = "25Gbit/s"\nprice_per_gpu_hour = 1.0\nnetwork = "net.toml"\n')
    with pytest.warns(NetworkFileWarning, match=r"option\[0\] \(ib\)\.nic_bandwidth = '25Gbit/s' is ignored"):
        (option,) = load_catalogue(tmp_path / "cat.toml").options
    assert option.nic.bandwidth_Bps == 12e9  # ... and in a plan option (where the option's value used to win)


def test_a_layout_the_file_was_not_calibrated_for_is_named(tmp_path):
    exp, said = _load(_files(tmp_path, gpus=4))
    assert exp.cluster.ranks_per_node == 4
    assert any("4 GPUs per node, but" in s and "calibrated on 8 GPUs per node (layouts 1x8, 2x8)" in s
               and "cluster.network" in s for s in said), said
    _, said = _load(_files(tmp_path, gpus=2))  # and fewer GPUs than the file's NICs
    assert any("2 GPUs per node" in s and "nics_per_node = 4" in s for s in said), said
    _, said = _load(_files(tmp_path, gpus=8))
    assert said == []
    _, said = _load(_files(tmp_path, gpus=4, calibrated=None))  # no [calibrated]: the NICs still fit
    assert said == []


def test_a_gpu_of_another_generation_is_named(tmp_path):
    _, said = _load(_files(tmp_path, device="Tesla V100-SXM2-32GB"))
    exp, net = tmp_path / "exp.toml", tmp_path / "net.toml"
    assert said == [f"{exp}: cluster.network: the trace's GPU is Tesla V100-SXM2-32GB (volta), but {net} has "
                    "gpu_arch = 'ampere'"]
    assert _load(_files(tmp_path, device="NVIDIA A100-SXM4-80GB"))[1] == []


def test_a_network_trace_named_as_a_network_file_says_to_calibrate_first(tmp_path, capsys):
    path = _files(tmp_path)
    (tmp_path / "net.json.gz").write_bytes(b"\x1f\x8b\x08\x00")  # any gzip header: a measured trace's name
    (tmp_path / "measured.toml").write_text('{"format": "simfog.network-trace/1"}')  # JSON under a .toml name
    for name in ("net.json.gz", "measured.toml"):
        path.write_text(path.read_text().replace('network = "net.toml"', f'network = "{name}"')
                        .replace('network = "net.json.gz"', f'network = "{name}"'))
        with pytest.raises(ConfigError, match=rf"cluster.network = '{name}': .*run `simfog calibrate {name} "
                                              r"-o network.toml` first"):
            experiment.load(path)
    assert cli.main(["collective", "allreduce", "--network", str(tmp_path / "net.json.gz"), "--nodes", "2",
                     "--gpus-per-node", "8"]) == 2
    assert "run `simfog calibrate" in capsys.readouterr().err


def test_simfog_collective_loads_through_the_same_function(tmp_path, capsys):
    _files(tmp_path)
    assert cli.main(["collective", "allreduce", "--network", str(tmp_path / "net.toml"), "--nodes", "2",
                     "--gpus-per-node", "4", "--sizes", "1MiB", "--json"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("simfog: warning: --network: 4 GPUs per node, but") and err.count("\n") == 1, err


def test_every_summary_names_its_trace_and_network_file(tmp_path, capsys):
    path = _files(tmp_path)
    assert cli.main(["simulate", str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["network_file"] == str(tmp_path / "net.toml") and s["trace"] == str(tmp_path / "t.json")
    assert cli.main(["simulate", str(path)]) == 0
    assert f"inputs             trace {tmp_path / 't.json'}; network file {tmp_path / 'net.toml'}" in \
        capsys.readouterr().out
    path.write_text(path.read_text().replace('network = "net.toml"', 'nic_bandwidth = "10Gbit/s"'))
    assert cli.main(["simulate", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["network_file"] is None


@pytest.mark.parametrize("latency, launch, fitted, said", [
    (6.13e-12, 3e-6, "bus bandwidth between nodes, latencyInter", "latencyInter = 6.13e-06 us, at its fit's bound "
     "0 us: the logs of {net} do not determine it"),
    (2e-6, 0.0, "bus bandwidth between nodes, latencyInter, launch, channels 2", "launch = 0 us, at its fit's bound "
     "0 us: the logs of {net} cannot separate launch from latencyInter (another log, e.g. one node's, would)"),
    (2e-6, 0.0, "bus bandwidth between nodes, latencyInter", None),  # launch 0 assumed, not fitted
    (2e-6, 3e-6, "bus bandwidth between nodes, latencyInter, launch", None),
])
def test_a_parameter_fitted_to_its_bound_is_named(tmp_path, latency, launch, fitted, said):
    path = _files(tmp_path)
    net = dataclasses.replace(NET, latency_inter_s=latency, launch_s=launch)
    network_file.save(tmp_path / "net.toml", net, {"fitted": fitted}, calibrated=ON_8)
    got = _load(path)[1]
    assert got == ([] if said is None else [f"{path}: cluster.network: " + said.format(net=tmp_path / "net.toml")])


def test_a_bus_bandwidth_at_the_nics_line_rate_is_named(tmp_path):
    path = _files(tmp_path)
    net = dataclasses.replace(NET, inter_bus_Bps=4 * 25e9, nic_Bps=25e9)  # 4 NICs of 200 Gbit/s, every bit used
    network_file.save(tmp_path / "net.toml", net, {"fitted": "bus bandwidth between nodes"}, calibrated=ON_8)
    (line,) = _load(path)[1]
    assert "bus bandwidth between nodes = 100 GB/s, at its fit's bound 100 GB/s" in line
