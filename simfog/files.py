"""Reading and writing files: gzip by suffix, and writes that never leave a half-written file behind."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import stat
import tempfile
import tomllib
import zlib
from pathlib import Path

from simfog.errors import ConfigError
from simfog.processes import pid_alive

# The most simfog reads from one input file, after decompression. Real inputs are far smaller (the largest
# Kineto traces are a few hundred MB); the cap keeps /dev/zero-like or gzip-bomb inputs from eating all memory.
MAX_INPUT_BYTES = 1 << 30
_GZIP_MAGIC = b"\x1f\x8b"


def check_input(path: str | os.PathLike) -> Path:
    """`path` as a Path if it is an existing regular file. Raises ConfigError ("path") for a missing file, a
    directory, or a FIFO, device or socket: those can block for ever or never end (/dev/zero); and for what is
    no path (None, a number, bytes) or an empty one."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise ConfigError("path", path, "a path to a file (a str or os.PathLike)")
    if not text:
        raise ConfigError("path", text, "a file name (not empty)")
    path = Path(text)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError("path", str(path), "an existing file") from None
    except (OSError, ValueError) as e:  # permission, a name too long, an embedded NUL byte
        raise ConfigError("path", str(path), f"a readable file ({getattr(e, 'strerror', None) or e})") from None
    if stat.S_ISDIR(mode):
        raise ConfigError("path", str(path), "a file, not a directory")
    if not stat.S_ISREG(mode):
        raise ConfigError("path", str(path), "a regular file (not a FIFO, device or socket)")
    return path


def resolve(base_dir: str | os.PathLike, name: str, *, field: str, source: str | None = None) -> Path:
    """`name` (a path relative to `base_dir`, as experiment and catalogue files give them) made absolute, symlinks
    followed. Raises ConfigError naming `field` for a path that cannot be resolved (a symlink loop, a NUL byte)."""
    try:
        return (Path(base_dir) / name).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # RuntimeError: a symlink loop (Python 3.11)
        raise ConfigError(field, name, f"a path to a file ({e})", source=source) from None


def read_bytes(path: str | os.PathLike, *, limit: int | None = None) -> bytes:
    """The file's bytes (`.gz` files decompressed), at most `limit` (default MAX_INPUT_BYTES). Raises ConfigError
    ("path") for what check_input refuses, an unreadable or corrupt file, or one over the limit."""
    limit = MAX_INPUT_BYTES if limit is None else limit
    path = check_input(path)
    try:
        with open(path, "rb") as raw:
            if path.suffix == ".gz":
                with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                    data = gz.read(limit + 1)
            else:
                data = raw.read(limit + 1)
    except FileNotFoundError:
        raise ConfigError("path", str(path), "an existing file") from None
    except (OSError, EOFError, zlib.error) as e:
        raise ConfigError("path", str(path), f"a readable file ({e})") from None
    if len(data) > limit:
        what = " decompressed" if path.suffix == ".gz" else ""
        raise ConfigError("path", str(path), f"a file of at most {limit:,} bytes{what}")
    return data


