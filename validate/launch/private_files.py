"""The files of a folder that several processes of one user share (the node agents' workdir): only files and folders
that no other user can have written are read or written, links are never followed, and a file is written whole
under a random temporary name (mkstemp: O_EXCL, O_NOFOLLOW) in a folder only the user can write, then renamed.

"Another user can write" a file or folder when its owner is neither this process' user nor root, or when it is
writable by others, or by a group other than its owner's private group (Debian's and Fedora's user private groups,
where the default umask 002 leaves new folders group-writable: a group named as its owner, with no other member).
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
import tempfile
from pathlib import Path

from simfog.errors import ConfigError

MAX_BYTES = 1 << 20  # a request, a report or an announcement is a few kB


class UnsafeFile(ConfigError):
    """A file or folder refused because another user could have written it, or because it is a link or no regular
    file; the message names the path and why."""

    def __init__(self, path: Path | str, problem: str):
        super().__init__(str(path), problem, "refused: only files and folders that no other user can write are read "
                         "or written here (owned by you or root, not writable by group or others, no links)")


def _private_group(gid: int, owner_uid: int) -> bool:
    try:
        group, owner = grp.getgrgid(gid), pwd.getpwuid(owner_uid).pw_name
    except KeyError:
        return False
    return group.gr_name == owner and set(group.gr_mem) <= {owner}


def writer_problem(st: os.stat_result) -> str | None:
    """Why another user could have written the file or folder of `st` (an lstat or fstat result), or None."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {st.st_uid} (neither you, uid {os.geteuid()}, nor root)"
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH:
        return f"writable by every user (mode {mode:o})"
    if mode & stat.S_IWGRP and not _private_group(st.st_gid, st.st_uid):
        return f"writable by group {st.st_gid} (mode {mode:o})"
    return None


def check_folder(path: Path) -> None:
    """Raise UnsafeFile unless `path` is a folder (not a link to one) that no other user can write;
    FileNotFoundError when it is missing."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFile(path, "a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFile(path, "not a folder")
    if (problem := writer_problem(st)) is not None:
        raise UnsafeFile(path, problem)


def check_workdir(root: Path) -> Path:
    """`root` made absolute (links resolved: the user named it), checked: no other user can write it, nor any folder
    above it, where one with the sticky bit (/tmp) is safe when its owner is trusted (others may add entries there
    but not move this one away). Returns the resolved path; raises UnsafeFile, or FileNotFoundError."""
    root = Path(root).resolve()
    check_folder(root)
    for parent in root.parents:
        st = os.lstat(parent)
        problem = writer_problem(st)
        sticky_and_trusted = st.st_mode & stat.S_ISVTX and st.st_uid in (os.geteuid(), 0)
        if problem is not None and not sticky_and_trusted:
            raise UnsafeFile(parent, f"{problem}; it holds the workdir")
    return root


def open_workdir(workdir: str | Path) -> Path:
    """The workdir, made if missing (only the user allowed in), resolved and checked (check_workdir)."""
    Path(workdir).mkdir(mode=0o700, parents=True, exist_ok=True)
    return check_workdir(Path(workdir))


def check_folders_down(root: Path, folder: Path) -> None:
    """check_folder on `root` and on every folder from it down to `folder` (which must lie inside it)."""
    check_folder(root)
    here = root
    for part in folder.relative_to(root).parts:
        here = here / part
        check_folder(here)


def make_folder(root: Path, folder: Path) -> None:
    """Create the folders from `root` (an existing, checked workdir) down to `folder`, only the user allowed in
    (mode 700), and check those that were there."""
    here = root
    for part in folder.relative_to(root).parts:
        here = here / part
        try:
            here.mkdir(mode=0o700)
        except FileExistsError:
            pass
        check_folder(here)


def open_private(path: Path, root: Path, flags: int = os.O_RDONLY) -> int | None:
    """A file descriptor of the regular file `path` inside `root`, after checking it and every folder down to it;
    None when it (or a folder on the way) does not exist. Raises UnsafeFile."""
    try:
        check_folders_down(root, path.parent)
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnsafeFile(path, "a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened: {e.strerror}") \
            from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(path, "not a regular file")
        if (problem := writer_problem(st)) is not None:
            raise UnsafeFile(path, problem)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path: Path, root: Path) -> bytes | None:
    """The bytes of `path` (see open_private), at most MAX_BYTES; None when it does not exist. Raises UnsafeFile."""
    fd = open_private(path, root)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise UnsafeFile(path, f"larger than {MAX_BYTES} bytes")
    return data


def write_private(path: Path, data: bytes, root: Path) -> None:
    """Write `data` to `path` whole: a temporary file of a random name made with O_EXCL in the same folder (checked
    down from `root`, so only the user can write it), then renamed over `path` (a link planted there is replaced,
    not followed). Raises UnsafeFile, OSError."""
    check_folders_down(root, path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
