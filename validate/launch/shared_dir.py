"""Launching on a real cluster without Slurm: one node agent per host, driven through a folder every node sees.

The user starts one agent on each node, once, before or while `simfog validate --launcher torchrun --hosts
h0,h1,... --workdir DIR` runs (the validator prints the exact commands, and `--print-commands` prints them alone):

    python -m validate.launch.shared_dir --workdir DIR --node I --hosts h0,h1,...

Each validation is a run of its own: the validator makes DIR/launches/<run>/ and points DIR/launches/current.json
at it. Every launch of the validation (the calibration microbenchmarks of each link class, then the training runs)
is one request file there, launch-<k>.json: the nodes it runs on, the rendezvous endpoint (the first of those
nodes' hosts, `port`), its id and the rank program. Each agent takes the current run's requests in order; an agent
whose node takes part runs one torchrun agent (validate.launch.torchrun.torchrun_argv: c10d rendezvous,
`nproc_per_node` workers of the rank program, the same as under Slurm), then writes launch-<k>.node<I>.json with
its exit code and last stderr lines; a node that does not take part writes that file at once. The validator waits
for every node's file (or its time bound), and when it is done writes `stop` in the run's folder, on which the
agents exit. An agent started while current.json still names a finished run waits for the next one. Files are
written whole (a temporary name, then rename), so a reader never sees half of one.

Each agent writes DIR/agents/node<I>.json while it runs (its host and Python; removed when it exits), which is how
the validator knows that every node is there before it sends the first request.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from simfog.errors import ConfigError
from validate.launch.launcher import LaunchError, RankResult
from validate.launch.torchrun import RDZV_PORT, RealNodes, module_of, stderr_tail, torchrun_argv

POLL_S = 0.2


def agent_commands(hosts: list[str], workdir: str, *, port: int = RDZV_PORT, python: str = "python") -> list[str]:
    """The command to start on each host (one node agent each), in host order."""
    hosts_arg = ",".join(hosts)
    return [shlex.join([python, "-m", "validate.launch.shared_dir", "--workdir", workdir, "--node", str(i),
                        "--hosts", hosts_arg, "--port", str(port)]) for i in range(len(hosts))]


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class AgentNodes(RealNodes):
    """The hosts of a real cluster whose node agents run the launches (`agents`, a SharedDirLauncher); leaving the
    block tells the agents to exit."""

    def __init__(self, hosts: list[str], nic_bandwidth_Bps: float, workdir: str | Path, *, port: int = RDZV_PORT,
                 log=None):
        super().__init__(list(hosts), nic_bandwidth_Bps, "a real cluster through node agents (torchrun on each host)")
        self.agents = SharedDirLauncher(workdir, hosts, port=port, **({"log": log} if log else {}))

    def __exit__(self, *exc) -> None:
        self.agents.stop()


class SharedDirLauncher:
    """The validator's side: sends launch requests to the agents of `hosts` through `workdir` and waits for them.

    `agents_timeout_s`: how long to wait for every agent to have started (their commands are printed through `log`
    once, at the first launch)."""

    def __init__(self, workdir: str | Path, hosts: list[str], *, port: int = RDZV_PORT,
                 agents_timeout_s: float = 600.0, log=lambda s: print(s, file=sys.stderr, flush=True)):
        if not workdir:
            raise ConfigError("--workdir", "(missing)", "a folder every host sees (the agents read the launch "
                              "requests there and the ranks write their records there)")
        self.dir = Path(workdir).resolve()
        self.hosts, self.port, self.agents_timeout_s, self.log = list(hosts), port, agents_timeout_s, log
        self.run = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.launches = self.dir / "launches" / self.run
        self.launches.mkdir(parents=True)
        _write(self.dir / "launches" / "current.json", {"run": self.run})
        self.k = 0
        self._agents_seen = False

    def wait_for_agents(self) -> None:
        """Return once every host's agent has announced itself; raise LaunchError after agents_timeout_s."""
        if self._agents_seen:
            return
        missing = self._missing_agents()
        if missing:
            cmds = agent_commands(self.hosts, str(self.dir), port=self.port)
            self.log("waiting for the node agents: start this on each host (the repository and its Python "
                     "environment at the same path on every host):\n"
                     + "\n".join(f"  # on {h}:\n  {c}" for h, c in zip(self.hosts, cmds, strict=True)))
        deadline = time.monotonic() + self.agents_timeout_s
        while missing and time.monotonic() < deadline:
            time.sleep(POLL_S)
            missing = self._missing_agents()
        if missing:
            raise LaunchError(f"no node agent started on {', '.join(self.hosts[i] for i in missing)} within "
                              f"{self.agents_timeout_s:g} s (their commands are printed above)", tuple(missing), [])
        self._agents_seen = True

    def _missing_agents(self) -> list[int]:
        return [i for i in range(len(self.hosts)) if _read(self.dir / "agents" / f"node{i}.json") is None]

    def launch(self, nodes: list[int], nproc_per_node: int, rank_argv: list[str], *, env: dict | None = None,
               timeout_s: float) -> list[RankResult]:
        """Run `rank_argv` as `nproc_per_node` torchrun workers on each of `nodes` (indices into hosts) and wait.
        Returns one RankResult per node (its agent's torchrun: rank = node index). Raises LaunchError naming the
        nodes whose torchrun failed (exit code, last stderr lines) or that passed `timeout_s`."""
        self.wait_for_agents()
        module, args = module_of(rank_argv)
        k, self.k = self.k, self.k + 1
        request = {"k": k, "nodes": list(nodes), "nproc_per_node": nproc_per_node, "module": module, "args": args,
                   "endpoint": f"{self.hosts[nodes[0]]}:{self.port}", "run_id": f"simfog-{self.run}-{k}",
                   "env": dict(env or {})}
        _write(self.launches / f"launch-{k}.json", request)
        deadline = time.monotonic() + timeout_s
        done: dict[int, dict] = {}
        while len(done) < len(self.hosts) and time.monotonic() < deadline:
            for i in range(len(self.hosts)):
                if i not in done and (d := _read(self.launches / f"launch-{k}.node{i}.json")) is not None:
                    done[i] = d
            if len(done) < len(self.hosts):
                time.sleep(POLL_S)
        results = [RankResult(i, done[i]["rc"] if i in done else None, "", done.get(i, {}).get("stderr", ""))
                   for i in nodes]
        late = [i for i in range(len(self.hosts)) if i not in done]
        failed = [r.rank for r in results if r.returncode not in (0, None)]
        if failed or late:
            parts = [f"node {i} ({self.hosts[i]}) torchrun exited with code {done[i]['rc']}; last stderr lines:\n"
                     + done[i].get("stderr", "") for i in failed]
            parts += [f"node {i} ({self.hosts[i]}) did not finish launch {k} within {timeout_s:g} s" for i in late]
            raise LaunchError("; ".join(parts), tuple(failed + late), results)
        return results

    def stop(self) -> None:
        """Tell the agents to exit (the validation is over)."""
        _write(self.launches / "stop", {"stopped": time.time()})


