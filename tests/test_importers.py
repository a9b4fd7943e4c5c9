"""Importers, checked on real third-party files (bench/data/ref) against the numbers in their PROVENANCE.md, on a
hand-made Kineto trace with hand-computed answers, and on synthetic nccl-tests logs (hypothesis)."""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog.commands import importing as importers_cli
from simfog.errors import ConfigError
from simfog.importers import IMPORTERS, ImporterWarning, import_file
from simfog.importers.kineto import network_trace_of as kineto_network
from simfog.importers.mgwfbp import network_trace_of
from simfog.trace import load_model_trace, load_network_trace

from .conftest import REF

MiB = 1 << 20
ECHO, ABCI, MG = REF / "nccl-tests" / "echo-a100-azure", REF / "nccl-tests" / "abci-v100", REF / "mgwfbp-googlenet"
GLOO, NCCL = REF / "gloo-ddp-cpu", REF / "kineto-nccl" / "nccl_parser_config" / "nccl_data.json.gz"


def us(m, nbytes):
    """Times (µs) of the measurement of `nbytes` in NetworkTrace m."""
    return [round(t * 1e6, 4) for t in next(x for x in m.measurements if x.bytes == nbytes).time_s]


# ---- registry and API ----

def test_registry_lists_the_importers_with_docstrings():
    assert IMPORTERS.names() == ["chakra", "imb", "kineto", "kineto-comm", "mgwfbp", "nccl-tests", "osu"]
    assert all(doc for _, doc in IMPORTERS.describe())


def test_unknown_kind_option_or_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="one of chakra, imb, kineto, kineto-comm, mgwfbp, nccl-tests, osu"):
        import_file("horovod", tmp_path / "x.log")
    (tmp_path / "x.log").write_text("")
    with pytest.raises(ConfigError, match="ranks, nodes, transport, backend") as e:
        import_file("osu", tmp_path / "x.log", rank=4)
    assert e.value.source == str(tmp_path / "x.log")
    with pytest.raises(ConfigError, match="an existing file"):
        import_file("osu", tmp_path / "missing.log")


def test_importing_simfog_importers_does_not_import_torch():
    code = "import sys, simfog.importers, simfog.commands.importing; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---- nccl-tests ----

@pytest.mark.parametrize("name, ranks, nodes, t1mib, t32mib, t1gib", [
    ("nccl_1.log", 1, 1, 5.26, 54.81, 1620.4), ("nccl_2.log", 2, 1, 59.46, 229.6, 5203.1),
    ("nccl_4.log", 4, 1, 66.24, 279.2, 7173.7), ("nccl_8.log", 8, 1, 72.53, 361.0, 8139.2),
    ("nccl_16.log", 16, 2, 100.1, 580.1, 16170), ("nccl_32.log", 32, 4, 131.8, 749.6, 16562),
    ("nccl_64.log", 64, 8, 157.0, 771.1, 17115), ("nccl_128.log", 128, 16, 183.1, 804.0, 16586)])
def test_echo_a100_reference_points(name, ranks, nodes, t1mib, t32mib, t1gib):
    net = import_file("nccl-tests", ECHO / name)
    assert {(m.collective, m.ranks, m.nodes) for m in net.measurements} == {("allreduce", ranks, nodes)}
    assert (us(net, MiB)[0], us(net, 32 * MiB)[0], us(net, 1024 * MiB)[0]) == (t1mib, t32mib, t1gib)
    assert net.backend == "nccl" and net.provenance.source == "imported"


def test_echo_quirks_in_place_column_interleaved_tag_and_transport():
    net8 = import_file("nccl-tests", ECHO / "nccl_8.log")
    assert us(net8, 33554432) == [361.0, 357.5]          # [out-of-place, in-place]
    assert [m.bytes for m in net8.measurements] == [8 << k for k in range(28)]   # 8 B .. 1 GiB
    assert net8.transport == "nvlink"                     # one node of SXM4 GPUs
    net128 = import_file("nccl-tests", ECHO / "nccl_128.log")
    assert net128.measurements[0].nodes == 16             # 17 if the interleaved "[1,0]<stdout>:" tag were kept
    assert len(net128.extra["nccl_tests"][0]["hosts"]) == 16
    assert us(net128, 1024) == [1242.3, 91.97]            # the noisy first row is kept as measured
    assert net128.transport == "unknown"
    assert import_file("nccl-tests", ECHO / "nccl_128.log", transport="ib").transport == "ib"
    oop = import_file("nccl-tests", ECHO / "nccl_8.log", times="out-of-place")
    assert us(oop, 33554432) == [361.0]


@pytest.mark.parametrize("path, ranks, nodes, t4, t1mib, t32mib, avg", [
    ("intra_vnode/job04.sh.7280532.nccl", 4, 1, 8.48, 79.05, 447.3, 18.8014),
    ("inter_vnode/job02.sh.7194532.nccl", 8, 2, 17.98, 198.7, 2970.9, 4.85188),
    ("inter_vnode/job04.sh.7194533.nccl", 16, 4, 31.31, 295.6, 3156.6, 4.25971),
    ("inter_vnode/job08.sh.7194534.nccl", 32, 8, 41.36, 337.7, 3319.4, 3.5418),
    ("inter_vnode/job16.sh.7194535.nccl", 64, 16, 56.18, 380.7, 3857.6, 2.8419),
    ("inter_vnode/job32.sh.7194536.nccl", 128, 32, 63.27, 507.1, 5031.7, 2.23976)])
def test_abci_v100_reference_points(path, ranks, nodes, t4, t1mib, t32mib, avg):
    net = import_file("nccl-tests", ABCI / path)
    assert {(m.ranks, m.nodes) for m in net.measurements} == {(ranks, nodes)}
    assert len(net.measurements) == 24                    # 4 B .. 32 MiB, UCX warning lines skipped
    assert (us(net, 4)[0], us(net, MiB)[0], us(net, 32 * MiB)[0]) == (t4, t1mib, t32mib)
    assert net.extra["nccl_tests"][0]["avg_busbw_GBps"] == avg
    assert net.provenance.date.startswith("2021-06-")     # from the UCX warnings' unix time stamps


