"""Launching the ranks with torchrun (one agent per node, c10d rendezvous) or under Slurm (srun starts the agents).

The rank program is the same for every launcher (`validate.ranks.worker`: it reads RANK and WORLD_SIZE and joins with
env://, which torchrun's agents set up for their workers, MASTER_ADDR/MASTER_PORT pointing at the rendezvous
store). What differs is who starts it:

- "local" (validate.launch.launcher.launch): simfog starts every rank itself, inside the emulated node namespaces. The
  default on one machine.
- "torchrun": one `torchrun` agent per node, `--nnodes N --nproc-per-node G --rdzv-backend c10d
  --rdzv-endpoint HOST:PORT --rdzv-id ID --max-restarts 0`, the agents find each other through node 0's store. On
  the emulated cluster simfog starts one agent in each node namespace (node 0 hosts the store: `is_host`), so
  the rendezvous and every collective cross the shaped links. On a real cluster without Slurm, one node agent per
  host (validate.launch.shared_dir, started by the user) runs this same agent command for each launch.
- "slurm": `srun_argv` builds one `srun` line from the experiment's layout (N nodes, one task per node, each task
  a torchrun agent of G workers; the rendezvous host is the allocation's first node, `scontrol show hostnames`,
  its id the job id) to run inside an allocation (`salloc -N N` or an sbatch script). The command line is the
  contract: tests run it through a stub `srun` that starts the N tasks on this machine.

torchrun's worker ranks are contiguous per node (RANK = node rank * G + local rank), as simfog's are; which node
gets which node rank is the rendezvous' choice, which does not matter on identical nodes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import uuid

from simfog.errors import ConfigError
from validate.launch.launcher import LaunchError, RankResult, _free_port, launch

LAUNCHERS = ("local", "torchrun", "slurm")
RDZV_PORT = 29400  # torchrun's documented example port; any free port of the host node


def module_of(argv: list[str]) -> tuple[str, list[str]]:
    """(module, arguments) of a `python -m module args...` argv (validate.launch.launcher.python_rank_argv)."""
    if len(argv) < 3 or argv[1] != "-m":
        raise ConfigError("argv", argv[:3], "a `python -m module ...` command (torchrun runs modules with -m)")
    return argv[2], [str(a) for a in argv[3:]]


def torchrun_argv(nnodes: int, nproc_per_node: int, endpoint: str, run_id: str, rank_argv: list[str], *,
                  is_host: bool | None = None, local_addr: str | None = None,
                  python: str = sys.executable) -> list[str]:
    """The torchrun agent command of one node: `python -m torch.distributed.run` (what the `torchrun` script runs)
    with a c10d rendezvous at `endpoint` ("host:port"), no restarts, running `rank_argv`'s module on each of its
    `nproc_per_node` workers. `is_host`: whether this agent hosts the store (None: torchrun decides from the host
    name). `local_addr`: the address other nodes reach this one at (torchrun hands node 0's to every worker as
    MASTER_ADDR; without it, the host name, which every emulated node namespace shares)."""
    module, args = module_of(rank_argv)
    conf = [] if is_host is None else ["--rdzv-conf", f"is_host={str(is_host).lower()}"]
    conf += [] if local_addr is None else ["--local-addr", local_addr]
    return [python, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, *conf,
            "--max-restarts", "0", "-m", module, *args]


# torchrun's own report of a failed worker starts with this line (torch.distributed.elastic); what the workers
# wrote themselves comes before it
_TORCHRUN_REPORT = re.compile(r"elastic/multiprocessing/api\.py.*failed \(exitcode")


def stderr_tail(text: str, lines: int = 12) -> str:
    """The last `lines` lines a torchrun agent's workers wrote to stderr (the cause: their traceback), before
    torchrun's own report of the failure, of which only the first line is kept; indented for a message."""
    all_lines = text.rstrip().splitlines()
    start = next((i for i, line in enumerate(all_lines) if _TORCHRUN_REPORT.search(line)), None)
    keep = all_lines[-lines:] if start is None else all_lines[:start][-lines:] + [all_lines[start]]
    return "\n".join("    " + line for line in keep)


def launch_torchrun(cluster, ranks_per_node: int, rank_argv: list[str], *, env: dict | None = None,
                    timeout_s: float) -> list[RankResult]:
    """One torchrun agent per node of `cluster` (an emulated or loopback cluster of validate.cluster.netemu), each
    running `ranks_per_node` workers of `rank_argv`; waits for all as validate.launch.launcher.launch does (results per
    agent, node order; a failure names the node's agent and its workers' last stderr lines). Raises LaunchError."""
    nodes = cluster.nodes
    host = nodes[0].address if getattr(cluster, "shaped", False) else "127.0.0.1"
    port = _free_port(cluster)
    run_id = f"simfog-{uuid.uuid4().hex[:8]}"

    def agent(node_index: int, node) -> list[str]:
        return torchrun_argv(len(nodes), ranks_per_node, f"{host}:{port}", run_id, rank_argv,
                             is_host=(node.index == 0), local_addr=node.address or "127.0.0.1")

    try:
        return launch(cluster, 1, agent, env_for_rank=lambda r, node: _agent_env(env), timeout_s=timeout_s)
    except LaunchError as e:
        raise LaunchError(f"torchrun (one agent per node; 'rank' below is the node's agent): {e}", e.ranks,
                          e.results) from None


