"""Why the run-time-decided family has no closed form: what each of its algorithms does depends on the run's own
timing, so no schedule fixed before the run stands for it, and the event engine runs it.

- Horovod (merge = "horovod"): every cycle its coordinator fuses the tensors that happen to be ready on every rank
  then, so the buckets follow the run's timing.
- WAGMA: a group operation starts when its FIRST member arrives; who waits, and for how long, is decided by the
  run (with comm.wait_for_group it is a barrier, but the global steps and layouts still interleave with drift).
- BAGUA async: a background loop on its own clock averages whatever the ranks have reached when a round runs.

Each algorithm's `closed_form_blocker()` says so (WAGMA and async with the protocol's default: the algorithm
decides while running).
"""

from __future__ import annotations


def horovod_blocker(merge: str) -> str:
    """Why Horovod's cycles run on the event engine."""
    return f"merge {merge!r} fuses at run time"
