"""Host settings that validators share (the SCHED_RR time slice, the allowed TCP congestion controls): held, not
just set, so that one validator ending never resets what another still needs, and the last one out restores the
value found before the first.

Each setting has one record in STATE_DIR, a folder only its owner (root) may write, on /run, which a reboot empties
as it resets the settings: the value found before the first holder ("original") and the holders, each a process
identity (pid and start time, so that a reused pid is never taken for a live holder) and a serial number (one
process may hold twice). Records change under an exclusive lock (flock) and are replaced whole (a mkstemp file
renamed over the record); no path in the folder is followed through a symlink. A holder killed without releasing
(kill -9) is released by its supervisor (validate.cluster.supervisor) within a second; if that died too, the next
`acquire` or `restore_abandoned` drops dead holders and restores the original once none is left.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from validate.cluster import supervisor

STATE_DIR = Path("/run/simfog-validate")
_serial = itertools.count()


def _folder(state_dir: Path) -> Path:
    """The state folder, made (mode 0700) if missing; OSError unless it is a real folder of this user that nobody
    else may write."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(state_dir, 0o700)
    st = os.lstat(state_dir)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(errno.EPERM, "not a folder of this user that only it may write (refused as the "
                              "validator's state folder)", str(state_dir))
    return state_dir


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    fd = os.open(state_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _record_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.json"


def read_record(name: str, state_dir: Path | None = None) -> dict | None:
    """A setting's record ({"original": str, "holders": [str]}), None when nobody holds it."""
    path = _record_path(state_dir or STATE_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        try:
            record = json.load(f)
        except ValueError:
            record = None
    if not isinstance(record, dict) or not isinstance(record.get("original"), str) or \
            not isinstance(record.get("holders"), list):
        print(f"simfog: ignored a malformed record {path}", file=sys.stderr)
        return None
    return record


def _write_record(state_dir: Path, name: str, original: str, holders: list[str]) -> None:
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=f".{name}.")  # O_EXCL, mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"original": original, "holders": holders}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, _record_path(state_dir, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _remove_record(state_dir: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_record_path(state_dir, name))


def new_holder() -> str:
    """A holder name for this process: its identity and a serial number."""
    return f"{supervisor.process_identity(os.getpid())}-{next(_serial)}"


def holder_alive(holder: str) -> bool:
    """Whether the process that took `holder` (new_holder) still runs: same pid, same start time."""
    identity = holder.rsplit("-", 1)[0]
    pid = identity.split("-", 1)[0]
    return pid.isdigit() and supervisor.process_identity(int(pid)) == identity


def _live_holders(record: dict | None, but: str | None = None) -> list[str]:
    return [h for h in (record or {}).get("holders", []) if h != but and isinstance(h, str) and holder_alive(h)]


def acquire(name: str, sysctl: Path, want: Callable[[str], str], holder: str, *, state_dir: Path | None = None) -> bool:
    """Hold setting `name` (the file `sysctl`) at `want(original)` as `holder`. Returns False, recording nothing,
    when nobody holds it and it has that value already. Raises OSError (nothing recorded) when it cannot be
    read or set."""
    folder = _folder(state_dir or STATE_DIR)
    with _locked(folder):
        record = read_record(name, folder)
        holders = _live_holders(record)
        if record is not None and not holders:  # every holder died unreleased
            sysctl.write_text(record["original"])
            _remove_record(folder, name)
            record = None
        current = sysctl.read_text().strip()
        original = record["original"] if record is not None else current
        value = want(original)
        if record is None and value == current:
            return False
        _write_record(folder, name, original, [*holders, holder])  # first: a kill from here on is undone
        try:
            if value != current:
                sysctl.write_text(value)
        except BaseException:
            if holders:
                _write_record(folder, name, original, holders)
            else:
                _remove_record(folder, name)
            raise
    return True


def release(name: str, sysctl: Path, holder: str, *, state_dir: Path | None = None) -> None:
    """Stop holding setting `name` as `holder` (whether it still runs or not): the original value comes back when
    no live holder is left. Idempotent."""
    folder = _folder(state_dir or STATE_DIR)
    with _locked(folder):
        record = read_record(name, folder)
        if record is None:
            return
        holders = _live_holders(record, but=holder)
        if holders:
            if holders != record["holders"]:
                _write_record(folder, name, record["original"], holders)
            return
        sysctl.write_text(record["original"])
        _remove_record(folder, name)


def restore_abandoned(name: str, sysctl: Path, *, state_dir: Path | None = None) -> bool:
    """Restore setting `name` when every holder died unreleased (and their supervisors with them); True if it
    was."""
    folder = _folder(state_dir or STATE_DIR)
    with _locked(folder):
        record = read_record(name, folder)
        if record is None or _live_holders(record):
            return False
        sysctl.write_text(record["original"])
        _remove_record(folder, name)
        return True


def undo_hold(name: str, sysctl: str, holder: str, state_dir: str) -> None:
    """`release` as the supervisor calls it (validate.cluster.supervisor: paths as strings)."""
    release(name, Path(sysctl), holder, state_dir=Path(state_dir))


@contextlib.contextmanager
def holding(name: str, sysctl: Path, want: Callable[[str], str], *, state_dir: Path | None = None) -> Iterator[bool]:
    """Hold setting `name` at `want(original)` for the block (see `acquire`; yields its answer), journaled with
    this process's supervisor first, so that a kill -9 is undone too. Raises OSError when it cannot be set. A
    failed release is said on stderr and left to the supervisor, which retries it when this process ends."""
    state_dir = state_dir or STATE_DIR
    sysctl.read_text()  # a missing sysctl: OSError before anything is recorded
    holder = new_holder()
    key = supervisor.register(undo_hold, name=name, sysctl=str(sysctl), holder=holder, state_dir=str(state_dir))
    try:
        held = acquire(name, sysctl, want, holder, state_dir=state_dir)
    except BaseException:
        supervisor.forget(key)
        raise
    if not held:
        supervisor.forget(key)
    try:
        yield held
    finally:
        if held:
            try:
                release(name, sysctl, holder, state_dir=state_dir)
                supervisor.forget(key)
            except OSError as e:
                print(f"simfog: cannot restore {sysctl}: {e}", file=sys.stderr)
