"""The first hour of a new user (issue 11, point 4): --version, defaults in --help, --json, outputs that never
overwrite and go to a new folder per run, ESTIMATED tables and self-describing CSVs, retarget's precision,
calibration's poor fits and progress bars only on a terminal."""

from __future__ import annotations

import argparse
import csv
import fcntl
import hashlib
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from simfog import cli
from simfog.files import new_run_dir

from .conftest import REPO, make_trace

EXP = """
seed = 5
iterations = 2
[workload]
trace = "t.json"
compute = "mean"
[cluster]
nodes = 1
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
nic_latency = "20us"
[comm]
collective = "ring"
merge = "wfbp"
"""

CATALOGUE = """
currency = "EUR"
[[option]]
name = "only"
gpus_per_node = 2
max_nodes = 4
intra_bandwidth = "100GB/s"
nic_bandwidth = "10Gbit/s"
price_per_gpu_hour = 1.0
"""


@pytest.fixture
def exp_file(tmp_path):
    make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    (tmp_path / "exp.toml").write_text(EXP)
    return tmp_path / "exp.toml"


@pytest.fixture
def estimated_exp(tmp_path):
    t = make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000])
    replace(t, provenance=replace(t.provenance, source="estimated", estimated=True)).save(tmp_path / "t.json")
    (tmp_path / "exp.toml").write_text(EXP)
    return tmp_path / "exp.toml"


