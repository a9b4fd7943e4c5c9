"""The analytic path of the sharded algorithms (fsdp, hsdp, zero1-3: simfog.algorithms.sharded): their `Plan` is
fixed before the run, so an iteration is a max-plus recurrence, solved over every rank at once (numpy vectors).

Every rank runs the same program (`_Sharded.run_iteration`), flattened once into ops; `now` is the rank's compute
stream (a vector over ranks):

    issue c    arrive = max(now, end of the previous collective of c's stream, end of c.after, end of the
               previous collective of c's process group, on any stream);
               start_c = max of arrive over c's group; end_c = start_c + duration_c  (per group)
               on the compute stream the rank waits for it: now = end_c
    need c     now = max(now, end_c)                 (what a step needs, a hook waits for)
    step i     now = now + (Σ of step i's layer times)·slow (+ the straggler delay on the last forward step)
    drain      now = max(now, end of every collective issued)
    optimizer  now = now + ((optimizer − host)/shards + host)·slow

Maxima are exact and every addition is the one SimPy performs (`now + delay`, the same operands), so times equal
the event engine's bit for bit. The summary's per (rank, iteration) sums add the engine's records in the engine's
order (simfog.analytic_records). Records themselves are built only when asked (`Result.intervals()`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from simfog.analytic_records import comm_sums, exposed_sums, iteration_records, row_sums, wait_sums


def blocker(alg) -> str | None:
    """None when this module can solve the plan of `alg` (a _Sharded running its own run_iteration), else why the
    event engine must run it."""
    if alg.n % alg.group_size:
        return f"the {alg.n} ranks do not split into groups of {alg.group_size}"
    plan = alg.plan
    if any(plan.colls[c].stream == "compute" for step in plan.steps for c in step.issue):
        return "a step issues a collective on the compute stream without waiting for it"
    if any(plan.colls[c].stream != "compute" for c in plan.after_optimizer):
        return "a collective after the optimizer step is not on the compute stream"
    return None


@dataclass(frozen=True)
class Groups:
    """The groups one plan group forms among the simulated ranks (Sharded._members): "all" (one group), "shard"
    (`size` consecutive ranks) or "replica" (ranks equal modulo `size`)."""

    kind: str
    size: int
    n: int  # simulated ranks

    @property
    def rows(self) -> int:
        return -(-self.n // self.size)

    @property
    def count(self) -> int:
        return 1 if self.kind == "all" else self.rows if self.kind == "shard" else self.size

    def max(self, x: np.ndarray):
        """Per group, the latest of `x` (n,): a scalar for "all", else (count,)."""
        if self.kind == "all":
            return x.max()
        table = x
        if self.n % self.size:  # (symmetric runs) groups beyond the simulated ranks: -inf never wins
            table = np.full(self.rows * self.size, -np.inf)
            table[:self.n] = x
        table = table.reshape(self.rows, self.size)
        return table.max(1) if self.kind == "shard" else table.max(0)

    def per_rank(self, v):
        """Each simulated rank's value of its group's `v` (a scalar stays one)."""
        if self.kind == "all":
            return v
        return np.repeat(v, self.size)[:self.n] if self.kind == "shard" else np.tile(v, self.rows)[:self.n]

    def ids(self, lo: int, hi: int) -> np.ndarray:
        """The group of each rank lo..hi-1 (not "all")."""
        ranks = np.arange(lo, hi)
        return ranks // self.size if self.kind == "shard" else ranks % self.size


@dataclass(frozen=True)
class Program:
    """What run_iteration does, flattened from the plan: `ops` ("issue", c, after or None) | ("need", c) |
    ("step", i) | ("drain",) | ("optimizer",); per collective its groups, stream and duration (a float, or per
    group); per step its layer time sum per trace sample; collectives in issue order."""

    ops: tuple
    groups: tuple
    communicators: tuple  # per collective its plan group ("shard", "replica", "all"): one communicator each
    streams: tuple
    durations: tuple
    seconds: tuple
    kinds: tuple
    last_forward: int
    issued: tuple


def program(sim) -> Program:
    alg, plan = sim.algorithm, sim.algorithm.plan
    ops, done, issued = [], set(), []

    def issue(c, hook):
        coll = plan.colls[c]
        # run_iteration looks `after` up among the collectives issued so far (done.get)
        ops.append(("issue", c, coll.after if coll.after in done else None))
        issued.append(c)
        if coll.stream != "compute" or hook:
            done.add(c)

    def hooks(pairs, hook=True):
        for wait, c in pairs:
            if wait is not None:
                ops.append(("need", wait))
            issue(c, hook)

    for i, step in enumerate(plan.steps):
        for c in step.issue:
            issue(c, False)
        ops += [("need", c) for c in step.need]
        ops.append(("step", i))
        hooks(step.hooks)
    hooks(plan.epilogue)
    ops += [("drain",), ("optimizer",)]
    hooks([(None, c) for c in plan.after_optimizer], hook=False)
    groups = tuple(_groups(alg, sim.simulated_ranks, coll.group) for coll in plan.colls)
    c = sim.compute
    seconds = []
    for step in plan.steps:
        times = c.layer_forward_s if step.kind == "forward" else c.layer_backward_s
        total = np.zeros(times.shape[0])
        for j in step.layers:  # float(sum(times[j] for j in layers)): added in this order, from 0
            total = total + times[:, j]
        seconds.append(total)
    return Program(tuple(ops), groups, tuple(coll.group for coll in plan.colls),
                   tuple(coll.stream for coll in plan.colls), _durations(sim, groups),
                   tuple(seconds), tuple(step.kind for step in plan.steps),
                   max(i for i, s in enumerate(plan.steps) if s.kind == "forward"), tuple(issued))


def _groups(alg, n: int, group: str) -> Groups:
    if group == "all" or (group == "shard" and alg.group_size == alg.n):
        return Groups("all", alg.n, n)
    return Groups(group, alg.group_size, n)


def _durations(sim, groups) -> tuple:
    """Each collective's duration (a float, or per group), as cost.time gives it for the group's members, asked once
    per distinct (op, bytes, group shape)."""
    alg, cost = sim.algorithm, sim.cost
    overhead = alg.collective_overhead_s
    shapes: dict = {}
    memo: dict = {}
    out = []
    for coll, g in zip(alg.plan.colls, groups):
        if g.kind == "all":
            out.append(overhead + cost.time(coll.op, coll.nbytes, None))
            continue
        if g not in shapes:
            shapes[g] = _shapes(alg, g)
        index, reps = shapes[g]
        times = []
        for group, nodes in reps:
            key = (coll.op, coll.nbytes, group, None if nodes is None else frozenset(nodes))
            if key not in memo:
                memo[key] = overhead + cost.group_time(coll.op, coll.nbytes, group, nodes)
            times.append(memo[key])
        out.append(np.array(times)[index])
    return tuple(out)


def _shapes(alg, g: Groups):
    """(per group the index of its shape (count,), [(cluster.Group, nodes or None)] per shape): what cost.time reads
    of a group's members (Sharded._members, over all ranks): how many ranks, on how many nodes, at most how many on
    one, and, with degraded NICs, which nodes."""
    from simfog.cluster import Group

    cluster = alg.sim.cost.cluster
    ranks = np.arange(alg.n)
    gid = ranks // g.size if g.kind == "shard" else ranks % g.size
    node = ranks // cluster.ranks_per_node
    width = int(node[-1]) + 1
    pairs, per_pair = np.unique(gid * width + node, return_counts=True)  # (group, node), sorted by group
    of_pair = pairs // width
    spans = np.split(pairs % width, np.flatnonzero(np.diff(of_pair)) + 1) if cluster.degraded_nics else None
    size = np.bincount(gid, minlength=g.count)[:g.count]
    nodes = np.bincount(of_pair, minlength=g.count)[:g.count]
    per_node = np.zeros(g.count, dtype=int)
    np.maximum.at(per_node, of_pair[of_pair < g.count], per_pair[of_pair < g.count])
    index = np.zeros(g.count, dtype=int)
    seen: dict = {}
    reps = []
    for x in range(g.count):
        on = None if spans is None else frozenset(spans[x].tolist())
        sig = (int(size[x]), int(nodes[x]), int(per_node[x]), on)
        if sig not in seen:
            seen[sig] = len(reps)
            reps.append((Group(*sig[:3]), None if on is None else set(on)))
        index[x] = seen[sig]
    return index, reps


@dataclass(frozen=True)
class Iteration:
    """One iteration of every simulated rank: per rank (n,) its start, backward's end, the optimizer step, its end;
    per collective its start and end (per group); with `keep`, per collective each rank's arrival and per
    step each rank's (start, end)."""

    t0: np.ndarray
    bwd_end: np.ndarray
    opt_start: np.ndarray
    opt_end: np.ndarray
    t_end: np.ndarray
    start: list
    end: list
    arrive: list | None
    steps: list | None


