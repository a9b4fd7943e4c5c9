"""Launching on a real cluster without Slurm: one node agent per host, driven through a folder every node sees.

The user makes a secret once (`python -m validate.launch.shared_dir --new-secret FILE`, readable by the user only;
the same file on every host: a shared home, or copied), then starts one agent on each node, before or while
`simfog validate --launcher torchrun --hosts h0,h1,... --workdir DIR --secret-file FILE` runs (the validator prints
the exact commands, and `--print-commands` prints them alone):

    python -m validate.launch.shared_dir --workdir DIR --node I --hosts h0,h1,... --port P --secret-file FILE

Each validation is a run of its own: the validator makes DIR/launches/<run>/ and points DIR/launches/current.json
at it. Every launch of the validation (the calibration microbenchmarks of each link class, then the training runs)
is one request file there, launch-<k>.json: the nodes it runs on, workers per node and the rank program
(validate.launch.agent_request). Each agent takes the current run's requests in order; an agent whose node takes
part runs one torchrun agent (validate.launch.torchrun.torchrun_argv: c10d rendezvous at the first of those nodes'
hosts and the agent's --port, `nproc_per_node` workers of the rank program, the same as under Slurm), then writes
launch-<k>.node<I>.json with its exit code and last stderr lines; a node that does not take part writes that file
at once, and a request refused (not signed with the secret, another program, an argument or variable not allowed,
a path outside DIR, a file another user can write) gets that file with the reason, the agent living on. The
validator waits for every node's file (or its time bound), and when it is done writes `stop` in the run's folder,
on which the agents exit. An agent started while current.json still names a finished run waits for the next one.

Every file is a message signed with the secret (validate.launch.agent_request), read only when no other user can
write it or a folder above it, and written whole under a random temporary name, then renamed
(validate.launch.private_files). Each agent writes DIR/agents/node<I>.json while it runs (its host, Python, --hosts,
--port and a nonce drawn at start, which every request must carry; removed when it exits), which is how the
validator knows that every node is there before it sends the first request. The agent's loop is
validate.launch.node_agent; this module is the validator's side and the agent's command line.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import uuid
from pathlib import Path

from simfog.errors import ConfigError
from validate.launch.agent_request import load_secret, new_secret, parse_request, read_message, request_args, seal
from validate.launch.launcher import LaunchError, RankResult
from validate.launch.node_agent import POLL_S, NodeAgent, run_agent
from validate.launch.private_files import make_folder, open_workdir, write_private
from validate.launch.torchrun import RDZV_PORT, RealNodes, module_of

__all__ = ["AgentNodes", "NodeAgent", "SharedDirLauncher", "agent_commands", "main", "run_agent"]


def agent_commands(hosts: list[str], workdir: str, *, secret_file: str, port: int = RDZV_PORT,
                   python: str = "python") -> list[str]:
    """The command to start on each host (one node agent each), in host order."""
    hosts_arg = ",".join(hosts)
    return [shlex.join([python, "-m", "validate.launch.shared_dir", "--workdir", workdir, "--node", str(i),
                        "--hosts", hosts_arg, "--port", str(port), "--secret-file", secret_file])
            for i in range(len(hosts))]


class AgentNodes(RealNodes):
    """The hosts of a real cluster whose node agents run the launches (`agents`, a SharedDirLauncher signing with
    the secret in `secret_file`); leaving the block tells the agents to exit."""

    def __init__(self, hosts: list[str], nic_bandwidth_Bps: float, workdir: str | Path, *, secret_file: str | None,
                 port: int = RDZV_PORT, log=None):
        if not secret_file:
            raise ConfigError("--secret-file", "(missing)", "with --hosts: the node agents' secret (make one with "
                              "`python -m validate.launch.shared_dir --new-secret FILE`)")
        super().__init__(list(hosts), nic_bandwidth_Bps, "a real cluster through node agents (torchrun on each host)")
        self.agents = SharedDirLauncher(workdir, hosts, secret=load_secret(secret_file), port=port,
                                        secret_file=secret_file, **({"log": log} if log else {}))

    def __exit__(self, *exc) -> None:
        self.agents.stop()


class SharedDirLauncher:
    """The validator's side: sends launch requests, signed with `secret`, to the agents of `hosts` through `workdir`
    and waits for them.

    `agents_timeout_s`: how long to wait for every agent to have started (their commands, naming `secret_file`, are
    printed through `log` once, at the first launch)."""

    def __init__(self, workdir: str | Path, hosts: list[str], *, secret: bytes, port: int = RDZV_PORT,
                 secret_file: str = "SECRET_FILE", agents_timeout_s: float = 600.0,
                 log=lambda s: print(s, file=sys.stderr, flush=True)):
        if not workdir:
            raise ConfigError("--workdir", "(missing)", "a folder every host sees (the agents read the launch "
                              "requests there and the ranks write their records there)")
        self.dir = open_workdir(workdir)
        self.hosts, self.port, self.agents_timeout_s, self.log = list(hosts), port, agents_timeout_s, log
        self.secret, self.secret_file = secret, secret_file
        self.run = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.launches = self.dir / "launches" / self.run
        make_folder(self.dir, self.launches)
        write_private(self.dir / "launches" / "current.json", seal("current", {"run": self.run}, secret), self.dir)
        self.k = 0
        self._nonces: list[str] | None = None

    def wait_for_agents(self) -> None:
        """Return once every host's agent has announced itself; raise LaunchError after agents_timeout_s, or at once
        for an announcement refused (not signed with this secret, another --hosts or --port)."""
        if self._nonces is not None:
            return
        nonces = self._announced()
        if len(nonces) < len(self.hosts):
            cmds = agent_commands(self.hosts, str(self.dir), secret_file=self.secret_file, port=self.port)
            self.log("waiting for the node agents: start this on each host (the repository and its Python "
                     "environment at the same path on every host, and the secret file):\n"
                     + "\n".join(f"  # on {h}:\n  {c}" for h, c in zip(self.hosts, cmds, strict=True)))
        deadline = time.monotonic() + self.agents_timeout_s
        while len(nonces) < len(self.hosts) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            nonces = self._announced()
        missing = [i for i in range(len(self.hosts)) if i not in nonces]
        if missing:
            raise LaunchError(f"no node agent started on {', '.join(self.hosts[i] for i in missing)} within "
                              f"{self.agents_timeout_s:g} s (their commands are printed above)", tuple(missing), [])
        self._nonces = [nonces[i] for i in range(len(self.hosts))]

    def _announced(self) -> dict[int, str]:
        """The nonces of the agents that announced themselves, by node."""
        nonces = {}
        for i, host in enumerate(self.hosts):
            path = self.dir / "agents" / f"node{i}.json"
            try:
                body = read_message(path, "agent", self.secret, self.dir)
            except ConfigError as e:
                raise LaunchError(f"node {i} ({host}): its agent's announcement was refused: {e}", (i,), []) from None
            if body is None:
                continue
            if (body.get("node"), body.get("hosts"), body.get("port")) != (i, self.hosts, self.port) or \
                    not isinstance(body.get("nonce"), str):
                raise LaunchError(f"node {i} ({host}): its agent runs with --node {body.get('node')!r} --hosts "
                                  f"{body.get('hosts')!r} --port {body.get('port')!r}, this validation with "
                                  f"--node {i} --hosts {self.hosts!r} --port {self.port}: restart it with the "
                                  "printed command", (i,), [])
            nonces[i] = body["nonce"]
        return nonces

    def launch(self, nodes: list[int], nproc_per_node: int, rank_argv: list[str], *, env: dict | None = None,
               timeout_s: float) -> list[RankResult]:
        """Run `rank_argv` as `nproc_per_node` torchrun workers on each of `nodes` (indices into hosts) and wait.
        `env` may hold PYTHONPATH (each agent sets its own repository's instead) and agent_request.ENV keys.
        Returns one RankResult per node (its agent's torchrun: rank = node index). Raises LaunchError naming the
        nodes whose torchrun failed (exit code, last stderr lines), that refused the request, or that passed
        `timeout_s`; ConfigError for a program, argument or variable the agents do not take."""
        self.wait_for_agents()
        module, args = module_of(rank_argv)
        k = self.k
        body = {"run": self.run, "k": k, "nodes": list(nodes), "nproc_per_node": nproc_per_node, "module": module,
                "args": request_args(module, args, self.dir), "agents": self._nonces,
                "env": {key: v for key, v in (env or {}).items() if key != "PYTHONPATH"}}
        request = parse_request(body, len(self.hosts))  # what the agents will check, checked before sending
        write_private(self.launches / f"launch-{k}.json", seal("request", request.body(), self.secret), self.dir)
        self.k += 1
        deadline = time.monotonic() + timeout_s
        done: dict[int, dict] = {}
        while len(done) < len(self.hosts) and time.monotonic() < deadline:
            for i in range(len(self.hosts)):
                if i not in done and (d := self._report(k, i)) is not None:
                    done[i] = d
            if len(done) < len(self.hosts):
                time.sleep(POLL_S)
        return self._results(k, nodes, done, timeout_s)

    def _report(self, k: int, node: int) -> dict | None:
        """Node `node`'s answer to launch k ({"rc", "stderr", "error"}), None while it has none."""
        path = self.launches / f"launch-{k}.node{node}.json"
        try:
            body = read_message(path, "report", self.secret, self.dir)
        except ConfigError as e:
            return {"rc": None, "stderr": "", "error": f"its report was refused: {e}"}
        if body is None:
            return None
        rc = body.get("rc")
        if (body.get("run"), body.get("k"), body.get("node")) != (self.run, k, node) or isinstance(rc, bool) or \
                not isinstance(rc, int | None) or not isinstance(body.get("stderr"), str) or \
                not isinstance(body.get("error"), str):
            return {"rc": None, "stderr": "", "error": f"its report {path} is not one for this launch"}
        return body

    def _results(self, k: int, nodes: list[int], done: dict[int, dict], timeout_s: float) -> list[RankResult]:
        results = [RankResult(i, done[i]["rc"] if i in done else None, "", done.get(i, {}).get("stderr", ""))
                   for i in nodes]
        late = [i for i in range(len(self.hosts)) if i not in done]
        refused = [i for i in range(len(self.hosts)) if i in done and done[i]["error"]]
        failed = [r.rank for r in results if r.returncode not in (0, None)]
        if failed or refused or late:
            parts = [f"node {i} ({self.hosts[i]}) torchrun exited with code {done[i]['rc']}; last stderr lines:\n"
                     + done[i]["stderr"] for i in failed]
            parts += [f"node {i} ({self.hosts[i]}) refused launch {k}: {done[i]['error']}" for i in refused]
            parts += [f"node {i} ({self.hosts[i]}) did not finish launch {k} within {timeout_s:g} s" for i in late]
            raise LaunchError("; ".join(parts), tuple(failed + refused + late), results)
        return results

    def stop(self) -> None:
        """Tell the agents to exit (the validation is over)."""
        write_private(self.launches / "stop", seal("stop", {"run": self.run}, self.secret), self.dir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="simfog's node agent: runs this node's part of each launch that "
                                            "`simfog validate --launcher torchrun --hosts ...` requests")
    p.add_argument("--workdir", help="the folder every host sees (the validator's --workdir)")
    p.add_argument("--node", type=int, help="this host's index in --hosts")
    p.add_argument("--hosts", help="comma-separated host names, in node order")
    p.add_argument("--port", type=int, default=RDZV_PORT, help=f"rendezvous port (default {RDZV_PORT})")
    p.add_argument("--secret-file", help="the secret shared with the validator (its --secret-file)")
    p.add_argument("--new-secret", metavar="FILE", help="make a new secret in FILE (readable by you only) and exit")
    a = p.parse_args(argv)
    try:
        if a.new_secret:
            print(f"wrote a new secret to {new_secret(a.new_secret)}; give it to every agent and to simfog "
                  "validate as --secret-file", file=sys.stderr)
            return 0
        missing = [o for o, v in (("--workdir", a.workdir), ("--node", a.node), ("--hosts", a.hosts),
                                  ("--secret-file", a.secret_file)) if v is None]
        if missing:
            p.error(f"the agent needs {', '.join(missing)} (or --new-secret FILE alone)")
        hosts = [h for h in a.hosts.split(",") if h]
        if not 0 <= a.node < len(hosts):
            p.error(f"--node {a.node}: an index into the {len(hosts)} hosts")
        return run_agent(a.workdir, a.node, hosts, secret=load_secret(a.secret_file), port=a.port)
    except (ConfigError, OSError) as e:
        print(f"node agent: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
