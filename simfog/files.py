"""Reading and writing files: gzip by suffix, and writes that never leave a half-written file behind."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import tempfile
import zlib
from pathlib import Path

from simfog.errors import ConfigError
from simfog.processes import pid_alive


def read_text(path: str | os.PathLike) -> str:
    """The file's text; `.gz` files are decompressed. Raises ConfigError if missing or unreadable."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("path", str(path), "an existing file") from None
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
        raise ConfigError("path", str(path), f"a readable text file ({e})") from None


def read_json(path: str | os.PathLike) -> object:
    """Parsed JSON of a `.json` or `.json.gz` file; a syntax error names the file, line and column."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError("json", f"line {e.lineno} column {e.colno}", f"valid JSON ({e.msg})",
                          source=str(path)) from None


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    # the writer's pid in the name tells a later write whether this file is still being written
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
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
        os.replace(tmp, path)
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