def iterate(sim, prog: Program, it: int, t0: np.ndarray, tables: dict | None = None, keep: bool = False):
    """Run iteration `it` from t0 (n,). `tables` {"forward": (n, F), "backward": (n, B)} receive each step's
    duration (end − start, as pandas takes it) column by column."""
    n = sim.simulated_ranks
    s, slow, delay = sim.draws[it, :n], sim.slowdown[:n], sim.delays[it, :n]
    c = sim.compute
    K = len(prog.groups)
    start, end = [None] * K, [None] * K
    arrive = [None] * K if keep else None
    steps = [] if keep else None
    columns = {"forward": 0, "backward": 0}
    tails: dict = {}
    communicators: dict = {}  # plan group -> its last collective issued (the engine's _communicator_tails)
    recent: dict = {}  # the latest collectives' ends per rank, kept a while (streams, hooks and steps reread them)

    def ends(k):
        if k not in recent:
            if len(recent) >= 64:
                del recent[next(iter(recent))]
            recent[k] = prog.groups[k].per_rank(end[k])
        return recent[k]

    now, latest, bwd_end, opt_start = t0, None, t0, t0
    for op in prog.ops:
        kind = op[0]
        if kind == "issue":
            _, k, after = op
            g, stream = prog.groups[k], prog.streams[k]
            arrival = now
            if stream != "compute" and stream in tails:
                arrival = np.maximum(arrival, ends(tails[stream]))
            if after is not None:
                arrival = np.maximum(arrival, ends(after))
            previous = communicators.get(prog.communicators[k])
            if previous is not None:
                arrival = np.maximum(arrival, ends(previous))
            communicators[prog.communicators[k]] = k
            start[k] = g.max(arrival)
            end[k] = start[k] + prog.durations[k]
            if keep:
                arrive[k] = arrival
            mine = ends(k)
            if stream == "compute":
                now = np.maximum(now, mine)  # = end_k: the rank waited for it
            else:
                tails[stream] = k
                latest = mine if latest is None else np.maximum(latest, mine)
        elif kind == "need":
            now = np.maximum(now, ends(op[1]))
        elif kind == "step":
            i = op[1]
            seconds = prog.seconds[i][s] * slow
            if i == prog.last_forward:
                seconds = seconds + delay
            before, now = now, now + seconds
            step_kind = prog.kinds[i]
            if tables is not None:
                tables[step_kind][:, columns[step_kind]] = now - before
                columns[step_kind] += 1
            if keep:
                steps.append((before, now))
            if step_kind == "backward":
                bwd_end = now
        elif kind == "drain":
            if latest is not None:
                now = np.maximum(now, latest)
        else:  # the optimizer updates the shard; host time (data loading, gaps) is not sharded
            host = c.host_s[s] if c.host_s is not None else np.zeros(n)
            opt_start = now
            now = now + ((c.optimizer_s[s] - host) / sim.algorithm.shards + host) * slow
            opt_end = now
    return Iteration(t0, bwd_end, opt_start, opt_end, now, start, end, arrive, steps)


