"""Undo what a validator changed on the host when it dies, however it dies (`kill -9` included), within a second.

The first change a process registers starts its supervisor (`python -m validate.cluster.supervisor`): a child in a
session of its own, so that a signal for the validator's process group or terminal does not reach it, reading a
pipe that only the validator holds. Before each change of the host the validator registers how to undo it (a
journal entry, one JSON line, written whole: under PIPE_BUF bytes); once it has undone the change itself it forgets
the entry. When the pipe closes, which the kernel does when the validator's process ends, however it ends, the
supervisor undoes what is left, newest first, and exits. An entry registered but not yet carried out when the
validator died is undone too, so every undo is idempotent and harmless on what does not exist (yet).

An entry names its undo: a function of a validate module and its keyword arguments (JSON values), imported by the
supervisor when the entry arrives, so that once the validator died undoing starts at once, even on busy cores. The
modules that change the host register their own: validate.launch.launcher.kill_marked (every process carrying a
launch's token: ranks, their children, MPI daemons, in any namespace or process group),
validate.cluster.netemu.remove_run (a cluster's namespaces, with their veths, bridge and tbf qdiscs, after killing
what runs inside), validate.cluster.host_settings.undo_hold (a shared host setting: the value found before the
first holder comes back once no live holder is left), and `remove_folder` here.

If the supervisor is killed too, the next validator still removes what dead owners left (namespaces and folders
named by owner pid, settings' dead holders). Without a supervisor (it could not start) a warning says so once
and the run goes on.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_FOLDER_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"  # what tempfile.mkdtemp's names are made of
PIPE_BUF = 4096  # Linux writes this many bytes to a pipe at once, never interleaved with another writer's


def process_identity(pid: int) -> str | None:
    """"<pid>-<start time in clock ticks since boot>" while process `pid` runs, None once it has exited (a zombie
    has exited). The start time tells a reused pid from the process that had it."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ..., starttime (22nd)
    except (OSError, ValueError, IndexError):
        return None
    if fields[0] in "ZX":
        return None
    return f"{int(pid)}-{fields[19]}"


def process_alive(pid: int) -> bool:
    """True while process `pid` runs (not a zombie: on a host whose init does not reap, a killed validator stays
    one for ever)."""
    return process_identity(pid) is not None


