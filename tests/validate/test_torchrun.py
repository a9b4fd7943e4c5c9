"""Launchers on real clusters: torchrun (one agent per node, c10d rendezvous) and Slurm (srun inside an
allocation). The command lines are the contract (checked as text); both then run for real here: torchrun agents
in the emulated node namespaces (root) against the local launcher, and the srun line through a stub srun that
starts its tasks on this machine (no real Slurm was run: the stub stands in for srun and scontrol)."""

from __future__ import annotations

import csv
import shlex
import stat
import sys
import textwrap

import pytest

from validate.launch.torchrun import module_of, srun_argv, torchrun_argv, torchrun_commands

from ..conftest import make_trace
from .conftest import emulation_available

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


def test_commands_for_each_node_of_a_real_cluster():
    cmds = torchrun_commands(["gpu01", "gpu02"], 8, RANK, run_id="r1")
    assert len(cmds) == 2 and all(c.startswith("python -m torch.distributed.run --nnodes 2 --nproc-per-node 8")
                                  for c in cmds)
    assert "--rdzv-endpoint gpu01:29400" in cmds[1] and "is_host=true" in cmds[0] and "is_host=false" in cmds[1]


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
    talking over the namespace's loopback, changes it several-fold)."""
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
STUB_SCONTROL = "#!/bin/sh\n# stand-in: every node of the allocation is this machine\nfor i in 1 2; do echo 127.0.0.1; done\n"


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
    assert lines[0] == "# on gpu01:" and lines[2] == "# on gpu02:"
    assert "--rdzv-endpoint gpu01:29400" in lines[3] and lines[3].endswith("/shared/r/spec.json /shared/r/ranks")
    assert "does not yet write that run's spec" in err
    assert main(["validate", str(exp), "--launcher", "torchrun", "--print-commands", "--hosts", "gpu01"]) == 2
