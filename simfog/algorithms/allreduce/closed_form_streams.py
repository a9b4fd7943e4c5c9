"""The static-bucket allreduce family's closed form on several communication streams (comm.streams > 1).

The event engine's program (simfog.algorithms.allreduce.program) lets each rank keep up to `streams` bucket
collectives in flight; collectives running at once share the links (simfog.engine.events.SharedChannel, processor
sharing: simfog.engine.sharing), so when one ends
depends on which others ran beside it, and no fixed max-plus schedule stands for it. But every collective is
global (each rank joins every bucket's collective, in bucket order), so whatever the shared links do happens once
for all ranks: a fluid loop over collectives, with the ranks as numpy vectors, replays it without SimPy.

Per iteration the loop holds the links' state (fraction of each running collective still to do, when the next one
is due to finish: the channel's pending wake-up) and, per rank, where its communication stream stands after its
last join and which buckets occupy its `streams` slots. Each pass either starts the next bucket's collective at
the last arrival of its ranks, or lets the links reach their next completion, whichever comes first; arrivals
that wait for a collective still running count as never until its end is known. Every time is computed with the
additions SimPy performs (`now + delay`) and the links with SharedChannel's very arithmetic (`_Links`), so the
times are those of the event engine bit for bit.

SimPy's order of events at one instant is the one thing a loop over times does not know. Where it could change a
result, the run is handed to the event engine (`Handover`): a collective whose last member arrives at the instant
the links' next completion is due (float coincidence), a pack/overhead and an unpack of one rank ending together
and scheduled together, and statically (`blocker`) collectives that take no time (one rank), which end at the
instant they start, in a tie with whatever that instant holds.

The per (rank, iteration) columns are summed as pandas sums the engine's records: comm records in the engine's
order (each bucket's collective, then packs, overheads and unpacks as they were appended), the exposed part as the
union of the comm intervals after backward (simfog.results._union_after_backward, the same stable sort and running
cover), both with np.add.reduceat (simfog.algorithms.sums.row_sums).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from simfog.algorithms.sums import CHUNK, row_sums
from simfog.engine.sharing import INF, SharedResource
from simfog.errors import Handover


def blocker(alg) -> str | None:
    """None when the streams loop can run `alg` (an AllreduceSGD with static buckets and streams > 1), else why not:
    a collective that takes no time (one rank) or whose time is not finite, for some number of collectives
    sharing the links."""
    if alg.call_factors is not None:
        return "collectives sharing links vary per call (simfog.variation): the event engine draws them"
    duration = alg.channel.duration
    for b in alg.buckets:
        for k in range(1, alg.streams + 1):
            d = duration(b.nbytes, k)
            if not 0 < d < INF:
                return ("a collective takes no time (one rank): it ends at the instant it starts, in SimPy's tie "
                        "order with that instant's other events" if d == 0 else
                        f"a collective's time is not finite ({d})")
    return None


class _Links:
    """The links' state as simfog.engine.events.SharedChannel keeps it (simfog.engine.sharing: the same arithmetic in
    the same order), driven by this loop instead of SimPy. `due` is the time of the pending wake-up (INF: none);
    `wake()` runs it."""

    def __init__(self, duration, nbytes):
        self.duration, self.nbytes, self.memo = duration, nbytes, {}
        self.links = SharedResource(1e-9)  # bucket -> fraction still to do, in start order
        self.due = INF

    @property
    def active(self) -> dict:
        return self.links.jobs

    def _rate(self, b: int):
        def rate(k: int) -> float:
            d = self.memo.get((b, k))
            if d is None:
                d = self.memo[b, k] = self.duration(self.nbytes[b], k)
            return 1.0 / d if d > 0 else INF

        return rate

    def _schedule(self, now: float) -> None:
        self.due = now + self.links.delay() if self.links.jobs else INF

    def start(self, b: int, now: float) -> None:
        self.links.add(now, b, 1.0, self._rate(b))
        self._schedule(now)

    def wake(self) -> tuple[float, list]:
        """Run the pending wake-up: (its time, the buckets whose collectives end then, in start order)."""
        now = self.due
        done = self.links.drained(now)
        self._schedule(now)
        return now, done


@dataclass
class Iteration:
    """One iteration of every rank (or of a block of ranks, `ranks()`): compute times (n,), per bucket the stream's
    time before the pack, after it and at arrival ((n,) each), and the collective's start, end and the end of its
    unpack (`free`: the stream slot is free again). `packed`: per bucket, whether it is packed and unpacked (a
    copy that takes time); `overhead`: the launch overhead (s) each bucket pays after its pack."""

    t0: np.ndarray
    t_b: np.ndarray
    t_e: np.ndarray
    t_o: np.ndarray
    t_end: np.ndarray
    pre: list
    mid: list
    arrive: list
    start: list
    end: list
    free: list
    packed: list
    overhead: float

    def ranks(self, lo: int, hi: int) -> Iteration:
        """Ranks lo..hi − 1 alone (views)."""
        def cut(x):
            return x[lo:hi]

        return replace(self, t0=cut(self.t0), t_b=cut(self.t_b), t_e=cut(self.t_e), t_o=cut(self.t_o),
                       t_end=cut(self.t_end), pre=list(map(cut, self.pre)), mid=list(map(cut, self.mid)),
                       arrive=list(map(cut, self.arrive)))


def iterate(sim, it: int, t0: np.ndarray) -> Iteration:
    """Iteration `it` of every rank from its starts t0 (n,): the fluid loop over the bucket collectives."""
    alg, c = sim.algorithm, sim.compute
    n, nb, streams = sim.simulated_ranks, len(alg.buckets), alg.streams
    s, slow = sim.draws[it, :n], sim.slowdown[:n]
    t_b = t0 + (c.forward_s[s] * slow + sim.delays[it, :n])
    t_e = t_b + sim.backward_s[s] * slow
    ready = np.ascontiguousarray(alg.ready.T)  # (buckets, samples)
    overhead = alg.overheads.collective_overhead_s
    copies = [alg.overheads.copy_s(b.nbytes) for b in alg.buckets]
    links = _Links(alg.channel.duration, [b.nbytes for b in alg.buckets])
    free = np.full(nb + 1, INF)  # per bucket, when its stream slot frees (INF: not known yet); [nb]: an empty slot
    free[nb] = -INF
    slots = [np.full(n, nb, dtype=np.intp) for _ in range(streams)]  # the bucket each rank's stream holds
    now = t_b
    pre_l, mid_l, arrive_l, start_l, end_l = [], [], [], [], [INF] * nb
    b, launched, cand = 0, None, None
    while b < nb or links.active:
        if b < nb and cand is None:
            if launched is None:  # buckets launch in order: a ready bucket waits for the earlier ones (SimPy:
                launch = t_b + ready[b][s] * slow  # now + (launch - now))
                launched = np.where(launch > now, now + (launch - now), now)
            held = [free[slot] for slot in slots]
            busy, first_free, which = held[0] > launched, held[0], np.zeros(n, dtype=np.intp)
            for i, h in enumerate(held[1:], 1):  # every stream busy: wait for the first to free
                busy &= h > launched
                sooner = h < first_free
                first_free, which = np.where(sooner, h, first_free), np.where(sooner, i, which)
            waits = bool(busy.any())
            pre = np.where(busy, first_free, launched) if waits else launched
            mid = pre + copies[b] if copies[b] > 0 else pre
            arrive = mid + overhead if overhead > 0 else mid
            cand = (float(arrive.max()), which, pre, mid, arrive, waits)
        first = cand[0] if b < nb else INF
        if first < links.due:  # the last member joins: the collective starts on the shared links
            _, which, pre, mid, arrive, _ = cand
            for i, slot in enumerate(slots):  # into the slot that freed first (or was free)
                slot[which == i] = b
            pre_l.append(pre), mid_l.append(mid), arrive_l.append(arrive), start_l.append(first)
            links.start(b, first)
            now, b, launched, cand = arrive, b + 1, None, None
        elif links.due < first:  # the links reach their next completion first
            t, done = links.wake()
            for d in done:
                end_l[d] = t
                free[d] = t + copies[d] if copies[d] > 0 else t
            if cand is not None and cand[5]:
                cand = None  # some rank waited for a slot: its arrival may now be known
        elif first == INF:
            raise Handover("a collective never completes")
        else:
            raise Handover("a collective's last member arrives at the very instant the shared links' next "
                           "completion is due: SimPy's order of that instant's events decides")
    last = float(free[:nb].max()) if nb else None  # the stream ends with its last unpack (or collective)
    t_o = np.maximum(t_e, last) if nb else np.maximum(t_e, t_b)
    t_end = t_o + c.optimizer_s[s] * slow
    return Iteration(t0, t_b, t_e, t_o, t_end, pre_l, mid_l, arrive_l, start_l, end_l, [float(f) for f in free[:nb]],
                     [copy > 0 for copy in copies], overhead)


def extras(itn: Iteration):
    """The packs, launch overheads and unpacks of every rank in the order the engine appends them (SimPy: by the
    time they end; at one instant, the one scheduled first; unpacks that also started together, by bucket), or
    None when there are none. Returns (starts, ends, codes), each (m, n), rank r's in column r: codes 3·bucket +
    (0 pack, 1 overhead, 2 unpack). Packs and overheads (one rank's stream, in bucket order) and unpacks (after
    collectives that end for every rank at once) interleave differently per rank. Raises Handover when a rank's
    pack or overhead and an unpack end at one instant and were scheduled at one instant (SimPy's queue order
    decides)."""
    n = len(itn.t0)
    stream_s, stream_e, stream_c = [], [], []
    for b, (pre, mid, arrive) in enumerate(zip(itn.pre, itn.mid, itn.arrive)):
        if itn.packed[b]:
            stream_s.append(pre), stream_e.append(mid), stream_c.append(3 * b)
        if itn.overhead > 0:
            stream_s.append(mid), stream_e.append(arrive), stream_c.append(3 * b + 1)
    unpacks = sorted((itn.free[b], itn.end[b], b) for b in range(len(itn.start)) if itn.packed[b])
    if not stream_c and not unpacks:
        return None
    ms, mu = len(stream_c), len(unpacks)
    if not mu:
        return np.array(stream_s), np.array(stream_e), np.broadcast_to(np.array(stream_c)[:, None], (ms, n))
    u_end = np.array([u[0] for u in unpacks])
    u_start = np.array([u[1] for u in unpacks])
    u_codes = np.array([3 * u[2] + 2 for u in unpacks])
    starts, ends = np.empty((ms + mu, n)), np.empty((ms + mu, n))
    codes = np.empty((ms + mu, n), dtype=np.intp)
    taken = np.zeros((ms + mu, n), dtype=bool)
    ranks = np.arange(n)
    for j, (a, e, code) in enumerate(zip(stream_s, stream_e, stream_c)):
        before = np.searchsorted(u_end, e, side="left")  # unpacks appended before this one
        for r in np.flatnonzero(before != np.searchsorted(u_end, e, side="right")):
            lo, hi = before[r], np.searchsorted(u_end, e[r], side="right")  # ends with unpacks: the one
            at = np.searchsorted(u_start[lo:hi], a[r], side="left")         # scheduled first comes first
            if at < hi - lo and u_start[lo + at] == a[r]:
                raise Handover("a pack or launch overhead and an unpack of one rank end at one instant, scheduled "
                               "at one instant: SimPy's order of that instant's events decides")
            before[r] = lo + at
        place = j + before
        starts[place, ranks], ends[place, ranks], codes[place, ranks] = a, e, code
        taken[place, ranks] = True
    free = ~taken.T  # the unpacks fill each rank's other places, in their order
    starts.T[free], ends.T[free], codes.T[free] = np.tile(u_start, n), np.tile(u_end, n), np.tile(u_codes, n)
    return starts, ends, codes


def comm_sums(itn: Iteration, more) -> np.ndarray:
    """comm_s per rank: its comm records' durations added in the engine's record order (each bucket's collective,
    then `more`, the extras() table)."""
    n = len(itn.t0)
    collectives = np.array(itn.end) - np.array(itn.start)
    if more is None:  # every rank alike: one sum
        return np.broadcast_to(row_sums(collectives[None, :]), (n,)).copy()
    table = np.vstack([np.broadcast_to(collectives[:, None], (len(collectives), n)), more[1] - more[0]])
    return row_sums(np.ascontiguousarray(table.T))


def exposed_sums(itn: Iteration, more) -> np.ndarray:
    """comm_exposed_s per rank as simfog.results._union_after_backward computes it: each comm record (in the
    engine's order, as comm_sums) clipped to [backward's end, optimizer's start], the kept ones (non-empty) stably
    sorted by start, each adding what reaches past the running cover of the ones before it, summed in that order.
    Collectives that no rank keeps are left out first (they neither add nor cover); the collectives' clipped starts
    never decrease (they start in bucket order), so only extras can need the sort."""
    t_e, t_o = itn.t_e, itn.t_o
    n = len(t_e)
    start, end = np.array(itn.start), np.array(itn.end)
    alive = (end > t_e.min()) & (start < t_o.max())
    starts = np.broadcast_to(start[alive][:, None], (int(alive.sum()), n))
    ends = np.broadcast_to(end[alive][:, None], starts.shape)
    if more is not None:
        starts, ends = np.vstack([starts, more[0]]), np.vstack([ends, more[1]])
    lo = np.maximum(starts, t_e)
    hi = np.minimum(ends, t_o)
    keep = hi > lo
    if more is not None:  # leave out the records no rank keeps
        used = keep.any(axis=1)
        if not used.all():
            lo, hi, keep = lo[used], hi[used], keep[used]
    if more is not None and len(lo) > 1:
        latest = np.maximum.accumulate(np.where(keep, lo, -INF), axis=0)  # kept starts so far
        if not (~keep[1:] | (lo[1:] >= latest[:-1])).all():  # a kept one starts before an earlier kept one
            order = np.argsort(np.where(keep, lo, INF), axis=0, kind="stable")
            lo, hi, keep = (np.take_along_axis(x, order, axis=0) for x in (lo, hi, keep))
    if not len(lo):
        return np.zeros(n)
    covered = np.empty_like(hi)
    covered[0] = -INF
    if len(hi) > 1:
        np.maximum.accumulate(np.where(keep[:-1], hi[:-1], -INF), axis=0, out=covered[1:])
    part = hi - np.maximum(lo, covered)
    part = np.where(part >= 0, part, 0.0)
    return row_sums(np.ascontiguousarray(part.T), np.ascontiguousarray(keep.T))


def run(sim, path: str):
    """Simulate `sim` (a simfog.simulation.Simulation of allreduce with static buckets on several streams) with the
    fluid loop. Returns its Result, which names `path`. Raises Handover where SimPy's tie order would decide."""
    started = time.perf_counter()
    n, iters = sim.simulated_ranks, sim.experiment.iterations
    cols = {k: np.zeros((n, iters)) for k in ("start_s", "end_s", "forward_s", "backward_s", "optimizer_s", "comm_s",
                                              "comm_exposed_s", "idle_s")}
    t0 = np.zeros(n)
    finished = np.zeros(n, dtype=int)
    for it in range(iters):
        itn = iterate(sim, it, t0)
        finished += np.isfinite(itn.t_end)
        rows = 4 * len(itn.start) + 1  # comm records per rank, at most (collective, pack, overhead, unpack)
        step = max(1, CHUNK // rows)  # blocks of ranks: bounded tables, each rank's records its own
        for lo in range(0, n, step):
            block = itn.ranks(lo, lo + step) if step < n else itn
            more = extras(block)
            cols["comm_s"][lo:lo + step, it] = comm_sums(block, more)
            cols["comm_exposed_s"][lo:lo + step, it] = exposed_sums(block, more)
        cols["start_s"][:, it], cols["end_s"][:, it] = t0, itn.t_end
        cols["forward_s"][:, it] = itn.t_b - t0
        cols["backward_s"][:, it] = itn.t_e - itn.t_b
        cols["optimizer_s"][:, it] = itn.t_end - itn.t_o
        cols["idle_s"][:, it] = np.maximum((itn.t_o - itn.t_e) - cols["comm_exposed_s"][:, it], 0.0)
        t0 = itn.t_end
    return sim.result(cols, path=path, started=started, finished=finished, make_records=lambda: records(sim),
                      make_columns=lambda: waits(sim))


def _kept(sim):
    """Each iteration again (for frames and records, built when asked)."""
    t0 = np.zeros(sim.simulated_ranks)
    for it in range(sim.experiment.iterations):
        itn = iterate(sim, it, t0)
        yield it, itn
        t0 = itn.t_end


def waits(sim) -> dict:
    """{"wait_s": (ranks, iterations)}: per rank, how long its collectives waited for their last member, added in
    bucket order (the engine records them so)."""
    out = np.zeros((sim.simulated_ranks, sim.experiment.iterations))
    for it, itn in _kept(sim):
        if itn.start:
            arrive = np.column_stack(itn.arrive)
            start = np.array(itn.start)[None, :]
            out[:, it] = row_sums(start - arrive, start > arrive)
    return {"wait_s": out}


def records(sim) -> list[tuple]:
    """The event engine's records (rank, iteration, kind, name, start_s, end_s), per rank and iteration: forward,
    backward, each bucket's wait and collective, the packs, overheads and unpacks in the engine's order, optimizer."""
    out: list[tuple] = []
    what = (".pack", ".overhead", ".unpack")
    for it, itn in _kept(sim):
        more = extras(itn)
        if more is not None:
            starts, ends, codes = (x.T.tolist() for x in more)
        lists = [x.tolist() for x in (itn.t0, itn.t_b, itn.t_e, itn.t_o, itn.t_end)]
        arrive = [a.tolist() for a in itn.arrive]
        per = list(zip(range(len(itn.start)), arrive, itn.start, itn.end))
        for r in range(len(itn.t0)):
            a0, ab, ae, ao, aend = (x[r] for x in lists)
            out.append((r, it, "forward", "forward", a0, ab))
            out.append((r, it, "backward", "backward", ab, ae))
            for b, arr, start, end in per:
                if start > arr[r]:
                    out.append((r, it, "wait", f"bucket{b}", arr[r], start))
                out.append((r, it, "comm", f"bucket{b}", start, end))
            if more is not None:
                out += [(r, it, "comm", f"bucket{code // 3}{what[code % 3]}", a, e)
                        for a, e, code in zip(starts[r], ends[r], codes[r])]
            out.append((r, it, "optimizer", "optimizer", ao, aend))
    return out
