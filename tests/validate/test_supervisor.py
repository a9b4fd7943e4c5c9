"""The cleanup supervisor: what a process journaled and did not undo itself is undone, newest first, once the
process ends, however it ends; what it forgot is left alone; a forked child does not keep it waiting."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from validate.cluster import host_settings, supervisor
from validate.cluster.supervisor import Supervisor, process_alive, process_identity, undo_all

from .conftest import supervisor_of, wait_until

REPO = Path(__file__).resolve().parents[2]


def test_what_is_left_in_the_journal_is_undone_when_the_pipe_closes(tmp_path):
    kept, removed = tmp_path / "kept", tmp_path / "removed"
    sup = Supervisor()
    for folder in (kept, removed):
        folder.mkdir()
        (folder / "file").write_text("x")
    key = sup.register(supervisor.remove_folder, path=str(kept))
    sup.register(supervisor.remove_folder, path=str(removed))
    sup.forget(key)  # undone by the process itself (here: not at all, so that we see it is left alone)
    assert sup.close() == 0
    assert kept.is_dir() and not removed.exists()


def test_entries_are_undone_newest_first_and_a_failure_stops_none(monkeypatch, capsys):
    done = []
    monkeypatch.setattr(supervisor, "remove_folder", lambda path: done.append(path))

    def fail(**args):
        raise OSError("no such sysctl")

    monkeypatch.setattr(host_settings, "undo_hold", fail)
    folder = "validate.cluster.supervisor:remove_folder"
    journal = {1: {"undo": folder, "args": {"path": "workspace"}},
               2: {"undo": "validate.cluster.host_settings:undo_hold", "args": {}},
               7: {"undo": folder, "args": {"path": "mpi"}}}
    assert undo_all(journal) == 1
    assert done == ["mpi", "workspace"]
    assert "no such sysctl" in capsys.readouterr().err


def test_an_undo_is_a_function_of_a_validate_module():
    for undo in (lambda: None, os.system, print):
        with pytest.raises(ValueError, match="module-level function of a validate module"):
            supervisor.register(undo)


def test_the_supervisor_ignores_a_journal_line_that_names_no_undo(capsys):
    journal = {}
    for line in (b'{"id": 1, "undo": "os:system", "args": {"command": "true"}}',
                 b'{"id": 2, "undo": "validate.cluster.supervisor:nothing", "args": {}}', b"not json"):
        supervisor._apply(journal, line)
    assert journal == {}
    assert capsys.readouterr().err.count("ignored journal line") == 3


# Journals a temporary folder and a marked process (a sleeper carrying the launch token in its environment, in a
# session of its own, as a rank), says where they are, and waits to be killed.
KILLED = textwrap.dedent("""
    import os, subprocess, sys, time
    from validate.cluster import supervisor
    from validate.launch.launcher import kill_marked
    with supervisor.temporary_folder("simfog-test-") as folder:
        supervisor.register(kill_marked, token=sys.argv[1])
        sleeper = subprocess.Popen(["sleep", "60"], env={**os.environ, "SIMFOG_LAUNCH": sys.argv[1]},
                                   start_new_session=True)
        print(folder, sleeper.pid, flush=True)
        time.sleep(60)
""")


def test_a_process_killed_with_sigkill_has_its_journal_undone(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", KILLED, uuid.uuid4().hex], stdout=subprocess.PIPE, text=True,
                             cwd=REPO, env=env)
    folder, sleeper = child.stdout.readline().split()
    assert Path(folder).parent == tmp_path and Path(folder).is_dir() and process_alive(int(sleeper))
    child.kill()
    child.wait()
    assert wait_until(lambda: not Path(folder).exists() and not process_alive(int(sleeper)), 5)


# Journals something (so its supervisor starts), forks a child that lives on, and exits once its stdin closes (so
# the test can find the supervisor as its child before it is reparented, however loaded the machine).
FORKS = textwrap.dedent("""
    import os, sys, time
    from validate.cluster import supervisor
    supervisor.register(supervisor.remove_folder, path="/nonexistent/simfog-test")
    print(supervisor.get().pid, flush=True)
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
    sys.stdin.read()
""")


def test_a_forked_child_does_not_hold_the_supervisor_s_pipe():
    parent = subprocess.Popen([sys.executable, "-c", FORKS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=REPO)
    sup = int(parent.stdout.readline())
    assert supervisor_of(parent.pid) == sup
    parent.stdin.close()
    assert parent.wait(timeout=30) == 0
    assert wait_until(lambda: not process_alive(sup), 5)  # while the forked child still sleeps


def test_process_identity_tells_processes_apart():
    me = process_identity(os.getpid())
    assert me.startswith(f"{os.getpid()}-") and process_identity(os.getpid()) == me
    child = subprocess.Popen([sys.executable, "-c", ""])
    assert wait_until(lambda: process_identity(child.pid) is None, 10)  # a zombie has exited
    assert process_alive(os.getpid()) and not process_alive(child.pid)
    child.wait()
    assert process_identity(child.pid) is None
