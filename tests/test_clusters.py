"""Shipped clusters by name (simfog.nccl.clusters): every one loads wherever a network file path is accepted, takes
its layout, re-estimates an estimated trace for its GPU, and bad names, files that shadow names and layouts that
contradict the cluster are refused with what is allowed."""

from __future__ import annotations

import math
import shutil
import tomllib
import warnings
from pathlib import Path

import pytest

from simfog import cli, experiment, network_file
from simfog.errors import ConfigError
from simfog.nccl import clusters
from simfog.nccl.clusters import ClusterFacts, ClusterGpuWarning
from simfog.network_file import NetworkFileWarning

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO / "simfog" / "data" / "resnet50-a100-b32-estimated.json.gz"
CORPUS = REPO / "bench" / "data"


def _experiment(tmp_path: Path, cluster: str, *, trace: Path = DEFAULT_TRACE, nodes: int = 4) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(f'seed = 1\niterations = 2\n[workload]\ntrace = "{trace}"\ncompute = "mean"\n'
                    f"[cluster]\nnodes = {nodes}\n{cluster}\n[comm]\nmerge = \"ddp\"\n")
    return path


def test_every_corpus_cluster_is_shipped_with_the_facts_its_folder_states():
    folders = sorted(p.parent for p in CORPUS.glob("nccl-tests*/*/facts.toml"))
    assert {f.name for f in folders} == set(clusters.names()) and len(folders) == 8
    for folder in folders:
        facts = tomllib.loads((folder / "facts.toml").read_text())
        net = network_file.load_named(folder.name, ".", field="network")
        c = net.cluster
        assert (c.name, c.gpu, c.gpus_per_node) == (folder.name, facts["gpu"], facts["gpus_per_node"])
        assert c.nodes_measured == tuple(sorted({e["nodes"] for e in facts["files"].values()}))
        assert c.nccl == facts.get("nccl_version", "")
        assert net.calibrated is not None and net.calibrated.intervals is not None  # leave-a-scale-out
        assert 0 < c.held_out_error < 1 and c.held_out_points > 0
        assert net.nccl.nics_per_node == facts.get("nics_per_node", net.nccl.nics_per_node)