class Supervisor:
    """The validator's side: the supervisor process and the write end of its pipe (see the module docstring)."""

    def __init__(self):
        read, self._fd = os.pipe()  # both ends non-inheritable: no rank or other child keeps the pipe open
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "validate.cluster.supervisor"], stdin=read,
                                         stdout=subprocess.DEVNULL, env=env, cwd="/", start_new_session=True)
        except BaseException:
            os.close(self._fd)
            raise
        finally:
            os.close(read)
        self.pid = self.proc.pid
        self._lock = threading.Lock()
        self._broken = False

    def _send(self, message: dict) -> bool:
        line = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        if len(line) > PIPE_BUF:
            raise ValueError(f"journal entry of {len(line)} bytes: a pipe writes at most {PIPE_BUF} bytes whole")
        with self._lock:
            if self._fd < 0 or self._broken:
                return False
            try:
                os.write(self._fd, line)
                return True
            except OSError:  # the supervisor died: say so once, go on without it
                self._broken = True
                print("simfog: the cleanup supervisor is gone; a kill -9 of this run now leaves the host changed "
                      "until the next run", file=sys.stderr)
                return False

    def register(self, undo: Callable, **args) -> int | None:
        """Journal how to undo a change that is about to be made: `undo(**args)` (see the module docstring);
        returns the entry's key for `forget`, None when the supervisor is gone."""
        key = next(_keys)
        return key if self._send({"id": key, "undo": _name_of(undo), "args": args}) else None

    def forget(self, key: int | None) -> None:
        """Drop an entry: its change has been undone."""
        if key is not None:
            self._send({"forget": key})

    def close(self, timeout_s: float = 30.0) -> int | None:
        """Close the pipe (the supervisor undoes what is still journaled and exits) and wait for it; its exit code,
        None if it is still busy after `timeout_s`."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def _drop_in_child(self) -> None:
        """After os.fork: the child must not hold the pipe (the supervisor would wait for the child's exit too)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_active: Supervisor | None = None
_start_lock = threading.Lock()
_warned = False
# keys of one process, across its supervisors: a forked child that starts its own never reuses a key it inherited
_keys = itertools.count(1)


def get() -> Supervisor | None:
    """This process's supervisor, started on first use; None when it cannot be started (said once)."""
    global _active, _warned
    with _start_lock:
        if _active is None and not _warned:
            try:
                _active = Supervisor()
            except OSError as e:
                _warned = True
                print(f"simfog: cannot start the cleanup supervisor ({e}); a kill -9 of this run would leave the "
                      "host changed until the next run", file=sys.stderr)
        return _active


def register(undo: Callable, **args) -> int | None:
    """`Supervisor.register` on this process's supervisor (None without one)."""
    sup = get()
    return sup.register(undo, **args) if sup is not None else None


def forget(key: int | None) -> None:
    """`Supervisor.forget` on this process's supervisor."""
    if key is not None and _active is not None:
        _active.forget(key)


def _after_fork_in_child() -> None:
    global _active, _start_lock
    _start_lock = threading.Lock()  # another thread may have held it at the fork
    if _active is not None:
        _active._drop_in_child()
        _active = None


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[Path]:
    """A new folder `prefix` + 8 random characters in tempfile.gettempdir() (mode 0700, as mkdtemp makes it),
    removed on leaving the block; journaled before it is made, so that the supervisor removes it if this process
    dies first."""
    root = Path(tempfile.gettempdir())
    for _ in range(100):
        path = root / (prefix + "".join(secrets.choice(_FOLDER_CHARS) for _ in range(8)))
        key = register(remove_folder, path=str(path))
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            forget(key)  # another's (a 1 in 37^8 draw): not ours to remove
            continue
        except BaseException:
            forget(key)
            raise
        break
    else:
        raise FileExistsError(f"no free name for a temporary folder {prefix}* in {root}")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        forget(key)


def remove_folder(path: str) -> None:
    """Remove a temporary folder (absolute paths only); a symlink in its place is refused, none inside followed."""
    if Path(path).is_absolute():
        shutil.rmtree(path, ignore_errors=True)


def _name_of(undo: Callable) -> str:
    """"module:function" for a module-level function of a validate module, the only undos an entry may name."""
    module, name = getattr(undo, "__module__", ""), getattr(undo, "__qualname__", "")
    if not module.startswith("validate.") or not name.isidentifier() or \
            getattr(sys.modules.get(module), name, None) is not undo:
        raise ValueError(f"{undo!r}: an undo is a module-level function of a validate module")
    return f"{module}:{name}"


def _resolve(name: str) -> Callable:
    module, _, function = str(name).partition(":")
    if not module.startswith("validate.") or not function.isidentifier():
        raise ValueError(f"not an undo: {name!r}")
    return getattr(importlib.import_module(module), function)


# -- the supervisor process ---------------------------------------------------------------------------------------

def _apply(journal: dict[int, dict], line: bytes) -> None:
    try:
        message = json.loads(line)
        if "forget" in message:
            journal.pop(int(message["forget"]), None)
        else:
            _resolve(message["undo"])  # imported now, not once the validator died
            if not isinstance(message["args"], dict):
                raise TypeError("args is not an object")
            journal[int(message["id"])] = message
    except (ValueError, TypeError, KeyError, ImportError, AttributeError) as e:
        print(f"simfog supervisor: ignored journal line {line[:200]!r}: {e}", file=sys.stderr)


def undo_all(journal: dict[int, dict]) -> int:
    """Undo the entries newest first; each failure is reported and the others still run. Returns the failures."""
    failures = 0
    for key in sorted(journal, reverse=True):
        entry = journal[key]
        try:
            _resolve(entry["undo"])(**entry["args"])
        except Exception as e:  # noqa: BLE001 - one failed undo must not keep the others from running
            failures += 1
            print(f"simfog supervisor: could not undo {entry}: {e}", file=sys.stderr)
    return failures


def main() -> int:
    """Read the journal from stdin until EOF, then undo what is left in it."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTSTP):  # a terminal's signals are the validator's
        signal.signal(sig, signal.SIG_IGN)
    journal: dict[int, dict] = {}
    pending = b""
    while chunk := os.read(0, 1 << 16):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            _apply(journal, line)
    # a torn last line (pending) cannot be: entries are written whole
    return 1 if undo_all(journal) else 0


if __name__ == "__main__":
    raise SystemExit(main())
