"""The event engine's records kept as numpy columns, and the per (rank, iteration) numbers the summary takes from
them, computed with numpy.

Why: at 10^5 ranks one iteration leaves millions of intervals, and a DataFrame built from a tuple per interval,
grouped by pandas, cost more than the simulation itself. Intervals come one at a time (`record`: the tuple appended
as it comes, the cheapest a call can be) or as a block (`record_block`: horovod's fused collectives, the same
interval on every rank; BAGUA async's averaging round, cut by each rank's iterations), kept as arrays rather than a
tuple per rank. `columns()` lays everything out as arrays in record order; `tuples()` the list of
(rank, iteration, kind, name, start_s, end_s) that Result.intervals() reads, built only when a frame is asked for.

`iteration_columns` gives per (rank, iteration) what simfog.results needs, in the (ranks, iterations) arrays the
closed forms give (simfog.algorithms), so one Result code serves both. Its numbers are bit for bit those of the
pandas code it replaced (tests/test_event_scale.py keeps that code and compares): the records sorted stably by
(rank, iteration), so each group's keep their record order; every sum is np.add.reduceat over the sorted groups,
the call pandas' groupby makes for sorted groups on the same numbers in the same order; minima and maxima are exact
in any order; comm_exposed_s is the union of the comm intervals clipped to [backward's end, optimizer's start],
sorted stably by clipped start, each adding what the earlier ones of its group did not cover, as the pandas code
did (groupby cummax, shift, clip(lower=0), sum).
"""

from __future__ import annotations

import numpy as np

KINDS = ("forward", "backward", "optimizer", "comm", "wait")
DTYPES = {"rank": np.int64, "iteration": np.int64, "kind": np.int16, "start_s": np.float64, "end_s": np.float64}
FIELDS = tuple(DTYPES)


class SpanLog:
    """Every interval the engine records, in record order. `record(rank, iteration, kind, name, start, end)` appends
    one; `record_block` many at once. Kinds are kept as codes into `kinds` (KINDS first, then any other in order of
    appearance)."""

    def __init__(self):
        self.rows: list[tuple] = []
        self.blocks: list[tuple] = []  # (len(rows) when recorded, ranks, iteration, kind, name, start, end)
        append = self.rows.append

        def record(*interval) -> None:  # (rank, iteration, kind, name, start, end): the argument tuple is the row
            append(interval)

        self.record = record
        self.kinds = list(KINDS)

    @classmethod
    def of(cls, rows) -> SpanLog:
        """A log of `rows`, (rank, iteration, kind, name, start, end) tuples (a measured run's, validate)."""
        log = cls()
        log.rows.extend(rows)
        return log

    def shape(self) -> tuple[int, int]:
        """(ranks, iterations) the records span: one more than the largest of each."""
        cols = self.columns()
        return tuple(int(cols[f].max()) + 1 if len(cols[f]) else 0 for f in ("rank", "iteration"))

    def record_block(self, ranks, iteration, kind: str, name: str, start, end) -> None:
        """Intervals of `ranks` (a range or an int array), one each, in that order; `iteration`, `start` and `end`
        are scalars (the same for every rank) or arrays along `ranks`."""
        self.blocks.append((len(self.rows), ranks, iteration, kind, name, start, end))

    def _code(self, kind: str) -> int:
        if kind not in self.kinds:
            self.kinds.append(kind)
        return self.kinds.index(kind)

    def columns(self) -> dict[str, np.ndarray]:
        """rank, iteration (int64), kind (codes into `kinds`, int16), start_s, end_s (float64), in record order."""
        rows = self.rows
        if rows:
            rank, iteration, kind, _name, start, end = zip(*rows)
            codes = {k: self._code(k) for k in dict.fromkeys(kind)}
            table = {"rank": np.array(rank, dtype=np.int64), "iteration": np.array(iteration, dtype=np.int64),
                     "kind": np.fromiter(map(codes.__getitem__, kind), dtype=DTYPES["kind"], count=len(kind)),
                     "start_s": np.array(start, dtype=float), "end_s": np.array(end, dtype=float)}
        else:
            table = {f: np.empty(0, dtype=DTYPES[f]) for f in FIELDS}
        if not self.blocks:
            return table
        parts: dict[str, list] = {f: [] for f in FIELDS}
        at = 0
        for pos, ranks, iteration, kind, _name, start, end in self.blocks:
            ranks = np.asarray(ranks, dtype=np.int64)
            block = {"rank": ranks, "iteration": iteration, "kind": self._code(kind), "start_s": start, "end_s": end}
            for f in FIELDS:
                parts[f].append(table[f][at:pos])
                parts[f].append(np.broadcast_to(np.asarray(block[f], dtype=DTYPES[f]), ranks.shape))
            at = pos
        return {f: np.concatenate(parts[f] + [table[f][at:]]) for f in FIELDS}

    def tuples(self) -> list[tuple]:
        """Every interval as (rank, iteration, kind, name, start_s, end_s), in record order."""
        if not self.blocks:
            return self.rows
        out: list[tuple] = []
        at = 0
        for pos, ranks, iteration, kind, name, start, end in self.blocks:
            out += self.rows[at:pos]
            n = len(ranks)
            its, starts, ends = (np.broadcast_to(x, n).tolist() for x in (iteration, start, end))
            out += [(r, i, kind, name, s, e) for r, i, s, e in zip(np.asarray(ranks).tolist(), its, starts, ends)]
            at = pos
        return out + self.rows[at:]


