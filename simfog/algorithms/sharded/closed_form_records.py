"""The records a sharded iteration leaves (simfog.algorithms.sharded.closed_form solves it), in the event engine's
order, and the per (rank, iteration) sums the summary takes over them, added as pandas adds them.

The engine records a collective when it ends, so a rank's collectives come in the order of their ends; of two that
end together, the one that started first (SimPy processes its timeout first); of two that also started together,
the one issued first (its last member joined first). That last rule is where SimPy can differ: when the
earlier-issued one's last member joined later at that very instant (it waited for an event of that instant, e.g.
the end of a collective that took no time), SimPy records the other first. Such twins have equal durations, so
comm_s and comm_exposed_s do not change; wait_s adds their waits the other way round, which changes its last bit
only if a rank waited differently for the two. pandas sums each (rank, iteration) group with np.add.reduceat;
the same call runs here on the same numbers in that order.
"""

from __future__ import annotations

import numpy as np

from simfog.algorithms.sharded.closed_form_program import Iteration, Program
from simfog.algorithms.sums import CHUNK, row_sums


class Records:
    """An iteration's collectives `cols` as each rank records them, for blocks of ranks [lo, hi): (rows, len(cols))
    tables of their start, end (per group) or arrival (per rank). `shared`: one group of all ranks for every
    column, or every group alike, so every rank records them in one order, rank 0's, which `cols` follows. Else
    columns come by group kind (each kind's in rank 0's order: one gather of rows per kind makes a block, no
    permutation after it) and `order` sorts each row."""

    def __init__(self, prog: Program, itn: Iteration, cols):
        def first(values, k):
            return np.atleast_1d(values[k])[0]

        position = {k: i for i, k in enumerate(prog.issued)}
        cols = sorted(cols, key=lambda k: (first(itn.end, k), first(itn.start, k), position[k]))
        kinds: dict = {}
        for k in cols:
            kinds.setdefault(prog.groups[k], []).append(k)
        self.itn, self.kinds = itn, list(kinds.items())
        self.shared = all(g.kind == "all" or _uniform(itn, ks) for g, ks in self.kinds)
        self.cols = cols if self.shared else [k for _, ks in self.kinds for k in ks]
        self.issue = np.array([position[k] for k in self.cols], dtype=int)
        self.stacked: dict = {}  # not shared: per kind its columns' values stacked per group (groups, columns)

    def table(self, what: str, lo: int, hi: int) -> np.ndarray:
        itn = self.itn
        if what == "arrive":
            return np.stack([itn.arrive[k][lo:hi] for k in self.cols], axis=1).reshape(hi - lo, len(self.cols))
        values = itn.start if what == "start" else itn.end
        if self.shared:  # one row for every rank
            row = np.array([np.atleast_1d(values[k])[0] for k in self.cols], dtype=float)
            return np.broadcast_to(row, (hi - lo, len(self.cols)))
        if what not in self.stacked:
            self.stacked[what] = [np.stack([np.atleast_1d(values[k]) for k in ks], axis=1) for _, ks in self.kinds]
        return np.concatenate([np.broadcast_to(m, (hi - lo, m.shape[1])) if g.kind == "all" else m[g.ids(lo, hi)]
                               for (g, _), m in zip(self.kinds, self.stacked[what])], axis=1)

    def order(self, *keys: np.ndarray) -> np.ndarray:
        """Per row (not shared), the order of its columns by keys (the last the first), then by issue: np.lexsort
        as laid out (runs nearly sorted, so fast), then, on rows where keys tie out of issue order, again with
        the columns in issue order (stable: ties keep it)."""
        order = np.lexsort(keys, axis=1)
        first = np.take_along_axis(keys[-1], order, 1)
        # neighbours that tie on the first key (few; infinite keys are collectives exposed_sums leaves out)
        r, c = np.nonzero((first[:, 1:] == first[:, :-1]) & np.isfinite(first[:, 1:]))
        a, b = order[r, c], order[r, c + 1]
        wrong = self.issue[a] > self.issue[b]
        for key in keys[:-1]:
            wrong &= key[r, a] == key[r, b]
        tied = np.unique(r[wrong])
        if len(tied):
            by_issue = np.argsort(self.issue)
            order[tied] = by_issue[np.lexsort(tuple(key[tied][:, by_issue] for key in keys), axis=1)]
        return order


def _uniform(itn: Iteration, cols) -> bool:
    """Whether every group has the same start and end of each of `cols` (e.g. ranks that compute alike)."""
    return all(np.all(v[k] == v[k][0]) for v in (itn.start, itn.end) for k in cols)


