"""Launchers on real clusters: torchrun (one agent per node, c10d rendezvous) and Slurm (srun inside an
allocation). The command lines are the contract (checked as text); both then run for real here: torchrun agents
in the emulated node namespaces (root) against the local launcher, and the srun line through a stub srun that
starts its tasks on this machine (no real Slurm was run: the stub stands in for srun and scontrol)."""

from __future__ import annotations

import csv
import json
import shlex
import stat
import sys
import textwrap
import time

import pytest

from validate.launch.shared_dir import agent_commands
from validate.launch.shared_dir import main as agent_main
from validate.launch.torchrun import module_of, srun_argv, torchrun_argv

from ..conftest import make_trace
from .conftest import emulation_available, skip_timing_if_host_limited

RANK = [sys.executable, "-m", "validate.ranks.worker", "/shared/spec.json", "/shared/ranks"]


def test_torchrun_agent_command():
    argv = torchrun_argv(4, 8, "10.0.0.1:29400", "job7", RANK, is_host=False, local_addr="10.0.0.2")
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    text = shlex.join(argv[3:])
    assert text == ("--nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 --rdzv-id job7 "
                    "--rdzv-conf is_host=false --local-addr 10.0.0.2 --max-restarts 0 -m validate.ranks.worker "
                    "/shared/spec.json /shared/ranks")
    with pytest.raises(Exception, match="argv"):
        module_of(["python", "script.py"])


def test_node_agent_commands_for_each_host_of_a_real_cluster():
    cmds = agent_commands(["gpu01", "gpu02"], "/shared/r", secret_file="/home/u/simfog.key", port=29500)
    assert cmds == [f"python -m validate.launch.shared_dir --workdir /shared/r --node {i} --hosts gpu01,gpu02 "
                    f"--port 29500 --secret-file /home/u/simfog.key" for i in (0, 1)]


def test_srun_line():
    argv = srun_argv(16, 8, RANK)
    assert argv[:7] == ["srun", "--nodes=16", "--ntasks=16", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                        "--export=ALL", "bash"]
    script = argv[-1]
    assert script.startswith('head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1); exec ')
    assert '--rdzv-endpoint "$head:29400" --rdzv-id "simfog-$SLURM_JOB_ID"' in script
    assert "--nnodes 16 --nproc-per-node 8" in script and script.endswith("/shared/spec.json /shared/ranks")


def _experiment(tmp_path, nodes=2, gpus=2):
    trace = make_trace([3e-3] * 6, [6e-3] * 6, [65536] * 6)
    trace.save(tmp_path / "trace.json")
    (tmp_path / "exp.toml").write_text(
        f'seed = 3\niterations = 4\n[workload]\ntrace = "trace.json"\ncompute = "mean"\n'
        f'[cluster]\nnodes = {nodes}\ngpus_per_node = {gpus}\nnic_bandwidth = "1Gbit/s"\n[comm]\nmerge = "wfbp"\n')
    return tmp_path / "exp.toml"


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


MEASURED = ("measured_iteration_s", "measured_backward_s", "measured_comm_s")


@pytest.mark.root
def test_torchrun_agents_per_emulated_node_measure_what_the_local_launcher_does(tmp_path):
    """2 nodes x 2 ranks over shaped links, the same configuration through --launcher torchrun and the default
    local launcher: same columns, every run succeeds, measured iteration times within 25 % of each other (this
    machine's run-to-run noise on such a short replay is a few %; a launcher that broke the layout, e.g. ranks
    talking over the namespace's loopback, changes it several-fold). On a HOST-LIMITED host the times are not
    compared."""
    ok, why = emulation_available()
    if not ok:
        pytest.skip(f"no emulated cluster here: {why}")
    from simfog.cli import main

    exp = _experiment(tmp_path)
    for launcher in ("torchrun", "local"):
        assert main(["validate", str(exp), "--emulate", "--launcher", launcher, "--csv",
                     str(tmp_path / f"{launcher}.csv")]) == 0
    t, loc = _rows(tmp_path / "torchrun.csv")[0], _rows(tmp_path / "local.csv")[0]
    assert t.keys() == loc.keys()
    assert (t["error"], loc["error"], t["buckets_match"], t["emulated"]) == ("", "", "True", "True")
    skip_timing_if_host_limited(t, loc)
    for key in MEASURED:
        a, b = float(t[key]), float(loc[key])
        assert a > 0 and b > 0 and abs(a - b) / b < 0.25, (key, a, b)


STUB_SRUN = textwrap.dedent('''\
    #!{python}
    """Stand-in for srun: runs `bash -c SCRIPT` once per node, at once, with the variables srun sets; fails like
    srun --kill-on-bad-exit (all tasks stopped when one fails)."""
    import os, subprocess, sys
    args = sys.argv[1:]
    nodes = int(next(a for a in args if a.startswith("--nodes=")).split("=")[1])
    cmd = args[args.index("bash"):]
    procs = [subprocess.Popen(cmd, env={{**os.environ, "SLURM_JOB_ID": "4242", "SLURM_NODEID": str(i),
                                        "SLURM_PROCID": str(i), "SLURM_JOB_NODELIST": "stub[0-%d]" % (nodes - 1)}})
             for i in range(nodes)]
    codes = [p.wait() for p in procs]
    sys.exit(max(codes))
    ''')
