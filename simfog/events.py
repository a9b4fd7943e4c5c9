"""Rendezvous primitives of the event engine, for the training algorithms: a `Collective` starts when its last
participant arrives and ends a duration later; a `SharedChannel` lets collectives that run at once share their
links (processor sharing). SimPy only; they know nothing of algorithms, traces or networks."""

from __future__ import annotations

import simpy


class Collective:
    """A collective among `expected` ranks: it starts when the last participant arrives (each arrives once it has
    launched the collective and its communication stream is free) and ends `duration_s` later."""

    __slots__ = ("env", "expected", "arrived", "duration_s", "start", "end", "done", "name", "channel", "nbytes")

    def __init__(self, env: simpy.Environment, expected: int, duration_s: float, name: str = "",
                 channel: SharedChannel | None = None, nbytes: float = 0.0):
        self.env, self.expected, self.arrived, self.duration_s = env, expected, 0, duration_s
        self.start = self.end = None
        self.done = env.event()
        self.name, self.channel, self.nbytes = name, channel, nbytes

    def join(self) -> simpy.Event:
        """Arrive; returns the event that fires when the collective has finished."""
        self.arrived += 1
        if self.arrived == self.expected:
            self.start = self.env.now
            if self.channel is not None:  # shares the links with whatever else runs; the channel ends it
                self.channel.start(self, self.nbytes)
                return self.done
            self.end = self.start + self.duration_s
            self.env.timeout(self.duration_s).callbacks.append(self._finish)
        return self.done

    def _finish(self, _event) -> None:
        self.done.succeed()


class SharedChannel:
    """Collectives of one group running at once share its links (processor sharing). With k running, each advances
    at the rate of its own duration when every link's bandwidth is divided by k (latencies are not shared).
    `duration(nbytes, k)` gives that time. Used when a rank keeps several collectives in flight (comm.streams)."""

    def __init__(self, env: simpy.Environment, duration):
        self.env, self.duration = env, duration
        self.active: dict[Collective, float] = {}  # collective -> fraction still to do
        self.updated = 0.0
        self.generation = 0

    def start(self, coll: Collective, nbytes: float) -> None:
        self._advance()
        coll.nbytes = nbytes
        self.active[coll] = 1.0
        self._schedule()

    def _rates(self) -> dict:
        k = len(self.active)
        return {c: 1.0 / self.duration(c.nbytes, k) if self.duration(c.nbytes, k) > 0 else float("inf")
                for c in self.active}

    def _advance(self) -> None:
        dt = self.env.now - self.updated
        if dt > 0 and self.active:
            for c, rate in self._rates().items():
                self.active[c] = max(0.0, self.active[c] - rate * dt)
        self.updated = self.env.now

    def _schedule(self) -> None:
        self.generation += 1
        if not self.active:
            return
        rates = self._rates()
        dt = min(left / rates[c] if rates[c] != float("inf") else 0.0 for c, left in self.active.items())
        gen = self.generation
        self.env.timeout(dt).callbacks.append(lambda _e: self._wake(gen))

    def _wake(self, gen: int) -> None:
        if gen != self.generation:
            return  # the active set changed since this wake-up was planned
        self._advance()
        # Done when (nearly) nothing is left, or when what is left would take less than the clock can add to now:
        # an absolute threshold alone left ~3e-12 of a collective whose wake-up then never advanced the clock
        # (a livelock in 67 of 120 ordinary comm.streams = 2 runs).
        now, rates = self.env.now, self._rates()
        finished = [c for c, left in self.active.items()
                    if left <= 1e-9 or rates[c] == float("inf") or now + left / rates[c] <= now]
        for c in finished:
            del self.active[c]
            c.end = self.env.now
            c.done.succeed()
        self._schedule()