def take(x: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """x (rows, m) with each row in `order` (None: as it is)."""
    return x if order is None else np.take_along_axis(x, order, 1)


def blocks(n: int, width: int):
    step = max(1, CHUNK // max(1, width))
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def comm_sums(prog: Program, itn: Iteration, n: int) -> np.ndarray:
    """comm_s: per rank the sum of its collectives' durations (end − start) in record order."""
    rec = Records(prog, itn, prog.issued)
    if rec.shared:
        return np.full(n, row_sums(rec.table("end", 0, 1) - rec.table("start", 0, 1))[0])
    out = np.empty(n)
    for lo, hi in blocks(n, len(rec.cols)):
        S, E = rec.table("start", lo, hi), rec.table("end", lo, hi)
        out[lo:hi] = row_sums(take(E - S, rec.order(S, E)))
    return out


def exposed_sums(prog: Program, itn: Iteration, n: int) -> np.ndarray:
    """comm_exposed_s as results._union_after_backward takes it: each collective clipped to [backward's end,
    optimizer's start], those left sorted by clipped start (stably, in record order), each adding what the
    earlier ones have not covered."""
    lo_min, hi_max = itn.bwd_end.min(), itn.opt_start.max()
    cand = [k for k in prog.issued if np.max(itn.end[k]) > lo_min and np.min(itn.start[k]) < hi_max]
    out = np.zeros(n)
    if not cand:
        return out
    rec = Records(prog, itn, cand)
    for lo, hi in blocks(n, len(cand)):
        S, E = rec.table("start", lo, hi), rec.table("end", lo, hi)
        s = np.maximum(S, itn.bwd_end[lo:hi, None])
        e = np.minimum(E, itn.opt_start[lo:hi, None])
        keep = e > s
        key = np.where(keep, s, np.inf)  # the kept ones first, by clipped start, then in record order
        order = np.argsort(key, axis=1, kind="stable") if rec.shared else rec.order(S, E, key)
        s, e, keep = (take(x, order) for x in (s, e, keep))
        covered = np.full_like(e, -np.inf)
        covered[:, 1:] = np.maximum.accumulate(np.where(keep, e, -np.inf), axis=1)[:, :-1]
        out[lo:hi] = row_sums(np.maximum(e - np.maximum(s, covered), 0.0), keep)
    return out


def wait_sums(prog: Program, itn: Iteration, n: int) -> np.ndarray:
    """wait_s: per rank how long its collectives waited for their last member (start − arrival where positive),
    summed in record order. Needs `itn` kept (arrivals)."""
    out = np.zeros(n)
    rec = Records(prog, itn, prog.issued)
    for lo, hi in blocks(n, len(rec.cols)):
        S, E, A = rec.table("start", lo, hi), rec.table("end", lo, hi), rec.table("arrive", lo, hi)
        if not rec.shared:
            order = rec.order(S, E)
            S, A = take(S, order), take(A, order)
        out[lo:hi] = row_sums(S - A, S > A)
    return out


def iteration_records(plan, prog: Program, itn: Iteration, it: int, n: int) -> list[tuple]:
    """The engine's records (rank, iteration, kind, name, start_s, end_s) of iteration `it` (kept): per rank its
    compute steps, its collectives in record order (each with its wait first, when its group made it wait), the
    optimizer step."""
    out: list[tuple] = []
    rec = Records(prog, itn, prog.issued)
    S, E, A = (rec.table(what, 0, n) for what in ("start", "end", "arrive"))
    order = None if rec.shared else rec.order(S, E)
    names = [plan.colls[k].name for k in rec.cols]
    S, E, A = (take(x, order).tolist() for x in (S, E, A))
    order = np.broadcast_to(np.arange(len(rec.cols)), (n, len(rec.cols))) if order is None else order
    order = order.tolist()
    steps = [(plan.steps[i], a.tolist(), e.tolist()) for i, (a, e) in enumerate(itn.steps)]
    opt = (itn.opt_start.tolist(), itn.opt_end.tolist())
    for r in range(n):
        out += [(r, it, step.kind, step.name, a[r], e[r]) for step, a, e in steps]
        for j, start, end, arrive in zip(order[r], S[r], E[r], A[r]):
            if start > arrive:
                out.append((r, it, "wait", names[j], arrive, start))
            out.append((r, it, "comm", names[j], start, end))
        out.append((r, it, "optimizer", "optimizer", opt[0][r], opt[1][r]))
    return out