def run(sim, path: str):
    """Simulate `sim` (an engine.Simulation of a sharded algorithm whose why_events() is None). Returns its Result,
    which names `path`."""
    from simfog.results import Result

    started = time.perf_counter()
    prog = program(sim)
    n, iters = sim.simulated_ranks, sim.experiment.iterations
    cols = {k: np.zeros((n, iters)) for k in ("start_s", "end_s", "forward_s", "backward_s", "optimizer_s", "comm_s",
                                              "comm_exposed_s", "idle_s")}
    tables = {kind: np.empty((n, prog.kinds.count(kind))) for kind in ("forward", "backward")}
    t0 = np.zeros(n)
    finished = np.zeros(n, dtype=int)
    for it in range(iters):
        itn = iterate(sim, prog, it, t0, tables)
        finished += np.isfinite(itn.t_end)
        exposed = exposed_sums(prog, itn, n)
        # The first record starts at t0: step 0's issues arrive then (a stream's tail is this iteration's), or,
        # issuing nothing, step 0 needs nothing and starts then. The last ends at t_end: everything was waited for.
        cols["start_s"][:, it], cols["end_s"][:, it] = itn.t0, itn.t_end
        cols["forward_s"][:, it] = row_sums(tables["forward"])
        cols["backward_s"][:, it] = row_sums(tables["backward"])
        cols["optimizer_s"][:, it] = itn.opt_end - itn.opt_start
        cols["comm_s"][:, it] = comm_sums(prog, itn, n)
        cols["comm_exposed_s"][:, it] = exposed
        cols["idle_s"][:, it] = np.maximum((itn.opt_start - itn.bwd_end) - exposed, 0.0)
        t0 = itn.t_end
    del tables
    sim.finished = finished.tolist()
    sim._check_finished()
    alg = sim.algorithm
    return Result(sim.experiment, None, symmetric=sim.symmetric, single_rank_time_s=sim.single_rank_time_s(),
                  buckets=alg.describe_buckets(), events=0, wall_s=time.perf_counter() - started, mixing=None,
                  memory=sim.memory, columns=cols, path=path, make_records=lambda: records(sim, prog),
                  make_columns=lambda: waits(sim, prog))


def _kept(sim, prog: Program):
    """Each iteration again, keeping arrivals and step times (for frames and records, built when asked)."""
    t0 = np.zeros(sim.simulated_ranks)
    for it in range(sim.experiment.iterations):
        itn = iterate(sim, prog, it, t0, keep=True)
        yield it, itn
        t0 = itn.t_end


def waits(sim, prog: Program) -> dict:
    """{"wait_s": (ranks, iterations)}: how long each rank's collectives waited for their last member."""
    out = np.zeros((sim.simulated_ranks, sim.experiment.iterations))
    for it, itn in _kept(sim, prog):
        out[:, it] = wait_sums(prog, itn, sim.simulated_ranks)
    return {"wait_s": out}


def records(sim, prog: Program) -> list[tuple]:
    """The event engine's records (rank, iteration, kind, name, start_s, end_s), from the recurrence."""
    return [r for it, itn in _kept(sim, prog)
            for r in iteration_records(sim.algorithm.plan, prog, itn, it, sim.simulated_ranks)]
