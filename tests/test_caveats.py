"""Every warning travels with the number: a calibration's quality is kept in the network file and shown on every row
and summary that uses it (simulate, sweep, curve, plan, tune), as are the sizes and node counts that leave its logs;
a trace of another GPU model than the cluster's, and NCCL's model without a network file, are warned of once."""

from __future__ import annotations

import csv
import json
import math

import pytest

from simfog import caveats, cli, nccl, network_file, sweeps
from simfog.errors import Caveat
from simfog.nccl.calibrated import Calibrated, FitQuality
from simfog.trace import Measurement, NetworkTrace, Provenance

from .conftest import make_trace

POOR = FitQuality(points=40, flagged=5, rms_log_error=0.29, worst_error=-0.64)
POOR_TEXT = "POOR FIT: network fit rms log error 0.29, worst -64 %; FLAGGED: 5 of 40 calibration points flagged"
NODES = "{} nodes, extrapolated from 2 nodes (NCCL's caps change at 3 nodes)"


def _files(tmp_path, *, quality=POOR, gpu="", device=None, cluster="", sizes=(8, 2**34)):
    """t.json (2 layers, 3 recorded iterations), net.toml (calibrated on 1x8 and 2x8 at `sizes`), e.toml on it."""
    trace = make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000],
                       samples=[([0.01, 0.02], [0.02, 0.03]), ([0.011, 0.021], [0.022, 0.031]),
                                ([0.012, 0.019], [0.019, 0.032])])
    if device is not None:
        from dataclasses import replace

        trace = replace(trace, device=device)
    trace.save(tmp_path / "t.json")
    covered = Calibrated("2.21.5", ((1, 8), (2, 8)), *sizes, ("allreduce",), quality=quality, gpu=gpu)
    network_file.save(tmp_path / "net.toml", nccl.NcclNetwork(230e9, 25e9, version="2.21.5", gpu_arch="hopper"),
                      calibrated=covered)
    exp = tmp_path / "e.toml"
    exp.write_text('iterations = 2\n[workload]\ntrace = "t.json"\n[cluster]\nnodes = 1\ngpus_per_node = 8\n'
                   f'network = "net.toml"\n{cluster}[comm]\nmerge = "ddp"\n')
    (tmp_path / "cat.toml").write_text('currency = "EUR"\n[[option]]\nname = "ib"\ngpus_per_node = 8\nmax_nodes = '
                                       '64\nprice_per_gpu_hour = 1.0\nnetwork = "net.toml"\n')
    return exp


def test_a_poor_fit_is_kept_in_the_network_file_and_read_back(tmp_path):
    _files(tmp_path)
    text = (tmp_path / "net.toml").read_text()
    assert "fit_rms_log_error = 0.29" in text and "fit_flagged = 5" in text and "fit_points = 40" in text
    net = network_file.load(tmp_path / "net.toml")
    assert net.calibrated.quality == POOR and net.calibrated.quality.poor
    assert Caveat.line(network_file.caveats(net)) == POOR_TEXT
    clean = FitQuality(40, 0, 0.05, 0.1)
    assert not clean.poor and clean.caveats() == []


def test_calibrate_writes_its_fit_quality_and_the_gpu_its_logs_name(tmp_path, capsys):
    """Logs the model cannot follow (every other size 3 times slower): POOR FIT in the report, and the same
    numbers in the network file, which every prediction then carries."""
    net = nccl.NcclNetwork(440e9, 368e9, version="2.21.5", gpu_arch="hopper")
    sizes = [2**k for k in range(3, 31, 2)]
    ms = tuple(Measurement("allreduce", r, n, b, (t, t)) for r, n in ((8, 1), (16, 2)) for i, b in enumerate(sizes)
               for t in [nccl.choose("allreduce", b, r, n, net).time_s * (3.0 if i % 2 else 1.0)])
    run = {"file": "x.log", "gpu": "NVIDIA H100 80GB HBM3", "measurements": [0, len(ms)]}
    trace = NetworkTrace("nccl", "ib", Provenance("synthetic", "2026-11-27", "test"), ms, {"nccl_tests": [run]})
    trace.save(tmp_path / "logs.json")
    assert cli.main(["calibrate", str(tmp_path / "logs.json"), "-o", str(tmp_path / "net.toml")]) == 0
    assert "POOR FIT" in capsys.readouterr().out
    covered = network_file.load(tmp_path / "net.toml").calibrated
    assert covered.gpu == "H100" and covered.quality.poor and covered.quality.points == 2 * len(sizes)
    # the stored numbers are the report's: rms of ln(predicted / measured) over the points
    from simfog.nccl import fit as nccl_fit

    cal = nccl_fit.fit([trace])
    errors = [p.rel_error for p in cal.points]
    assert covered.quality.rms_log_error == pytest.approx(math.sqrt(sum(math.log1p(e) ** 2 for e in errors)
                                                                    / len(errors)), abs=1e-6)
    assert covered.quality.worst_error == pytest.approx(max(errors, key=abs), abs=1e-6)


