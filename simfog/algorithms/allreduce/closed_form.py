"""The static-bucket allreduce family's closed form: a max-plus recurrence over every rank at once (numpy vectors).

When every decision is fixed before the run (algorithm "allreduce" or a compressed allreduce with a static merge
policy, one communication stream), the event engine's schedule (simfog.algorithms.allreduce.program) has a closed
form.
Per iteration, with s the rank's compute draw, slow its slowdown, d its straggler delay:

    t_b  = t0 + (fwd[s]·slow + d)                     backward starts
    T    = t_b                                         the rank's communication stream
    per bucket b, in order:
        launch = t_b + ready[s, b]·slow;  T = T + (launch − T) if launch > T       (SimPy: now + delay)
        T += copy_b (pack, when > 0);  T += overhead (when > 0);  arrive_b = T
        start_b = max over ranks of arrive_b;  end_b = start_b + duration_b       (the Collective barrier; the
                                                       iteration's own under per-call variation, simfog.variation)
        T = end_b (+ copy_b: unpack)
    t_e  = t_b + bwd[s]·slow;  t_o = max(t_e, T);  next t0 = t_o + opt[s]·slow

Every addition is the one SimPy performs (`now + delay`, in the same order), so the times are bit for bit those of
the event engine. The per-(rank, iteration) columns the summary needs (compute, comm, exposed comm, idle, wait)
are summed in the order and with the summation (np.add.reduceat) pandas uses on the engine's sorted records,
so summaries are equal too. Records (the per-interval list of the event engine) are built only when asked for
(`Result.intervals()`), from the same recurrence. On several communication streams sharing links
(comm.streams > 1) there is no fixed schedule, but every collective is global: closed_form_streams replays them.
"""

from __future__ import annotations

import time

import numpy as np

from simfog.results import PATH_ANALYTIC


def _segment_sums(n: int, values: list, masks: list | None = None) -> np.ndarray:
    """Per rank, the sum of `values` (each a (n,) array or a scalar, in order) where `masks` (each (n,) bool or None
    for all) hold, added as pandas adds a group sorted by rank: np.add.reduceat over the kept values laid out rank
    by rank (the very call on the very numbers, so the same bits). Ranks with nothing kept sum to 0."""
    out = np.zeros(n)
    if not values:
        return out
    m = len(values)
    if masks is None and all(np.ndim(v) == 0 for v in values):
        return out + np.add.reduceat(np.array(values, dtype=float), [0])[0]
    table = np.empty((n, m + 1))  # a spare column: every segment's end is an index inside the table
    for j, v in enumerate(values):
        table[:, j] = v
    flat = table.ravel()
    if masks is None:
        bounds = np.empty(2 * n, dtype=np.intp)
        bounds[0::2] = np.arange(n) * (m + 1)
        bounds[1::2] = bounds[0::2] + m
        return np.add.reduceat(flat, bounds)[0::2]
    keep = np.zeros((n, m + 1), dtype=bool)
    for j, k in enumerate(masks):
        keep[:, j] = True if k is None else k
    counts = keep.sum(axis=1)
    some = counts > 0
    first = keep.argmax(axis=1)
    ranks = np.flatnonzero(some)
    if (keep[ranks, first[ranks] + counts[ranks] - 1]).all() and some.any():
        # Each rank keeps one run of columns (intervals of one stream overlapping a window): sum the runs where
        # they lie, as segments [start, end) of one reduceat taken every other one.
        starts = ranks * (m + 1) + first[ranks]
        bounds = np.empty(2 * len(ranks), dtype=np.intp)
        bounds[0::2], bounds[1::2] = starts, starts + counts[ranks]
        if _runs_are_contiguous(keep, first, counts, ranks):
            out[ranks] = np.add.reduceat(flat, bounds)[0::2]
            return out
    if some.any():
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out[some] = np.add.reduceat(table[keep], starts[some])
    return out