def test_list_clusters_prints_one_line_per_cluster_starting_with_its_name(capsys):
    assert cli.main(["list", "clusters"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "clusters:"
    assert [line.split()[0] for line in lines[1:]] == clusters.names()
    for line in lines[1:]:
        assert line.startswith("  ") and not line.startswith("   ")
    socket = next(line for line in lines if line.split()[0] == "polaris-a100-socket")
    for part in ("NVIDIA A100-SXM4-40GB", "4 GPUs/node", "NICs 2 x 200Gbit/s", "transport tcp", "Slingshot",
                 "NCCL 2.18", "nodes measured 2, 8, 128", "held-out error"):
        assert part in socket, part


def test_a_name_in_an_experiment_takes_the_clusters_layout_and_links(tmp_path):
    exp = experiment.load(_experiment(tmp_path, 'network = "polaris-a100-ofi"', nodes=8))
    shipped = network_file.load(clusters.CLUSTERS_DIR / "polaris-a100-ofi.toml")
    assert (exp.cluster.nodes, exp.cluster.ranks_per_node) == (8, 4)  # the nodes the experiment's, GPUs the cluster's
    assert exp.network.nccl == shipped.nccl and exp.comm.collective == "nccl"
    assert exp.cluster.nic.bandwidth_Bps == shipped.nccl.inter_bus_Bps
    assert exp.cluster.gpu_memory_B == 40e9  # the cluster's GPU's, the experiment stating none


def test_stating_other_gpus_per_node_than_the_named_cluster_is_refused_with_both_numbers(tmp_path):
    with pytest.raises(ConfigError, match=r"cluster.gpus_per_node = 8: 4, the GPUs per node of cluster "
                                          r"polaris-a100-ofi") as e:
        experiment.load(_experiment(tmp_path, 'network = "polaris-a100-ofi"\ngpus_per_node = 8'))
    assert "exp.toml" in str(e.value)
    same = experiment.load(_experiment(tmp_path, 'network = "polaris-a100-ofi"\ngpus_per_node = 4'))
    assert same.cluster.ranks_per_node == 4


def test_an_unknown_name_is_refused_with_the_shipped_ones(tmp_path):
    with pytest.raises(ConfigError) as e:
        experiment.load(_experiment(tmp_path, 'network = "polaris-a100"'))
    text = str(e.value)
    assert "cluster.network = 'polaris-a100'" in text and "exp.toml" in text
    assert all(name in text for name in clusters.names())
    with pytest.raises(ConfigError, match="an existing network file"):  # a path stays a path
        experiment.load(_experiment(tmp_path, 'network = "nets/missing.toml"'))


def test_a_file_that_shadows_a_name_is_refused_naming_both(tmp_path):
    shutil.copy(clusters.CLUSTERS_DIR / "abci-a100.toml", tmp_path / "polaris-a100-ofi")
    with pytest.raises(ConfigError, match=r"either the network file .*polaris-a100-ofi or the shipped cluster "
                                          r"polaris-a100-ofi, not both"):
        experiment.load(_experiment(tmp_path, 'network = "polaris-a100-ofi"'))
    exp = experiment.load(_experiment(tmp_path, 'network = "./polaris-a100-ofi"'))  # the file, spelt as a path
    assert exp.network.cluster.name == "abci-a100"


def test_an_estimated_trace_is_re_estimated_for_the_clusters_gpu(tmp_path, capsys):
    exp = experiment.load(_experiment(tmp_path, 'network = "xxrjun-cluster01-h100"', nodes=10))
    trace = exp.workload.trace
    assert trace.device["name"] == "h100" and trace.provenance.estimated
    assert "re-estimated for NVIDIA H100 80GB HBM3, the GPU of cluster xxrjun-cluster01-h100" in \
        exp.workload.compute_source()
    assert cli.main(["simulate", str(tmp_path / "exp.toml")]) == 0
    assert "re-estimated for NVIDIA H100 80GB HBM3" in capsys.readouterr().out
    a100 = experiment.load(_experiment(tmp_path, 'network = "polaris-a100-ofi"')).workload.trace
    assert a100.device["name"] == "a100" and "re-estimated" not in a100.provenance.command  # already its GPU
    assert sum(layer.backward_s[0] for layer in trace.layers) < sum(layer.backward_s[0] for layer in a100.layers)


def test_a_measured_trace_of_another_gpu_is_kept_and_flagged(tmp_path):
    h200 = REPO / "traces" / "resnet50-h200-b32.json.gz"
    with pytest.warns(NetworkFileWarning, match="the trace's GPU is NVIDIA H200 .hopper., but .*polaris-a100-ofi"):
        exp = experiment.load(_experiment(tmp_path, 'network = "polaris-a100-ofi"', trace=h200))
    assert exp.workload.trace.provenance.estimated is False
    assert "H200" in exp.workload.trace.device["name"]


def test_an_estimated_trace_is_kept_with_a_warning_where_no_spec_of_the_gpu_is_known(tmp_path):
    text = (clusters.CLUSTERS_DIR / "abci-a100.toml").read_text().replace('gpu = "A100-SXM4-40GB"',
                                                                          'gpu = "Imaginary X9000"')
    (tmp_path / "x9000.toml").write_text(text)
    with pytest.warns(ClusterGpuWarning, match="no spec of Imaginary X9000"):
        exp = experiment.load(_experiment(tmp_path, 'network = "x9000.toml"'))
    assert exp.workload.trace.device["name"] == "a100"
    assert exp.cluster.ranks_per_node == 8  # a user's file with a [cluster] section gives the layout too


def test_beyond_the_largest_measured_scale_the_run_says_extrapolated_from_it(tmp_path, capsys):
    path = _experiment(tmp_path, 'network = "polaris-a100-socket"', nodes=256)
    assert cli.main(["simulate", str(path)]) == 0
    assert "EXTRAPOLATED: 256 nodes, extrapolated from 128 nodes" in capsys.readouterr().out
    inside = _experiment(tmp_path, 'network = "polaris-a100-socket"', nodes=64)
    assert cli.main(["simulate", str(inside)]) == 0
    assert "EXTRAPOLATED" not in capsys.readouterr().out


def test_the_cluster_section_round_trips_and_refuses_bad_values(tmp_path):
    facts = ClusterFacts("c", "NVIDIA H100", 8, "ib", (2, 4), nics="8 x 400Gbit/s", fabric="fat tree",
                         nccl="2.21", gpu_memory_B=80e9, held_out_error=0.1234, held_out_points=7, source="here")
    assert ClusterFacts.from_toml(facts.to_toml(), "x") == facts
    nan = ClusterFacts.from_toml({**facts.to_toml(), "held_out_error": math.nan}, "x")
    assert "no held-out error" in nan.describe()
    for key, bad in (("transport", "infiniband"), ("gpus_per_node", 0), ("nodes_measured", []),
                     ("held_out_error", -1.0), ("colour", "red")):
        with pytest.raises(ConfigError, match=f"cluster.{key}"):
            ClusterFacts.from_toml({**facts.to_toml(), key: bad}, "x")
    net = network_file.load(clusters.CLUSTERS_DIR / "abci-v100.toml")
    out = tmp_path / "copy.toml"
    network_file.save(out, net.nccl, net.provenance, calibrated=net.calibrated, cluster=net.cluster)
    again = network_file.load(out)
    assert (again.nccl, again.cluster, again.calibrated) == (net.nccl, net.cluster, net.calibrated)


def test_collective_takes_a_name(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.main(["collective", "allreduce", "--network", "abci-a100", "--nodes", "16", "--gpus-per-node",
                         "8", "--sizes", "1MiB"]) == 0
    out = capsys.readouterr().out
    assert "network abci-a100" in out and "tree/LL128" in out


def test_a_jobs_file_takes_a_name_and_its_gpus_per_node(tmp_path):
    from simfog import jobs

    trace = REPO / "traces" / "bert-base-h200-b8.json.gz"
    path = tmp_path / "jobs.toml"
    path.write_text(f'seed = 1\niterations = 2\n[cluster]\nnodes = 8\nnetwork = "together-b200-ib"\n'
                    f'[[job]]\nworkload = {{ trace = "{trace}", compute = "mean" }}\nranks = 16\n'
                    f'[[job]]\nworkload = {{ trace = "{trace}", compute = "mean" }}\nranks = 32\n')
    loaded = jobs.load(path)
    assert [(j.experiment.cluster.nodes, j.experiment.cluster.ranks_per_node) for j in loaded] == [(2, 8), (4, 8)]
    assert all(j.experiment.network.cluster.name == "together-b200-ib" for j in loaded)


def test_a_shipped_file_is_what_its_generator_writes_from_the_corpus():
    """bench/ship_clusters.py is deterministic: calibrating the cluster's logs again gives its shipped file byte for
    byte (one small cluster here; `python bench/ship_clusters.py --check` checks them all)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(REPO / "bench" / "ship_clusters.py"), "--check", "--only",
                          "together-b200-ib"], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("  together-b200-ib  NVIDIA B200, 8 GPUs/node")