def test_simulate_names_every_warning_in_its_summary(tmp_path, capsys):
    exp = _files(tmp_path, sizes=(32 * 2**20, 16 * 2**30))
    assert cli.main(["simulate", str(exp), "--nodes", "8"]) == 0
    said = next(line for line in capsys.readouterr().out.splitlines() if "WARNINGS" in line)
    assert said.startswith("  WARNINGS           " + POOR_TEXT + "; EXTRAPOLATED: " + NODES.format(8))
    assert said.endswith("; 976.6 KiB outside the logs' 32 MiB..16 GiB; 1.907 MiB outside the logs' 32 MiB..16 GiB")
    assert cli.main(["simulate", str(exp), "--nodes", "8", "--json"]) == 0
    codes = [w["code"] for w in json.loads(capsys.readouterr().out)["warnings"]]
    assert codes == ["POOR FIT", "FLAGGED", "EXTRAPOLATED", "EXTRAPOLATED", "EXTRAPOLATED"]  # nodes, 2 buckets


def test_sweep_and_curve_rows_carry_their_warnings(tmp_path, capsys):
    exp = _files(tmp_path)
    out = tmp_path / "s.csv"
    assert cli.main(["sweep", str(exp), "--nodes", "1,8", "-o", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out.splitlines()
    rows = list(csv.DictReader(open(out, newline="")))
    assert [r["warnings"] for r in rows] == [POOR_TEXT, f"{POOR_TEXT}; EXTRAPOLATED: {NODES.format(8)}"]
    for r in rows:  # the printed row ends with the CSV's cell
        assert any(line.lstrip().startswith(r["ranks"]) and line.endswith("  " + r["warnings"]) for line in printed)
    assert cli.main(["curve", str(exp), "--nodes", "1,8", "-o", str(tmp_path / "c"), "--json", "--no-progress"]) == 0
    assert [r["warnings"] for r in json.loads(capsys.readouterr().out)["rows"]] == [r["warnings"] for r in rows]
    import simfog

    df = simfog.sweep(simfog.load(exp), ranks=[8, 64])  # the Python API's frame has the column too
    assert list(df.warnings) == [r["warnings"] for r in rows]


def test_plan_rows_carry_the_warnings_simulate_gives_the_same_run(tmp_path, capsys):
    """The issue's case: simulate flagged sizes outside the logs at 64 GPUs, the plan row at 64 GPUs did not."""
    exp = _files(tmp_path, sizes=(32 * 2**20, 16 * 2**30))
    assert cli.main(["plan", str(exp), "--catalogue", str(tmp_path / "cat.toml"), "--gpus", "8,64", "--json",
                     "-o", str(tmp_path / "p")]) == 0
    rows = {r["gpus"]: r["warnings"] for r in json.loads(capsys.readouterr().out)["rows"]}
    for gpus in (8, 64):
        assert cli.main(["simulate", str(exp), "--ranks", str(gpus), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert rows[gpus] == Caveat.line(Caveat(**w) for w in summary["warnings"])
    assert "1.907 MiB outside the logs' 32 MiB..16 GiB" in rows[64] and NODES.format(8) in rows[64]
    assert cli.main(["plan", str(exp), "--catalogue", str(tmp_path / "cat.toml"), "--gpus", "64",
                     "-o", str(tmp_path / "p2")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("64 "))
    assert row.endswith("  " + rows[64])
    with open(tmp_path / "p2" / "plan.csv", newline="") as f:
        assert next(csv.DictReader(f))["warnings"] == rows[64]


def test_tune_rows_carry_their_warnings(tmp_path, capsys):
    exp = _files(tmp_path)
    assert cli.main(["tune", str(exp), "--nodes", "8", "--points", "2", "--refine", "0", "-o", str(tmp_path / "t"),
                     "--json"]) == 0
    warned = json.loads(capsys.readouterr().out)["warnings"]
    assert set(warned) >= {"threshold (best)", "ddp", "horovod"}
    assert all(w.startswith(POOR_TEXT + "; EXTRAPOLATED: " + NODES.format(8)) for w in warned.values())
    with open(tmp_path / "t" / "tune.csv", newline="") as f:
        assert all(r["warnings"].startswith(POOR_TEXT) for r in csv.DictReader(f))
    assert cli.main(["tune", str(exp), "--points", "2", "--refine", "0", "-o", str(tmp_path / "t"), "--force"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ddp ")]
    assert table and table[0].endswith("  " + POOR_TEXT)


def test_collective_says_the_calibration_quality_over_its_rows(tmp_path, capsys):
    _files(tmp_path)
    argv = ["collective", "allreduce", "--network", str(tmp_path / "net.toml"), "--nodes", "2", "--gpus-per-node", "8",
            "--sizes", "1MiB"]
    assert cli.main(argv) == 0
    assert f"# WARNINGS (every row): {POOR_TEXT}" in capsys.readouterr().out.splitlines()
    assert cli.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == POOR_TEXT


def test_a_clean_calibration_inside_its_logs_adds_nothing(tmp_path, capsys):
    exp = _files(tmp_path, quality=FitQuality(40, 0, 0.05, 0.1))
    assert cli.main(["simulate", str(exp), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
    assert cli.main(["simulate", str(exp)]) == 0
    assert "WARNINGS" not in capsys.readouterr().out


def test_a_new_kind_of_warning_is_one_function(tmp_path, monkeypatch):
    """The mechanism is generic: a check added to CHECKS (as i38's "extrapolated from N nodes" band will be) lands
    on every row."""
    from .conftest import make_experiment

    monkeypatch.setattr(caveats, "CHECKS", list(caveats.CHECKS))
    caveats.check(lambda exp, buckets: [Caveat("SHIPPED", f"cluster x at {exp.ranks} ranks")])
    trace = make_trace([0.01], [0.02], [1000])
    rows = sweeps.run(make_experiment(trace), sweeps.grid([2, 4], ["ddp"], ["linear"]), tmp_path / "s.csv",
                      progress=False)
    assert [r["warnings"] for r in rows] == ["SHIPPED: cluster x at 2 ranks", "SHIPPED: cluster x at 4 ranks"]


def test_caveat_line_groups_texts_under_their_code():
    cs = [Caveat("A", "1"), Caveat("B", "2"), Caveat("A", "3"), Caveat("A", "1")]
    assert Caveat.line(cs) == "A: 1; 3; B: 2"
    assert Caveat.line([]) == "" and str(cs[0]) == "A: 1"


@pytest.mark.parametrize("cluster, device, said", [
    ('gpu = "H100"\n', {"kind": "cuda", "name": "NVIDIA H200"}, "cluster.gpu = 'H100': the trace's compute times are "
                                                                "of NVIDIA H200, not of H100"),
    ('gpu = "H200"\n', {"kind": "cuda", "name": "NVIDIA H200"}, None),
    ('gpu = "H100"\n', {"kind": "cpu", "name": "AMD EPYC"}, "the trace's compute times are of AMD EPYC, not of H100"),
    ("", {"kind": "cuda", "name": "NVIDIA H200"}, None),  # the cluster says no model: nothing to compare
])
def test_a_trace_of_another_gpu_model_is_warned_once(tmp_path, capsys, cluster, device, said):
    exp = _files(tmp_path, cluster=cluster, device=device, quality=None)
    assert cli.main(["simulate", str(exp), "--json"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "compute times are of" in line]
    assert len(lines) == (1 if said else 0), err
    if said:
        assert said in lines[0]


def test_an_h200_trace_on_h100_logs_is_warned_by_name_not_generation(tmp_path, capsys):
    """Both are Hopper: the generation check says nothing; the GPU the logs name does."""
    exp = _files(tmp_path, gpu="H100", device={"kind": "cuda", "name": "NVIDIA H200"}, quality=None)
    assert cli.main(["simulate", str(exp), "--json"]) == 0
    err = capsys.readouterr().err
    assert err.count("the trace's compute times are of NVIDIA H200, not of H100, the GPU of the logs") == 1, err
    # the cluster said to be H100 too: still one warning, not one per place that says H100
    exp = _files(tmp_path, gpu="H100", device={"kind": "cuda", "name": "NVIDIA H200"}, quality=None,
                 cluster='gpu = "H100"\n')
    assert cli.main(["simulate", str(exp), "--json"]) == 0
    assert capsys.readouterr().err.count("the trace's compute times are of NVIDIA H200") == 1
    capsys.readouterr()
    (tmp_path / "cat.toml").write_text('currency = "EUR"\n[[option]]\nname = "ib"\ngpus_per_node = 8\nmax_nodes = 8\n'
                                       'price_per_gpu_hour = 1.0\nintra_bandwidth = "100GB/s"\nnic_bandwidth = '
                                       '"100Gbit/s"\ngpu = "H100"\n')
    assert cli.main(["plan", str(tmp_path / "t.json"), "--catalogue", str(tmp_path / "cat.toml"), "--gpus", "8",
                     "-o", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    assert err.count("option (ib).gpu = 'H100': the trace's compute times are of NVIDIA H200, not of H100") == 1


def test_nccl_without_a_network_file_is_warned_once(tmp_path, capsys):
    make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    exp = tmp_path / "e.toml"
    body = '[workload]\ntrace = "t.json"\n[cluster]\nnodes = 2\ngpus_per_node = 2\nnic_bandwidth = "10Gbit/s"\n'
    exp.write_text(body + '[comm]\ncollective = "nccl"\n')
    assert cli.main(["simulate", str(exp), "--iterations", "1"]) == 0
    assert capsys.readouterr().err.count('= "nccl" without a network file') == 1
    exp.write_text(body)
    assert cli.main(["simulate", str(exp), "--iterations", "1"]) == 0
    assert "without a network file" not in capsys.readouterr().err
    assert cli.main(["sweep", str(exp), "--collective", "ring,nccl", "--ranks", "2,4", "-o",
                     str(tmp_path / "s.csv"), "--no-progress", "--jobs", "1"]) == 0
    assert capsys.readouterr().err.count('--collective = "nccl" without a network file') == 1
