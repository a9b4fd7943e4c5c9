"""Chakra execution traces in and out: the schema on a public trace byte for byte, its import (a PyTorch DDP step of
ResNet-50) against what is known of it, export then import giving the same simulation bit for bit, the export's
ASTRA-sim inputs against the cluster, the per-operator reading on exported traces stripped of simfog's attributes,
and every bad input as one line naming the file and the node, with nothing written."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from simfog import cli, experiment, merge
from simfog.data import DEFAULT_EXPERIMENT
from simfog.errors import ConfigError
from simfog.exporters import export_chakra
from simfog.importers import ImporterWarning, import_files
from simfog.importers import chakra_schema as schema
from simfog.simulation import simulate
from simfog.trace import load_model_trace

REPO = Path(__file__).resolve().parents[1]
PUBLIC = REPO / "bench" / "data" / "chakra" / "mlcommons-feeder-resnet50" / "feeder_tests_trace.tar.gz"
PUBLIC_ET_SHA256 = "e4ae8172ef0d18f94cb12371b28c8d78095bac13b0375986cf56c86e2ba2d4ed"  # its PROVENANCE.md
MATRIX_BASE = REPO / "bench" / "engine-resnet50-cpu.toml"  # ResNet-50 on CPU, 5 samples, compute drawn per rank


@pytest.fixture(scope="module")
def public_et(tmp_path_factory) -> Path:
    """chakra.0.et out of the committed archive, checked against its recorded checksum."""
    folder = tmp_path_factory.mktemp("public")
    with tarfile.open(PUBLIC) as tar:
        data = tar.extractfile("tests/data/chakra.0.et").read()
    assert hashlib.sha256(data).hexdigest() == PUBLIC_ET_SHA256
    path = folder / "chakra.0.et"
    path.write_bytes(data)
    return path


def small(path=MATRIX_BASE, **comm) -> experiment.Experiment:
    """An experiment on 2 nodes x 4 ranks, 3 iterations, 1 Gbit/s NICs (communication about as long as compute)."""
    exp = experiment.load(path)
    c = exp.cluster
    exp = dataclasses.replace(exp, iterations=3, cluster=dataclasses.replace(c, nodes=2, ranks_per_node=4,
                                                                             nic=c.nic.with_bandwidth(1e9 / 8)))
    return exp.with_comm(**comm) if comm else exp


def with_trace(exp, trace):
    return dataclasses.replace(exp, workload=dataclasses.replace(exp.workload, trace=trace))


def numbers(result) -> tuple:
    """What a run predicts: its summary's numbers, and its per (rank, iteration) and per-interval frames."""
    s = result.summary()
    return ({k: v for k, v in s.items() if isinstance(v, int | float) and not isinstance(v, bool)},
            result.iterations().to_csv(index=False), result.intervals().to_csv(index=False))


# ---- the schema and the public trace ---------------------------------------------------------------------------

def test_the_schema_reads_and_writes_the_public_trace_byte_for_byte(public_et):
    data = public_et.read_bytes()
    stream = schema.decode(data, str(public_et))
    assert schema.encode(stream.metadata, stream.nodes) == data
    kinds = [schema.NODE_TYPE_NAMES[n.type] for n in stream.nodes]
    assert (len(kinds), kinds.count("COMP_NODE"), kinds.count("COMM_COLL_NODE")) == (3664, 3643, 21)  # PROVENANCE
    assert schema.attributes(stream.metadata)["schema"] == "1.0.1"
    assert schema.check_version(stream.metadata, "x") == "0.0.4"