def _runs_are_contiguous(keep, first, counts, ranks) -> bool:
    """Whether each of `ranks` keeps exactly the columns first..first + count − 1."""
    m = keep.shape[1]
    cols = np.arange(m)
    sub = keep[ranks] if len(ranks) < keep.shape[0] else keep
    want = (cols >= first[ranks, None]) & (cols < (first[ranks] + counts[ranks])[:, None])
    return bool((sub == want).all())


def _schedule(sim, it: int, t0: np.ndarray):
    """One iteration's recurrence from the iteration starts t0 (n,). Returns (s, slow, t_b, t_e, T, steps): T the
    communication stream's end (n,), steps per bucket (pre, mid, arrive, start, end, after): the stream time before
    the pack, after it (before the launch overhead), at arrival (vectors, or None when equal to the previous one),
    and the collective's start, end and the end of its unpack (scalars)."""
    alg, c = sim.algorithm, sim.compute
    n = sim.simulated_ranks
    s = sim.draws[it, :n]
    slow = sim.slowdown[:n]
    t_b = t0 + (c.forward_s[s] * slow + sim.delays[it, :n])
    ready = np.ascontiguousarray(alg.ready.T)  # (buckets, samples)
    T = t_b
    overhead = alg.overheads.collective_overhead_s
    steps = []
    for b in range(len(alg.buckets)):
        launch = t_b + ready[b][s] * slow
        if np.ndim(T) == 0:  # every rank's stream is free at the same time: the previous bucket's end
            T = np.where(launch > T, T + (launch - T), T)
        else:
            later = launch > T
            if later.any():
                T = np.where(later, T + (launch - T), T)
        copy = alg.overheads.copy_s(alg.buckets[b].nbytes)
        pre = T
        if copy > 0:
            T = T + copy
        mid = T
        if overhead > 0:
            T = T + overhead
        start = T.max()
        end = start + alg.duration(it, b)
        after = end + copy if copy > 0 else end
        steps.append((pre, mid, T, start, end, after))
        T = after
    t_e = t_b + sim.backward_s[s] * slow
    return s, slow, t_b, t_e, T, steps


def _time_ordered(steps, overhead: float):
    """The comm intervals of one stream in time order: per bucket pack, overhead, collective, unpack."""
    for pre, mid, arrive, start, end, after in steps:
        if mid is not pre:
            yield pre, mid
        if overhead > 0:
            yield mid, arrive
        yield start, end
        if mid is not pre:
            yield end, after


def run(sim):
    """Simulate `sim` (a simfog.simulation.Simulation of static buckets on one stream whose closed_form_blocker()
    is None). Returns its Result."""
    started = time.perf_counter()
    alg, c = sim.algorithm, sim.compute
    n, iters = sim.simulated_ranks, sim.experiment.iterations
    overhead = alg.overheads.collective_overhead_s
    cols = {k: np.zeros((n, iters)) for k in ("start_s", "end_s", "forward_s", "backward_s", "optimizer_s", "comm_s",
                                              "comm_exposed_s", "idle_s")}
    t0 = np.zeros(n)
    finished = np.zeros(n, dtype=int)
    for it in range(iters):
        s, slow, t_b, t_e, T, steps = _schedule(sim, it, t0)
        t_o = np.maximum(t_e, T)
        t_end = t_o + c.optimizer_s[s] * slow
        finished += np.isfinite(t_end)
        # Per (rank, iteration) sums in the order of the engine's records (each bucket's collective, then per
        # bucket its pack, overhead and unpack), added as pandas adds them.
        durations = [end - start for pre, mid, arrive, start, end, after in steps]
        for pre, mid, arrive, _start, end, after in steps:
            if mid is not pre:
                durations.append(mid - pre)
            if overhead > 0:
                durations.append(arrive - mid)
            if mid is not pre:
                durations.append(after - end)
        comm = _segment_sums(n, durations)
        # comm_exposed_s: the union of the comm intervals between backward's end and the optimizer step. One stream:
        # they follow one another, so each clipped to that window adds hi − lo (pandas' running cover of the
        # earlier ones never reaches past the next one's start).
        lo_min, hi_max = t_e.min(), t_o.max()
        parts, kept = [], []
        for a, e in _time_ordered(steps, overhead):
            if np.ndim(e) == 0 and e <= lo_min or np.ndim(a) == 0 and a >= hi_max:
                continue  # before every backward's end, or after every optimizer step's start
            lo = np.maximum(a, t_e)
            hi = np.minimum(e, t_o)
            keep = hi > lo
            if not keep.any():
                continue
            parts.append(hi - lo)
            kept.append(None if keep.all() else keep)
        exposed = _segment_sums(n, parts, None if all(k is None for k in kept) else kept)
        cols["start_s"][:, it], cols["end_s"][:, it] = t0, t_end
        cols["forward_s"][:, it] = t_b - t0
        cols["backward_s"][:, it] = t_e - t_b
        cols["optimizer_s"][:, it] = t_end - t_o
        cols["comm_s"][:, it] = comm
        cols["comm_exposed_s"][:, it] = exposed
        cols["idle_s"][:, it] = np.maximum((t_o - t_e) - exposed, 0.0)
        t0 = t_end
    return sim.result(cols, path=PATH_ANALYTIC, started=started, finished=finished,
                      make_records=lambda: records(sim), make_columns=lambda: waits(sim))


