"""A node agent (see validate.launch.shared_dir, whose `python -m` runs it): follows the workdir's current run and
answers its launch requests in order, each checked (validate.launch.agent_request) before its node's torchrun runs
the rank program; a request refused is answered with the reason, and the agent goes on."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from simfog.errors import ConfigError
from validate.launch.agent_request import (
    LaunchRequest,
    RequestError,
    parse_request,
    rank_argv,
    rank_env,
    read_message,
    run_name,
    seal,
    unseal,
)
from validate.launch.private_files import (
    check_folder,
    check_folders_down,
    make_folder,
    open_workdir,
    read_private,
    write_private,
)
from validate.launch.torchrun import RDZV_PORT, stderr_tail, torchrun_argv

POLL_S = 0.2
STDERR_CHARS = 64_000  # of a report's stderr tail


class NodeAgent:
    """Node `node`'s agent (see the module docstring): `step` follows current.json and serves the current run's
    next request, if any. Every refusal is written to `log` once."""

    def __init__(self, workdir: str | Path, node: int, hosts: list[str], secret: bytes, *, port: int = RDZV_PORT,
                 log=lambda s: print(s, file=sys.stderr, flush=True)):
        self.root = open_workdir(workdir)
        self.node, self.hosts, self.secret, self.port, self.log = node, list(hosts), secret, port, log
        self.nonce = secrets.token_hex(16)
        self.run: str | None = None
        self.k = 0
        self.left: set[str] = set()  # runs stopped, or left for a newer one: never entered again
        self._said: set[str] = set()
        self.announcement = self.root / "agents" / f"node{node}.json"

    def announce(self) -> None:
        make_folder(self.root, self.announcement.parent)
        body = {"node": self.node, "hosts": self.hosts, "port": self.port, "nonce": self.nonce,
                "host": socket.gethostname(), "python": sys.executable, "pid": os.getpid(), "started": time.time()}
        write_private(self.announcement, seal("agent", body, self.secret), self.root)

    def withdraw(self) -> None:
        try:
            check_folders_down(self.root, self.announcement.parent)
            self.announcement.unlink(missing_ok=True)
        except (ConfigError, OSError):
            pass

    def _say(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            self.log(f"node agent {self.node}: {message}")

    def step(self) -> str:
        """One look: "served" (a request was answered), "stopped" (the run is over) or "idle"."""
        self._follow_current()
        if self.run is None:
            return "idle"
        folder = self.root / "launches" / self.run
        path = folder / f"launch-{self.k}.json"
        try:
            raw = read_private(path, self.root)
        except ConfigError as e:
            report = self._refuse(path, e)
        else:
            if raw is None:
                return "stopped" if self._stopped(self.run) else "idle"
            report = self._serve(path, raw)
        try:
            write_private(folder / f"launch-{self.k}.node{self.node}.json",
                          seal("report", {"run": self.run, "k": self.k, "node": self.node, **report}, self.secret),
                          self.root)
        except (ConfigError, OSError) as e:
            self._say(f"cannot answer {path} ({e}): leaving run {self.run}")
            self.left.add(self.run)
            self.run = None
            return "idle"
        self.k += 1
        return "served"

    def _follow_current(self) -> None:
        path = self.root / "launches" / "current.json"
        try:
            body = read_message(path, "current", self.secret, self.root)
            if body is None:
                return
            current = run_name(body.get("run"), "current.json run")
            if current == self.run or current in self.left:
                return
            check_folder(self.root / "launches" / current)
        except FileNotFoundError:
            return
        except ConfigError as e:
            self._say(f"ignoring {path}: {e}")
            return
        if self._stopped(current):  # a finished run (from before this agent): wait for the next
            self.left.add(current)
            return
        if self.run is not None:
            self.left.add(self.run)
        self.run, self.k = current, 0

    def _stopped(self, run: str) -> bool:
        path = self.root / "launches" / run / "stop"
        try:
            body = read_message(path, "stop", self.secret, self.root)
        except ConfigError as e:
            self._say(f"ignoring {path}: {e}")
            return False
        return body is not None and body.get("run") == run

    def _refuse(self, path: Path, error: ConfigError) -> dict:
        self._say(f"refused {path}: {error}")
        return {"rc": None, "stderr": "", "error": str(error)}

    def _serve(self, path: Path, raw: bytes) -> dict:
        try:
            request = parse_request(unseal(raw, "request", self.secret, source=str(path)), len(self.hosts))
            if (request.run, request.k) != (self.run, self.k):
                raise RequestError("run, k", [request.run, request.k], f"{[self.run, self.k]} (the folder's run and "
                                   "the file's index: a request copied from elsewhere is not run)", source=str(path))
            if request.agents[self.node] != self.nonce:
                raise RequestError(f"agents[{self.node}]", request.agents[self.node], "this agent's nonce (in its "
                                   "announcement: a request made before it started is not run)", source=str(path))
            if self.node not in request.nodes:
                return {"rc": 0, "stderr": "", "error": ""}
            argv = rank_argv(request, self.root)
        except ConfigError as e:
            return self._refuse(path, e)
        return self._torchrun(request, argv)

    def _torchrun(self, request: LaunchRequest, argv: list[str]) -> dict:
        nodes = request.nodes
        agent = torchrun_argv(len(nodes), request.nproc_per_node, f"{self.hosts[nodes[0]]}:{self.port}",
                              f"simfog-{request.run}-{request.k}", argv, is_host=(self.node == nodes[0]),
                              python=sys.executable)
        with tempfile.TemporaryFile() as err:
            try:
                code = subprocess.call(agent, env=rank_env(request), stdout=subprocess.DEVNULL, stderr=err,
                                       stdin=subprocess.DEVNULL)
            except OSError as e:
                return {"rc": None, "stderr": "", "error": f"torchrun could not start: {e}"}
            err.seek(0)
            tail = stderr_tail(err.read().decode(errors="replace"))
            # a few long lines could pass the size a reader takes (private_files.MAX_BYTES): keep their end
            return {"rc": code, "stderr": tail[-STDERR_CHARS:], "error": ""}


def run_agent(workdir: str | Path, node: int, hosts: list[str], *, secret: bytes, port: int = RDZV_PORT,
              idle_timeout_s: float = 24 * 3600.0, log=lambda s: print(s, file=sys.stderr, flush=True)) -> int:
    """The agent loop of node `node` (a NodeAgent): returns 0 once its run is stopped, 1 after `idle_timeout_s`
    without a request. Raises ConfigError for a workdir another user can write."""
    agent = NodeAgent(workdir, node, hosts, secret, port=port, log=log)
    with _signals_end_the_loop():
        try:
            agent.announce()
            return _loop(agent, idle_timeout_s)
        finally:
            agent.withdraw()


def _loop(agent: NodeAgent, idle_timeout_s: float) -> int:
    idle_since = time.monotonic()
    while True:
        outcome = agent.step()
        if outcome == "stopped":
            return 0
        if outcome == "served":
            idle_since = time.monotonic()
            continue
        if time.monotonic() - idle_since > idle_timeout_s:
            return 1
        time.sleep(POLL_S)


@contextlib.contextmanager
def _signals_end_the_loop():
    """SIGTERM (what `kill`, systemd and Slurm send) raises SystemExit(143) and SIGINT KeyboardInterrupt in the
    agent's loop, so that its `finally` withdraws the announcement: by default SIGTERM ends the process at once
    and leaves agents/node<I>.json behind. A second signal while the first is handled waits for the clean-up. An
    ignored SIGINT (an agent started with `&` by a script) stays ignored; in a thread (tests) nothing changes,
    since only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ending = []

    def end(signum, frame):
        if ending:
            return
        ending.append(signum)
        raise SystemExit(128 + signum) if signum == signal.SIGTERM else KeyboardInterrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s, handler in before.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, end)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