def test_the_public_ddp_step_imports_with_simfogs_own_ddp_buckets(public_et):
    trace = import_files("chakra", [public_et])
    sizes = [trace.tensors[n].nbytes for n in trace.grad_ready_order]
    assert sizes == [8_196_000, 31_502_336, 26_255_360, 26_550_272, 9_724_160]  # the file's ALL_REDUCE comm_size
    assert trace.parameters == 25_557_032  # ResNet-50 in float32
    ours = load_model_trace(REPO / "traces" / "resnet50-cpu-b32.json.gz")  # simfog's DDP plan of ResNet-50
    assert [b.nbytes for b in merge.plan("ddp", merge.grad_tensors(ours))] == sizes
    # every device compute node lands in forward, backward or the optimizer step, with its recorded duration
    stream = schema.decode(public_et.read_bytes(), "x")
    device_us = sum(n.duration_micros for n in stream.nodes
                    if n.type == schema.NODE_TYPES["COMP_NODE"] and not schema.attributes(n)["is_cpu_op"])
    total = sum(layer.forward_s[0] + layer.backward_s[0] for layer in trace.layers) + trace.optimizer_s[0]
    assert total == pytest.approx(device_us * 1e-6, rel=1e-12)
    first_backward = next(layer for layer in reversed(trace.layers) if layer.backward_s[0] > 0)
    assert "nll_loss_backward" in first_backward.name  # backward starts at the loss
    ready = [g.ready_s for g in merge.grad_tensors(trace)]
    assert ready == sorted(ready) and ready[-1] == pytest.approx(sum(x.backward_s[0] for x in trace.layers))
    notes = trace.provenance.notes
    assert str(public_et) in notes and "schema version 0.0.4" in notes and "BROADCAST" not in notes
    assert "ncclKernel_Broadcast" in notes  # what was not kept is said


def default_on_a_ring():
    """The embedded default (a shipped cluster, whose collective is NCCL's model) on simfog's ring, which ASTRA-sim
    runs too."""
    return experiment.override(experiment.load(DEFAULT_EXPERIMENT), collective="ring")


# ---- round trip --------------------------------------------------------------------------------------------------

ROUND_TRIPS = [
    ("default: A100 estimate, ddp, ring, 128 ranks", lambda: default_on_a_ring()),
    ("drawn compute, mgwfbp, hierarchical", lambda: small(merge="mgwfbp", collective="hierarchical")),
    ("fsdp per layer, prefetch 2, resharded", lambda: small(algorithm="fsdp", prefetch=2)),
    ("zero2 with overlap", lambda: small(algorithm="zero2", overlap_comm=True, reduce_bucket_size=2_000_000)),
    ("threshold, a slow rank", lambda: dataclasses.replace(
        small(merge="threshold", threshold_bytes=8 * 2**20),
        heterogeneity=experiment.Heterogeneity(rank_slowdown=((3, 1.5),)))),
]


@pytest.mark.parametrize("name,make", ROUND_TRIPS, ids=[r[0] for r in ROUND_TRIPS])
def test_export_then_import_gives_the_same_simulation_bit_for_bit(tmp_path, name, make):
    exp = make()
    done = export_chakra(exp, tmp_path / "out")
    files = sorted((tmp_path / "out").glob("workload.*.et"))
    assert len(files) == done.ranks == exp.ranks
    back = import_files("chakra", files)
    assert back == dataclasses.replace(exp.workload.trace, provenance=back.provenance)
    p, q = back.provenance, exp.workload.trace.provenance
    assert "schema version 0.0.4" in p.notes and p.command.startswith("simfog import chakra")
    assert (p.source, p.estimated) == (q.source, q.estimated)  # an estimate stays one
    assert numbers(simulate(with_trace(exp, back))) == numbers(simulate(exp))
    one = import_files("chakra", files[1])  # any one rank's file holds the trace
    assert one == dataclasses.replace(back, provenance=one.provenance)


def test_the_cli_round_trip_writes_a_trace_that_simulates_alike(tmp_path, capsys):
    out = tmp_path / "astra"
    assert cli.main(["export", "chakra", str(MATRIX_BASE), "-o", str(out), "--ranks", "16"]) == 0
    printed = capsys.readouterr().out
    assert "16 Chakra traces" in printed and "AstraSim_Analytical_Congestion_Unaware" in printed
    assert 'compute = "samples"' in printed  # what ASTRA-sim will not see is said
    trace = tmp_path / "back.json.gz"
    assert cli.main(["import", "chakra", *map(str, sorted(out.glob("workload.*.et"))), "-o", str(trace)]) == 0
    exp = experiment.load(MATRIX_BASE).with_ranks(16)
    assert numbers(simulate(with_trace(exp, load_model_trace(trace)))) == numbers(simulate(exp))


# ---- what ASTRA-sim is given -------------------------------------------------------------------------------------

def _nodes(path: Path):
    return schema.decode(path.read_bytes(), str(path)).nodes