@pytest.mark.parametrize("path", sorted(ECHO.glob("*.log")) + sorted(ABCI.glob("*/*.nccl")), ids=lambda p: p.name)
def test_times_agree_with_the_logs_busbw_column(path):
    """busbw = size/time * 2(n-1)/n: checks the µs -> s conversion and the column alignment of every row."""
    net = import_file("nccl-tests", path)
    for m, busbw in zip(net.measurements, net.extra["nccl_tests"][0]["busbw_GBps"], strict=True):
        n = m.ranks
        for t, b in zip(m.time_s, busbw, strict=True):
            expected = m.bytes / t / 1e9 * 2 * (n - 1) / n
            assert b == pytest.approx(expected, rel=0.02, abs=0.011)


def _nccl_log(rows, *, ranks, hosts, crlf=False, tags=False, new_format=False, ucx=(), factor=None):
    """A synthetic all_reduce_perf log in the old (Echo/ABCI) or the newer (root, #wrong) layout; busbw/algbw is
    `factor` (default allreduce's 2(n-1)/n)."""
    factor = 2 * (ranks - 1) / ranks if factor is None else factor
    lines = [f"[1622510346.876958] [{hosts[0]}:1:0] ucp_context.c:1437 UCX  WARN  UCP version" for _ in ucx]
    lines += [f"# nThread 1 nGpus 1 minBytes 8 maxBytes {rows[-1][0]} step: 2(factor) warmup iters: 5 iters: 20 "
              "validation: 1 ", "#", "# Using devices"]
    lines += [f"#   Rank {r:2d} Pid {100 + r:6d} on {hosts[r * len(hosts) // ranks]:>10} device {r:2d} [0x00] "
              "A100-SXM4-40GB" for r in range(ranks)]
    lines += ["#", "#       size         count      type   redop     time   algbw   busbw  error     time ..."]
    for size, t1, t2 in rows:
        alg1, alg2 = size / t1 / 1e3, size / t2 / 1e3
        root = "      -1" if new_format else ""
        lines.append(f"{size:12d} {size // 4:13d}     float     sum{root} {t1:8.2f} {alg1:7.2f} "
                     f"{alg1 * factor:7.2f}  {'0' if new_format else '2e-07'} {t2:8.2f} "
                     f"{alg2:7.2f} {alg2 * factor:7.2f}  {'0' if new_format else '2e-07'}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.5 ", "#"]
    if tags:
        lines = ["[1,0]<stdout>:" + line for line in lines]
    return ("\r\n" if crlf else "\n").join(lines) + "\n"


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(3, 30), st.floats(5, 9e4), st.floats(5, 9e4)), min_size=1, max_size=6,
                unique_by=lambda r: r[0]),
       st.sampled_from([(2, ["a"]), (4, ["a"]), (8, ["a", "b"]), (12, ["h1", "h2", "h3"])]),
       st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_synthetic_logs_parse_back_exactly(tmp_path_factory, rows, layout, crlf, tags, new_format, ucx):
    ranks, hosts = layout
    rows = sorted((1 << k, round(t1, 2), round(t2, 2)) for k, t1, t2 in rows)
    path = tmp_path_factory.mktemp("nccl") / "x.log"
    path.write_bytes(_nccl_log(rows, ranks=ranks, hosts=hosts, crlf=crlf, tags=tags, new_format=new_format,
                               ucx=range(2 if ucx else 0)).encode())
    net = import_file("nccl-tests", path, collective="allreduce")
    assert [(m.bytes, m.ranks, m.nodes) for m in net.measurements] == [(s, ranks, len(hosts)) for s, _, _ in rows]
    assert [us(net, s) for s, _, _ in rows] == [[t1, t2] for _, t1, t2 in rows]


def test_the_collective_is_read_inferred_or_must_be_given(tmp_path):
    rows = [(1 << 20, 50.0, 50.0), (1 << 24, 400.0, 400.0)]
    named = "# Collective test starting: all_gather_perf\n" + _nccl_log(rows, ranks=4, hosts=["a"], factor=0.75)
    (tmp_path / "named.log").write_text(named)
    assert import_file("nccl-tests", tmp_path / "named.log").measurements[0].collective == "allgather"
    (tmp_path / "ag.log").write_text(_nccl_log(rows, ranks=4, hosts=["a"], factor=0.75))   # (n-1)/n: not allreduce
    # old-format columns 'redop' before time rule out allgather (no redop column); (n-1)/n leaves two
    with pytest.raises(ConfigError, match="pass collective=NAME.*fits reduce_scatter, alltoall"):
        import_file("nccl-tests", tmp_path / "ag.log")
    net = import_file("nccl-tests", tmp_path / "ag.log", collective="reduce-scatter")
    assert net.measurements[0].collective == "reduce_scatter"
    (tmp_path / "ar.log").write_text(_nccl_log(rows, ranks=4, hosts=["a", "b"]).replace("A100-SXM4-40GB", "GPU"))
    net = import_file("nccl-tests", tmp_path / "ar.log")
    assert (net.measurements[0].collective, net.transport) == ("allreduce", "unknown")   # 2 nodes: NICs unknown
    assert "2(n-1)/n confirms it" in net.provenance.notes


def test_an_osu_log_given_to_the_nccl_tests_importer(tmp_path):
    with pytest.raises(ConfigError, match="nccl-tests log.*use kind 'osu'") as e:
        import_file("nccl-tests", MG / "allreduce8.log")
    assert e.value.source == str(MG / "allreduce8.log")
    with pytest.raises(ConfigError, match="nccl-tests log"):
        import_file("nccl-tests", GLOO / "rank0.json.gz")


# ---- OSU ----

@pytest.mark.parametrize("name, ranks, expected", [
    ("allreduce2.log", 2, [31.92, 67.49, 126.12, 201.40, 1839.14]),
    ("allreduce4.log", 4, [54.50, 71.82, 223.94, 300.92, 2251.96]),
    ("allreduce8.log", 8, [82.28, 182.03, 791.79, 1110.54, 4678.91])])
def test_osu_reference_points(name, ranks, expected):
    net = import_file("osu", MG / name, **({"ranks": 4} if name == "allreduce4.log" else {}))
    assert [us(net, b)[0] for b in (4, 8192, 12288, 65536, MiB)] == expected
    assert len(net.measurements) == 266 and net.measurements[-1].bytes == MiB
    assert {(m.collective, m.ranks, m.nodes) for m in net.measurements} == {("allreduce", ranks, ranks)}
    assert "one process per node" in net.provenance.notes and net.backend == "mpi"


