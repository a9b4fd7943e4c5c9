"""Progress bars for the commands that can run for more than a few seconds.

Shown on stderr and only when stderr is a terminal: tests, pipes and log files see exactly what they saw before
(tqdm writes to stderr whether or not anyone is looking, which would fill logs with carriage returns)."""

from __future__ import annotations

import sys


def shown(enabled: bool = True) -> bool:
    """True when a bar should be drawn: asked for, and stderr is a terminal."""
    try:
        return enabled and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def bar(iterable=None, *, total: int | None = None, desc: str | None = None, unit: str = "it",
        enabled: bool = True):
    """A tqdm bar on stderr (disabled, so free, unless `shown`); use as a context manager or iterate over it."""
    import tqdm

    return tqdm.tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                     disable=not shown(enabled), dynamic_ncols=True)
