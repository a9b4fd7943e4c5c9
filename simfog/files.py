"""Reading and writing files: gzip by suffix, and writes that never leave a half-written file behind."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import tempfile
import zlib
from pathlib import Path

from simfog.errors import ConfigError


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


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w"):
    """Open a temporary file beside `path`; it replaces `path` only if the block finishes without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
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


def refuse_existing(paths, *, force: bool, option: str = "-o") -> None:
    """Outputs are never overwritten by accident: ConfigError naming the first of `paths` that exists, unless
    `force`. Called before any work, so a long run is not wasted on a name that would be refused."""
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
    if root.exists() and not root.is_dir():
        raise ConfigError("output folder", str(root), "a directory (a file of that name is in the way)")
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run = RunDir(Path(tempfile.mkdtemp(prefix=f".{command}-{stamp}.", suffix=".partial", dir=root)))
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