def test_the_workload_is_the_iteration_simfog_simulates(tmp_path):
    exp = dataclasses.replace(small(merge="mgwfbp"), heterogeneity=experiment.Heterogeneity(rank_slowdown=((2, 2.0),)))
    done = export_chakra(exp, tmp_path / "out")
    assert done.distinct == 2  # rank 2 is slower; the other seven share one file
    from simfog.algorithms.allreduce.plan import static_plan

    trace, buckets = exp.workload.trace, static_plan(exp)
    for rank, factor in ((0, 1.0), (2, 2.0)):
        nodes = _nodes(tmp_path / "out" / f"workload.{rank}.et")
        comp = [n for n in nodes if n.type == schema.NODE_TYPES["COMP_NODE"]]
        coll = [n for n in nodes if n.type == schema.NODE_TYPES["COMM_COLL_NODE"]]
        assert len(comp) == 2 * len(trace.layers) + 1 and len(coll) == len(buckets)
        expected = [round(np.mean(x.forward_s) * factor * 1e6) for x in trace.layers]
        assert [n.duration_micros for n in comp[:len(trace.layers)]] == expected
        assert [schema.attributes(n)["comm_size"] for n in coll] == [b.nbytes for b in buckets]
        assert [n.id for n in nodes] == list(range(len(nodes)))
        assert all(d < n.id for n in nodes for d in n.data_deps)  # ids in issue order: ASTRA-sim's lowest first
        assert set(coll[-1].data_deps) <= {n.id for n in nodes} and nodes[-1].name == "optimizer"
        assert coll[-1].id in nodes[-1].data_deps  # the step waits for the last bucket


@pytest.mark.parametrize("collective", ["ring", "hierarchical"])
def test_the_network_and_system_are_the_clusters(tmp_path, collective):
    exp = small(collective=collective)
    export_chakra(exp, tmp_path / "out")
    text = (tmp_path / "out" / "network.yml").read_text()
    c, gib = exp.cluster, 2**30
    if collective == "ring":  # one ring of 8 at the NIC's speed, the slower link
        want = ["topology: [ Ring ]", "npus_count: [ 8 ]", f"bandwidth: [ {c.nic.bandwidth_Bps / gib!r} ]",
                f"latency: [ {c.nic.latency_s * 1e9!r} ]"]
    else:  # the node's ring, then the nodes' ring with the NIC shared by the node's 4 ranks
        want = ["topology: [ Ring, Ring ]", "npus_count: [ 4, 2 ]",
                f"bandwidth: [ {c.intra.bandwidth_Bps / gib!r}, {c.nic.bandwidth_Bps / 4 / gib!r} ]"]
    assert all(line in text for line in want), text
    system = json.loads((tmp_path / "out" / "system.json").read_text())
    assert system["preferred-dataset-splits"] == 1 and system["active-chunks-per-dimension"] == 1
    assert system["all-reduce-implementation"] == ["ring"] * (1 if collective == "ring" else 2)
    assert system["collective-optimization"] == "localBWAware"  # two levels: reduce-scatter, allreduce, all-gather
    manifest = json.loads((tmp_path / "out" / "export.json").read_text())
    assert manifest["ranks"] == 8 and manifest["chakra_schema"] == "0.0.4"


# ---- the per-operator reading, on exported traces without simfog's attributes -----------------------------------

def test_a_foreign_ddp_trace_is_read_per_operator_to_the_same_iteration(tmp_path):
    exp = dataclasses.replace(default_on_a_ring(), iterations=2)
    export_chakra(exp, tmp_path / "out", exact=False)  # what another tool writing the same graph would write
    assert not any(a.name.startswith("simfog.") for n in _nodes(tmp_path / "out" / "workload.0.et") for a in n.attr)
    trace = import_files("chakra", [tmp_path / "out" / "workload.0.et"], model="resnet50", batch_size=32)
    from simfog.algorithms.allreduce.plan import static_plan

    assert [trace.tensors[n].nbytes for n in trace.grad_ready_order] == [b.nbytes for b in static_plan(exp)]
    assert trace.model == "resnet50" and trace.batch_size == 32 and "per operator" in trace.provenance.notes
    nodes = 2 * len(exp.workload.trace.layers) + 1
    ours = simulate(exp).summary()["iteration_time_s"]
    theirs = simulate(with_trace(exp, trace).with_comm(merge="wfbp")).summary()["iteration_time_s"]
    assert abs(theirs - ours) <= nodes * 0.5e-6  # each duration rounded to whole microseconds, nothing else


