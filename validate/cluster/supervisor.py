"""Undo what a validator changed on the host when it dies, however it dies (`kill -9` included), within a second.

The first change a process registers starts its supervisor (`python -m validate.cluster.supervisor`): a child in a
session of its own, so that a signal for the validator's process group or terminal does not reach it, reading a
pipe that only the validator holds. Before each change of the host the validator registers how to undo it (a
journal entry, one JSON line, written whole: under PIPE_BUF bytes); once it has undone the change itself it forgets
the entry. When the pipe closes, which the kernel does when the validator's process ends, however it ends, the
supervisor undoes what is left, newest first, and exits. An entry registered but not yet carried out when the
validator died is undone too, so every undo is idempotent and harmless on what does not exist (yet). The kinds:

    marked      kill every process whose environment carries a launch's token (ranks, their children, MPI
                daemons, in any namespace or process group: validate.launch.launcher.kill_marked)
    namespaces  delete an emulated cluster's network namespaces, with their veths, bridge and tbf qdiscs, after
                killing what runs inside (validate.cluster.netemu.remove_run)
    setting     release a shared host setting the validator held (validate.cluster.host_settings.release: the
                value found before the first holder comes back once no live holder is left)
    folder      remove a temporary folder

If the supervisor is killed too, the next validator still removes what dead owners left (namespaces and folders
named by owner pid, settings' dead holders). Without a supervisor (it could not start) a warning says so once
and the run goes on.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Iterator
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

    def register(self, undo: str, **args) -> int | None:
        """Journal how to undo a change that is about to be made (see the module docstring); returns the entry's
        key for `forget`, None when the supervisor is gone."""
        if undo not in UNDO:
            raise ValueError(f"unknown undo {undo!r}: one of {', '.join(UNDO)}")
        key = next(_keys)
        return key if self._send({"id": key, "undo": undo, **args}) else None

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


def register(undo: str, **args) -> int | None:
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
        key = register("folder", path=str(path))
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


# -- the supervisor process ---------------------------------------------------------------------------------------

def _kill_marked(entry: dict) -> None:
    from validate.launch.launcher import kill_marked

    kill_marked(str(entry["token"]))


def _remove_namespaces(entry: dict) -> None:
    from validate.cluster.netemu import remove_run

    remove_run(str(entry["run"]))


def _release_setting(entry: dict) -> None:
    from validate.cluster.host_settings import release

    release(str(entry["name"]), Path(entry["sysctl"]), str(entry["holder"]), state_dir=Path(entry["state_dir"]))


def _remove_folder(entry: dict) -> None:
    path = Path(entry["path"])
    if path.is_absolute():
        shutil.rmtree(path, ignore_errors=True)  # refuses a symlink in its place; never follows one inside


UNDO = {"marked": _kill_marked, "namespaces": _remove_namespaces, "setting": _release_setting,
        "folder": _remove_folder}


def _apply(journal: dict[int, dict], line: bytes) -> None:
    try:
        message = json.loads(line)
        if "forget" in message:
            journal.pop(int(message["forget"]), None)
        elif message.get("undo") in UNDO:
            journal[int(message["id"])] = message
        else:
            raise ValueError("neither an entry nor a forget")
    except (ValueError, TypeError, KeyError) as e:
        print(f"simfog supervisor: ignored journal line {line[:200]!r}: {e}", file=sys.stderr)


def undo_all(journal: dict[int, dict]) -> int:
    """Undo the entries newest first; each failure is reported and the others still run. Returns the failures."""
    failures = 0
    for key in sorted(journal, reverse=True):
        entry = journal[key]
        try:
            UNDO[entry["undo"]](entry)
        except Exception as e:  # noqa: BLE001 - one failed undo must not keep the others from running
            failures += 1
            print(f"simfog supervisor: could not undo {entry}: {e}", file=sys.stderr)
    return failures


def main() -> int:
    """Read the journal from stdin until EOF, then undo what is left in it."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTSTP):  # a terminal's signals are the validator's
        signal.signal(sig, signal.SIG_IGN)
    # imported now, while the validator runs: once it died, undoing starts at once, even on busy cores
    import validate.cluster.host_settings  # noqa: F401
    import validate.cluster.netemu  # noqa: F401
    import validate.launch.launcher  # noqa: F401
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