def test_osu_process_count_must_be_known_and_consistent(tmp_path):
    (tmp_path / "osu.log").write_bytes((MG / "allreduce4.log").read_bytes())
    with pytest.raises(ConfigError, match="pass ranks=N"):
        import_file("osu", tmp_path / "osu.log")           # no "4," prefix in this file, no number in its name
    with pytest.warns(ImporterWarning, match="ranks = 4 taken from the file name"):
        net = import_file("osu", MG / "allreduce4.log")
    assert net.measurements[0].ranks == 4 and net.extra["osu"][0]["ranks_from"] == "inferred from the file name"
    with pytest.raises(ConfigError, match="prefix"):
        import_file("osu", MG / "allreduce8.log", ranks=4)
    assert import_file("osu", MG / "allreduce8.log", nodes=2).measurements[0].nodes == 2
    with pytest.raises(ConfigError, match="OSU.*use kind 'nccl-tests'"):
        import_file("osu", ECHO / "nccl_8.log")
    with pytest.raises(ConfigError, match="OSU"):
        import_file("osu", MG / "tmp8comm.log")


# ---- MG-WFBP ----

def test_mgwfbp_googlenet_tmp8comm():
    mt = import_file("mgwfbp", MG / "tmp8comm.log")
    assert (mt.model, len(mt.layers), len(mt.tensors), mt.parameters) == ("googlenet", 64, 128, 13_379_136)
    assert sum(layer.backward_s[0] for layer in mt.layers) == pytest.approx(0.205334, abs=5e-7)
    assert all(layer.forward_s == (0.0,) for layer in mt.layers) and not mt.provenance.estimated
    assert "no forward times" in mt.provenance.notes
    first = mt.layers[0]
    assert (first.name, [t.elements for t in first.params]) == ("conv1/7x7_s2", [9408, 64])
    assert first.backward_s == (pytest.approx(0.0151437),)
    assert mt.grad_ready_order[:2] == ("loss3/classifier.bias", "loss3/classifier.weight")
    assert mt.grad_ready_order[-1] == "conv1/7x7_s2.weight"
    mg = mt.extra["mgwfbp"]
    assert (mg["nodes"], mg["dump_used"], mg["dumps"]) == (8, 1, 2)
    timed = [b for b in mg["comm_buckets"] if b["time_s"]]
    assert len(timed) == 65 and sum(b["time_s"] for b in timed) == pytest.approx(0.310738, abs=5e-7)
    glitch = next(b for b in timed if b["params"] == ["inception_4a/5x5_reduce.bias"])   # param_id 37
    assert glitch["time_s"] == pytest.approx(36e-6)
    assert sum(b["time_s"] for b in mg["merged_buckets"] if b["time_s"]) == pytest.approx(0.297641, abs=5e-7)


@pytest.mark.parametrize("name, compute_ms, comm_ms, comm_rows, merged", [
    ("tmp8ocomm.log", 202.303, 319.427, 65, (30, 277.154)), ("tmp2comm.log", 200.329, 153.993, 128, None),
    ("tmp4comm.log", 206.783, 261.512, 128, None), ("tmp4ocomm.log", 201.959, 257.556, 65, (50, 176.717)),
    ("tmpcomm.log", 201.532, 166.846, 128, None)])
def test_mgwfbp_other_dumps(name, compute_ms, comm_ms, comm_rows, merged):
    mt = import_file("mgwfbp", MG / name)
    assert (len(mt.layers), mt.parameters) == (64, 13_379_136)
    assert sum(layer.backward_s[0] for layer in mt.layers) * 1e3 == pytest.approx(compute_ms, abs=5e-4)
    timed = [b["time_s"] for b in mt.extra["mgwfbp"]["comm_buckets"] if b["time_s"]]
    assert (len(timed), sum(timed) * 1e3) == (comm_rows, pytest.approx(comm_ms, abs=5e-4))
    got = mt.extra["mgwfbp"].get("merged_buckets")
    if merged is None:
        assert got is None
    else:
        times = [b["time_s"] for b in got if b["time_s"]]
        assert (len(times), sum(times) * 1e3) == (merged[0], pytest.approx(merged[1], abs=5e-4))


def test_mgwfbp_forward_ratio_network_trace_and_wrong_files():
    mt = import_file("mgwfbp", MG / "tmp8comm.log", forward_per_backward=0.5)
    assert mt.layers[0].forward_s == (pytest.approx(0.0151437 / 2),) and mt.provenance.estimated
    net = network_trace_of(mt)
    assert len(net.measurements) == 65
    assert (net.measurements[0].bytes, net.measurements[0].time_s, net.measurements[0].ranks) == (
        4 * (9408 + 64), (0.001169,), 8)
    with pytest.raises(ConfigError, match="node count"):
        network_trace_of(import_file("mgwfbp", MG / "tmpcomm.log"))     # no N in the file name
    with pytest.raises(ConfigError, match="B-Caffe.*use kind 'osu'"):
        import_file("mgwfbp", MG / "allreduce8.log")


# ---- Kineto: a hand-made trace with hand-computed answers ----

def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _iteration(t, s):
    """One iteration starting at t µs, autograd sequence numbers from s."""
    def op(name, ts, dur, seq=None, **args):
        return _x(name, "cpu_op", t + ts, dur, **({"Sequence number": seq} if seq is not None else {}), **args)
    return [
        _x("Optimizer.zero_grad#SGD.zero_grad", "user_annotation", t, 10), op("aten::zero_", 2, 6),
        _x("nn.Module: Linear_0", "python_function", t + 10, 100),
        op("aten::linear", 20, 80, seq=s, **{"Input Dims": [[8, 4], [3, 4], [3]]}),
        op("aten::t", 22, 3, seq=s), op("aten::addmm", 30, 60, seq=s + 1),
        op("aten::view", 115, 5, seq=s + 2),                      # a view outside modules: joins the next layer
        _x("nn.Module: ReLU_0", "python_function", t + 125, 35), op("aten::relu", 130, 20, seq=s + 2),
        op("aten::add_", 162, 3, seq=s + 3),                      # no backward node, last: joins the last layer
        op("autograd::engine::evaluate_function: ReluBackward0", 200, 30, seq=s + 2),
        op("autograd::engine::evaluate_function: AddmmBackward0", 240, 60, seq=s + 1),
        op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 300, 20),
        op("torch::autograd::AccumulateGrad", 301, 4, **{"Input Dims": [[3]], "Input type": ["float"]}),
        op("autograd::engine::evaluate_function: TBackward0", 320, 5, seq=s),
        op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 325, 75),
        op("torch::autograd::AccumulateGrad", 326, 4, **{"Input Dims": [[3, 4]], "Input type": ["float"]}),
        op("c10d::allreduce_", 340, 50, **{"Input Dims": [[[15]], []]}),   # DDP hook: comm, not compute
        _x("gloo:all_reduce", "user_annotation", t + 345, 50, tid=2, **{"Input Dims": [[15]],
                                                                       "Input type": ["float"]}),
        _x("Optimizer.step#SGD.step", "user_annotation", t + 410, 40), op("aten::add_", 415, 30)]


