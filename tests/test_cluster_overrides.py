"""A real question without hand-written TOML: --nodes, --gpus-per-node, --nic-bandwidth and --network on simulate,
sweep, curve, tune and plan, read and checked as the file's own keys; `simfog init` writes a starter experiment (and
a one-option catalogue) that runs as written; the catalogue's format in `plan --help` and docs/catalogue.md."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

import simfog
from simfog import cli, experiment, nccl, network_file, plan
from simfog.errors import ConfigError

from .conftest import make_trace

ROOT = Path(__file__).resolve().parents[1]
BASE = '[workload]\ntrace = "t.json"\ncompute = "mean"\n[cluster]\n{cluster}[comm]\nmerge = "ddp"\n'


@pytest.fixture
def folder(tmp_path):
    make_trace([0.01, 0.02], [0.02, 0.03], [2_000_000, 500_000]).save(tmp_path / "t.json")
    network_file.save(tmp_path / "net.toml", nccl.NcclNetwork(230e9, 40e9, latency_inter_s=5e-6, version="2.21.5"))
    (tmp_path / "e.toml").write_text(BASE.format(cluster='nodes = 2\ngpus_per_node = 2\nnic_bandwidth = '
                                                         '"10Gbit/s"\n'))
    return tmp_path


def _json(capsys, *argv):
    assert cli.main([str(a) for a in argv]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _written(folder, cluster: str) -> Path:
    path = folder / "written.toml"
    path.write_text(BASE.format(cluster=cluster))
    return path


def test_simulate_overrides_equal_the_same_keys_written(folder, capsys):
    given = _json(capsys, "simulate", folder / "e.toml", "--nodes", "3", "--gpus-per-node", "4", "--nic-bandwidth",
                  "5Gbit/s", "--json")
    written = _json(capsys, "simulate", _written(folder, 'nodes = 3\ngpus_per_node = 4\nnic_bandwidth = "5Gbit/s"\n'),
                    "--json")
    assert given == written and given["ranks"] == 12
    on_net = _json(capsys, "simulate", folder / "e.toml", "--network", folder / "net.toml", "--json")
    net_written = _json(capsys, "simulate", _written(folder, 'nodes = 2\ngpus_per_node = 2\nnetwork = "net.toml"\n'),
                        "--json")
    assert on_net == net_written and on_net["collective"] == "nccl"  # the network's default collective, as written
    # the Python API takes the same overrides, by keyword, and gives the same numbers
    api = simfog.simulate(simfog.load(folder / "e.toml", nodes=3, gpus_per_node=4, nic_bandwidth="5Gbit/s"))
    assert api.summary()["samples_per_s"] == given["samples_per_s"]


def test_network_replaces_the_links_written_without_a_word_and_is_relative_to_here(folder, capsys, monkeypatch):
    monkeypatch.chdir(folder)
    (folder / "sub").mkdir()
    (folder / "sub" / "e.toml").write_text((folder / "e.toml").read_text().replace('"t.json"', '"../t.json"'))
    out = _json(capsys, "simulate", "sub/e.toml", "--network", "net.toml", "--json")  # ./net.toml, not sub/net.toml
    assert out["network_file"] == str(folder / "net.toml")
    assert "warning" not in capsys.readouterr().err  # the file's nic_bandwidth gave way to the network's links
    assert cli.main(["simulate", str(folder / "e.toml"), "--network", str(folder / "net.toml"), "--nic-bandwidth",
                     "1Gbit/s"]) == 0
    err = capsys.readouterr().err
    assert "simfog: warning: --nic-bandwidth = '1Gbit/s' is ignored: the network file" in err, err


@pytest.mark.parametrize("flag, value, key", [
    ("--nic-bandwidth", "10", "nic_bandwidth"), ("--nic-bandwidth", "0Gbit/s", "nic_bandwidth"),
    ("--gpus-per-node", "0", "gpus_per_node"), ("--nodes", "0", "nodes"),
    ("--network", "missing.toml", "network"), ("--network", "t.json", "network"),
])
def test_a_bad_override_is_refused_as_the_file_key_is_naming_the_option(folder, capsys, monkeypatch, flag, value,
                                                                         key):
    monkeypatch.chdir(folder)
    shown = value if key in ("nodes", "gpus_per_node") else repr(str(folder / value) if key == "network" else value)
    line = f"{key} = {shown}\n".replace("'", '"')  # the file's network named as the option names it: from here
    cluster = 'nodes = 2\ngpus_per_node = 2\nnic_bandwidth = "10Gbit/s"\n'
    cluster = re.sub(f"^{key} = .*\n", "", cluster, flags=re.M) + line
    with pytest.raises(ConfigError) as from_file:
        experiment.load(_written(folder, cluster))
    assert cli.main(["simulate", "e.toml", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    allowed = from_file.value.allowed.replace(str(folder / "written.toml"), str(folder / "e.toml"))
    assert err == f"simfog: error: {flag} = {shown}: {allowed}", err


def test_ranks_and_nodes_together_are_refused(folder, capsys):
    assert cli.main(["simulate", str(folder / "e.toml"), "--ranks", "8", "--nodes", "2"]) == 2
    assert "--nodes = 2: either --ranks (8) or --nodes, not both" in capsys.readouterr().err
    assert cli.main(["sweep", str(folder / "e.toml"), "--ranks", "8", "--nodes", "2"]) == 2
    assert "either --ranks or --nodes" in capsys.readouterr().err


def test_sweep_curve_and_tune_take_the_cluster_overrides(folder, capsys):
    written = _written(folder, 'nodes = 2\ngpus_per_node = 4\nnic_bandwidth = "5Gbit/s"\n')
    given = ["--gpus-per-node", "4", "--nic-bandwidth", "5Gbit/s"]
    a = _json(capsys, "sweep", folder / "e.toml", "--nodes", "1,2,4", *given, "--json", "-o", folder / "a.csv",
              "--no-progress")["rows"]
    b = _json(capsys, "sweep", written, "--ranks", "4,8,16", "--json", "-o", folder / "b.csv", "--no-progress")["rows"]
    assert [r["ranks"] for r in a] == [4, 8, 16]
    assert [r["samples_per_s"] for r in a] == [r["samples_per_s"] for r in b]
    c = _json(capsys, "curve", folder / "e.toml", "--nodes", "1,2,...,4", *given, "--json", "-o", folder / "c",
              "--no-progress")["rows"]
    assert [r["samples_per_s"] for r in c] == [r["samples_per_s"] for r in a]
    t1 = _json(capsys, "tune", folder / "e.toml", "--nodes", "2", *given, "--points", "3", "--refine", "0",
               "--json", "-o", folder / "t1")
    t2 = _json(capsys, "tune", written, "--points", "3", "--refine", "0", "--json", "-o", folder / "t2")
    assert t1["best_iteration_time_s"] == t2["best_iteration_time_s"] and t1["ranks"] == 8


def test_plan_overrides_set_every_option_of_the_catalogue(folder, capsys):
    (folder / "cat.toml").write_text('currency = "EUR"\n[[option]]\nname = "a"\ngpus_per_node = 8\nmax_nodes = 8\n'
                                     'intra_bandwidth = "100GB/s"\nnic_bandwidth = "10Gbit/s"\nprice_per_gpu_hour = 1\n'
                                     '[[option]]\nname = "b"\ngpus_per_node = 2\nmax_nodes = 8\nintra_bandwidth = '
                                     '"100GB/s"\nnic_bandwidth = "25Gbit/s"\nprice_per_gpu_hour = 2\n')
    same = 'gpus_per_node = 4\nmax_nodes = 8\nnetwork = "net.toml"\n'
    (folder / "same.toml").write_text(f'currency = "EUR"\n[[option]]\nname = "a"\n{same}price_per_gpu_hour = 1\n'
                                      f'[[option]]\nname = "b"\n{same}price_per_gpu_hour = 2\n')
    given = _json(capsys, "plan", folder / "e.toml", "--catalogue", folder / "cat.toml", "--gpus", "8,16",
                  "--gpus-per-node", "4", "--network", folder / "net.toml", "--json", "-o", folder / "p1")["rows"]
    written = _json(capsys, "plan", folder / "e.toml", "--catalogue", folder / "same.toml", "--gpus", "8,16",
                    "--json", "-o", folder / "p2")["rows"]
    key = ("option", "gpus", "nodes", "collective", "samples_per_s", "cost_per_hour")
    assert [[r[k] for k in key] for r in given] == [[r[k] for k in key] for r in written]
    assert cli.main(["plan", str(folder / "e.toml"), "--catalogue", str(folder / "cat.toml"), "--gpus", "8",
                     "--gpus-per-node", "0"]) == 2
    err = capsys.readouterr().err
    assert "simfog: error: --gpus-per-node = 0: an integer in 1..1,000,000" in err, err


def test_init_writes_an_experiment_that_runs_as_written_and_a_catalogue_of_the_same_cluster(tmp_path, capsys,
                                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init", "-o", "exp.toml", "--catalogue", "cat.toml", "--nodes", "2"]) == 0
    capsys.readouterr()
    text = Path("exp.toml").read_text()
    assert all(line.startswith("#") or " # " in line for line in text.splitlines() if "=" in line)  # annotated
    ran = _json(capsys, "simulate", "exp.toml", "--json")
    assert ran["ranks"] == 16 and ran["warnings"] == []
    planned = _json(capsys, "plan", "exp.toml", "--catalogue", "cat.toml", "--gpus", "16", "--json", "-o", "p")
    assert planned["rows"][0]["samples_per_s"] == ran["samples_per_s"]
    assert cli.main(["init", "-o", "exp.toml"]) == 2  # never overwritten by accident
    assert "add --force" in capsys.readouterr().err


def test_init_with_a_gpu_trace_and_network(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    network_file.save("net.toml", nccl.NcclNetwork(230e9, 40e9, version="2.21.5"))
    (tmp_path / "runs").mkdir()
    trace = ROOT / "traces" / "bert-base-h200-b8.json.gz"
    assert cli.main(["init", "-o", "runs/exp.toml", "--gpu", "H200", "--trace", str(trace), "--network", "net.toml",
                     "--gpus-per-node", "4"]) == 0
    text = Path("runs/exp.toml").read_text()
    assert 'network = "../net.toml"' in text and 'gpu = "H200"' in text and "# nic_bandwidth" in text
    capsys.readouterr()
    ran = _json(capsys, "simulate", "runs/exp.toml", "--json")
    assert ran["collective"] == "nccl" and ran["gpus_per_node"] == 4 and ran["model"] == "bert-base"
    assert "warning" not in capsys.readouterr().err  # the trace is the cluster's GPU
    assert cli.main(["init", "-o", "other.toml", "--gpu", "H100", "--trace", str(trace)]) == 0
    assert "the trace's compute times are of NVIDIA H200, not of H100" in capsys.readouterr().err


def test_init_refuses_a_bad_value_naming_its_option_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init", "-o", "exp.toml", "--catalogue", "cat.toml", "--nic-bandwidth", "10"]) == 2
    assert "simfog: error: --nic-bandwidth = '10': a bandwidth with its unit" in capsys.readouterr().err
    assert cli.main(["init", "-o", "exp.toml", "--gpu", ""]) == 2
    assert "simfog: error: --gpu = '': the GPU model of the cluster" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _help(capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    return capsys.readouterr().out


def test_the_catalogue_format_is_in_plan_help_and_docs_and_names_every_key(capsys):
    helped = _help(capsys)
    block = helped[helped.index("# simfog catalogue"):]
    docs = (ROOT / "docs" / "catalogue.md").read_text()
    example = re.search(r"```toml\n(.*?)```", docs, re.S).group(1)
    assert example.strip() == block.strip()  # one text: what init writes, plan --help shows, docs/catalogue.md holds
    keys = set(re.findall(r"^#? ?(\w+) = ", example, re.M))
    assert keys == plan._OPTION | plan._TOP - {"option"}, keys ^ (plan._OPTION | plan._TOP)
    for key in plan._OPTION | plan._TOP:
        assert f"`{key}`" in docs or key == "option", key
    # and the example itself is a catalogue simfog reads, commented keys and all
    uncommented = re.sub(r"^# (\w+ = )", r"\1", example, flags=re.M).replace('"network.toml"', '"n.toml"')
    import tomllib

    data = tomllib.loads(uncommented)
    data["option"][0].pop("network")  # the links stand in its place
    assert plan.catalogue_from_dict(data, "example.toml").options[0].gpu == "H100"


def test_plan_rows_name_the_compute_mode_and_keep_their_warnings_in_the_csv(tmp_path, capsys):
    make_trace([0.01, 0.02], [0.02, 0.03], [2_000_000, 500_000]).save(tmp_path / "t.json")
    assert cli.main(["plan", str(tmp_path / "t.json"), "--gpus", "8", "-o", str(tmp_path / "p")]) == 0
    with open(tmp_path / "p" / "plan.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["warnings"] == "" for r in rows)
    assert f"; {experiment.DEFAULT_COMPUTE} layer times of" in capsys.readouterr().out
