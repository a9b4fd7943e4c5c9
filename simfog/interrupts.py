"""Ctrl-C that holds: the command line's SIGINT handler raises KeyboardInterrupt, as Python's does, and also notes
that it came, so that a loop can stop on it where the exception itself was swallowed.

Python swallows an exception raised in a destructor (it prints "Exception ignored in ..." and goes on): Ctrl-C 20 s
into a 32-rank Horovod simulation landed in a progress bar's `__del__` at garbage collection, and the run went on to
its end and exited 0. The same holds wherever code catches BaseException (SimPy resumes the engine's processes
inside one). `simfog.engine.ranks.run_events` asks `requested()` every 65,536 events, and a noted interrupt raised
in a destructor is not printed."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

_requested = threading.Event()


def requested() -> bool:
    """True once SIGINT came while `handled` was in force."""
    return _requested.is_set()


def _handler(signum, frame):
    _requested.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def handled():
    """Within the block, SIGINT raises KeyboardInterrupt and is noted (`requested`). Only where Python's own handler
    is in force, in the main thread (elsewhere the block changes nothing); the handler before is restored after."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    _requested.clear()
    unraisable = sys.unraisablehook

    def quiet(args, _shown=unraisable):
        if not (isinstance(args.exc_value, KeyboardInterrupt) and _requested.is_set()):
            _shown(args)

    signal.signal(signal.SIGINT, _handler)
    sys.unraisablehook = quiet
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = unraisable
        _requested.clear()
