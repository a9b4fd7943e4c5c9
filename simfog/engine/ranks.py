"""The event engine's rank processes and its event loop: every rank an explicit SimPy process with a compute stream,
and a communication stream its training algorithm drives.

A rank runs forward, tells its algorithm that backward starts (`backward_started`, which returns the event its
optimizer step waits for), runs backward, waits for that event, and runs its optimizer step; an algorithm whose
communication gates compute runs each whole iteration itself (`run_iteration`). The hooks are those of
simfog.engine.protocol.TrainingAlgorithm: the rank processes know nothing of which algorithm runs, nor of GPUs,
networks or traces; durations come as numbers.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from simfog import interrupts
from simfog.progress import bar

if TYPE_CHECKING:  # SimPy is imported only when a run takes the event engine (start-up of every command)
    import simpy


def rank_program(env: simpy.Environment, algorithm, rank: int, iterations: int, draws, times, record, finished,
                 slowdown, delays):
    """The SimPy process of `rank` for `iterations` iterations. `draws[it, rank]` is the trace sample of each
    iteration; `times` (forward, backward, optimizer) are per iteration lists of per rank seconds, or None for an
    algorithm that runs whole iterations (which then gets the rank's `slowdown` and its per iteration `delays`);
    `record(rank, iteration, kind, name, start, end)` keeps an interval; finished[rank] counts the iterations done."""
    if algorithm.whole_iterations:
        slow = slowdown[rank]
        for it in range(iterations):
            yield from algorithm.run_iteration(rank, it, draws[it, rank], slow, delays[it, rank])
            finished[rank] += 1
        return
    forward, backward, optimizer = times
    backward_started = algorithm.backward_started
    for it in range(iterations):
        t0 = env.now
        yield env.timeout(forward[it][rank])
        t_b = env.now
        record(rank, it, "forward", "forward", t0, t_b)
        comm_done = backward_started(rank, it, draws[it, rank], t_b)
        yield env.timeout(backward[it][rank])
        t_e = env.now
        record(rank, it, "backward", "backward", t_b, t_e)
        if comm_done is not None:
            yield comm_done
        t_o = env.now
        yield env.timeout(optimizer[it][rank])
        record(rank, it, "optimizer", "optimizer", t_o, env.now)
        finished[rank] += 1


def run_events(env: simpy.Environment, *, progress: bool = False) -> int:
    """Process every event of `env` until none is left. Returns how many ran. `progress`: count them on a bar
    (stderr, on a terminal only; the total is not known ahead)."""
    events = 0
    step, peek, inf = env.step, env.peek, float("inf")
    # Millions of short-lived events and records: the cyclic garbage collector, run every few hundred allocations,
    # would scan them all again and again (half the run at 10^5 ranks). Reference counting frees what it can; the
    # collector runs again after the loop.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with bar(desc="simulate", unit="event", enabled=progress) as shown:
            while peek() < inf:
                step()
                events += 1
                if not events & 0xFFFF:  # every 65,536 events: a bar update per event would cost more than it shows
                    shown.update(0x10000)
                    if interrupts.requested():  # Ctrl-C swallowed where it landed (simfog.interrupts)
                        raise KeyboardInterrupt
    finally:
        if collecting:
            gc.enable()
    return events