def _toy_trace(path):
    events = _iteration(0, 1) + _iteration(1000, 11)
    path.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 1_800_000_000 * 10**9,
                                "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
                                "traceEvents": events}))
    return path


def test_kineto_attribution_on_a_hand_made_trace(tmp_path):
    mt = import_file("kineto", _toy_trace(tmp_path / "toy.json"))
    assert [layer.name for layer in mt.layers] == ["Linear_0", "ReLU_0"]
    linear, relu = mt.layers
    assert linear.forward_s == pytest.approx((80e-6, 80e-6)) and relu.forward_s == pytest.approx((28e-6, 28e-6))
    # Linear_0 backward: AddmmBackward 60 + AccumulateGrad 20 + TBackward 5 + AccumulateGrad 75 - allreduce 50
    assert linear.backward_s == pytest.approx((110e-6, 110e-6)) and relu.backward_s == pytest.approx((30e-6,) * 2)
    assert [(t.name, t.elements) for t in linear.params] == [("Linear_0.weight", 12), ("Linear_0.bias", 3)]
    assert mt.grad_ready_order == ("Linear_0.bias", "Linear_0.weight") and relu.params == ()
    assert mt.optimizer_s == pytest.approx((36e-6, 36e-6))      # zero_ 6 + add_ 30
    # step 0..450 (Optimizer.step end) - compute 108 + 140 + 36; the allreduce ends (395) before backward (400)
    assert mt.host_s == pytest.approx((166e-6, 166e-6))
    assert [it["exposed_comm_s"] for it in mt.extra["kineto"]["iterations"]] == [0.0, 0.0]
    assert (mt.batch_size, mt.samples, mt.device["kind"]) == (8, 2, "cpu")
    k = mt.extra["kineto"]
    assert k["buckets"] == [[15], [15]] and k["attribution"] == "nn.Module"
    assert [c["duration_s"] for c in k["collectives"]] == pytest.approx([50e-6, 50e-6])
    assert k["collectives"][0]["issue_s"] == pytest.approx(340e-6) and k["collectives"][0]["bytes"] == 60
    assert mt.provenance.date == "2027-01-15T08:00:00Z"
    with pytest.raises(ConfigError, match="no GPU activity"):
        import_file("kineto", tmp_path / "toy.json", clock="gpu")
    assert import_file("kineto", tmp_path / "toy.json", skip=1).samples == 1
    with pytest.raises(ConfigError, match="fewer than the 2 iterations"):
        import_file("kineto", tmp_path / "toy.json", skip=2)


def test_kineto_collectives_that_data_parallelism_does_not_issue_are_named(tmp_path):
    def c10d(name, ts, dims, dtype):
        return _x(name, "cpu_op", ts, 2, **{"Input Dims": dims, "Input type": [dtype] * len(dims)})
    extra = [c10d("c10d::alltoall_base_", 170, [[1024], [1024]], "float"),
             c10d("c10d::_allgather_base_", 175, [[4 << 20], [2 << 20]], "float"),    # 2 Mi floats in: large
             c10d("c10d::_allgather_base_", 180, [[8], [4]], "float")]                # 16 B in: metadata
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps({"traceEvents": _iteration(0, 1) + extra + _iteration(1000, 11)}))
    with pytest.warns(ImporterWarning, match=r"not plain data-parallel.*alltoall x1 \(largest 4,096 bytes\); "
                      r"allgather x1 \(largest 8,388,608 bytes\)"):
        mt = import_file("kineto", path)
    assert mt.extra["kineto"]["buckets"] == [[15], [15]]         # still imported: the DDP buckets are modelled
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImporterWarning)           # plain DDP: no warning
        import_file("kineto", _toy_trace(tmp_path / "toy.json"))


# ---- Kineto: real traces ----

@pytest.mark.parametrize("rank, durations_ms", [
    (0, [[28.69], [64.93, 76.86], [52.88, 58.46]]), (1, [[70.87], [8.65, 37.65], [10.60, 38.11]])])
def test_kineto_gloo_ddp_buckets_and_durations(rank, durations_ms):
    mt = import_file("kineto", GLOO / f"rank{rank}.json.gz")
    k = mt.extra["kineto"]
    assert [it["name"] for it in k["iterations"]] == ["iteration 1", "iteration 2", "iteration 3"]
    assert k["buckets"] == [[8_667_146], [2_108_426, 6_558_720], [2_108_426, 6_558_720]]
    allreduces = [[c["duration_s"] * 1e3 for c in k["collectives"] if c["iteration"] == i
                   and c["collective"] == "allreduce"] for i in range(3)]
    assert allreduces == [pytest.approx(d, abs=0.006) for d in durations_ms]
    broadcasts = [c["elements"] for c in k["collectives"] if c["collective"] == "broadcast"]
    assert broadcasts == [11, 2]                                # the bucket rebuild in iteration 2
    assert (mt.parameters, len(mt.tensors), mt.batch_size, mt.samples) == (8_667_146, 10, 64, 3)
    assert [layer.name for layer in mt.layers] == [f"{n}_{i}" for i in range(4) for n in ("linear", "relu")] + [
        "linear_4", "cross_entropy_loss_0"]
    assert [t.elements for t in mt.layers[0].params] == [256 * 1024, 1024]
    assert mt.grad_ready_order[:2] == ("linear_4.bias", "linear_4.weight")
    assert (k["clock"], k["params_from"], mt.device["kind"]) == ("cpu", "AccumulateGrad shapes", "cpu")


