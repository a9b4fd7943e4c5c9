"""Rendezvous primitives of the event engine, for the training algorithms: a `Collective` starts when its last
participant arrives and ends a duration later; a `SharedChannel` lets collectives that run at once share their
links (processor sharing). SimPy only; they know nothing of algorithms, traces or networks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simfog.engine.sharing import INF, SharedResource

if TYPE_CHECKING:  # SimPy is imported only when a run takes the event engine (start-up of every command)
    import simpy


class Collective:
    """A collective among `expected` ranks: it starts when the last participant arrives (each arrives once it has
    launched the collective and its communication stream is free) and ends `duration_s` later. On a shared channel
    its time is the channel's times `factor` (its per-call variation, simfog.variation)."""

    __slots__ = ("env", "expected", "arrived", "duration_s", "start", "end", "done", "name", "channel", "nbytes",
                 "factor")

    def __init__(self, env: simpy.Environment, expected: int, duration_s: float, name: str = "",
                 channel: SharedChannel | None = None, nbytes: float = 0.0, factor: float = 1.0):
        self.env, self.expected, self.arrived, self.duration_s = env, expected, 0, duration_s
        self.start = self.end = None
        self.done = env.event()
        self.name, self.channel, self.nbytes, self.factor = name, channel, nbytes, factor

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
    """Collectives of one group running at once share its links (processor sharing, simfog.engine.sharing). With k
    running, each advances at the rate of its own duration when every link's bandwidth is divided by k (latencies
    are not shared). `duration(nbytes, k)` gives that time. Used when a rank keeps several collectives in flight
    (comm.streams)."""

    def __init__(self, env: simpy.Environment, duration):
        self.env, self.duration = env, duration
        self.links = SharedResource(1e-9)  # collective -> fraction still to do
        self.generation = 0

    def _rate(self, nbytes: float, factor: float = 1.0):
        def rate(k: int) -> float:
            d = self.duration(nbytes, k)
            if factor != 1.0:
                d = d * factor
            return 1.0 / d if d > 0 else INF

        return rate

    def start(self, coll: Collective, nbytes: float) -> None:
        coll.nbytes = nbytes
        self.links.add(self.env.now, coll, 1.0, self._rate(nbytes, coll.factor))
        self._schedule()

    def _schedule(self) -> None:
        self.generation += 1
        if not self.links.jobs:
            return
        gen = self.generation
        self.env.timeout(self.links.delay()).callbacks.append(lambda _e: self._wake(gen))

    def _wake(self, gen: int) -> None:
        if gen != self.generation:
            return  # the active set changed since this wake-up was planned
        for c in self.links.drained(self.env.now):
            c.end = self.env.now
            c.done.succeed()
        self._schedule()
