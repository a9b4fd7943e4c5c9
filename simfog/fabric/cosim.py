"""Several jobs' timelines run together in time on one fabric: a co-simulation of their iterations.

Each job brings its run alone, as interval records (rank, iteration, kind, name, start_s, end_s; simfog.results),
and, per set S of other jobs communicating beside it, how long each of its collectives takes with them on the
network (its run with S's traffic always on: simfog.fabric.job prices a collective's steps sharing the links
max-min fairly with S's steps). The co-simulation replays every job from its start, in one clock:

- a compute interval keeps its duration; it starts when what it waited for alone has ended: the interval before it
  on its rank's compute stream, and for the optimizer every collective of its iteration (it waits for the
  gradients), for any other compute interval a collective that ended exactly when it started alone (a forward that
  waited for its all-gather);
- a collective (its interval on every rank at once) starts when the collective before it on each rank has ended
  and no earlier, after the compute interval that last ended on each rank before it was launched, than alone (its
  launch follows the compute, which is not slowed);
- while it runs, a collective progresses at the speed alone / beside, its duration alone over its duration beside
  the set of other jobs with a collective running at that instant: a job idle between collectives frees the links.

A start is the alone start plus a delay: the largest of what each predecessor's end was delayed less the slack the
predecessor had alone (the time between its end and this start; none for the launch's compute). Times are each
job's own (0 at its start); `offsets` place the jobs on the common clock. A job whose collectives never run beside
another's is replayed unchanged: its records come back equal, bit for bit.

What the replay cannot see: the order of collectives or buckets changing with the slowdown (a dynamic merge policy
decides again), and a compute interval that waited alone for a collective with time to spare (only the optimizer's
wait and exact waits are kept).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from simfog.errors import Infeasible

COMPUTE = ("forward", "backward", "optimizer")

Record = tuple  # (rank, iteration, kind, name, start_s, end_s)
Key = tuple  # a collective: (iteration, name, occurrence of that name in the iteration on its rank)


@dataclass(frozen=True)
class Timeline:
    """One job as the co-simulation takes it: `records`, its run alone; `beside`, per frozenset of other jobs
    (their indices in the job list) each collective's duration (s) with them communicating, by `collectives` key.
    A set missing from `beside` leaves the job's collectives at their alone speed."""

    records: tuple[Record, ...]
    beside: Mapping[frozenset, Mapping[Key, float]]


def collectives(records: Sequence[Record]) -> dict[Key, float]:
    """Each collective's duration (s) in `records`, by key (iteration, name, occurrence): the first rank's."""
    out: dict[Key, float] = {}
    for key, rec in _keyed(records):
        out.setdefault(key, rec[5] - rec[4])
    return out


def _keyed(records: Sequence[Record]):
    seen: dict[tuple, int] = {}
    for rec in records:
        if rec[2] == "comm":
            k = (rec[0], rec[1], rec[3])
            seen[k] = seen.get(k, -1) + 1
            yield (rec[1], rec[3], seen[k]), rec


class _Graph:
    """One job's intervals as nodes with predecessors (node, slack); a collective is one node for all its ranks."""

    def __init__(self, records: Sequence[Record]):
        self.records = list(records)
        self.start: list[float] = []
        self.end: list[float] = []
        self.is_comm: list[bool] = []
        self.key: list = []
        self.of_record: dict[int, int] = {}
        self.wait_of: dict[int, int] = {}  # record of a wait -> record of its collective's interval on that rank
        self.anchor: dict[int, int] = {}  # record of a collective's interval -> compute node its launch followed
        comm_node: dict[Key, int] = {}
        waits: dict[tuple, int] = {}
        keys = iter([key for key, _ in _keyed(self.records)])  # in record order, as the comm records below
        for i, rec in enumerate(self.records):
            if rec[2] not in COMPUTE and rec[2] not in ("comm", "wait"):
                raise Infeasible(f"the co-simulation replays compute, comm and wait intervals, not {rec[2]!r}")
            if rec[2] == "wait":
                waits[(rec[0], rec[1], rec[3])] = i
            elif rec[2] == "comm":
                key = next(keys)
                if (rec[0], rec[1], rec[3]) in waits:
                    self.wait_of[waits.pop((rec[0], rec[1], rec[3]))] = i
                if key not in comm_node:
                    comm_node[key] = self._add(rec[4], rec[5], True, key)
                self.of_record[i] = comm_node[key]
            else:
                self.of_record[i] = self._add(rec[4], rec[5], False, None)
        preds: list[dict[int, float]] = [{} for _ in self.start]

        def link(node: int, record: int, slack: float) -> None:
            p = self.of_record[record]
            if p != node:
                preds[node][p] = min(slack, preds[node].get(p, slack))

        launch_of = {c: self.records[w][4] for w, c in self.wait_of.items()}
        ranks: dict[int, list[int]] = {}
        for i, rec in enumerate(self.records):
            if rec[2] != "wait":
                ranks.setdefault(rec[0], []).append(i)
        for rows in ranks.values():
            compute = _Ends(self.records, [i for i in rows if self.records[i][2] in COMPUTE])
            comm = _Ends(self.records, [i for i in rows if self.records[i][2] == "comm"])
            by_iteration: dict[int, list[int]] = {}
            by_end: dict[float, list[int]] = {}
            for c in comm.rows:
                by_iteration.setdefault(self.records[c][1], []).append(c)
                by_end.setdefault(self.records[c][5], []).append(c)
            for i in rows:
                rank, it, kind, _, start, _ = self.records[i]
                node = self.of_record[i]
                if kind == "comm":
                    before = comm.latest(start, lambda r, node=node: self.of_record[r] != node)
                    if before is not None:
                        link(node, before, start - self.records[before][5])
                    launch = compute.latest(launch_of.get(i, start))
                    if launch is not None:
                        self.anchor[i] = self.of_record[launch]
                        link(node, launch, 0.0)
                    continue
                before = compute.latest(start, lambda r, i=i: r != i)
                if before is not None:
                    link(node, before, start - self.records[before][5])
                waited = by_iteration.get(it, []) if kind == "optimizer" else by_end.get(start, [])
                for c in waited:
                    if self.records[c][5] <= start:
                        link(node, c, start - self.records[c][5])
        self.preds = [sorted(p.items()) for p in preds]
        self.dependents: list[list[int]] = [[] for _ in self.start]
        for node, ps in enumerate(self.preds):
            for p, _ in ps:
                self.dependents[p].append(node)

    def _add(self, start: float, end: float, is_comm: bool, key) -> int:
        self.start.append(start)
        self.end.append(end)
        self.is_comm.append(is_comm)
        self.key.append(key)
        return len(self.start) - 1