@pytest.mark.filterwarnings("ignore:.*NOT the model's tensors:UserWarning")
def test_kineto_nccl_resnet50_buckets_kernels_and_layers():
    with pytest.raises(ConfigError, match="batch_size"):
        import_file("kineto", NCCL)                             # record_shapes was off: no input shape
    mt = import_file("kineto", NCCL, batch_size=32, model="resnet50")
    k = mt.extra["kineto"]
    assert [it["name"] for it in k["iterations"]] == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    assert [round(it["duration_s"] * 1e3, 1) for it in k["iterations"]] == [222.4, 219.7, 224.9]
    assert k["buckets"] == [[2_049_000, 7_875_584, 6_563_840, 6_637_568, 2_431_040]] * 3
    kernels = [[round(c["duration_s"] * 1e3, 3) for c in k["collectives"] if c["iteration"] == i
                and c["collective"] == "allreduce"] for i in range(3)]
    assert kernels == [[3.307, 2.424, 2.369, 2.161, 1.690], [2.521, 2.674, 2.622, 2.417, 2.028],
                       [5.993, 5.983, 5.808, 2.637, 2.129]]
    assert [(c["elements"], c["dtype"]) for c in k["collectives"] if c["collective"] == "broadcast"] == [
        (53_120, "float32"), (53, "int64")] * 3
    # ResNet-50: 53 convolutions, 53 batch norms, 49 ReLUs, 16 residual adds, 1 fc; 161 parameter tensors
    kinds = [layer.name.rsplit("_", 1)[0] for layer in mt.layers]
    assert [kinds.count(n) for n in ("conv2d", "batch_norm", "relu", "add", "linear")] == [53, 53, 49, 16, 1]
    assert [it["accumulate_grad"] for it in k["iterations"]] == [161] * 3
    assert [it["unattributed_backward"] for it in k["iterations"]] == [0] * 3
    # no shapes recorded: the parameters are the 5 DDP buckets (25,557,032 = torchvision ResNet-50)
    assert (mt.parameters, mt.grad_ready_order) == (25_557_032, tuple(f"bucket{i}" for i in range(5)))
    assert mt.layers[-2].name == "linear_0" and mt.layers[-2].params[0].elements == 2_049_000
    assert mt.layers[0].params[0].name == "bucket4"
    assert (k["clock"], mt.device["name"], mt.software["nccl"]) == ("gpu", "NVIDIA A100-PG509-200", "2.17.1")
    assert all(layer.forward_s[0] > 0 for layer in mt.layers if layer.name.startswith("conv2d"))
    assert "NOT the model's tensors" in mt.provenance.notes
    cpu = import_file("kineto", NCCL, batch_size=32, clock="cpu")
    assert cpu.extra["kineto"]["clock"] == "cpu" and cpu.parameters == mt.parameters


def _replay_at_own_layout(mt, net):
    """Mean simulated iteration of `mt` on its own layout (2 ranks, 1 node, ring allreduce, DDP buckets, layer
    means) with the links calibrated from `net`."""
    from simfog.calibrate import fit
    from simfog.cluster import Cluster, Link
    from simfog.experiment import Comm, Experiment, Workload
    from simfog.simulation import simulate

    cluster = fit(net).apply(Cluster(1, 2, Link(1e-6, 1e10), Link(1e-5, 1e9)))
    exp = Experiment(0, 6, Workload(mt, "<memory>", "mean"), cluster, Comm(collective="ring", merge="ddp"))
    return simulate(exp).summary()


def test_kineto_nccl_replay_reproduces_the_profiler_step(tmp_path):
    with pytest.warns(ImporterWarning, match="NOT the model's tensors"):
        mt = import_file("kineto", NCCL, batch_size=32)
    its = mt.extra["kineto"]["iterations"]
    for it in its:      # the step is compute + exposed communication + host time, nothing dropped
        assert it["compute_s"] + it["exposed_comm_s"] + it["host_s"] == pytest.approx(it["duration_s"])
    # The last bucket is issued by the last AccumulateGrad: its whole kernel (PROVENANCE.md) runs after backward's
    # last work, a few µs of launch after it.
    assert [it["exposed_comm_s"] * 1e3 for it in its] == pytest.approx([1.690, 2.028, 2.129], abs=0.01)
    assert [round(h * 1e3, 1) for h in mt.host_s] == [181.9, 178.9, 183.7]   # launch-bound: GPU idle most of it
    assert "host_s (mean 181 ms)" in mt.provenance.notes
    net = kineto_network(mt)
    assert [(m.collective, m.ranks, m.nodes, m.bytes) for m in net.measurements] == [
        ("broadcast", 2, 1, 212_480), ("broadcast", 2, 1, 424)] + [
        ("allreduce", 2, 1, 4 * n) for n in (2_049_000, 7_875_584, 6_563_840, 6_637_568, 2_431_040)]
    assert [round(t * 1e3, 3) for t in net.measurements[2].time_s] == [3.307, 2.521, 5.993]
    assert "INFERRED: the host shows 8 GPUs" in net.provenance.notes
    assert _cli("kineto-comm", NCCL, "-o", tmp_path / "net.json") == 0           # the CLI writes the same
    assert load_network_trace(tmp_path / "net.json").measurements == net.measurements
    summary = _replay_at_own_layout(mt, net)
    measured = sum(it["duration_s"] for it in its) / len(its)
    assert summary["buckets"] == 5
    assert summary["iteration_time_s"] == pytest.approx(measured, rel=0.05)    # 220.5 ms vs 222.4 ms measured


@pytest.mark.parametrize("rank, exposed_ms", [(0, [29.25, 76.73, 61.74]), (1, [73.40, 31.23, 38.69])])
def test_kineto_gloo_step_is_compute_exposed_comm_and_host(rank, exposed_ms):
    mt = import_file("kineto", GLOO / f"rank{rank}.json.gz")
    its = mt.extra["kineto"]["iterations"]
    for it, host in zip(its, mt.host_s, strict=True):
        assert it["compute_s"] + it["exposed_comm_s"] + host == pytest.approx(it["duration_s"])
    # the main thread waits from its last backward node to the end of the last gloo:all_reduce (PROVENANCE.md)
    assert [it["exposed_comm_s"] * 1e3 for it in its] == pytest.approx(exposed_ms, abs=0.01)
    with pytest.raises(ConfigError, match="nodes=N"):
        import_file("kineto-comm", GLOO / f"rank{rank}.json.gz")       # a CPU trace does not say where ranks ran
    net = import_file("kineto-comm", GLOO / f"rank{rank}.json.gz", nodes=1)
    assert [(m.collective, m.bytes, len(m.time_s)) for m in net.measurements] == [
        ("allreduce", 4 * 8_667_146, 1), ("broadcast", 44, 1), ("broadcast", 8, 1),
        ("allreduce", 4 * 2_108_426, 2), ("allreduce", 4 * 6_558_720, 2)]


