"""simfog.nccl.fit, the network file and `simfog calibrate` / `simfog collective` on NCCL logs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from simfog import cli, nccl, network_file
from simfog.errors import ConfigError, Infeasible
from simfog.importers import import_file
from simfog.nccl import fit as nccl_fit
from simfog.trace import Measurement, NetworkTrace, Provenance

from .conftest import REF, REPO

US = 1e-6
TRUE = nccl.NcclNetwork(intra_bus_Bps=230e9, inter_bus_Bps=120e9, latency_inter_s=4 * US, launch_s=6 * US,
                        channels=8, tree_fill_B=100e3)
SIZES = [2**k for k in range(3, 31, 2)]
OFF = {"tree_fill_B": 0.0, "two_node_tree_gain": 1.0}  # simfog's additions off where the logs cannot tell them
A100 = REF / "nccl-tests" / "echo-a100-azure"


def synthetic(layouts, net=TRUE, *, slow=None) -> NetworkTrace:
    """Measurements that `net` predicts exactly (one layout's size `slow` taken 3x slower)."""
    ms = []
    for ranks, nodes in layouts:
        for b in SIZES:
            t = nccl.choose("allreduce", b, ranks, nodes, net).time_s * (3.0 if (ranks, nodes, b) == slow else 1)
            ms.append(Measurement("allreduce", ranks, nodes, b, (t, t * 1.01)))
    return NetworkTrace("nccl", "ib", Provenance("synthetic", "2026-11-23", "test", source="estimated",
                                                 estimated=True), tuple(ms))


def test_fit_recovers_a_known_network():
    # the fill starts off (not at the shipped default, which is near TRUE's): the 3+-node logs must identify it
    cal = nccl_fit.fit([synthetic([(8, 1), (16, 2), (32, 4), (64, 8)])], channels=8, unidentified=OFF)
    n = cal.network
    assert n.intra_bus_Bps == pytest.approx(TRUE.intra_bus_Bps, rel=0.02)
    assert n.inter_bus_Bps == pytest.approx(TRUE.inter_bus_Bps, rel=0.02)
    assert n.launch_s == pytest.approx(TRUE.launch_s, abs=0.3 * US)
    assert np.median(cal.errors()) < 0.01 and not any(p.flag for p in cal.points)
    assert "tree fill" in cal.fitted  # 3+ multi-node scales: the fill is fitted, not the default


def test_a_disturbed_point_is_flagged_not_followed():
    slow = (32, 4, 2**19)
    cal = nccl_fit.fit([synthetic([(8, 1), (16, 2), (32, 4)], slow=slow)], channels=8)
    flagged = [p for p in cal.points if p.flag]
    assert [(p.ranks, p.nodes, p.bytes) for p in flagged] == [slow]
    assert np.median(cal.errors(flagged=False)) < 0.01
    assert "flagged" in cal.report()


def test_additions_stay_off_where_the_logs_cannot_tell_them():
    # simfog's tree fill starts off and 2-node logs cannot identify it (it was a 64 KiB default chosen on the
    # reference logs before; issue 23: defaults of simfog's additions are off, fitted only when identified)
    exact = replace(TRUE, tree_fill_B=0.0)
    for layouts in ([(8, 1), (16, 2)], [(8, 1), (16, 2), (32, 4), (64, 8)]):
        cal = nccl_fit.fit([synthetic(layouts, exact)], channels=8, unidentified=OFF)
        assert cal.network.tree_fill_B == 0 and "tree fill" not in cal.fitted
        assert "tree fill (off: not identified)" in cal.assumed and np.median(cal.errors()) < 0.01
        assert cal.network.net_latency_s == (0.0, 0.0, 0.0) and cal.network.two_node_tree_gain == 1.0


def test_terms_the_logs_cannot_tell_take_the_default_given():
    # 2-node logs cannot identify the tree fill: it stays at the value given for that case (the bench learns it
    # across clusters; simfog ships the value learned from all of them, nccl_fit.UNIDENTIFIED)
    net = replace(TRUE, tree_fill_B=65536.0)
    cal = nccl_fit.fit([synthetic([(8, 1), (16, 2)], net)], channels=8,
                       unidentified={"tree_fill_B": 65536.0, "two_node_tree_gain": 1.0})
    assert cal.network.tree_fill_B == 65536.0 and "tree fill" not in cal.fitted
    assert f"tree fill (64 KiB, {nccl_fit.UNIDENTIFIED_SOURCE}: not identified)" in cal.assumed
    assert np.median(cal.errors()) < 0.01
    logs = [synthetic([(8, 1), (16, 2)], replace(TRUE, tree_fill_B=0.0))]  # without: simfog's shipped values
    assert nccl_fit.fit(logs, channels=8).network == nccl_fit.fit(
        logs, channels=8, unidentified=nccl_fit.UNIDENTIFIED).network


def test_a_plugin_costlier_protocol_is_fitted():
    # a fabric whose plugin makes every LL inter-node step 30 us costlier than NCCL's tables (NCCL still chooses
    # by its tables): identified and recovered from 1-8-node logs, the other protocols' extra latency stays off
    slow = replace(TRUE, tree_fill_B=0.0, net_latency_s=(30 * US, 0.0, 0.0))
    cal = nccl_fit.fit([synthetic([(8, 1), (16, 2), (32, 4), (64, 8)], slow)], channels=8)
    assert "LL inter-node latency" in cal.fitted
    assert cal.network.net_latency_s[0] == pytest.approx(30 * US, rel=0.1)
    assert cal.network.net_latency_s[1:] == (0.0, 0.0) and np.median(cal.errors()) < 0.01


def test_nothing_to_fit_is_refused_in_one_line():
    one_rank = NetworkTrace("nccl", "nvlink", Provenance("x", "d", "h"),
                            (Measurement("allreduce", 1, 1, 8, (1e-6,)), Measurement("allreduce", 1, 1, 16, (1e-6,))))
    with pytest.raises(Infeasible, match="1-rank"):
        nccl_fit.fit([one_rank])
    one_size = NetworkTrace("nccl", "nvlink", Provenance("x", "d", "h"), (Measurement("allreduce", 8, 1, 8, (1e-5,)),))
    with pytest.raises(Infeasible, match="same size"):
        nccl_fit.fit([one_size])


def test_real_a100_logs_held_out():
    """Fitted on <= 2 nodes of Echo's A100 logs, the 4-16-node logs are predicted within a median of 15 %. (Was
    10 % with a tree fill of 64 KiB by default, a value chosen by looking at these very logs; simfog's additions
    now start off and 2-node logs cannot identify the fill: 12.4 %.)"""
    train = [import_file("nccl-tests", A100 / f"nccl_{n}.log") for n in (1, 2, 4, 8, 16)]
    test = [import_file("nccl-tests", A100 / f"nccl_{n}.log") for n in (32, 64, 128)]
    cal = nccl_fit.fit(train)
    assert cal.network.gpu_arch == "ampere"  # read from the logs' A100-SXM4-40GB devices
    pts = nccl_fit.predict(cal.network, test)
    errors = np.array([abs(p.rel_error) for p in pts])
    assert len(errors) == 69 and np.median(errors) < 0.15
    # the 1 KiB row of the 64-GPU log (314.8/293.7 us against 76.9 us at 4 KiB) is flagged as disturbed
    assert any(p.ranks == 64 and p.bytes == 1024 and p.flag == "non-monotone" for p in pts)


def test_network_file_round_trip(tmp_path):
    path = tmp_path / "network.toml"
    network_file.save(path, TRUE, {"fitted_from": 'a "quoted" name'})
    loaded = network_file.load(path)
    for k in TRUE.__dataclass_fields__:
        want = getattr(TRUE, k)
        assert getattr(loaded.nccl, k) == (pytest.approx(want, rel=1e-5) if isinstance(want, float) else want)
    assert loaded.provenance["fitted_from"] == 'a "quoted" name'


@pytest.mark.parametrize("text,field", [("[nccl]\nintra_bus_bandwidth = \"1GB/s\"\n", "nccl.inter_bus_bandwidth"),
                                        ("[nccl]\nintra_bus_bandwidth = \"1GB/s\"\ninter_bus_bandwidth = 5\n",
                                         "nccl.inter_bus_bandwidth"),
                                        ("[nccl]\nchanels = 8\n", "nccl.chanels"),
                                        ("[other]\n", "other"),
                                        ("[nccl\n", "toml")])
def test_bad_network_file_names_the_key(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=field) as e:
        network_file.load(path)
    assert str(path) in str(e.value)


def test_calibrate_then_collective_cli(tmp_path, capsys):
    traces = []
    for n in (8, 16):
        out = tmp_path / f"a{n}.json.gz"
        assert cli.main(["import", "nccl-tests", str(A100 / f"nccl_{n}.log"), "-o", str(out)]) == 0
        traces.append(str(out))
    net = tmp_path / "network.toml"
    assert cli.main(["calibrate", *traces, "-o", str(net)]) == 0
    out = capsys.readouterr().out
    assert "NCCL model 2.30 (ampere" in out and f"wrote {net}" in out
    assert cli.main(["collective", "all_reduce", "--network", str(net), "--nodes", "4", "--gpus-per-node", "8",
                     "--sizes", "1MiB,64MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["bytes"] for r in rows] == [2**20, 2**26]
    for r in rows:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * 31 / 32)
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert {"algorithm", "protocol", "time_s"} <= set(r)
    assert cli.main(["collective", "allreduce", "--network", str(net), "--nodes", "4", "--gpus-per-node", "8",
                     "--compare", str(A100 / "nccl_32.log")]) == 0
    table = capsys.readouterr().out
    assert "measured" in table and "23 sizes compared" in table


def test_collective_cli_refuses_bad_sizes(tmp_path, capsys):
    net = tmp_path / "network.toml"
    network_file.save(net, TRUE)
    code = cli.main(["collective", "allreduce", "--network", str(net), "--nodes", "2", "--gpus-per-node", "8",
                     "--sizes", "8GiB:8B"])
    err = capsys.readouterr().err
    assert code == 2 and "--sizes" in err and "Traceback" not in err


def test_experiment_with_network_file_simulates_with_nccl(tmp_path):
    from simfog import experiment
    from simfog.simulation import new_simulation

    net = tmp_path / "network.toml"
    network_file.save(net, replace(TRUE, channels=16))
    trace = REPO / "traces" / "resnet20-cpu-b32.json.gz"
    exp_path = tmp_path / "exp.toml"
    exp_path.write_text(f'[workload]\ntrace = "{trace}"\ncompute = "mean"\n[cluster]\nnodes = 2\ngpus_per_node = 8\n'
                        f'network = "network.toml"\n[comm]\nmerge = "ddp"\nnccl_proto = "Simple"\n')
    exp = experiment.load(exp_path)
    assert exp.comm.collective == "nccl" and exp.comm.nccl_protocols == ("Simple",)
    cost = exp.cost_model()
    assert cost.allreduce(2**20) == nccl.choose("allreduce", 2**20, 16, 2, exp.network.nccl,
                                                protocols=("Simple",)).time_s
    new_simulation(exp).run()


def test_single_process_logs_pay_one_launch_per_gpu():
    """nccl-tests -g 8 (one thread, 8 GPUs) is recorded per measurement and fitted as serial launches."""
    trace = import_file("nccl-tests", A100 / "nccl_8.log")
    assert set(nccl_fit.gpus_per_thread(trace)) == {8}
    assert set(nccl_fit.gpus_per_thread(import_file("nccl-tests", A100 / "nccl_16.log"))) == {1}
    cal = nccl_fit.fit([import_file("nccl-tests", A100 / f"nccl_{n}.log") for n in (2, 4, 8)])
    assert any("launch per extra GPU" in f for f in cal.fitted)
    # 8 B: 2, 4, 8 GPUs measured 8.5, 16.4, 31.4 us (x3.7); NCCL's latencies alone grow x1.9 (7.8 -> 15.0 us)
    small = {p.ranks: p for p in cal.points if p.bytes == 8}
    assert small[8].predicted_s / small[2].predicted_s > 2.5
    assert all(abs(small[n].rel_error) < 0.2 for n in (2, 4, 8))


def test_zero_byte_rows_are_left_out():
    trace = synthetic([(8, 1), (16, 2)])
    zero = Measurement("allreduce", 8, 1, 0, (0.0, 0.0))
    with_zero = replace(trace, measurements=(zero, *trace.measurements))
    assert len(nccl_fit.fit([with_zero], channels=8).points) == len(trace.measurements)