class _Ends:
    """Records of one rank's stream, found by end: the one that ended last at or before a time."""

    def __init__(self, records: list, rows: list[int]):
        self.rows = rows
        self._order = sorted(rows, key=lambda i: (records[i][5], i))
        self._ends = [records[i][5] for i in self._order]

    def latest(self, at: float, keep=lambda r: True) -> int | None:
        k = bisect.bisect_right(self._ends, at) - 1
        while k >= 0 and not keep(self._order[k]):
            k -= 1
        return self._order[k] if k >= 0 else None


def cosimulate(timelines: Sequence[Timeline], offsets: Sequence[float]) -> list[list[Record]]:
    """Each job's records replayed together with the others' (module docstring), job k starting at `offsets[k]`
    (s) on the common clock; times in each job's records stay its own (0 at its start)."""
    if len(offsets) != len(timelines):
        raise ValueError(f"offsets: one per job ({len(timelines)}), got {len(offsets)}")
    graphs = [_Graph(t.records) for t in timelines]
    delay_start = [[0.0] * len(g.start) for g in graphs]
    delay_end: list[list[float | None]] = [[None] * len(g.start) for g in graphs]
    waiting = [[len(p) for p in g.preds] for g in graphs]
    pending: list[tuple[float, int, int, int]] = []  # (global start, sequence, job, node)
    running: list[dict[int, list[float]]] = [{} for _ in graphs]  # node -> [local end, speed]
    seq = 0

    def ready(j: int, node: int) -> None:
        nonlocal seq
        stack = [node]
        while stack:
            n = stack.pop()
            g = graphs[j]
            d = 0.0
            for p, slack in g.preds[n]:
                d = max(d, delay_end[j][p] - slack)
            delay_start[j][n] = d
            if g.is_comm[n]:
                heapq.heappush(pending, (offsets[j] + (g.start[n] + d), seq, j, n))
                seq += 1
                continue
            delay_end[j][n] = d
            for m in g.dependents[n]:
                waiting[j][m] -= 1
                if waiting[j][m] == 0:
                    stack.append(m)

    for j, g in enumerate(graphs):
        for n in [n for n in range(len(g.start)) if waiting[j][n] == 0]:  # before any is resolved
            ready(j, n)
    while pending or any(running):
        ends = [offsets[j] + run[n][0] for j, run in enumerate(running) for n in run]
        now = min([*ends, pending[0][0]] if pending else ends)
        for j, run in enumerate(running):
            for n in [n for n in run if offsets[j] + run[n][0] <= now]:
                local_end = run.pop(n)[0]
                delay_end[j][n] = local_end - graphs[j].end[n]
                for m in graphs[j].dependents[n]:
                    waiting[j][m] -= 1
                    if waiting[j][m] == 0:
                        ready(j, m)
        while pending and pending[0][0] <= now:
            _, _, j, n = heapq.heappop(pending)
            g = graphs[j]
            running[j][n] = [g.end[n] + delay_start[j][n], 1.0]
        busy = frozenset(j for j, run in enumerate(running) if run)
        for j, run in enumerate(running):
            others = busy - {j}
            durations = timelines[j].beside.get(others) if others else None
            now_local = now - offsets[j]
            for n, state in run.items():
                g = graphs[j]
                alone = g.end[n] - g.start[n]
                speed = alone / durations[g.key[n]] if durations is not None and alone > 0 else 1.0
                if speed != state[1]:
                    left = (state[0] - now_local) * state[1]  # alone-seconds of the collective still to run
                    state[0], state[1] = now_local + left / speed, speed
    for j in range(len(graphs)):
        if any(d is None for d in delay_end[j]):
            raise Infeasible(f"job {j}: intervals waiting on one another in a circle; the co-simulation cannot "
                             "replay this timeline")
    return [_shifted(g, delay_start[j], delay_end[j]) for j, g in enumerate(graphs)]


def _shifted(g: _Graph, delay_start: list[float], delay_end: list) -> list[Record]:
    out = []
    for i, (rank, it, kind, name, start, end) in enumerate(g.records):
        if kind == "wait":
            comm = g.wait_of.get(i)
            if comm is None:
                out.append((rank, it, kind, name, start, end))
                continue
            launch = g.anchor.get(comm)
            new_end = end + delay_start[g.of_record[comm]]
            out.append((rank, it, kind, name, min(start + (delay_end[launch] if launch is not None else 0.0),
                                                  new_end), new_end))
            continue
        n = g.of_record[i]
        if kind == "comm":
            out.append((rank, it, kind, name, start + delay_start[n], end + delay_end[n]))
        else:
            out.append((rank, it, kind, name, start + delay_start[n], end + delay_start[n]))
    return out