def run_agent(workdir: str | Path, node: int, hosts: list[str], *, port: int = RDZV_PORT,
              idle_timeout_s: float = 24 * 3600.0) -> int:
    """The agent loop of node `node` (see the module docstring): returns 0 once its run is stopped, 1 after
    `idle_timeout_s` without a request."""
    root = Path(workdir).resolve()
    announced = root / "agents" / f"node{node}.json"
    _write(announced, {"host": socket.gethostname(), "python": sys.executable, "pid": os.getpid(),
                       "started": time.time()})
    run, k, idle_since = None, 0, time.monotonic()
    try:
        while True:
            current = (_read(root / "launches" / "current.json") or {}).get("run")
            if current is not None and current != run:
                if run is None and (root / "launches" / current / "stop").exists():
                    current = None  # a finished run, from before this agent: wait for the next
                else:
                    run, k = current, 0
            folder = root / "launches" / run if run is not None else None
            request = _read(folder / f"launch-{k}.json") if folder is not None else None
            if request is None:
                if folder is not None and (folder / "stop").exists():
                    return 0
                if time.monotonic() - idle_since > idle_timeout_s:
                    return 1
                time.sleep(POLL_S)
                continue
            result = {"rc": 0, "stderr": ""}
            if node in request["nodes"]:
                result = _run_torchrun(request, node, port)
            _write(folder / f"launch-{k}.node{node}.json", result)
            k, idle_since = k + 1, time.monotonic()
    finally:
        announced.unlink(missing_ok=True)


def _run_torchrun(request: dict, node: int, port: int) -> dict:
    nodes = request["nodes"]
    argv = torchrun_argv(len(nodes), request["nproc_per_node"], request["endpoint"], request["run_id"],
                         [sys.executable, "-m", request["module"], *request["args"]], is_host=(node == nodes[0]),
                         python=sys.executable)
    env = {**os.environ, **request.get("env", {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        env.pop(key, None)  # torchrun sets its workers' own
    with tempfile.TemporaryFile() as err:
        code = subprocess.call(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
        err.seek(0)
        return {"rc": code, "stderr": stderr_tail(err.read().decode(errors="replace"))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="simfog's node agent: runs this node's part of each launch that "
                                            "`simfog validate --launcher torchrun --hosts ...` requests")
    p.add_argument("--workdir", required=True, help="the folder every host sees (the validator's --workdir)")
    p.add_argument("--node", type=int, required=True, help="this host's index in --hosts")
    p.add_argument("--hosts", required=True, help="comma-separated host names, in node order")
    p.add_argument("--port", type=int, default=RDZV_PORT, help=f"rendezvous port (default {RDZV_PORT})")
    a = p.parse_args(argv)
    hosts = [h for h in a.hosts.split(",") if h]
    if not 0 <= a.node < len(hosts):
        p.error(f"--node {a.node}: an index into the {len(hosts)} hosts")
    return run_agent(a.workdir, a.node, hosts, port=a.port)


if __name__ == "__main__":
    raise SystemExit(main())