def run(*argv, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "simfog.cli", *map(str, argv)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


# ---- --version and --help ----

def test_version_is_the_packages():
    out = run("--version")
    assert out.returncode == 0, out.stderr
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert out.stdout.strip() == f"simfog {version}"


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_help_shows_every_default_once_and_never_none():
    parsers = list(_parsers(cli.build_parser()))
    assert len(parsers) > len(cli.COMMANDS)
    for parser in parsers:
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            text = formatter._get_help_string(action) or ""
            shown = action.default not in (None, False, argparse.SUPPRESS)
            if shown and (action.option_strings or action.nargs in ("?", "*")):
                assert "default" in text, (parser.prog, action.dest)
            assert text.count("(default:") <= 1, (parser.prog, action.dest)
        assert "(default: None)" not in parser.format_help(), parser.prog
    tune_help = run("tune", "--help").stdout
    assert re.search(r"log-spaced thresholds in the first pass\s+\(default:\s+25\)", tune_help)


# ---- outputs: never overwritten without --force; a new folder per run by default ----

def test_explicit_outputs_are_refused_when_they_exist_unless_forced(exp_file, tmp_path):
    trace = tmp_path / "t.json"
    (tmp_path / "cat.toml").write_text(CATALOGUE)
    cases = [
        (["simulate", exp_file, "--intervals"], "i.csv", "--intervals"),
        (["simulate", exp_file, "--timeline"], "tl.json", "--timeline"),
        (["tune", exp_file, "--points", "3", "--refine", "0", "-o"], "tu", "-o"),
        (["plan", exp_file, "--catalogue", tmp_path / "cat.toml", "--target-samples-per-s", "100", "-o"], "p", "-o"),
        (["curve", exp_file, "--ranks", "2,4", "--jobs", "1", "-o"], "c", "-o"),
        (["import", "kineto", trace, "-o"], "imp.json", "-o"),
        (["calibrate", REPO / "traces" / "net-gloo-loopback.json.gz", "--model", "nccl", "-o"], "n.toml", "-o"),
    ]
    for argv, name, option in cases:
        # -o names a folder for tune, plan and curve (several files), a file elsewhere
        first = {"tu": "tu/tune.png", "p": "p/plan.csv", "c": "c/curve.png"}.get(name, name)
        (tmp_path / first).parent.mkdir(exist_ok=True)
        (tmp_path / first).write_text("keep me")
        out = run(*argv, tmp_path / name)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        err = out.stderr.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in out.stderr, out.stderr
        assert str(tmp_path / first) in err[0] and "--force" in err[0] and option in err[0], err[0]
        assert (tmp_path / first).read_text() == "keep me"
    # --force writes over it
    forced = run("tune", exp_file, "--points", "3", "--refine", "0", "-o", tmp_path / "tu", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "tu" / "tune.png").read_bytes()[:4] == b"\x89PNG"


def test_retarget_refuses_an_existing_output(tmp_path):
    src = REPO / "traces" / "resnet50-cpu-b32.json.gz"
    (tmp_path / "r.json").write_text("keep me")
    out = run("retarget", src, "--device", "a100", "-o", tmp_path / "r.json")
    assert out.returncode == 2 and "--force" in out.stderr and str(tmp_path / "r.json") in out.stderr
    assert (tmp_path / "r.json").read_text() == "keep me"
    assert run("retarget", src, "--device", "a100", "-o", tmp_path / "r.json", "--force").returncode == 0


def test_default_outputs_go_to_a_new_folder_per_run(exp_file, tmp_path):
    for command, argv, names in [
        ("sweep", ["--ranks", "2,4", "--jobs", "1"], {"sweep.csv"}),
        ("curve", ["--ranks", "2,4", "--jobs", "1"], {"curve.csv", "curve.png", "curve.svg"}),
        ("tune", ["--points", "3", "--refine", "0"], {"tune.csv", "tune.png"}),
    ]:
        folders = []
        for _ in range(2):
            out = run(command, exp_file, *argv, cwd=tmp_path)
            assert out.returncode == 0, out.stderr
            made = sorted((tmp_path / "simfog-out").glob(f"{command}-*"))
            assert len(made) == len(folders) + 1
            new = next(m for m in made if m not in folders)
            folders.append(new)
            assert re.fullmatch(rf"{command}-\d{{8}}T\d{{6}}Z(-\d+)?", new.name)
            assert {p.name for p in new.iterdir()} == names
            assert str(new) in out.stdout or str(new.relative_to(tmp_path)) in out.stdout
    assert not [p for p in (tmp_path / "simfog-out").iterdir() if p.name.startswith(".")]  # no partial folder


def test_plan_default_output_is_a_new_folder(exp_file, tmp_path):
    (tmp_path / "cat.toml").write_text(CATALOGUE)
    out = run("plan", exp_file, "--catalogue", tmp_path / "cat.toml", "--target-samples-per-s", "100", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (folder,) = (tmp_path / "simfog-out").glob("plan-*")
    assert {p.name for p in folder.iterdir()} == {"plan.csv", "plan.png"}


def test_a_failed_run_leaves_no_folder(tmp_path):
    with pytest.raises(KeyboardInterrupt), new_run_dir("sweep", tmp_path / "runs") as out:
        (out.path / "sweep.csv").write_text("half")
        raise KeyboardInterrupt
    assert list((tmp_path / "runs").iterdir()) == []
    with new_run_dir("sweep", tmp_path / "runs") as a, new_run_dir("sweep", tmp_path / "runs") as b:
        (a.path / "x").write_text("a")
        (b.path / "x").write_text("b")
    assert a.final != b.final and (a.final / "x").read_text() == "a" and (b.final / "x").read_text() == "b"


def test_curve_resumes_an_existing_csv_and_redraws_its_plots(exp_file, tmp_path):
    folder = tmp_path / "c"
    assert run("curve", exp_file, "--ranks", "2,4", "--jobs", "1", "-o", folder).returncode == 0
    again = run("curve", exp_file, "--ranks", "2,4,8", "--jobs", "1", "-o", folder)  # no --force needed
    assert again.returncode == 0, again.stderr
    assert f"resuming {folder / 'curve.csv'}: 2 of 3 rows reused from it, 1 to run" in again.stderr
    assert len(list(csv.DictReader(open(folder / "curve.csv")))) == 3


# ---- --json on sweep, curve and plan ----

def _table_numbers(stdout: str) -> list[tuple[int, float]]:
    """(ranks, samples/s) of each table row as printed."""
    return [(int(m[1]), float(m[2])) for m in re.finditer(r"^\s*(\d+) \S+\s+\S+\s+\S+ \S+\s+([\d.]+)\s+[\d.]+%$",
                                                          stdout, re.M)]


def test_sweep_and_curve_json_have_the_tables_numbers(exp_file, tmp_path):
    for command in ("sweep", "curve"):
        argv = [command, exp_file, "--ranks", "2,4", "--jobs", "1"]
        table = run(*argv, "-o", tmp_path / f"{command}-table.csv" if command == "sweep" else tmp_path / "ct")
        as_json = run(*argv, "--json", "-o", tmp_path / f"{command}.csv" if command == "sweep" else tmp_path / "cj")
        assert table.returncode == 0 and as_json.returncode == 0, as_json.stderr
        data = json.loads(as_json.stdout)  # stdout is one JSON object; "wrote ..." went to stderr
        assert "wrote" in as_json.stderr and data["estimated"] is False
        rows = data["rows"]
        assert [(r["ranks"], round(r["samples_per_s"], 1)) for r in rows] == _table_numbers(table.stdout)
        for r in rows:
            assert isinstance(r["ranks"], int) and isinstance(r["iteration_time_s"], float)
            assert r["estimated"] is False and r["error"] == "" and r["seed"] == 5 and r["compute"] == "mean"
        written = list(csv.DictReader(open(data["csv"])))
        assert [float(r["samples_per_s"]) for r in written] == [r["samples_per_s"] for r in rows]


def test_plan_json_has_the_tables_rows_and_best(exp_file, tmp_path):
    (tmp_path / "cat.toml").write_text(CATALOGUE)
    argv = ["plan", exp_file, "--catalogue", tmp_path / "cat.toml", "--target-samples-per-s", "150"]
    table = run(*argv, "-o", tmp_path / "pt")
    out = run(*argv, "--json", "-o", tmp_path / "pj")
    assert table.returncode == 0 and out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["best"] == data["rows"][0] and data["currency"] == "EUR"
    assert data["target_samples_per_s"] == 150
    best = data["best"]
    assert best["samples_per_s"] >= 150 and isinstance(best["gpus"], int) and best["meets_target"] is True
    assert f"{best['samples_per_s']:,.1f}" in table.stdout and data["csv"] == str(tmp_path / 'pj' / 'plan.csv')


# ---- ESTIMATED and self-describing CSVs ----

def test_sweep_and_curve_tables_say_estimated(estimated_exp, tmp_path):
    for command, o in (("sweep", tmp_path / "s.csv"), ("curve", tmp_path / "c")):
        out = run(command, estimated_exp, "--ranks", "2", "--jobs", "1", "-o", o)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[0].startswith("ESTIMATED"), out.stdout


def test_measured_inputs_are_not_called_estimated(exp_file, tmp_path):
    out = run("sweep", exp_file, "--ranks", "2", "--jobs", "1", "-o", tmp_path / "s.csv")
    assert out.returncode == 0 and "ESTIMATED" not in out.stdout


def test_sweep_csv_records_experiment_trace_mode_and_seed(exp_file, tmp_path):
    from simfog import experiment

    out = run("sweep", exp_file, "--ranks", "2,4", "--jobs", "1", "-o", tmp_path / "s.csv")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    trace = experiment.load(exp_file).workload.trace
    digest = hashlib.sha256(json.dumps(trace.to_dict(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    for r in rows:
        assert r["experiment"] == str(exp_file)
        assert Path(r["trace"]) == (tmp_path / "t.json").resolve()
        assert r["trace_sha256"] == digest and r["compute"] == "mean" and r["seed"] == "5"


# ---- retarget: PyTorch's default precision per layer kind ----

def test_retarget_defaults_to_what_torch_runs_on_the_device():
    from simfog.retarget import DEVICES, retarget
    from simfog.trace import load_model_trace

    r50 = load_model_trace(REPO / "traces" / "resnet50-cpu-b32.json.gz")
    default, tf32, fp32 = (retarget(r50, "a100", **kw) for kw in ({}, {"precision": "tf32"},
                                                                   {"precision": "fp32"}))
    total = lambda t: sum(layer.forward_s[0] + layer.backward_s[0] for layer in t.layers)  # noqa: E731
    # convolutions on TF32 tensor cores (cudnn.allow_tf32 defaults True), not on CUDA cores: what assuming fp32
    # everywhere cost (2.7x too slow on an A100 in the roofline days); tf32 everywhere adds only the fc layer
    assert total(fp32) / total(default) > 1.2
    assert total(tf32) <= total(default) * 1.001
    # a V100 has no TF32: fp32 everywhere
    v100 = retarget(r50, "v100")
    assert [x.forward_s for x in v100.layers] == [x.forward_s for x in retarget(r50, "v100", precision="fp32").layers]
    assert DEVICES.get("v100").peak_flops["tf32"] == DEVICES.get("v100").peak_flops["fp32"]
    assert "torch default" in default.provenance.notes and "allow_tf32" in default.provenance.notes


@pytest.mark.parametrize("name, conv", [("conv1", True), ("layer1.0.downsample.0", True), ("features.0", True),
                                        ("features.denseblock1.denselayer1.conv2", True), ("fc", False),
                                        ("classifier.0", False), ("transformer.h.0.attn.c_attn", False),
                                        ("encoder.layer.0.attention.self.query", False)])
def test_layer_kind_from_its_module_path(name, conv):
    from simfog.retarget import is_convolution

    assert is_convolution(name) is conv


def test_retarget_says_which_precision_it_chose(tmp_path):
    out = run("retarget", REPO / "traces" / "resnet50-cpu-b32.json.gz", "--device", "a100", "-o", tmp_path / "r.json")
    assert out.returncode == 0, out.stderr
    assert "torch default" in out.stdout and "tf32" in out.stdout and "fp32" in out.stdout
    help_text = " ".join(run("retarget", "--help").stdout.split())
    assert "allow_tf32" in help_text and "(default: torch)" not in help_text.replace("torch (default)", "")


# ---- calibration: poor fits are flagged and shown with fewer digits ----

def test_poor_alpha_beta_fit_is_flagged_with_two_significant_figures():
    from simfog.calibrate import fit
    from simfog.trace import load_network_trace

    cal = fit(load_network_trace(REPO / "traces" / "net-gloo-loopback.json.gz"))
    f = cal.fits["intra"]
    assert f.rms_rel_error > 0.4 and f.poor and cal.to_dict()["fits"]["intra"]["poor_fit"] is True
    report = cal.report()
    assert "POOR FIT" in report
    row = next(line for line in report.splitlines() if line.startswith("intra "))
    for number in re.findall(r"([\d.]+) (?:us|ms|s|Gbit/s|Mbit/s)\b", row):
        figures = number.replace(".", "").lstrip("0") if "." in number else number.strip("0")  # 270: 2
        assert len(figures) <= 2, row


def test_good_alpha_beta_fit_keeps_its_digits_and_no_flag():
    from simfog.calibrate import fit
    from tests.test_calibrate import line
    from tests.test_calibrate import make_trace as make_net_trace

    cal = fit(make_net_trace({"intra": line(7.123e-6, 1 / 2.345e9)}))
    assert not cal.fits["intra"].poor and "POOR FIT" not in cal.report()
    assert "18.76 Gbit/s" in cal.report()  # 2.345e9 B/s, 4 significant figures


# ---- progress: on a terminal only ----

def test_no_progress_output_when_stderr_is_not_a_terminal(exp_file, tmp_path):
    (tmp_path / "cat.toml").write_text(CATALOGUE)
    for argv in (["plan", exp_file, "--catalogue", tmp_path / "cat.toml", "--target-samples-per-s", "250",
                  "-o", tmp_path / "p"],
                 ["sweep", exp_file, "--ranks", "2,4", "--jobs", "1", "-o", tmp_path / "s.csv"],
                 ["tune", exp_file, "--points", "3", "--refine", "0", "-o", tmp_path / "t"],
                 ["simulate", exp_file]):
        out = run(*argv)
        assert out.returncode == 0 and out.stderr == "", (argv, out.stderr)


def test_progress_bar_on_a_terminal(exp_file, tmp_path):
    (tmp_path / "cat.toml").write_text(CATALOGUE)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a width
    proc = subprocess.Popen([sys.executable, "-m", "simfog.cli", "plan", str(exp_file), "--catalogue",
                             str(tmp_path / "cat.toml"), "--target-samples-per-s", "250", "-o", str(tmp_path / "p")],
                            stdout=subprocess.PIPE, stderr=follower, env={**os.environ, "PYTHONPATH": str(REPO)})
    os.close(follower)
    seen = b""
    try:
        while True:  # read as it comes, so a full terminal buffer never blocks the command
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the command has exited
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    stdout = proc.stdout.read().decode()
    assert proc.wait(timeout=300) == 0
    assert b"plan" in seen and b"sim" in seen  # tqdm's "plan: 3 sim [...]"
    assert "wrote" in stdout and "\r" not in stdout  # the bar went to the terminal, not into stdout
