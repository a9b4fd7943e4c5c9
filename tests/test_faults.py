"""Faults leave nothing behind: a SIGKILLed sweep's worker processes exit, and the temporary file of a SIGKILLed
atomic write is removed by the next write to the same path (a live writer's is not)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from simfog.files import atomic_open, write_json

# Enters atomic_open(argv[1]), writes a little, says so and waits to be killed (or for stdin to close).
WRITER = textwrap.dedent("""
    import sys
    from simfog.files import atomic_open
    with atomic_open(sys.argv[1]) as f:
        f.write("half of it")
        print("writing", flush=True)
        sys.stdin.read()
""")


def _writer(path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    return proc


def _temps(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_next_write_removes_the_temporary_file_of_a_killed_writer(tmp_path):
    path = tmp_path / "out.json"
    killed = _writer(path)
    killed.kill()  # SIGKILL: its `finally` never runs
    killed.wait()
    left = _temps(tmp_path)
    assert len(left) == 1 and left[0].startswith(".out.json.")
    live = _writer(path)  # another writer of the same path, still in its block
    try:
        mine = _writer(tmp_path / "out.json.1")  # a writer of another path whose name begins alike
        try:
            (tmp_path / ".out.json.keep.tmp").write_text("not ours")  # not a name atomic_open gives

            write_json(path, {"a": 1})

            assert path.read_text() == '{\n "a": 1\n}\n'
            temps = _temps(tmp_path)
            assert left[0] not in temps  # the dead writer's file is gone
            assert len(temps) == 3  # the live writers' files and the foreign file stay
            assert ".out.json.keep.tmp" in temps
        finally:
            mine.communicate("")  # closes stdin: it finishes and replaces its file
    finally:
        live.communicate("")
    assert path.read_text() == "half of it"
    assert _temps(tmp_path) == [".out.json.keep.tmp"]


def test_atomic_write_still_replaces_only_on_success(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("old")
    try:
        with atomic_open(path) as f:
            f.write("new")
            raise RuntimeError("writer failed")
    except RuntimeError:
        pass
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["x.txt"]
    with atomic_open(path) as f:
        f.write("new")
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["x.txt"]
