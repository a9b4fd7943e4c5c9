"""Small process helpers: whether a pid is alive, and worker processes that end with the process that started them."""

from __future__ import annotations

import os
import threading
import time

WATCH_S = 0.5  # how often an orphan check runs: an idle worker costs a wake-up this often


def pid_alive(pid: int) -> bool:
    """True while process `pid` exists (a zombie counts: it exists until reaped), also someone else's."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's live process, or not a pid we can ask about: assume alive
    return True


def exit_with(owner_pid: int) -> None:
    """Initializer of pool workers (`ProcessPoolExecutor(initializer=exit_with, initargs=(os.getpid(),))`).

    A worker whose owner was killed (SIGKILL: no shutdown message) would wait for work for ever, as the pool's
    queues stay open in the other workers. A daemon thread ends the worker once it has been re-parented (its
    parent, the owner or a forkserver that exits with it, died) or the owner is gone."""
    parent = os.getppid()
    threading.Thread(target=_watch, args=(owner_pid, parent), name="simfog-exit-with-owner", daemon=True).start()


def _watch(owner_pid: int, parent: int) -> None:
    while os.getppid() == parent and pid_alive(owner_pid):
        time.sleep(WATCH_S)
    os._exit(1)  # at once: nothing a worker does is wanted without its owner