def test_several_foreign_rank_files_keep_each_ranks_compute(tmp_path):
    exp = dataclasses.replace(small(), heterogeneity=experiment.Heterogeneity(rank_slowdown=((1, 3.0),)))
    export_chakra(exp, tmp_path / "out", exact=False)
    trace = import_files("chakra", [tmp_path / "out" / "workload.1.et", tmp_path / "out" / "workload.0.et"])
    assert trace.sample_ranks == (0, 1)
    forward = np.array([layer.forward_s for layer in trace.layers])
    slow = forward[:, 1][forward[:, 0] > 50e-6] / forward[:, 0][forward[:, 0] > 50e-6]
    assert slow.size and np.allclose(slow, 3.0, rtol=0.02)  # rank 1's own times, in whole microseconds


def test_a_foreign_fsdp_trace_keeps_its_reduce_scatters_as_gradients(tmp_path):
    exp = small(algorithm="fsdp", fsdp_unit="model")
    export_chakra(exp, tmp_path / "out")
    nodes = _nodes(tmp_path / "out" / "workload.0.et")
    ops = [schema.COLLECTIVE_TYPE_NAMES[schema.attributes(n)["comm_type"]] for n in nodes
           if n.type == schema.NODE_TYPES["COMM_COLL_NODE"]]
    assert ops == ["ALL_GATHER", "ALL_GATHER", "REDUCE_SCATTER"]  # one unit: gathered for forward and backward
    gathered = [schema.attributes(n)["comm_size"] for n in nodes if "allgather" in n.name]
    assert gathered == [round(exp.workload.trace.nbytes / 8)] * 2  # ASTRA-sim's all-gather size: each rank's part
    export_chakra(exp, tmp_path / "plain", exact=False)
    with pytest.warns(ImporterWarning, match="REDUCE_SCATTER"):
        trace = import_files("chakra", [tmp_path / "plain" / "workload.0.et"])
    assert [t.nbytes for t in trace.tensors.values()] == [exp.workload.trace.nbytes]
    assert "ALL_GATHER" in trace.provenance.notes or "allgather" in trace.provenance.notes


def test_reduce_scatter_gradients_are_read_with_a_warning(tmp_path):
    """An FSDP-like step written by hand: all-gathers before forward and backward, reduce-scatters after."""
    nodes = [_node(0, "COMM_COLL_NODE", [], comm=("ALL_GATHER", 4000)),
             _node(1, "COMP_NODE", [0], name="fwd", us=100),
             _node(2, "COMM_COLL_NODE", [1], comm=("ALL_GATHER", 4000)),
             _node(3, "COMP_NODE", [2], name="layer_backward", us=200),
             _node(4, "COMM_COLL_NODE", [3], comm=("REDUCE_SCATTER", 4000)),
             _node(5, "COMP_NODE", [4], name="optimizer.step", us=30)]
    path = _write(tmp_path / "fsdp.et", nodes)
    with pytest.warns(ImporterWarning, match="REDUCE_SCATTER comm_size"):
        trace = import_files("chakra", [path])
    assert [t.nbytes for t in trace.tensors.values()] == [4000]
    times = (trace.layers[0].forward_s, trace.layers[1].backward_s, trace.optimizer_s)
    assert times == ((100 * 1e-6,), (200 * 1e-6,), (30 * 1e-6,))  # microseconds, as recorded
    assert "ALL_GATHER" not in trace.provenance.notes or "Not kept" in trace.provenance.notes


# ---- bad input ---------------------------------------------------------------------------------------------------

def _node(i, kind, deps, *, name=None, us=10, comm=None, attrs=()):
    n = schema.Node(id=i, name=name or f"n{i}", type=schema.NODE_TYPES[kind], data_deps=deps, duration_micros=us)
    if comm:
        n.attr.extend([schema.attr("comm_type", int64_val=schema.COLLECTIVE_TYPES[comm[0]]),
                       schema.attr("comm_size", int64_val=comm[1])])
    n.attr.extend(attrs)
    return n


def _write(path: Path, nodes, version="0.0.4") -> Path:
    path.write_bytes(schema.encode(schema.GlobalMetadata(version=version), nodes))
    return path


def _ddp(extra=(), deps_of_first=()):
    """forward, backward, one gradient allreduce, optimizer: the least a data-parallel step has."""
    return [_node(1, "COMP_NODE", list(deps_of_first), name="fwd"), _node(2, "COMP_NODE", [1], name="x_backward"),
            _node(3, "COMM_COLL_NODE", [2], comm=("ALL_REDUCE", 1024)), _node(4, "COMP_NODE", [3], name="step"),
            *extra]


