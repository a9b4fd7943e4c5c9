"""The gates of several jobs launched at once on one emulated fabric (validate.jobs): each rank of each job waits at
the start until every rank of every job is ready, and at the end until every rank is done. A gate is a folder of
marker files, one per rank, that every rank polls; the spec's "gate" says where and how many."""

from __future__ import annotations

import os
import time
from pathlib import Path


def wait_at_start(gate: dict, rank: int) -> None:
    """Several jobs on one fabric (validate.jobs) start together: each rank, once its process group is up, marks
    itself ready in the folder `gate["dir"]` and waits until all `gate["ranks"]` ranks of every job have."""
    folder = Path(gate["dir"])
    (folder / f"{gate['job']}-rank{rank}").touch()
    deadline = time.monotonic() + float(gate["timeout_s"])
    while len(os.listdir(folder)) < int(gate["ranks"]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"start gate {folder}: {len(os.listdir(folder))} of {gate['ranks']} ranks ready "
                               f"after {gate['timeout_s']} s")
        time.sleep(0.002)


def leave_at_end(gate: dict, rank: int, wait: bool) -> None:
    """Several jobs on one fabric (validate.jobs) also end together: a job done first would otherwise tear down its
    processes (interpreter and torch exit, a CPU burst on the shared host) while the others still measure, and their
    last iterations came out 1.4-2.9 times the others. Each rank marks itself done in `gate["end_dir"]` (also when it
    failed, so that nobody waits for it) and, when `wait`, waits until every rank of every job has, at most
    `gate["end_timeout_s"]`: its own measurements are taken, so a late job costs time, never the row."""
    if not gate.get("end_dir"):
        return
    folder = Path(gate["end_dir"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{gate['job']}-rank{rank}").touch()
    deadline = time.monotonic() + float(gate.get("end_timeout_s", gate["timeout_s"]))
    while wait and len(os.listdir(folder)) < int(gate["ranks"]) and time.monotonic() < deadline:
        time.sleep(0.005)