STUB_SCONTROL = ("#!/bin/sh\n# stand-in: every node of the allocation is this machine\n"
                 "for i in 1 2; do echo 127.0.0.1; done\n")


def test_slurm_launcher_through_a_stub_srun(tmp_path, monkeypatch):
    """`--launcher slurm` builds its srun line and runs calibration and training through it; the stub starts the
    two tasks (torchrun agents) here. Rows come back complete, not emulated, saying how they were launched."""
    pytest.importorskip("torch")
    from simfog.cli import main

    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in (("srun", STUB_SRUN.format(python=sys.executable)), ("scontrol", STUB_SCONTROL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod((stubs / name).stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{stubs}:{__import__('os').environ['PATH']}")
    exp = _experiment(tmp_path)
    work = tmp_path / "shared"
    rc = main(["validate", str(exp), "--launcher", "slurm", "--workdir", str(work), "--csv", str(tmp_path / "s.csv")])
    assert rc == 0
    row = _rows(tmp_path / "s.csv")[0]
    assert row["error"] == "" and row["emulated"] == "False" and row["buckets_match"] == "True"
    assert float(row["measured_iteration_s"]) > 0
    assert sorted(p.name for p in (work / "ranks").iterdir()) == [f"rank{r}.json" for r in range(4)]


def test_slurm_needs_a_shared_workdir(tmp_path):
    from simfog.cli import main

    assert main(["validate", str(_experiment(tmp_path)), "--launcher", "slurm"]) == 2


def test_print_commands_for_a_real_cluster(tmp_path, capsys):
    from simfog.cli import main

    exp = _experiment(tmp_path)
    assert main(["validate", str(exp), "--launcher", "torchrun", "--print-commands", "--hosts", "gpu01,gpu02",
                 "--workdir", "/shared/r"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines == ["# on gpu01:", "python -m validate.launch.shared_dir --workdir /shared/r --node 0 --hosts "
                     "gpu01,gpu02 --port 29400 --secret-file SECRET_FILE", "# on gpu02:", "python -m "
                     "validate.launch.shared_dir --workdir /shared/r --node 1 --hosts gpu01,gpu02 --port 29400 "
                     "--secret-file SECRET_FILE"]
    assert "--launcher torchrun --hosts gpu01,gpu02 --workdir /shared/r --secret-file SECRET_FILE" in err
    assert "--new-secret SECRET_FILE" in err
    # with a secret file: its path in every command; one that others can read is refused before anything runs
    key = tmp_path / "simfog.key"
    assert agent_main(["--new-secret", str(key)]) == 0
    assert main(["validate", str(exp), "--launcher", "torchrun", "--print-commands", "--hosts", "gpu01,gpu02",
                 "--workdir", "/shared/r", "--secret-file", str(key)]) == 0
    out, err = capsys.readouterr()
    assert [line.endswith(f"--port 29400 --secret-file {key}") for line in out.splitlines()] == [False, True] * 2
    assert f"--workdir /shared/r --secret-file {key}" in err
    key.chmod(0o644)
    assert main(["validate", str(exp), "--launcher", "torchrun", "--print-commands", "--hosts", "gpu01,gpu02",
                 "--workdir", "/shared/r", "--secret-file", str(key)]) == 2
    assert "only you can read and write" in capsys.readouterr().err
    assert main(["validate", str(exp), "--launcher", "torchrun", "--print-commands", "--hosts", "gpu01"]) == 2
    assert main(["validate", str(exp), "--launcher", "slurm", "--hosts", "gpu01,gpu02", "--workdir", "/x"]) == 2
    assert main(["validate", str(exp), "--launcher", "torchrun", "--hosts", "gpu01,gpu02"]) == 2  # no --workdir
    assert main(["validate", str(exp), "--launcher", "torchrun", "--hosts", "gpu01,gpu02", "--workdir",
                 str(tmp_path / "w")]) == 2  # no --secret-file
    assert "--secret-file = '(missing)'" in capsys.readouterr().err


def test_torchrun_on_hosts_through_node_agents(tmp_path, capsys):
    """A real cluster without Slurm, played on this machine: two hosts (both 127.0.0.1), the node-agent commands
    that --print-commands gives started as a user would, then `--launcher torchrun --hosts` runs the calibration
    and the training through them and compares; the agents exit when it is done."""
    pytest.importorskip("torch")
    import os
    import subprocess
    from pathlib import Path

    from simfog.cli import main
    from validate.collect.collect_network import free_port

    exp, work, port, key = _experiment(tmp_path), tmp_path / "shared", str(free_port()), tmp_path / "simfog.key"
    assert agent_main(["--new-secret", str(key)]) == 0
    hosts = ["--launcher", "torchrun", "--hosts", "127.0.0.1,127.0.0.1", "--workdir", str(work), "--rdzv-port", port,
             "--secret-file", str(key)]
    assert main(["validate", str(exp), *hosts, "--print-commands"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    agents = [subprocess.Popen([sys.executable, *shlex.split(c)[1:]], env=env, cwd=repo,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
    try:
        assert main(["validate", str(exp), *hosts, "--csv", str(tmp_path / "h.csv")]) == 0
        codes = [a.wait(timeout=30) for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert codes == [0, 0], [a.stderr.read() for a in agents]
    row = _rows(tmp_path / "h.csv")[0]
    assert row["error"] == "" and row["emulated"] == "False" and row["buckets_match"] == "True"
    assert float(row["measured_iteration_s"]) > 0
    assert "not emulated: a real cluster through node agents" in capsys.readouterr().err
    assert sorted(p.name for p in (work / "ranks").iterdir()) == [f"rank{r}.json" for r in range(4)]
    # calibration: the NIC class on both hosts, the intra class on the first only; then the training run
    run = work / "launches" / json.loads((work / "launches" / "current.json").read_text())["body"]["run"]
    launches = [json.loads((run / f"launch-{k}.json").read_text())["body"]["nodes"] for k in range(3)]
    assert launches == [[0, 1], [0], [0, 1]] and (run / "stop").exists()
    assert not list((work / "agents").iterdir())   # each agent removed its announcement on leaving


def test_node_agents_report_failures_and_absence(tmp_path):
    """A launch whose program fails names the node, its exit code and its stderr (a program the agents do not run
    is refused before it is sent); a host with no agent is named once the wait for agents runs out; the agents exit
    on stop."""
    pytest.importorskip("torch")
    import threading

    from simfog.errors import ConfigError
    from validate.collect.collect_network import free_port
    from validate.launch.launcher import LaunchError
    from validate.launch.shared_dir import SharedDirLauncher, run_agent

    hosts, port, secret = ["127.0.0.1"], free_port(), b"a test secret of 32 characters."
    launcher = SharedDirLauncher(tmp_path, hosts, secret=secret, port=port, log=lambda s: None)
    codes = []
    agent = threading.Thread(target=lambda: codes.append(run_agent(tmp_path, 0, hosts, secret=secret, port=port)))
    agent.start()
    (tmp_path / "spec.json").write_text("not a spec")
    (tmp_path / "ranks").mkdir()
    try:
        with pytest.raises(ConfigError, match="no_such_module"):
            launcher.launch([0], 1, [sys.executable, "-m", "validate.no_such_module"], timeout_s=120)
        with pytest.raises(LaunchError, match=r"node 0 \(127.0.0.1\) torchrun exited with code [1-9]") as e:
            launcher.launch([0], 1, [sys.executable, "-m", "validate.ranks.worker", str(tmp_path / "spec.json"),
                                     str(tmp_path / "ranks")], timeout_s=120)
        assert "JSONDecodeError" in str(e.value)
    finally:
        launcher.stop()
        agent.join(timeout=30)
    assert codes == [0]
    # an agent started after that run ended waits for the next run instead of taking the old one's stop
    late = threading.Thread(target=lambda: codes.append(run_agent(tmp_path, 0, hosts, secret=secret, port=port)))
    late.start()
    time.sleep(1.0)
    assert late.is_alive()
    second = SharedDirLauncher(tmp_path, hosts, secret=secret, port=port, log=lambda s: None)
    time.sleep(2.0)  # the agent (polling every 0.2 s) takes the new run before it is stopped
    second.stop()
    late.join(timeout=30)
    assert codes == [0, 0]
    absent = SharedDirLauncher(tmp_path / "other", ["gpu01", "gpu02"], secret=secret, agents_timeout_s=0.3,
                               log=lambda s: None)
    with pytest.raises(LaunchError, match="no node agent started on gpu01, gpu02 within 0.3 s"):
        absent.launch([0, 1], 1, RANK, timeout_s=1)


def test_stderr_tail_keeps_the_workers_cause_before_torchrun_s_report():
    from validate.launch.torchrun import stderr_tail

    text = ("w1\nModuleNotFoundError: no x\nE1126 06:47:14.794000 1 torch/distributed/elastic/multiprocessing/"
            "api.py:1002] failed (exitcode: 1) local_rank: 0\nTraceback (most recent call last):\n  File run.py\n"
            + "boiler\n" * 30)
    assert stderr_tail(text).splitlines() == ["    w1", "    ModuleNotFoundError: no x",
                                              "    E1126 06:47:14.794000 1 torch/distributed/elastic/multiprocessing/"
                                              "api.py:1002] failed (exitcode: 1) local_rank: 0"]
    assert stderr_tail("a\nb\nc", lines=2) == "    b\n    c"