@pytest.mark.filterwarnings("ignore:.*NOT the model's tensors:UserWarning")
def test_kineto_sampled_128_rank_pair_imports_what_it_has():
    with pytest.warns(ImporterWarning, match=r"not plain data-parallel.*alltoall x4 \(largest 382,132,224 bytes\); "
                      r"allgather x2 \(largest 16,777,216 bytes\)"):
        mt = import_file("kineto", REF / "kineto-nccl" / "trace_filter" / "sampled_rank-0.json.gz", batch_size=1)
    sizes = [c["elements"] for c in mt.extra["kineto"]["collectives"] if c["collective"] == "allreduce"]
    assert sizes == [19_618_307, 26_955_536, 26_258_430, 5_716_654]
    assert "10 of 10 collectives have no execution record" in mt.provenance.notes    # no kernels in this sample


@pytest.mark.slow
def test_kineto_trace_without_any_sizes_is_refused():
    with pytest.raises(ConfigError, match="sizes not recorded"):
        import_file("kineto", REF / "kineto-nccl" / "df_index_resolver" / "df_index_resolver.json.gz", batch_size=1)


def test_truncated_and_wrong_kineto_files(tmp_path):
    raw = (GLOO / "rank0.json.gz").read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ConfigError, match="Kineto.*truncated") as e:
        import_file("kineto", tmp_path / "cut.json.gz")
    assert e.value.source == str(tmp_path / "cut.json.gz")
    text = gzip.decompress(raw)
    (tmp_path / "cut.json").write_bytes(text[: len(text) // 2])
    with pytest.raises(ConfigError, match="Kineto.*truncated") as e:
        import_file("kineto", tmp_path / "cut.json")
    assert e.value.field == "json" and e.value.source == str(tmp_path / "cut.json")
    with pytest.raises(ConfigError, match="Kineto"):
        import_file("kineto", ECHO / "nccl_8.log")
    (tmp_path / "other.json").write_text('{"format": "simfog.model-trace/1"}')
    with pytest.raises(ConfigError, match="traceEvents"):
        import_file("kineto", tmp_path / "other.json")


# ---- Kineto: a folder of rank traces ----

def _rank_trace(path, events, *, rank=None, base_shift_us=0):
    """One rank's trace file: `events` with their clock moved `base_shift_us` later in baseTimeNanoseconds (and
    their ts back by as much, so the absolute times do not change); distributedInfo.rank only when `rank` is given."""
    info = {"backend": "gloo", "world_size": 2, **({"rank": rank} if rank is not None else {})}
    moved = [dict(e, ts=e["ts"] - base_shift_us) for e in events]
    path.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 1_800_000_000 * 10**9 + base_shift_us
                                * 1000, "distributedInfo": info, "host_name": "box", "traceEvents": moved}))
    return path


def _late_rank(events, gloo_start_us, gloo_dur_us, relu_us):
    """The toy iteration's events as a slower rank runs them: its relu takes `relu_us`, and its gloo worker starts
    the allreduce `gloo_start_us` after the iteration start and runs `gloo_dur_us`."""
    out = []
    for e in events:
        t = e["ts"] - e["ts"] % 1000                              # the iteration's start (iterations 1000 µs apart)
        if e["name"] == "gloo:all_reduce":
            e = dict(e, ts=t + gloo_start_us, dur=gloo_dur_us)
        elif e["name"] == "aten::relu":
            e = dict(e, dur=relu_us)
        out.append(e)
    return out


def test_kineto_folder_transfer_time_leaves_out_the_wait(tmp_path):
    """Rank 0's gloo worker runs the allreduce 345..395 µs into each iteration; rank 1 (slower relu, a clock base
    1 ms later, its rank only in the file name) starts it at 375 and ends at 397. Transfer = 397 - 375 = 22 µs (not
    rank 0's 50); rank 0 waited 30 µs for rank 1, whose arrival released it."""
    folder = tmp_path / "run"
    folder.mkdir()
    events = _iteration(0, 1) + _iteration(1000, 11)
    _rank_trace(folder / "trainer0.json", events, rank=0)
    _rank_trace(folder / "rank-1.json", _late_rank(events, 375, 22, 25), base_shift_us=1000)
    mt = import_file("kineto", folder)
    assert mt.sample_ranks == (0, 0, 1, 1) and mt.samples == 4
    assert mt.layers[1].forward_s == pytest.approx((28e-6, 28e-6, 33e-6, 33e-6))    # each rank its own relu
    k = mt.extra["kineto"]
    assert (k["ranks"], k["files"], k["hosts"]) == ([0, 1], ["trainer0.json", "rank-1.json"], ["box"])
    assert [c["duration_s"] for c in k["collectives"]] == pytest.approx([22e-6, 22e-6])
    assert [c["wait_s"] for c in k["collectives"]] == [pytest.approx([30e-6, 0.0])] * 2
    assert [c["released_by"] for c in k["collectives"]] == [1, 1]
    assert [it["start_s"] for it in k["iterations"]] == pytest.approx([0.0, 1e-3, 0.0, 1e-3])   # clocks aligned
    net = import_file("kineto-comm", folder)
    assert [(m.collective, m.ranks, m.nodes, m.bytes, m.time_s) for m in net.measurements] == [
        ("allreduce", 2, 1, 60, pytest.approx((22e-6, 22e-6)))]
    assert "waiting for a slower peer is not counted" in net.provenance.notes and "1 host(s)" in net.provenance.notes
    assert kineto_network(mt).measurements == net.measurements
    assert load_model_trace_roundtrip(mt, tmp_path) == mt.to_dict()


def load_model_trace_roundtrip(mt, tmp_path):
    mt.save(tmp_path / "mt.json")
    return load_model_trace(tmp_path / "mt.json").to_dict()


def test_kineto_folder_refuses_ranks_that_disagree(tmp_path):
    events = _iteration(0, 1) + _iteration(1000, 11)
    for name, files, match in [
            ("empty", {}, "one Kineto trace"),
            ("twice", {"a.json": 0, "b.json": 0}, "one file per rank"),
            ("norank", {"a.json": None}, "distributedInfo"),
            ("short", {"rank0.json": (0, events), "rank1.json": (1, _iteration(0, 1))}, "iterations")]:
        folder = tmp_path / name
        folder.mkdir()
        for fname, spec in files.items():
            rank, evs = spec if isinstance(spec, tuple) else (spec, events)
            _rank_trace(folder / fname, evs, rank=rank)
        with pytest.raises(ConfigError, match=match):
            import_file("kineto", folder)
    with pytest.raises(ConfigError, match="a file, not a directory"):
        import_file("osu", tmp_path / "twice")                      # only the Kineto importers read folders