def iteration_columns(log: SpanLog, ranks: int, iterations: int) -> dict[str, np.ndarray]:
    """Per (rank, iteration), (ranks, iterations) arrays: start_s, end_s (the group's first start and last end),
    forward_s, backward_s, optimizer_s, comm_s, wait_s (sums of the kind's durations), comm_exposed_s (the union of
    comm time between backward's end and the optimizer's start) and idle_s (the rest of that window). Every
    (rank, iteration) has records: each simulated rank finished each iteration (Simulation._check_finished)."""
    cols = log.columns()
    size = ranks * iterations
    key = cols["rank"] * iterations + cols["iteration"]
    order = None if _nondecreasing(key) else np.argsort(key, kind="stable")
    take = (lambda x: x) if order is None else (lambda x: x[order])
    key, kind, start, end = take(key), take(cols["kind"]), take(cols["start_s"]), take(cols["end_s"])
    first = _starts(key)
    if len(first) != size:
        from simfog.errors import SimfogError

        raise SimfogError(f"the engine recorded {len(first)} of {size} (rank, iteration) pairs")
    out = {"start_s": np.minimum.reduceat(start, first), "end_s": np.maximum.reduceat(end, first)}
    dur = end - start
    code = {k: i for i, k in enumerate(log.kinds)}
    of = {k: kind == code[k] for k in KINDS}
    for k in ("forward", "backward", "optimizer", "comm", "wait"):
        out[f"{k}_s"] = _sums(dur[of[k]], key[of[k]], size)
    # Backward and the optimizer may come in pieces (sharded algorithms run them unit by unit): backward ends with
    # its last piece, the optimizer starts with its first (NaN where a group has none).
    bwd_end = _reduce(np.maximum, end[of["backward"]], key[of["backward"]], size)
    opt_start = _reduce(np.minimum, start[of["optimizer"]], key[of["optimizer"]], size)
    comm = of["comm"]
    out["comm_exposed_s"] = exposed = _union(key[comm], start[comm], end[comm], bwd_end, opt_start, size)
    window = opt_start - bwd_end
    out["idle_s"] = _clip0(np.where(np.isnan(window), 0.0, window) - exposed)
    return {k: v.reshape(ranks, iterations) for k, v in out.items()}


def _union(key, start, end, lo, hi, size: int) -> np.ndarray:
    """Per group, how long at least one interval [start, end] clipped to [lo, hi] of its group ran (overlapping time
    once): kept intervals sorted stably by clipped start, each adding what the earlier ones did not cover."""
    s = np.fmax(start, lo[key])  # the pandas code's row-wise max and min skipped NaN
    e = np.fmin(end, hi[key])
    keep = e > s
    key, s, e = key[keep], s[keep], e[keep]
    same = key[1:] == key[:-1]
    if not np.all(~same | (s[1:] >= s[:-1])):
        order = np.lexsort((s, key))  # stable: ties keep record order
        key, s, e = key[order], s[order], e[order]
        same = key[1:] == key[:-1]
    covered = np.full(len(e), -np.inf)  # per interval, the latest end of the earlier ones of its group
    if np.all(~same | (e[1:] >= e[:-1])):  # ends in order: the previous one's
        covered[1:][same] = e[:-1][same]
    elif len(e):  # a running maximum per group: group-major codes of the ends' ranks, accumulated
        values, rank = np.unique(e, return_inverse=True)
        group = np.concatenate([[0], np.cumsum(~same)])
        run = np.maximum.accumulate(group * len(values) + rank.ravel())
        covered[1:][same] = values[run[:-1][same] % len(values)]
    return _sums(_clip0(e - np.maximum(s, covered)), key, size)


def _nondecreasing(x: np.ndarray) -> bool:
    return bool(np.all(x[1:] >= x[:-1]))


def _starts(key: np.ndarray) -> np.ndarray:
    """Where each run of equal keys begins (key sorted)."""
    if not len(key):
        return np.zeros(0, dtype=np.intp)
    return np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))


def _sums(values: np.ndarray, key: np.ndarray, size: int) -> np.ndarray:
    """Per group 0..size-1, the sum of its values (key sorted), added as pandas' groupby sum adds sorted groups:
    np.add.reduceat over the group's values in order. Groups without values sum to 0."""
    out = np.zeros(size)
    if len(key):
        first = _starts(key)
        out[key[first]] = np.add.reduceat(values, first)
    return out


def _reduce(ufunc, values: np.ndarray, key: np.ndarray, size: int) -> np.ndarray:
    """Per group (key sorted), ufunc.reduceat of its values; NaN for a group without values."""
    out = np.full(size, np.nan)
    if len(key):
        first = _starts(key)
        out[key[first]] = ufunc.reduceat(values, first)
    return out


def _clip0(x: np.ndarray) -> np.ndarray:
    """pandas' clip(lower=0): negatives become 0.0, NaN stays."""
    return np.where((x >= 0) | np.isnan(x), x, 0.0)
