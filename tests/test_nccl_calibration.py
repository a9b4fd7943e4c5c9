"""Calibration with the hardware a user knows and what the logs state: NCCL_DEBUG facts, flags against logs,
rails (logs at 1-2 GPUs per node predict 8), alltoall/sendrecv fitted jointly, channels assumed from the hardware,
and the extrapolation notes."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simfog import cli, nccl, network_file
from simfog.errors import ConfigError
from simfog.importers.nccl_debug import read_debug
from simfog.importers.nccl_tests import import_nccl_tests
from simfog.nccl import batch
from simfog.nccl import facts as nccl_facts
from simfog.nccl import fit as nccl_fit
from simfog.nccl.calibrated import Calibrated, note_line
from simfog.trace import Measurement, NetworkTrace, Provenance

from .nccl_log_writer import run_lines

US = 1e-6
SIZES = [2**k for k in range(3, 31, 2)]
# 8 H100 per node, one 400 Gb/s NIC per GPU (rails), NCCL 2.29.2; the whole node's bus bandwidth 8 x 46 GB/s
H100 = nccl.NcclNetwork(440e9, 368e9, latency_inter_s=0.0, launch_s=8 * US, channels=None, version="2.29.2",
                        gpu_arch="hopper", nics_per_node=8, nic_Bps=50e9, intra_transport="nvswitch",
                        p2p_latency_s=6 * US, p2p_nic_Bps=40e9, p2p_intra_Bps=300e9)
HARDWARE = dict(version="2.29.2", gpu_arch="hopper", nics_per_node=8, nic_Bps=50e9, intra_transport="nvswitch")
INFO = "node01:1234:1234 [0] NCCL INFO "


def synthetic(layouts, net, ops=("allreduce",)) -> NetworkTrace:
    ms = [Measurement(op, r, n, b, (t, t * 1.01)) for op in ops for r, n in layouts for b in SIZES
          for t in [nccl.choose(op, b, r, n, net).time_s]]
    return NetworkTrace("nccl", "ib", Provenance("synthetic", "2026-11-27", "test", source="estimated",
                                                 estimated=True), tuple(ms))


def test_nccl_debug_lines_as_nccl_prints_them():
    lines = [INFO + "NCCL version 2.21.5+cuda12.4",
             INFO + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB [RO]; OOB "
                    "ib0:10.0.0.1<0>",
             INFO + "Using network IB",
             INFO + "CPU/0-0 (1/2/-1)",
             INFO + "Pattern 4, crossNic 0, nChannels 8, bw 24.000000/24.000000, type NVL/PXB, sameChannels 1",
             INFO + "Pattern 1, crossNic 0, nChannels 8, bw 40.000000/24.000000, type NVL/PIX, sameChannels 0",
             INFO + "Channel 00/16 :    0   1   2   3   4   5   6   7",
             INFO + "Channel 15/16 :    0   1   2   3   4   5   6   7",
             INFO + "NVLS multicast support is not available on dev 0"]
    assert read_debug(lines) == {"release": "2.21.5", "network": "IB", "nics": 4, "link_layer": "IB",
                                 "runtime_channels": 16, "graph_channels": 8, "gpu_nic_path": "pxb", "nvls": False,
                                 "cpu_vendor": "amd"}
    merged = INFO + "NET/IB : Using [0]={[0] mlx5_0:1/RoCE, [1] mlx5_1:1/RoCE} [1]={[2] mlx5_2:1/RoCE, [3] " \
                    "mlx5_3:1/RoCE} ; OOB eth0:10.0.0.1<0>"
    assert read_debug([merged]) == {"network": "IB", "nics": 2, "link_layer": "RoCE"}
    assert read_debug([INFO + "NET/Socket : Using [0]eth0:10.1.1.1<0> [1]eth1:10.1.2.1<0>"])["nics"] == 2
    ofi = read_debug([INFO + "NET/OFI Selected Provider is cxi (found 4 nics)", INFO + "16 coll channels, 16 "
                      "collnet channels, 0 nvls channels, 16 p2p channels, 2 p2p channels per peer"])
    assert ofi == {"network": "OFI", "nics": 4, "runtime_channels": 16}
    assert read_debug(["#  size count type"]) == {}


def _log(tmp_path, name, hosts, release, nics=4, runtime_channels=16):
    info = "\n".join([INFO + f"NCCL version {release}+cuda12.4",
                      INFO + "NET/IB : Using " + " ".join(f"[{i}]mlx5_{i}:1/IB" for i in range(nics)) +
                      " ; OOB ib0:10.0.0.1<0>", INFO + f"Channel 00/{runtime_channels} :    0   1"])
    lines = run_lines("middle", "allreduce", sizes=[2**k for k in range(3, 30, 3)], hosts=hosts, nccl_info=info)
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return import_nccl_tests(path)


def test_calibrate_uses_what_the_logs_state(tmp_path):
    traces = [_log(tmp_path, "a.log", ("node01",), "2.21.5"), _log(tmp_path, "b.log", ("node01", "node02"), "2.21.5")]
    cal = nccl_fit.fit(traces)
    n = cal.network
    assert (n.version, n.nics_per_node, n.channels, n.gpu_arch) == ("2.21.5", 4, 8, "ampere")
    assert any("2.21.5" in g and "log" in g for g in cal.given) and not cal.warnings
    # a flag that contradicts the log wins, with a warning naming both
    cal = nccl_fit.fit(traces, nics_per_node=8, version="2.21")
    assert cal.network.nics_per_node == 8
    assert cal.warnings == ("--nics-per-node 8 contradicts the logs (log: NCCL_DEBUG (nics): 4); using 8",)
    # logs of two releases are refused together
    other = _log(tmp_path, "c.log", ("node03", "node04"), "2.18.3")
    with pytest.raises(ConfigError, match="one NCCL release"):
        nccl_fit.fit([*traces, other])


def test_rails_logs_at_one_and_two_gpus_per_node_predict_eight():
    """10 nodes x 1 and 2 GPUs (and one node of 8) calibrate a network whose 10 x 8 predictions match the truth:
    the inter-node bus bandwidth follows the NICs a layout uses (GPU i through NIC i mod 8)."""
    logs = synthetic([(8, 1), (10, 10), (20, 10)], H100, ops=("allreduce", "allgather", "reduce_scatter"))
    cal = nccl_fit.fit([logs], **HARDWARE)
    assert np.median(cal.errors()) < 0.01
    assert cal.network.inter_Bps(1) == pytest.approx(H100.inter_bus_Bps / 8, rel=0.03)
    for op in ("allreduce", "allgather", "reduce_scatter"):
        for b in (2**20, 2**26, 2**30):
            assert nccl.choose(op, b, 80, 10, cal.network).time_s == pytest.approx(
                nccl.choose(op, b, 80, 10, H100).time_s, rel=0.05)
    notes = cal.calibrated.notes(cal.network, "allreduce", 10, 8, 2**26)
    assert notes == ["8 NICs per node in use (logs: at most 2)"]  # 8 GPUs per node: the one-node log
    assert note_line(notes) == "EXTRAPOLATED: 8 NICs per node in use (logs: at most 2)"
    assert cal.calibrated.notes(cal.network, "allreduce", 10, 16, 2**26)[0] == "16 GPUs per node (logs: at most 8)"


def test_channels_the_logs_cannot_tell_take_the_hardware_value():
    logs = synthetic([(8, 1), (16, 2)], replace(H100, nics_per_node=8))
    cal = nccl_fit.fit([logs], **HARDWARE)
    assert cal.network.channels is None  # NCCL's own count for each layout
    assert any(a.startswith("channels (derived from the NICs") for a in cal.assumed)
    assert cal.network.graph_channels(8, 2) == nccl.derived_channels(H100, 8, 2)


def test_alltoall_sendrecv_and_collectives_share_one_network():
    logs = synthetic([(8, 1), (16, 2), (32, 4)], H100, ops=("allreduce", "allgather", "alltoall", "sendrecv"))
    cal = nccl_fit.fit([logs], **HARDWARE)
    n = cal.network
    assert {"p2p GPU rate", "p2p NIC rate", "p2p latency per peer"} <= set(cal.fitted)
    assert n.p2p_nic_Bps == pytest.approx(40e9, rel=0.03) and n.p2p_intra_Bps == pytest.approx(300e9, rel=0.03)
    assert n.p2p_latency_s == pytest.approx(6 * US, rel=0.1) and np.median(cal.errors()) < 0.01
    assert {p.algorithm for p in cal.points if p.op in ("alltoall", "sendrecv")} == {"p2p"}


def test_p2p_by_hand():
    # alltoall of 64 MiB on 2 nodes x 8: (16-1) x 6 us + max(64 MiB x 7/16 / 300 GB/s, 8 x 64 MiB x 8/16 /
    # (40 GB/s x 8 NICs)) + launch 8 us; sendrecv on 2 nodes: 6 + 64 MiB / 40 GB/s + 8
    b = 2**26
    assert nccl.choose("alltoall", b, 16, 2, H100).time_s == pytest.approx(
        15 * 6 * US + max(b * 7 / 16 / 300e9, 8 * b * 8 / 16 / 320e9) + 8 * US)
    assert nccl.choose("sendrecv", b, 16, 2, H100).time_s == pytest.approx(14 * US + b / 40e9)
    # without fitted rates: a GPU's = one node's bus bandwidth, a NIC's = the whole node's / NICs, the latency the
    # release's Ring/Simple NET step (14 us)
    plain = replace(H100, p2p_latency_s=None, p2p_nic_Bps=None, p2p_intra_Bps=None)
    assert nccl.choose("sendrecv", b, 16, 2, plain).time_s == pytest.approx(22 * US + b / 46e9)


def test_extrapolation_notes():
    cov = Calibrated("2.21.5", ((1, 8), (2, 8)), 8, 2**30, ("allreduce",))
    net = nccl.NcclNetwork(200e9, 100e9, version="2.21.5")
    assert cov.notes(net, "allreduce", 2, 8, 2**20) == []
    assert cov.notes(net, "allgather", 16, 8, 2**33) == [
        "16 nodes, extrapolated from 2 nodes (NCCL's caps change at 3 nodes)", "allgather: no allgather log "
        "(calibrated on allreduce)", "8 GiB outside the logs' 8 B..1 GiB"]
    assert cov.notes(replace(net, version="2.23"), None, 2, 4) == ["NCCL 2.23 (logs: 2.21.5)"]
    assert cov.notes(replace(net, version="2.31"), None, 1, 8)[-1].startswith("NCCL 2.31 is newer than")


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(nccl.OPS), version=st.sampled_from(["2.8", "2.14", "2.18.1", "2.21", "2.23", "2.30"]),
       arch=st.sampled_from(nccl.ARCHS), layout=st.sampled_from([(8, 1), (16, 2), (15, 2), (4, 4), (128, 16)]),
       gain=st.floats(1.0, 2.0), fill=st.sampled_from([0.0, 5e4]))
def test_batch_equals_choose(op, version, arch, layout, gain, fill):
    net = nccl.NcclNetwork(230e9, 100e9, latency_inter_s=3 * US, launch_s=2 * US, version=version, gpu_arch=arch,
                           nvls=True, collnet=True, intra_transport="nvswitch", tree_fill_B=fill,
                           two_node_tree_gain=gain, net_latency_s=(2 * US, 0.0, 5 * US))
    sizes = np.array([2.0**k for k in range(0, 34)] + [3.0, 1000.0, 65535.0])
    times, picks = batch.choose_many(op, sizes, *layout, net)
    for b, t, i in zip(sizes, times, picks, strict=True):
        c = nccl.choose(op, b, *layout, net)
        assert t == pytest.approx(c.time_s, rel=1e-12)
        assert i < 0 or batch.PAIRS[i] == (c.algorithm, c.protocol)


def test_network_file_keeps_hardware_additions_and_coverage(tmp_path):
    net = replace(H100, net_latency_s=(3 * US, 0.0, 7 * US), two_node_tree_gain=1.25, tree_fill_B=4096.0,
                  gpu_nic_path="pxn", cpu_vendor="amd")
    cov = Calibrated("2.29.2", ((1, 8), (10, 1), (10, 2)), 8, 2**30, ("allgather", "allreduce"))
    path = tmp_path / "network.toml"
    network_file.save(path, net, {"fitted_from": "x"}, calibrated=cov)
    loaded = network_file.load(path)
    assert loaded.calibrated == cov
    for k in net.__dataclass_fields__:
        want, got = getattr(net, k), getattr(loaded.nccl, k)
        assert got == (pytest.approx(want, rel=1e-5) if isinstance(want, (float, tuple)) else want), k
    text = path.read_text()
    assert 'channels = "hardware"' in text and 'nic_bandwidth = "400Gbit/s"' in text
    for bad, field in (('channels = "auto"', "nccl.channels"), ("two_node_tree_gain = 3", "nccl.two_node_tree_gain"),
                       ('gpu_nic_path = "far"', "nccl.gpu_nic_path"), ('version = "2.7"', "nccl.version")):
        p = tmp_path / "bad.toml"
        p.write_text(f'[nccl]\nintra_bus_bandwidth = "1GB/s"\ninter_bus_bandwidth = "1GB/s"\n{bad}\n')
        with pytest.raises(ConfigError, match=field) as e:
            network_file.load(p)
        assert str(p) in str(e.value)
    p = tmp_path / "bad.toml"
    p.write_text('[nccl]\nintra_bus_bandwidth = "1GB/s"\ninter_bus_bandwidth = "1GB/s"\n[calibrated]\nlayouts = [3]\n')
    with pytest.raises(ConfigError, match="calibrated"):
        network_file.load(p)


def test_calibrate_flags_then_collective_names_every_extrapolation(tmp_path, capsys):
    trace = tmp_path / "h100.json.gz"
    synthetic([(8, 1), (10, 10), (20, 10)], H100, ops=("allreduce", "allgather")).save(trace)
    out = tmp_path / "network.toml"
    assert cli.main(["calibrate", str(trace), "--nccl-version", "2.29.2", "--gpu-arch", "hopper", "--nics-per-node",
                     "8", "--nic-bandwidth", "400Gbit/s", "--intra-transport", "nvswitch", "-o", str(out)]) == 0
    report = capsys.readouterr().out
    assert "8 NICs per node x 400 Gbit/s" in report and "assumed: " in report and f"wrote {out}" in report
    assert cli.main(["collective", "allreduce", "--network", str(out), "--nodes", "10", "--gpus-per-node", "2",
                     "--sizes", "1MiB"]) == 0
    assert "EXTRAPOLATED" not in capsys.readouterr().out
    assert cli.main(["collective", "alltoall", "--network", str(out), "--nodes", "10", "--gpus-per-node", "8",
                     "--sizes", "1MiB,4GiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["extrapolated"] == ["8 NICs per node in use (logs: at most 2)",
                                       "alltoall: no alltoall log (calibrated on allgather, allreduce)"]
    assert "4 GiB outside the logs' 8 B..512 MiB" in rows[1]["extrapolated"] and rows[0]["algorithm"] == "p2p"
    assert cli.main(["collective", "allreduce", "--network", str(out), "--nodes", "10", "--gpus-per-node", "8",
                     "--sizes", "1MiB"]) == 0
    assert "EXTRAPOLATED: 8 NICs per node in use (logs: at most 2)" in capsys.readouterr().out


def test_simulate_and_plan_name_their_extrapolations(tmp_path, capsys):
    from .conftest import make_trace

    make_trace([0.02, 0.03], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    cov = Calibrated("2.21.5", ((1, 8), (2, 8)), 8, 2**30, ("allreduce",))
    network_file.save(tmp_path / "net.toml", nccl.NcclNetwork(230e9, 100e9, version="2.21.5"), calibrated=cov)
    exp = tmp_path / "e.toml"
    exp.write_text('[workload]\ntrace = "t.json"\ncompute = "mean"\n[cluster]\nnodes = 4\ngpus_per_node = 8\n'
                   'network = "net.toml"\n[comm]\nmerge = "ddp"\n')
    assert cli.main(["simulate", str(exp)]) == 0
    said = next(line for line in capsys.readouterr().out.splitlines() if "WARNINGS" in line)
    assert said.endswith("EXTRAPOLATED: 4 nodes, extrapolated from 2 nodes (NCCL's caps change at 3 nodes)")
    assert cli.main(["simulate", str(exp), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    said = "4 nodes, extrapolated from 2 nodes (NCCL's caps change at 3 nodes)"
    assert summary["extrapolated"] == [said]
    assert summary["warnings"] == [{"code": "EXTRAPOLATED", "text": said}]
    (tmp_path / "cat.toml").write_text('currency = "EUR"\n[[option]]\nname = "ib"\ngpus_per_node = 8\n'
                                       'max_nodes = 8\nprice_per_gpu_hour = 1.0\nnetwork = "net.toml"\n')
    assert cli.main(["plan", str(tmp_path / "t.json"), "--catalogue", str(tmp_path / "cat.toml"),
                     "--target-samples-per-s", "5000", "--top", "20", "--json", "-o", str(tmp_path / "plan")]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert all(r["warnings"] == ("" if r["nodes"] <= 2 else f"EXTRAPOLATED: {r['nodes']} nodes, extrapolated "
                                 "from 2 nodes (NCCL's caps change at 3 nodes)") for r in rows)
    assert any(r["nodes"] > 2 for r in rows)


@pytest.mark.parametrize("algorithm", ["fsdp", "hsdp", "zero3"])
def test_sharded_algorithms_cost_their_collectives_with_nccls_model(algorithm):
    """fsdp, hsdp and zero3 on 4 nodes x 8 GPUs with a network file: every all-gather, reduce-scatter and
    allreduce lasts what NCCL's model gives for its group (hsdp: a shard group is one node's 8 GPUs, a replica
    group one GPU on each of the 4 nodes, so one NIC of 4: rails)."""
    from simfog.network_file import NetworkFile
    from simfog.simulation import new_simulation, simulate

    from .conftest import make_experiment, make_trace

    net = nccl.NcclNetwork(230e9, 100e9, latency_inter_s=2 * US, version="2.21.5", nics_per_node=4)
    trace = make_trace([1e-3] * 2, [1e-3] * 2, [10**6, 2 * 10**6])
    exp = replace(make_experiment(trace, algorithm=algorithm, collective="nccl", nodes=4, gpus_per_node=8,
                                  iterations=1), network=NetworkFile(net))
    df = simulate(exp).intervals()
    groups = {"shard": (8, 1) if algorithm == "hsdp" else (32, 4), "replica": (4, 4), "all": (32, 4)}
    seen = set()
    for c in new_simulation(exp).algorithm.describe_buckets():
        ranks, nodes = groups.get(c["group"], (32, 4))
        row = df[(df["rank"] == 0) & (df.name == c["name"])].iloc[0]
        assert row.end_s - row.start_s == pytest.approx(nccl.choose(c["collective"], c["bytes"], ranks, nodes,
                                                                    net).time_s, rel=1e-9)
        seen.add(c["collective"])
    assert {"allgather", "reduce_scatter"} <= seen
    if algorithm == "hsdp":  # the replica allreduce crosses nodes on one NIC of four: a quarter of the bus bandwidth
        assert nccl.choose("allreduce", 2**30, 4, 4, net).time_s > 3 * nccl.choose("allreduce", 2**30, 32, 4,
                                                                                   net).time_s


def test_srun_task_labels_are_read_through(tmp_path):
    # Slurm's `srun -l` prefixes every line with its task, `0: # nThread ...` (as CSCS Alps logs print them)
    lines = run_lines("middle", "allreduce", sizes=[8, 1024, 2**20], hosts=("nid01", "nid02"), gpus_per_node=4,
                      gpu="NVIDIA GH200 120GB")
    path = tmp_path / "job.out"
    path.write_text("+ srun -l all_reduce_perf -b 8\n" + "\n".join(f"0: {line}" for line in lines) + "\n")
    trace = import_nccl_tests(path)
    assert [(m.ranks, m.nodes, m.bytes) for m in trace.measurements] == [(8, 2, 8), (8, 2, 1024), (8, 2, 2**20)]
    assert nccl_facts.arch_of(trace) == "hopper"
    # from 10 tasks on srun right-aligns the label (` 0: `, and `  0: ` from 100), as Alps' 4-128-node logs have it
    for pad in (" ", "  "):
        path.write_text("+ srun -l all_reduce_perf\n" + "\n".join(f"{pad}0: {line}" for line in lines) + "\n")
        assert [m.bytes for m in import_nccl_tests(path).measurements] == [8, 1024, 2**20]


def test_nics_per_node_fitted_from_logs_at_several_gpus_per_node():
    # 2-node alltoall at 1, 2, 4, 8 GPUs per node with 4 NICs: the node's remote share G x S/2 leaves through
    # min(G, 4) NICs, so the time doubles from 4 to 8 GPUs and not before. Nobody states the NICs: the fit finds 4.
    net = replace(H100, nics_per_node=4)
    logs = [synthetic([(1, 1), (4, 1), (8, 1)], net, ops=("alltoall", "sendrecv")),
            synthetic([(2 * g, 2) for g in (1, 2, 4, 8)], net, ops=("alltoall", "sendrecv"))]
    cal = nccl_fit.fit(logs, version="2.29.2", gpu_arch="hopper", intra_transport="nvswitch")
    assert cal.network.nics_per_node == 4
    assert "NICs per node 4 (logs at 1, 2, 4, 8 GPUs per node on several nodes)" in cal.fitted
    assert np.median(cal.errors()) < 0.01
    # logs of one GPU count per node cannot tell: no rails, as before
    one = nccl_fit.fit([synthetic([(8, 1), (16, 2)], net, ops=("alltoall",))], version="2.29.2", gpu_arch="hopper")
    assert one.network.nics_per_node is None


def test_inter_node_bus_bandwidth_from_the_p2p_nic_rate_without_multi_node_collective_logs():
    # one-node allreduce, 2-node alltoall / sendrecv only: the collectives between nodes run on the NICs the p2p
    # logs measured, p2p NIC rate x NICs (40 GB/s x 8), not on the one-node bus bandwidth
    logs = [synthetic([(8, 1)], H100, ops=("allreduce",)),
            synthetic([(16, 2)], H100, ops=("alltoall", "sendrecv"))]
    cal = nccl_fit.fit(logs, **HARDWARE)
    assert cal.network.p2p_nic_Bps == pytest.approx(40e9, rel=0.03)
    assert cal.network.inter_bus_Bps == pytest.approx(8 * cal.network.p2p_nic_Bps, rel=1e-9)
    assert any(a.startswith("bus bandwidth between nodes = the p2p NIC rate") for a in cal.assumed)


def test_without_one_node_logs_the_constant_goes_to_the_network_latency():
    # 2-node logs alone cannot tell a per-operation launch from the inter-node latency (both add a constant there);
    # NCCL's model has no launch term, so none is fitted and latencyInter carries the constant. Truth: launch 0,
    # latencyInter 12 us (a socket-like network): recovered, and so are the 8-node times.
    net = replace(H100, launch_s=0.0, latency_inter_s=12 * US, channels=8, nics_per_node=None, nic_Bps=None)
    cal = nccl_fit.fit([synthetic([(16, 2)], net)], version="2.29.2", gpu_arch="hopper", channels=8)
    assert cal.network.launch_s == 0.0 and "launch" not in cal.fitted
    assert any(a.startswith("launch 0 (no one-node logs") for a in cal.assumed)
    assert cal.network.latency_inter_s == pytest.approx(12 * US, rel=0.05)
    for b in (8, 2**16):
        assert nccl.choose("allreduce", b, 64, 8, cal.network).time_s == pytest.approx(
            nccl.choose("allreduce", b, 64, 8, net).time_s, rel=0.05)


def test_nics_without_their_rate_derive_the_channels_at_the_rate_the_logs_measure():
    # 4 NICs stated, their rate not: NCCL's search would derive the channels from the NICs and their rate, so the
    # fit takes the p2p NIC rate the logs measure (40 GB/s) and derives from it (unless the logs identify a count)
    net = replace(H100, nics_per_node=4)
    logs = synthetic([(8, 1), (16, 2)], net, ops=("allreduce", "alltoall"))
    cal = nccl_fit.fit([logs], version="2.29.2", gpu_arch="hopper", intra_transport="nvswitch", nics_per_node=4)
    note = next(a for a in cal.assumed if "derived from the 4 NICs" in a)
    expected = nccl.derived_channels(replace(net, nic_Bps=cal.network.p2p_nic_Bps), 4, 2)
    assert note.startswith(f"channels {expected} ") and "40 GB/s per NIC" in note
    assert cal.network.nic_Bps is None  # the rate stays unstated in the network