@pytest.fixture
def gloo_folder(tmp_path):
    """The two gloo-ddp-cpu rank traces in a folder of their own (copied: the reference folder has other files)."""
    folder = tmp_path / "gloo"
    folder.mkdir()
    for r in (0, 1):
        (folder / f"rank{r}.json.gz").write_bytes((GLOO / f"rank{r}.json.gz").read_bytes())
    return folder


def test_kineto_gloo_folder_collectives_timed_across_ranks(gloo_folder, tmp_path):
    mt = import_file("kineto", gloo_folder)
    k = mt.extra["kineto"]
    assert (mt.samples, mt.sample_ranks, k["ranks"], k["hosts"]) == (6, (0, 0, 0, 1, 1, 1), [0, 1], ["vm"])
    assert mt.layers == tuple(dataclass_replace_times(a, b) for a, b in zip(
        import_file("kineto", GLOO / "rank0.json.gz").layers, import_file("kineto", GLOO / "rank1.json.gz").layers))
    # PROVENANCE.md: end on the last rank to finish minus start on the last rank to start
    assert [(c["collective"], c["elements"]) for c in k["collectives"]] == [
        ("allreduce", 8_667_146), ("broadcast", 11), ("broadcast", 2)] + [
        ("allreduce", 2_108_426), ("allreduce", 6_558_720)] * 2
    assert [c["duration_s"] * 1e3 for c in k["collectives"]] == pytest.approx(
        [30.32, 0.10, 2.29, 8.76, 37.64, 10.78, 38.15], abs=0.01)
    assert [c["released_by"] for c in k["collectives"]] == [0, 1, 0, 1, 1, 1, 1]
    assert max(k["collectives"][3]["wait_s"]) * 1e3 == pytest.approx(56.17, abs=0.01)   # rank 0 waited 56 ms
    net = import_file("kineto-comm", gloo_folder)                  # nodes: both traces name host "vm"
    assert [(m.collective, m.nodes, m.bytes, [round(t * 1e3, 2) for t in m.time_s]) for m in net.measurements] == [
        ("allreduce", 1, 4 * 8_667_146, [30.32]), ("broadcast", 1, 44, [0.10]), ("broadcast", 1, 8, [2.29]),
        ("allreduce", 1, 4 * 2_108_426, [8.76, 10.78]), ("allreduce", 1, 4 * 6_558_720, [37.65, 38.15])]
    assert kineto_network(mt).measurements == net.measurements
    assert _cli("kineto", gloo_folder, "-o", tmp_path / "mt.json.gz") == 0
    assert load_model_trace(tmp_path / "mt.json.gz").sample_ranks == mt.sample_ranks


def dataclass_replace_times(a, b):
    """Layer `a` with `b`'s samples appended: what a folder of the two ranks holds."""
    from dataclasses import replace
    return replace(a, forward_s=a.forward_s + b.forward_s, backward_s=a.backward_s + b.backward_s)


@pytest.mark.filterwarnings("ignore:.*(NOT the model's tensors|not plain data-parallel):UserWarning")
def test_kineto_sampled_pair_folder_says_ranks_are_missing_and_refuses_what_disagrees(tmp_path):
    """HTA's trace_filter pair: 2 of 128 ranks, sampled (events dropped), so their layers differ."""
    folder = tmp_path / "pair"
    folder.mkdir()
    for r in (0, 1):
        name = f"sampled_rank-{r}.json.gz"
        (folder / name).write_bytes((REF / "kineto-nccl" / "trace_filter" / name).read_bytes())
    with pytest.warns(ImporterWarning, match="2 of the run's 128 ranks"):
        with pytest.raises(ConfigError, match="layers.*the ranks of one data-parallel run") as e:
            import_file("kineto", folder, batch_size=1)
    assert e.value.source.endswith("sampled_rank-1.json.gz")
    with pytest.warns(ImporterWarning, match="2 of the run's 128 ranks"):
        with pytest.raises(ConfigError, match="collective #0.*the ranks issue the same collectives"):
            import_file("kineto-comm", folder, nodes=2)             # sampled: rank 1's first kept one differs


def _replay(mt, net, ranks=2):
    """The simulated run of `mt` replayed in recorded order at its own layout (1 node, `ranks` ranks, ring, DDP
    buckets), links calibrated from `net`: (the run's mean iteration, each rank's mean iteration), seconds."""
    from simfog.calibrate import fit
    from simfog.cluster import Cluster, Link
    from simfog.experiment import Comm, Experiment, Workload
    from simfog.simulation import simulate

    n = mt.samples // max(1, len(set(mt.sample_ranks)))
    cluster = fit(net).apply(Cluster(1, ranks, Link(1e-6, 1e10), Link(1e-5, 1e9)))
    result = simulate(Experiment(0, n, Workload(mt, "<memory>", "replay"), cluster, Comm(collective="ring")))
    ends = result.iterations().groupby("rank")["end_s"].max()
    return result.summary()["iteration_time_s"], [ends[r] / n for r in range(ranks)]


def test_kineto_gloo_folder_replay_reproduces_the_run(gloo_folder):
    """The gloo pair replayed at its own layout (each rank its own recorded compute and host time, iteration by
    iteration; links fitted to the folder's own transfer times) against the measured run: 269.9 ms per iteration
    vs 274.0 ms (-1.5 %; the run's span: rank 1 starts first and ends last), rank 0 252.5 vs 257.2 ms (-1.9 %),
    rank 1 269.9 vs 274.0 ms (-1.5 %). What is left is the network fit: the folder's 5 collectives, timed on 2
    oversubscribed vCPUs, fit a line only to 45 % rms (26.2 MB: 27.9 ms fitted, 37.6 / 38.2 ms measured).
    Iteration 1 ran DDP's first single bucket (8.7 M elements, 30.3 ms) where the replay uses the rebuilt two;
    the rebuild's broadcasts (2.8 + 2.3 ms on rank 0) are in its host time.

    Not within 5 %, for reasons the numbers show:
    - One rank's file alone (rank0.json.gz, rank1.json.gz) replayed on both ranks with the same links: -10.9 %
      and -7.3 %. Its record's exposed communication is mostly waiting for the other rank (rank 0 waited 56, 39,
      42, 20 ms for rank 1 at the 2nd..5th allreduce); a replay of two copies of one rank cannot wait.
    - compute = "mean" on the folder: 256.5 ms (-6.4 %). Each rank's three iterations differ widely (rank 1's
      forward 20, 98, 15 ms): the means lose iteration 2, in which rank 1 fell 56 ms behind and rank 0 waited
      (the slower rank's mean is below the mean of the slower rank per iteration).
    """
    mt = import_file("kineto", gloo_folder)
    its = mt.extra["kineto"]["iterations"]
    for it in its:      # every rank's step is compute + exposed communication + host time, nothing dropped
        assert it["compute_s"] + it["exposed_comm_s"] + it["host_s"] == pytest.approx(it["duration_s"])
    per_rank = [[it for it in its if it["rank"] == r] for r in (0, 1)]
    run = max(mine[-1]["start_s"] + mine[-1]["duration_s"] for mine in per_rank) / 3   # the last rank's end
    measured = [sum(it["duration_s"] for it in mine) / 3 for mine in per_rank]
    assert [round(x * 1e3, 1) for x in (run, *measured)] == [274.0, 257.2, 274.0]
    simulated, ranks = _replay(mt, import_file("kineto-comm", gloo_folder))
    assert simulated == pytest.approx(run, rel=0.05)
    assert ranks == pytest.approx(measured, rel=0.05)
    assert [round(x * 1e3, 1) for x in (simulated, *ranks)] == [269.9, 252.5, 269.9]