def read_text(path: str | os.PathLike, *, limit: int | None = None) -> str:
    """The file's UTF-8 text (`.gz` files decompressed). Raises ConfigError ("path") as read_bytes does, or for
    bytes that are not UTF-8 (naming the offset, and saying so when they are gzip data without a .gz name)."""
    data = read_bytes(path, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if data.startswith(_GZIP_MAGIC):
            allowed = "a UTF-8 text file, not gzip-compressed data (a trace? pass the right file, or name it .gz)"
        else:
            allowed = f"a UTF-8 text file (byte {data[e.start]:#04x} at offset {e.start} is not UTF-8)"
        raise ConfigError("path", str(path), allowed) from None


def read_json(path: str | os.PathLike) -> object:
    """Parsed JSON of a `.json` or `.json.gz` file; a syntax error names the file, line and column."""
    return parse_json(read_text(path), str(path))


def parse_json(text: str, source: str, allowed: str = "valid JSON") -> object:
    """json.loads(text), with every failure (syntax, nesting too deep for the parser, integers too long) as one
    ConfigError naming `source`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError("json", f"line {e.lineno} column {e.colno}", f"{allowed} ({e.msg})", source=source) from None
    except RecursionError:
        raise ConfigError("json", "(nesting too deep)", f"{allowed}, nested less deeply", source=source) from None
    except ValueError as e:  # e.g. an integer over Python's 4,300-digit limit
        raise ConfigError("json", str(e)[:80], allowed, source=source) from None


def parse_toml(text: str, source: str, allowed: str = "valid TOML") -> dict:
    """tomllib.loads(text), with every failure (syntax, nesting too deep, integers too long) as one ConfigError
    naming `source`."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("toml", str(e), allowed, source=source) from None
    except RecursionError:
        raise ConfigError("toml", "(nesting too deep)", f"{allowed}, nested less deeply", source=source) from None
    except ValueError as e:  # an integer over Python's 4,300-digit limit
        raise ConfigError("toml", str(e)[:80], allowed, source=source) from None


# Linux's (and macOS's) longest file name and path, in bytes, on every common filesystem. Writes go through a
# temporary file ".<name>.<pid>.<8 random>.tmp" beside the target (atomic_open): a name must leave room for its
# 15 characters and a pid of up to 7 digits (pid_max is at most 2**22).
NAME_MAX = 255
PATH_MAX = 4096
_TEMP_EXTRA = 22


def output_name(path: object, field: str = "output", *, folder: bool = False) -> Path:
    """`path` as a Path if it can name an output at all: a str or os.PathLike (not bytes), not empty, without NUL
    bytes, no name in it over NAME_MAX bytes (a file's own, unless `folder`, over NAME_MAX less what its temporary
    file adds) and under PATH_MAX in all. Raises ConfigError naming `field`. Looks at nothing on disk."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise ConfigError(field, path, "a file name (a str or os.PathLike)")
    if not text:
        raise ConfigError(field, text, "a file name (not empty)")
    if "\0" in text:
        raise ConfigError(field, text, "a file name without NUL bytes")
    if len(os.fsencode(text)) >= PATH_MAX:
        raise ConfigError(field, text, f"a path of under {PATH_MAX:,} bytes ({len(os.fsencode(text)):,} here)")
    path = Path(text)
    for i, part in enumerate(path.parts):
        own = i == len(path.parts) - 1 and not folder
        most, size = NAME_MAX - _TEMP_EXTRA * own, len(os.fsencode(part))
        if size > most:
            raise ConfigError(field, text, f"a file name of at most {most} bytes ({size} here: names end at "
                              f"{NAME_MAX} bytes, and the file is written through a temporary one whose name adds "
                              f"up to {_TEMP_EXTRA})" if own else f"folder names of at most {most} bytes ({size} here)")
    return path


def output_kind(path: Path, field: str = "output") -> str | None:
    """What is at `path` now: None (nothing), "folder" (a directory, or a link to one) or "file" (anything else).
    Raises ConfigError naming `field` where it cannot be looked at (no permission, a symlink loop)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if os.path.islink(path):  # a dangling link, or a loop: a write replaces the link itself
            return "file"
        if isinstance(e, (FileNotFoundError, NotADirectoryError)):
            return None
        raise ConfigError(field, str(path), f"a path that can be looked at ({e.strerror or e})") from None
    return "folder" if stat.S_ISDIR(mode) else "file"


def check_output(path: str | os.PathLike, *, field: str = "output") -> Path:
    """`path` as a Path if a file can be written there: a name output_name accepts, not an existing directory,
    and the nearest folder on its way that exists is a folder where files (or the missing folders) can be made.
    Raises ConfigError naming `field` otherwise. The one check of an output path: commands (through
    refuse_existing), the Python API and sweeps call it before their work, so a bad -o fails at once and writes
    nothing."""
    path = output_name(path, field)
    if output_kind(path, field) == "folder":
        raise ConfigError(field, str(path), "a file name, not an existing directory")
    for parent in path.parents:  # the nearest existing ancestor must be a folder
        kind = output_kind(parent, field)
        if kind == "file":
            raise ConfigError(field, str(path), f"a file in a folder ({parent} is not a folder)")
        if kind == "folder":
            _probe(parent, path, field)
            break
    return path


def _probe(folder: Path, path: Path, field: str) -> None:
    """Make and remove an empty folder in `folder`: what a write does there first, and the only test that holds
    everywhere (os.access says yes to root on /proc and /sys, where nothing can be made; statvfs misses some
    read-only mounts)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".simfog-probe-", dir=folder))
    except OSError as e:
        raise ConfigError(field, str(path), f"a file in a folder where files can be made ({folder}: "
                          f"{e.strerror or e})") from None


def make_parent(path: Path, field: str = "output") -> None:
    """The folders on the way to `path`, made if missing. Raises ConfigError naming `field` where they cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # the parent is a file, not writable, a read-only mount, ...
        raise ConfigError(field, str(path), f"a file in a writable folder ({e.strerror or e})") from None


def _temp_pattern(path: Path) -> re.Pattern:
    """Names atomic_open gives its temporary files for `path`: ".<name>.<writer pid>.<8 random>.tmp" (mkstemp's
    random part is 8 characters of [a-z0-9_]), anchored so that another target's temporary files never match."""
    return re.compile(rf"\.{re.escape(path.name)}\.(?P<pid>\d+)\.[a-z0-9_]{{8}}\.tmp")


def _remove_stale_temps(path: Path) -> None:
    """Removes temporary files of earlier writes to `path` whose writer is dead (killed before it could clean up,
    e.g. by SIGKILL); a live writer's file stays. Best effort: a file that cannot be removed is left."""
    pattern = _temp_pattern(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        m = pattern.fullmatch(name)
        if m and not pid_alive(int(m["pid"])):
            with contextlib.suppress(OSError):
                os.unlink(path.parent / name)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w"):
    """Open a temporary file beside `path`; it replaces `path` only if the block finishes without error.
    Temporary files that killed writers left beside `path` are removed first (see `_remove_stale_temps`)."""
    path = check_output(path)
    make_parent(path)
    try:
        _remove_stale_temps(path)
        # the writer's pid in the name tells a later write whether this file is still being written
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    except OSError as e:  # the parent is a file, not writable, ...
        raise ConfigError("output", str(path), f"a file in a writable folder ({e.strerror or e})") from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a finished file gets the usual permissions
    try:
        if path.suffix == ".gz":
            # mtime=0 and no name keep gzipped output byte-for-byte reproducible.
            raw = open(tmp, "wb")
            gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
            f = gz if "b" in mode else _TextOver(gz)
            try:
                yield f
            finally:
                gz.close()
                raw.close()
        else:
            with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
                yield f
        try:
            os.replace(tmp, path)
        except OSError as e:  # e.g. a directory appeared at `path` meanwhile
            raise ConfigError("output", str(path), f"a file name that can be replaced ({e.strerror or e})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class _TextOver:
    def __init__(self, binary):
        self._b = binary

    def write(self, s: str) -> int:
        return self._b.write(s.encode("utf-8"))


def write_json(path: str | os.PathLike, data: object, *, indent: int | None = 1) -> None:
    """Write JSON atomically (gzipped when the name ends in .gz)."""
    with atomic_open(path) as f:
        f.write(json.dumps(data, indent=indent))
        f.write("\n")


def refuse_existing(paths, *, force: bool, option: str = "-o") -> None:
    """Every one of `paths` (None: not asked for) can be written (check_output), and outputs are never overwritten
    by accident: ConfigError naming `option` and the first of `paths` that cannot be written or exists, unless
    `force`. Called before any work, so a long run is not wasted on a name that would be refused."""
    for p in paths:
        if p is not None:
            check_output(p, field=option)
    if force:
        return
    for p in paths:
        if p is not None and os.path.lexists(p):
            raise ConfigError(option, str(p), f"a path that does not exist yet (it does: add --force to overwrite "
                              f"it, or choose another {option})")


RUNS_ROOT = "simfog-out"


class RunDir:
    """A run's output folder: `path` is where to write (hidden until the run finishes), `final` where it ended."""

    def __init__(self, path: Path):
        self.path = path
        self.final: Path | None = None


@contextlib.contextmanager
def new_run_dir(command: str, root: str | os.PathLike = RUNS_ROOT):
    """A new folder `root/<command>-<UTC timestamp>[-n]/` for one run's outputs. It appears at once with
    everything in it: the outputs go to a hidden temporary folder beside it, renamed when the block finishes;
    on an error (or Ctrl-C) the temporary folder is removed, so no half-run folder is ever left to mistake for a
    finished one. Yields a RunDir; `run.final` is set after the block."""
    import shutil
    from datetime import UTC, datetime

    root = Path(root)
    if output_kind(root, "output folder") == "file":
        raise ConfigError("output folder", str(root), "a directory (a file of that name is in the way)")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    try:
        root.mkdir(parents=True, exist_ok=True)
        run = RunDir(Path(tempfile.mkdtemp(prefix=f".{command}-{stamp}.", suffix=".partial", dir=root)))
    except OSError as e:  # a read-only working directory, ...
        raise ConfigError("output folder", str(root), f"a folder where a run's folder can be made ({e.strerror or e}"
                          "); or name one with -o") from None
    try:
        yield run
        for n in range(1, 10_000):
            final = root / (f"{command}-{stamp}" + (f"-{n}" if n > 1 else ""))
            if os.path.lexists(final):
                continue
            try:
                os.rename(run.path, final)  # atomic; fails if another run took the name meanwhile
            except OSError:
                continue
            run.final = final
            return
        raise ConfigError("output folder", str(root), "fewer than 10,000 runs of one command in one second")
    finally:
        if run.final is None:
            shutil.rmtree(run.path, ignore_errors=True)