def _agent_env(env: dict | None) -> dict:
    # launch() sets RANK/WORLD_SIZE/MASTER_* for a plain rank; an agent must not pass its own to the workers it
    # starts (torchrun sets theirs), so they are cleared here; GLOO_SOCKET_IFNAME (the node's NIC) stays.
    cleared = {k: "" for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")}
    return {**cleared, **(env or {})}


def srun_argv(nodes: int, ranks_per_node: int, rank_argv: list[str], *, port: int = RDZV_PORT,
              srun: str = "srun") -> list[str]:
    """The srun line that runs `rank_argv` on `nodes` nodes x `ranks_per_node` GPUs inside a Slurm allocation: one
    task per node, each a torchrun agent; the rendezvous on the allocation's first node (scontrol show hostnames
    $SLURM_JOB_NODELIST), id $SLURM_JOB_ID; srun kills every task when one fails (--kill-on-bad-exit)."""
    for name, v in (("nodes", nodes), ("ranks_per_node", ranks_per_node)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(name, v, "an integer >= 1")
    agent = torchrun_argv(nodes, ranks_per_node, "__ENDPOINT__", "__RUNID__", rank_argv)
    script = (f'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1); '
              f'exec {shlex.join(agent)}').replace("__ENDPOINT__", f'"$head:{port}"').replace(
                  "__RUNID__", '"simfog-$SLURM_JOB_ID"')
    return [srun, f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            "--export=ALL", "bash", "-c", script]


def launch_slurm(nodes: int, ranks_per_node: int, rank_argv: list[str], *, env: dict | None = None,
                 timeout_s: float, srun: str = "srun") -> RankResult:
    """Run `srun_argv` and wait (inside an allocation; the spec and output folders must be on a filesystem every
    node sees). Returns srun's RankResult (rank -1: the whole job). Raises LaunchError when srun fails or passes
    `timeout_s` (then it is killed, and with it, by srun, every task)."""
    argv = srun_argv(nodes, ranks_per_node, rank_argv, srun=srun)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 15)
            time.sleep(2)
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait()
            code = None
        out.seek(0)
        err.seek(0)
        result = RankResult(-1, proc.returncode, out.read().decode(errors="replace"),
                            err.read().decode(errors="replace"))
    if code != 0:
        what = f"passed the {timeout_s:g} s time bound" if code is None else f"exited with code {code}"
        tail = stderr_tail(result.stderr)
        raise LaunchError(f"srun {what}: {shlex.join(argv[:6])} ...; last stderr lines:\n{tail}", (), [result])
    return result


class RealNodes:
    """The nodes of a real cluster as validate.run sees a cluster: no emulation (the network is the real one) and
    nothing started by simfog itself (srun, or the node agents of validate.launch.shared_dir, do it). `names` in
    node order; `reason` says which kind of cluster, for the run's note."""

    shaped = False

    def __init__(self, names: list[str], nic_bandwidth_Bps: float, reason: str):
        from validate.cluster.netemu import NodeSpec

        self.nodes = [NodeSpec(i, "", name, "") for i, name in enumerate(names)]
        self.nic_bandwidth_Bps = nic_bandwidth_Bps
        self.reason = reason

    def __enter__(self) -> RealNodes:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def shaper_stats(self) -> list[dict]:
        return []


def launch_ranks(cluster, ranks_per_node: int, argv: list[str], options, timeout_s: float) -> None:
    """Run `argv` (a `python -m validate.ranks.worker ...` command) on every rank with `options.launcher`
    (validate.run.Options): simfog itself ("local"), one torchrun agent per node ("torchrun": started here in the
    emulated nodes, or by the node agents of a real cluster's hosts, validate.launch.shared_dir) or srun inside a
    Slurm allocation ("slurm"). Raises LaunchError."""
    from validate.launch import launcher  # looked up at each call: tests stand in for launcher.launch

    if getattr(cluster, "agents", None) is not None:  # a real cluster's node agents (validate.launch.shared_dir)
        cluster.agents.launch([n.index for n in cluster.nodes], ranks_per_node, argv, env=rank_environment(),
                              timeout_s=timeout_s)
    elif options.launcher == "torchrun":
        launch_torchrun(cluster, ranks_per_node, argv, env=rank_environment(), timeout_s=timeout_s)
    elif options.launcher == "slurm":
        launch_slurm(len(cluster.nodes), ranks_per_node, argv, env=rank_environment(), timeout_s=timeout_s,
                     srun=options.srun)
    else:
        launcher.launch(cluster, ranks_per_node, lambda r, node: argv, env_for_rank=lambda r, node: rank_environment(),
                        timeout_s=timeout_s)


def rank_environment() -> dict:
    """The environment every rank gets: one OpenMP thread, and this checkout on its PYTHONPATH."""
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    return {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