BAD = [
    ("not a trace", lambda p: p.write_text('{"schema": "not protobuf"}\n' * 20), r"not a Chakra|truncated"),
    ("truncated", lambda p: p.write_bytes(_write(p, _ddp()).read_bytes()[:-7]),
     r"node after node id 3 .*truncated"),
    ("unknown version", lambda p: _write(p, _ddp(), version="9.9.9"), r"GlobalMetadata.version = '9.9.9'"),
    ("cycle", lambda p: _write(p, _ddp(deps_of_first=[4])), r"node [1-4] data_deps .*cycle"),
    ("missing dependency", lambda p: _write(p, _ddp(deps_of_first=[77])), r"node 1 data_deps = 77"),
    ("subgroup pg_name", lambda p: _write(p, _ddp([
        _node(5, "COMM_COLL_NODE", [4], comm=("ALL_REDUCE", 8), attrs=[schema.attr("pg_name", string_val="1")]),
        _node(6, "COMM_COLL_NODE", [5], comm=("ALL_REDUCE", 8), attrs=[schema.attr("pg_name", string_val="2")])])),
     r"node 6 pg_name = '2'.*subset of the ranks"),
    ("subgroup dims", lambda p: _write(p, _ddp([_node(5, "COMM_COLL_NODE", [4], comm=("ALL_REDUCE", 8), attrs=[
        schema.attr("involved_dim", bool_list=[True, False])])])), r"node 5 involved_dim .*every dimension"),
    ("pipeline send", lambda p: _write(p, _ddp([_node(5, "COMM_SEND_NODE", [4])])),
     r"node 5 = 'COMM_SEND_NODE'.*pipeline-parallel"),
    ("all-to-all", lambda p: _write(p, _ddp([_node(5, "COMM_COLL_NODE", [4], comm=("ALL_TO_ALL", 8))])),
     r"node 5 comm_type = 'ALL_TO_ALL'"),
    ("allreduce in forward", lambda p: _write(p, [_node(0, "COMM_COLL_NODE", [], comm=("ALL_REDUCE", 8)),
                                                  *_ddp(deps_of_first=[0])]), r"node 0 = 'ALL_REDUCE before back"),
    ("no backward", lambda p: _write(p, [_node(1, "COMP_NODE", []), _node(2, "COMM_COLL_NODE", [1],
                                                                           comm=("ALL_REDUCE", 8))]),
     r"backward pass"),
]


@pytest.mark.parametrize("name,make,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_naming_the_file_and_nothing_is_written(tmp_path, capsys, name, make, message):
    path = tmp_path / "bad.0.et"
    make(path)
    with pytest.raises(ConfigError, match=message) as e:
        import_files("chakra", [path])
    assert e.value.source == str(path)
    out = tmp_path / "t.json"
    assert cli.main(["import", "chakra", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and not out.exists()


def test_rank_files_of_different_runs_are_refused(tmp_path):
    a = _write(tmp_path / "w.0.et", _ddp())
    b = _write(tmp_path / "w.1.et", [*_ddp()[:2], _node(3, "COMM_COLL_NODE", [2], comm=("ALL_REDUCE", 2048)),
                                     _ddp()[3]])
    with pytest.raises(ConfigError, match="gradients") as e:
        import_files("chakra", [a, b])
    assert e.value.source == str(b)


def test_what_the_export_cannot_write_is_refused_and_nothing_is_written(tmp_path, capsys):
    exp_file = tmp_path / "e.toml"
    exp_file.write_text(MATRIX_BASE.read_text().replace('"../traces/', f'"{REPO}/traces/'))
    for args, message in ((["--collective", "tree"], "comm.collective = 'tree'"),
                          (["--merge", "horovod"], "comm.merge = 'horovod'")):
        assert cli.main(["export", "chakra", str(exp_file), "-o", str(tmp_path / "o"), *args]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="comm.algorithm = 'hsdp'.*every rank"):
        export_chakra(small(algorithm="hsdp"), tmp_path / "o")
    with pytest.raises(ConfigError, match="comm.algorithm = 'powersgd'"):
        export_chakra(small(algorithm="powersgd", powersgd_rank=2), tmp_path / "o")
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.*"))
    (tmp_path / "o").mkdir()
    assert cli.main(["export", "chakra", str(exp_file), "-o", str(tmp_path / "o")]) == 2
    assert "--force" in capsys.readouterr().err and not list((tmp_path / "o").iterdir())
