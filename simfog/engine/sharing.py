"""Processor sharing, written once: jobs on a resource at the same time share it, each at the rate the resource gives
it when k jobs are on it, recomputed only when a job arrives or leaves.

`SharedResource` is one resource's state and arithmetic, with no clock of its own: the event engine's
`SharedChannel` (simfog.engine.events: collectives of one group sharing its links, comm.streams > 1) drives it with
SimPy timeouts, the allreduce family's closed form on several streams with a loop over its collectives, and
`SharedLinks` (many resources and a heap of their completions: point-to-point messages under
comm.p2p_sharing = "fluid") with the dataflow family's evaluation in time order. One arithmetic in one order, so the
three agree bit for bit where they meet.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable

INF = math.inf


class SharedResource:
    """One shared resource. A job is added with an amount to do (a fraction of a collective, bytes of a message)
    and `rate(k)`, its rate (amount per second) when k jobs share the resource (INF: it takes no time). `advance(t)`
    lets every job progress to time t; `delay()` is how long, from the last advance, until the first job drains;
    `drained(t)` advances to t and removes and returns the jobs done then: those with at most `epsilon` left, or
    whose remainder would take less than the clock can add to t (an absolute threshold alone left slivers whose
    wake-up never advanced the clock: a livelock in 67 of 120 ordinary comm.streams = 2 runs)."""

    __slots__ = ("jobs", "updated", "epsilon")

    def __init__(self, epsilon: float):
        self.jobs: dict[Hashable, list] = {}  # job -> [amount left, rate(k)], in arrival order
        self.updated = 0.0
        self.epsilon = epsilon

    def _rates(self) -> list[float]:
        k = len(self.jobs)
        return [rate(k) for _, rate in self.jobs.values()]

    def advance(self, t: float) -> None:
        dt = t - self.updated
        if dt > 0 and self.jobs:
            for job, rate in zip(self.jobs.values(), self._rates()):
                job[0] = max(0.0, job[0] - rate * dt)
        self.updated = t

    def add(self, t: float, job: Hashable, amount: float, rate: Callable[[int], float]) -> None:
        """Job `job` arrives at t with `amount` to do."""
        self.advance(t)
        self.jobs[job] = [amount, rate]

    def delay(self) -> float:
        """Seconds from the last advance until the first job drains (INF: no job)."""
        if not self.jobs:
            return INF
        return min(left / rate if rate != INF else 0.0 for (left, _), rate in zip(self.jobs.values(), self._rates()))

    def drained(self, t: float, *, at_least_one: bool = False) -> list:
        """Advance to t; remove and return the jobs done then, in arrival order. `at_least_one`: when rounding
        left every job a sliver, the one due first is done."""
        self.advance(t)
        k, rates = len(self.jobs), self._rates()
        done = [job for (job, (left, _)), rate in zip(self.jobs.items(), rates)
                if left <= self.epsilon or rate == INF or t + left / rate <= t]
        if not done and at_least_one and k:
            done = [min(self.jobs, key=lambda j: self.jobs[j][0] / self.jobs[j][1](k))]
        for job in done:
            del self.jobs[job]
        return done


class SharedLinks:
    """Many resources shared by processor sharing, with a heap of their completions. `add(t, job, resource, nbytes,
    bw, cap)` puts a job on a resource at time t, running at min(cap, bw / jobs there) bytes per second;
    `next_time()` is the earliest completion; `pop(t)` advances every resource with a completion at t and returns
    the (job, resource) pairs that have drained."""

    def __init__(self):
        self.resources: dict[int, SharedResource] = {}
        self.due: list[tuple[float, int, int]] = []  # (completion time, generation, resource)
        self.generation: dict[int, int] = {}

    def _schedule(self, r: int) -> None:
        g = self.generation[r] = self.generation.get(r, 0) + 1
        resource = self.resources[r]
        if resource.jobs:
            heapq.heappush(self.due, (resource.updated + resource.delay(), g, r))

    def add(self, t: float, job: int, r: int, nbytes: float, bw: float, cap: float) -> None:
        resource = self.resources.get(r)
        if resource is None:
            resource = self.resources[r] = SharedResource(1e-6)
            resource.updated = t
        resource.add(t, job, nbytes, lambda k: min(cap, bw / k))
        self._schedule(r)

    def next_time(self) -> float:
        while self.due and self.due[0][1] != self.generation.get(self.due[0][2]):
            heapq.heappop(self.due)  # planned before the resource's jobs changed
        return self.due[0][0] if self.due else INF

    def pop(self, t: float) -> list[tuple[int, int]]:
        out = []
        while self.next_time() <= t:
            _, _, r = heapq.heappop(self.due)
            out += [(j, r) for j in self.resources[r].drained(t, at_least_one=True)]
            self._schedule(r)
        return out