def waits(sim) -> dict:
    """{"wait_s": (ranks, iterations)}: per rank and iteration, how long its collectives waited for their last
    participant (summed as pandas sums the engine's wait records). Only frames need it: built when asked."""
    n, iters = sim.simulated_ranks, sim.experiment.iterations
    out = np.zeros((n, iters))
    t0 = np.zeros(n)
    for it in range(iters):
        s, slow, t_b, t_e, T, steps = _schedule(sim, it, t0)
        out[:, it] = _segment_sums(n, [start - arrive for _, _, arrive, start, _, _ in steps],
                                   [start > arrive for _, _, arrive, start, _, _ in steps])
        t0 = np.maximum(t_e, T) + sim.compute.optimizer_s[s] * slow
    return {"wait_s": out}


def records(sim) -> list[tuple]:
    """The event engine's records (rank, iteration, kind, name, start_s, end_s) of `sim`, from the recurrence:
    per iteration and rank forward, backward, waits and collectives, packs, overheads and unpacks, optimizer."""
    alg, c = sim.algorithm, sim.compute
    n, iters = sim.simulated_ranks, sim.experiment.iterations
    overhead = alg.overheads.collective_overhead_s
    names = [f"bucket{b}" for b in range(len(alg.buckets))]
    out: list[tuple] = []
    t0 = np.zeros(n)
    for it in range(iters):
        s, slow, t_b, t_e, T, steps = _schedule(sim, it, t0)
        t_o = np.maximum(t_e, T)
        t_end = t_o + c.optimizer_s[s] * slow
        lists = [x.tolist() for x in (t0, t_b, t_e, t_o, t_end)]
        per = [(name, pre.tolist(), mid.tolist(), arrive.tolist(), float(start), float(end), float(after),
                mid is not pre) for name, (pre, mid, arrive, start, end, after) in zip(names, steps)]
        for r in range(n):
            a0, ab, ae, ao, aend = (x[r] for x in lists)
            out.append((r, it, "forward", "forward", a0, ab))
            out.append((r, it, "backward", "backward", ab, ae))
            for name, _pre, _mid, arrive, start, end, _after, _copied in per:
                if start > arrive[r]:
                    out.append((r, it, "wait", name, arrive[r], start))
                out.append((r, it, "comm", name, start, end))
            for name, pre, mid, arrive, _start, end, after, copied in per:
                if copied:
                    out.append((r, it, "comm", f"{name}.pack", pre[r], mid[r]))
                if overhead > 0:
                    out.append((r, it, "comm", f"{name}.overhead", mid[r], arrive[r]))
                if copied:
                    out.append((r, it, "comm", f"{name}.unpack", end, after))
            out.append((r, it, "optimizer", "optimizer", ao, aend))
        t0 = t_end
    return out
