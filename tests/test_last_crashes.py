"""What issue 35's fuzzing found (4,325 inputs on ba8880a): a fat tree with more spines than leaf uplinks, output
paths that cannot be made or are too long or empty, the jobs API and Experiment.with_comm taking anything,
retarget writing traces simfog cannot read, a job run twice on its own nodes, count lists typed wrong, calibrate
--nvls where NVLS cannot run, and a node agent's announcement left behind by SIGTERM. Each test here failed before.

CLI cases run in-process through bench/fuzz.py's run_case: exit 2, one `simfog: error:` line naming the culprit,
nothing written (no file, no folder, no simfog-out/ run folder), under an alarm that turns a hang into a failure.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import simfog
from simfog import files, jobs
from simfog.errors import ConfigError
from simfog.trace import load_model_trace

from .conftest import REPO, make_trace
from .test_fuzz_cli import fuzz

MLP = REPO / "traces" / "mlp-cpu-b1024.json.gz"
NET = str(REPO / "traces" / "net-gloo-loopback.json.gz")


def _check(d: Path, argv: list[str], needle: str) -> str:
    case = fuzz.Case("issue35", argv, (needle,))
    outcome = fuzz.run_case(case, d, timeout=120)
    assert outcome.kind == "clean", f"simfog {' '.join(argv)[:200]} -> {outcome.kind}: {outcome.detail}\n" \
                                    f"{outcome.stderr}"
    return outcome.stderr


def _exp(d: Path, *, nodes: int = 2, gpus: int = 2, extra: str = "") -> str:
    (d / "t.json").write_bytes(gzip.decompress(MLP.read_bytes()))
    (d / "e.toml").write_text(f'seed = 1\niterations = 2\n[workload]\ntrace = "t.json"\ncompute = "mean"\n'
                              f'[cluster]\nnodes = {nodes}\ngpus_per_node = {gpus}\nnic_bandwidth = "25Gbit/s"\n'
                              + extra)
    return "e.toml"


# ---- a fat tree whose spines outnumber its leaves' uplinks ----

@pytest.mark.parametrize("spines", [5, 100, 10**12])
def test_three_tier_fat_tree_with_more_spines_than_leaf_uplinks(tmp_path, spines):
    # the example: 2 nodes per leaf, so 2 leaf uplinks; 3 spines got a clean error, these divided by zero
    fabric = ('[fabric]\nkind = "fat_tree"\ntiers = 3\nnodes_per_leaf = 2\nleaves_per_pod = 2\n'
              f"spines_per_pod = {spines}\n")
    err = _check(tmp_path, ["simulate", _exp(tmp_path, nodes=8, extra=fabric)], "fabric.spines_per_pod")
    assert "e.toml" in err and ("at most the leaves' uplinks (2" in err or "at most 4,194,304" in err)


@pytest.mark.parametrize("key", ["spine_uplinks", "leaf_uplinks", "leaf_oversubscription"])
def test_fabric_counts_and_ratios_of_400_digits(tmp_path, key):
    # past MOST_NODES a count (and any ratio past 1e300) made a rate that no float holds: OverflowError
    fabric = ('[fabric]\nkind = "fat_tree"\ntiers = 3\nnodes_per_leaf = 2\nleaves_per_pod = 2\n'
              f"{key} = {10**400}\n")
    _check(tmp_path, ["simulate", _exp(tmp_path, nodes=8, extra=fabric)], f"fabric.{key}")


# ---- output paths: the one check (simfog.files.check_output) for every command and the API ----

def _output_cases(out: str) -> list[tuple[list[str], str]]:
    """Every command that writes, with `out` as its output (a file, or a folder for curve, tune and plan)."""
    return [
        (["simulate", "e.toml", "--intervals", out], "--intervals"),
        (["simulate", "e.toml", "--timeline", out], "--timeline"),
        (["sweep", "e.toml", "--jobs", "1", "--no-progress", "-o", out], "-o"),
        (["curve", "e.toml", "--ranks", "2,4", "--jobs", "1", "--no-progress", "-o", out], "-o"),
        (["tune", "e.toml", "--points", "3", "--refine", "1", "-o", out], "-o"),
        (["plan", "t.json", "--target-samples-per-s", "1", "-o", out], "-o"),
        (["retarget", "t.json", "--device", "a100", "-o", out + ".json" if out else out], "-o"),
        (["import", "osu", "x.log", "-o", out + ".json" if out else out], "--output"),
        (["calibrate", NET, "--model", "nccl", "-o", out], "-o"),
    ]


def _inputs(d: Path) -> None:
    _exp(d)
    (d / "x.log").write_text("# OSU MPI Allreduce Latency Test\n# Size       Avg Latency(us)\n4 1.0\n8 2.0\n")


@pytest.mark.parametrize("where", ["/proc/nonexistent/x.csv", "/sys/x.csv"])
@pytest.mark.parametrize("command", range(9))
def test_outputs_that_cannot_be_made_are_refused_by_every_command(tmp_path, where, command):
    # sweep and curve raised FileNotFoundError (/proc) and PermissionError (/sys); the others were clean already
    root = "/" + where.split("/")[1]
    if not os.path.isdir(root):
        pytest.skip(f"no {root} here")
    _inputs(tmp_path)
    argv, option = _output_cases(where)[command]
    _check(tmp_path, argv, option)


def test_the_python_sweep_refuses_an_output_that_cannot_be_made(tmp_path):
    _exp(tmp_path)
    for where in ("/proc/nonexistent/x.csv", "/sys/x.csv"):
        with pytest.raises(ConfigError) as e:
            simfog.sweep(tmp_path / "e.toml", ranks=[2], output=where)
        assert e.value.field == "output"


def test_a_read_only_folder_is_refused_before_the_sweep_runs(tmp_path, monkeypatch):
    # A read-only mount (EROFS) cannot be made in a test; the folder's every mkdir fails as one would.
    _inputs(tmp_path)
    real = os.mkdir

    def read_only(path, *a, **k):
        if os.path.abspath(path).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, *a, **k)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(os, "mkdir", read_only)
    err = _check(tmp_path, ["sweep", "e.toml", "--jobs", "1", "--no-progress", "-o", "ro/sub/x.csv"], "-o")
    assert "Read-only file system" in err
    err = _check(tmp_path, ["curve", "e.toml", "--ranks", "2,4", "--jobs", "1", "--no-progress", "-o", "ro/c"], "-o")
    assert "Read-only file system" in err


@pytest.mark.parametrize("command", range(9))
def test_a_file_name_over_255_bytes_is_refused_by_every_command(tmp_path, command):
    # OSError ENAMETOOLONG in nine commands (check_output's is_dir, folder_prefix's exists)
    _inputs(tmp_path)
    argv, option = _output_cases("x" * 300 + ".csv")[command]
    err = _check(tmp_path, argv, option)
    assert "at most 255 bytes" in err or "at most 233 bytes" in err


@pytest.mark.parametrize("name", ["y" * 240 + ".csv", "x" * 300 + "/o.csv", "d/" * 2100 + "o.csv"])
def test_names_a_write_cannot_make_are_refused_before_any_work(name):
    # 244 bytes is a legal name, but its temporary file's (".<name>.<pid>.<8>.tmp") is not: that failed only
    # after the work, at the write; a path over 4 KiB the same
    with pytest.raises(ConfigError) as e:
        files.check_output(name)
    assert e.value.field == "output" and "bytes" in e.value.allowed


def test_a_long_name_that_leaves_room_for_the_temporary_file_is_written(tmp_path):
    path = tmp_path / ("z" * (files.NAME_MAX - 22 - 5) + ".json")
    files.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the probe left nothing


@pytest.mark.parametrize("command", [0, 1, 3, 4, 5, 8])
def test_an_empty_output_path_is_refused_not_taken_as_none(tmp_path, command):
    # curve, tune, plan and calibrate took -o '' as no -o, simulate --intervals '' and --timeline '' too
    _inputs(tmp_path)
    argv, option = _output_cases("")[command]
    err = _check(tmp_path, argv, option)
    assert "not empty" in err
    assert not (tmp_path / "simfog-out").exists()


def test_an_empty_input_path_names_the_path(tmp_path):
    with pytest.raises(ConfigError) as e:
        files.check_input("")
    assert e.value.field == "path" and "not empty" in e.value.allowed


# ---- the jobs API and Experiment.with_comm: the CLI's checks ----

def _jobs_file(d: Path) -> Path:
    (d / "t.json").write_bytes(gzip.decompress(MLP.read_bytes()))
    path = d / "jobs.toml"
    path.write_text('seed = 1\niterations = 2\n[cluster]\nnodes = 4\ngpus_per_node = 1\nnic_bandwidth = "25Gbit/s"\n'
                    '[[job]]\nname = "a"\nworkload = { trace = "t.json", compute = "mean" }\nranks = 2\n'
                    '[[job]]\nname = "b"\nworkload = { trace = "t.json", compute = "mean" }\nranks = 2\n')
    return path


@pytest.mark.parametrize("arg", [None, 5, b"x", ""])
def test_jobs_load_of_what_is_no_path(arg):
    with pytest.raises(ConfigError) as e:
        jobs.load(arg)
    assert e.value.field == "path"


@pytest.mark.parametrize("arg", [5, None, [], "x"])
def test_jobs_from_table_of_what_is_no_table(arg):
    with pytest.raises(ConfigError) as e:
        jobs.from_table(arg)
    assert e.value.field == "d"


def test_jobs_run_of_what_are_no_jobs(tmp_path):
    exp = simfog.load(tmp_path / _exp(tmp_path))
    for arg, field in ((None, "jobs"), (5, "jobs"), (["x"], "jobs[0]"), ([exp], "jobs[0]"), ([], "jobs")):
        with pytest.raises(ConfigError) as e:
            jobs.run(arg)
        assert e.value.field == field, arg


@pytest.mark.parametrize("model", ["expectation", "timeline"])
def test_one_job_twice_is_refused_as_a_jobs_file_refuses_it(tmp_path, model):
    # jobs.run([j, j]) ran the job twice on its own nodes (slowdown 1.377 each)
    a, b = jobs.load(_jobs_file(tmp_path))
    with pytest.raises(ConfigError) as e:
        jobs.run([a, a], model=model)
    assert e.value.field == "job[1].name"
    b_on_a = type(b)("b", b.experiment, a.nodes, b.start_s)  # another name, the same nodes
    with pytest.raises(ConfigError) as e:
        jobs.run([a, b_on_a], model=model)
    assert e.value.field == "job[1].placement" and "no earlier job" in e.value.allowed


def test_a_jobs_file_still_runs(tmp_path):
    result = jobs.run(jobs.load(_jobs_file(tmp_path)))
    assert [j.name for j in result.jobs] == ["a", "b"] and result.converged


def test_with_comm_of_a_field_that_does_not_exist(tmp_path):
    exp = simfog.load(tmp_path / _exp(tmp_path))
    with pytest.raises(ConfigError) as e:
        exp.with_comm(bogus=1)
    assert e.value.field == "bogus"
    assert exp.with_comm(merge="wfbp").comm.merge == "wfbp"


# ---- a written trace loads ----

def _roofline_mlp(d: Path) -> str:
    """The MLP trace without its operators: what the roofline (and its --efficiency, --launch) estimates."""
    from dataclasses import replace

    trace = load_model_trace(MLP)
    replace(trace, layers=tuple(replace(layer, ops=()) for layer in trace.layers)).save(d / "roofline.json")
    return str(d / "roofline.json")


@pytest.mark.parametrize("flag, value", [("--samples-per-s", "1e-300"), ("--samples-per-s", "1e300"),
                                         ("--efficiency", "1e-300")])
def test_retarget_never_writes_a_trace_simfog_cannot_read(tmp_path, flag, value):
    # each wrote a trace (forward 4.6e302 ms, or layers of 0.00 ms) that load_model_trace then refused
    trace = _roofline_mlp(tmp_path) if flag == "--efficiency" else str(MLP)
    err = _check(tmp_path, ["retarget", trace, "--device", "a100", flag, value, "-o", "s.json.gz"],
                 "--samples-per-s" if flag == "--samples-per-s" else "s.json.gz")
    assert "not written" in err or "samples/s" in err


@pytest.mark.parametrize("flag, value", [("--efficiency", "0.5"), ("--launch", "40us")])
def test_retarget_refuses_the_rooflines_knobs_for_a_trace_the_learned_model_estimates(tmp_path, flag, value):
    err = _check(tmp_path, ["retarget", str(MLP), "--device", "a100", flag, value, "-o", "s.json.gz"], flag)
    assert "operators" in err and not (tmp_path / "s.json.gz").exists()


def test_retarget_at_the_edge_of_its_bounds_writes_a_trace_that_loads(tmp_path):
    # 1024 samples per 1e9 s: the longest step a trace may hold
    case = fuzz.Case("issue35", ["retarget", str(MLP), "--device", "a100", "--samples-per-s", "1.024e-6", "-o",
                                 "s.json"], may_succeed=True, output="s.json")
    assert fuzz.run_case(case, tmp_path, timeout=120).kind == "ok"
    assert load_model_trace(tmp_path / "s.json").extra["pinned_step_s"] == pytest.approx(1e9)


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_a_trace_that_would_not_load_is_not_written(tmp_path, name):
    trace = make_trace([1e302], [1.0], [10])
    with pytest.raises(ConfigError) as e:
        trace.save(tmp_path / name)
    assert e.value.field == "layers[0].forward_s[0]" and name in str(e.value)
    assert list(tmp_path.iterdir()) == []
    make_trace([1.0], [1.0], [10]).save(tmp_path / name)
    assert load_model_trace(tmp_path / name).layers[0].forward_s == (1.0,)


# ---- count lists, calibrate --nvls ----

@pytest.mark.parametrize("argv, option", [
    (["plan", "e.toml", "--gpus", "4,,8"], "--gpus"),
    (["plan", "e.toml", "--gpus", " 4"], "--gpus"),
    (["plan", "e.toml", "--nodes", "2,"], "--nodes"),
    (["plan", "e.toml", "--gpus", "4_0"], "--gpus"),
    (["sweep", "e.toml", "--jobs", "1", "--no-progress", "--ranks", "2,,4"], "--ranks"),
    (["sweep", "e.toml", "--jobs", "1", "--no-progress", "--ranks", "٤"], "--ranks"),
    (["sweep", "e.toml", "--jobs", "1", "--no-progress", "--merge", "ddp, wfbp"], "--merge"),
    (["curve", "e.toml", "--jobs", "1", "--no-progress", "--ranks", "2,4,"], "--ranks"),
    (["curve", "e.toml", "--jobs", "1", "--no-progress", "--ranks", "4_0"], "--ranks"),
])
def test_count_lists_typed_wrong_are_refused(tmp_path, argv, option):
    _exp(tmp_path)
    _check(tmp_path, argv, option)


@pytest.mark.parametrize("flags, against", [(["--gpu-arch", "volta"], "gpu_arch volta (given)"),
                                            (["--gpu-arch", "hopper", "--intra-transport", "pci"],
                                             "intra_transport pci (given)"),
                                            ([], "gpu_arch ampere (assumed)")])
def test_calibrate_nvls_where_nvls_cannot_run_warns_and_fits_without_it(tmp_path, capsys, flags, against):
    from simfog import cli, network_file

    out = tmp_path / "n.toml"
    assert cli.main(["calibrate", NET, "--model", "nccl", "--nvls", *flags, "-o", str(out)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("simfog: warning:")]
    assert any("nvls (given) needs Hopper or newer GPUs on NVSwitch" in w and against in w for w in warnings), \
        warnings
    assert network_file.load(out).nccl.nvls is False


def test_calibrate_nvls_on_hopper_nvswitch_keeps_it(tmp_path, capsys):
    from simfog import cli, network_file

    out = tmp_path / "n.toml"
    assert cli.main(["calibrate", NET, "--model", "nccl", "--nvls", "--gpu-arch", "hopper", "--intra-transport",
                     "nvswitch", "-o", str(out)]) == 0
    assert "nvls" not in capsys.readouterr().err
    assert network_file.load(out).nccl.nvls is True


# ---- the node agent's announcement ----

def _default_signals() -> None:
    # as a shell starts a foreground child: SIGINT at its default and open (see test_fuzz_cli._unblock_sigint)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_node_agent_ended_by_a_signal_removes_its_announcement(tmp_path, sig, code):
    from validate.launch.agent_request import new_secret

    secret = new_secret(tmp_path / "simfog.key")
    work = tmp_path / "shared"
    work.mkdir(mode=0o700)
    agent = subprocess.Popen(
        [sys.executable, "-m", "validate.launch.shared_dir", "--workdir", str(work), "--node", "0", "--hosts", "h0",
         "--secret-file", str(secret)], env=dict(os.environ, PYTHONPATH=str(REPO)), stderr=subprocess.PIPE,
        text=True, preexec_fn=_default_signals)
    announcement = work / "agents" / "node0.json"
    try:
        deadline = time.monotonic() + 60
        while not announcement.exists() and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert announcement.exists(), agent.stderr.read() if agent.poll() is not None else "no announcement"
        agent.send_signal(sig)
        assert agent.wait(timeout=60) == code
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert not announcement.exists()
    assert "Traceback" not in agent.stderr.read()