# ---- saving and the CLI ----

def test_imported_traces_save_and_load_unchanged(tmp_path):
    for kind, path, opts, load in [("kineto", GLOO / "rank0.json.gz", {}, load_model_trace),
                                   ("mgwfbp", MG / "tmp8comm.log", {}, load_model_trace),
                                   ("nccl-tests", ECHO / "nccl_128.log", {}, load_network_trace),
                                   ("osu", MG / "allreduce4.log", {"ranks": 4}, load_network_trace)]:
        trace = import_file(kind, path, **opts)
        trace.save(tmp_path / f"{kind}.json.gz")
        assert load(tmp_path / f"{kind}.json.gz").to_dict() == trace.to_dict()


def _cli(*argv):
    parser = argparse.ArgumentParser(prog="simfog import")
    importers_cli.add_arguments(parser)
    return importers_cli.run(parser.parse_args([str(a) for a in argv]))


def test_cli_writes_the_trace_and_rejects_bad_options(tmp_path, capsys):
    assert _cli("osu", MG / "allreduce4.log", "-o", tmp_path / "osu4.json", "-s", "ranks=4") == 0
    assert load_network_trace(tmp_path / "osu4.json").measurements[0].ranks == 4
    assert "266 measurements" in capsys.readouterr().out
    assert _cli("mgwfbp", MG / "tmp8comm.log", "-o", tmp_path / "g.json.gz", "-s", "forward_per_backward=0.5") == 0
    assert load_model_trace(tmp_path / "g.json.gz").provenance.estimated
    with pytest.raises(ConfigError, match="an option of importer osu"):
        _cli("osu", MG / "allreduce4.log", "-o", tmp_path / "x.json", "-s", "procs=4")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        _cli("osu", MG / "allreduce4.log", "-o", tmp_path / "x.json", "-s", "ranks")
    with pytest.raises(ConfigError, match="integer"):
        _cli("osu", MG / "allreduce4.log", "-o", tmp_path / "x.json", "-s", "ranks=four")
    with pytest.raises(ConfigError, match=".json or .json.gz"):
        _cli("osu", MG / "allreduce4.log", "-o", tmp_path / "x.txt", "-s", "ranks=4")
    with pytest.raises(ConfigError, match="nccl-tests log"):
        _cli("nccl-tests", MG / "allreduce4.log", "-o", tmp_path / "y.json")
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()


H200_KINETO = Path(__file__).resolve().parents[1] / "traces" / "resnet50-h200-ddp1-kineto.json.gz"


def _replay_one_rank(mt) -> float:
    from simfog.cluster import Cluster, Link
    from simfog.experiment import Comm, Experiment, Workload
    from simfog.simulation import simulate

    exp = Experiment(0, len(mt.host_s), Workload(mt, "<memory>", "replay"),
                     Cluster(1, 1, Link(1e-6, 1e11), Link(1e-5, 1e10)), Comm(collective="ring", merge="ddp"))
    return simulate(exp).summary()["iteration_time_s"]


def test_h200_kineto_trace_imports_the_model_and_reproduces_the_profiled_step():
    """The shipped H200 trace (traces/profile_ddp_kineto.py: ResNet-50 b32, DDP over NCCL, one rank): shapes were
    recorded, so the parameters are ResNet-50's own 161 tensors; the step is compute + exposed comm + host time;
    a replay at its layout takes the profiled step, and the importer says that host time is half of it."""
    with pytest.warns(ImporterWarning, match=r"host time is 5\d% of the profiled step .* pass step_time="):
        mt = import_file("kineto", H200_KINETO)
    assert mt.batch_size == 32 and mt.device["name"] == "NVIDIA H200" and mt.software["nccl"] == "2.28.9"
    assert len(mt.tensors) == 161 and sum(t.elements for t in mt.tensors.values()) == 25_557_032
    its = mt.extra["kineto"]["iterations"]
    for it in its:
        assert it["compute_s"] + it["exposed_comm_s"] + it["host_s"] == pytest.approx(it["duration_s"])
        assert it["exposed_comm_s"] == 0.0 and it["accumulate_grad"] == 161
    profiled = sum(it["duration_s"] for it in its) / len(its)
    assert _replay_one_rank(mt) == pytest.approx(profiled, rel=0.01)


def test_step_time_replaces_the_profiler_s_host_time():
    """Told the step without the profiler (20-24 ms measured on the same GPU just before profiling), host time is
    that step minus compute and exposed communication; the replay takes it; the profiled host time is kept."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no host-share warning once the step is given
        mt = import_file("kineto", H200_KINETO, step_time="21.9ms")
    its = mt.extra["kineto"]["iterations"]
    assert [h for h in mt.host_s] == pytest.approx([0.0219 - it["compute_s"] - it["exposed_comm_s"] for it in its])
    assert mt.extra["kineto"]["step_time_s"] == 0.0219 and len(mt.extra["kineto"]["profiled_host_s"]) == 4
    assert "step_time 21.9 ms" in mt.provenance.notes
    assert _replay_one_rank(mt) == pytest.approx(0.0219, rel=0.01)
    for bad in ("22", "0ms", "fast"):
        with pytest.raises(ConfigError, match="step_time"):
            import_file("kineto", H200_KINETO, step_time=bad)
    assert importers_cli._options("kineto", ["step_time=21.9ms"]) == {"step_time": "21.9ms"}
