"""The sharded family's closed form (fsdp, hsdp, zero1-3): their `Plan` is fixed before the run, so an iteration is a
max-plus recurrence, solved over every rank at once (numpy vectors).

Every rank runs the same program (`ShardedAlgorithm.run_iteration`), flattened once into ops
(closed_form_program); `now` is the rank's compute stream (a vector over ranks):

    issue c    arrive = max(now, end of the previous collective of c's stream, end of c.after, end of the
               previous collective of c's process group, on any stream);
               start_c = max of arrive over c's group; end_c = start_c + duration_c  (per group; per iteration
               under per-call variation, simfog.variation)
               on the compute stream the rank waits for it: now = end_c
    need c     now = max(now, end_c)                 (what a step needs, a hook waits for)
    step i     now = now + (Σ of step i's layer times)·slow (+ the straggler delay on the last forward step)
    drain      now = max(now, end of every collective issued)
    optimizer  now = now + ((optimizer − host)/shards + host)·slow

Maxima are exact and every addition is the one SimPy performs (`now + delay`, the same operands), so times equal
the event engine's bit for bit. The summary's per (rank, iteration) sums add the engine's records in the engine's
order (closed_form_records). Records themselves are built only when asked (`Result.intervals()`).
"""

from __future__ import annotations

import time

import numpy as np

from simfog.algorithms.sharded.closed_form_program import Iteration, Program, program
from simfog.algorithms.sharded.closed_form_records import comm_sums, exposed_sums, iteration_records, wait_sums
from simfog.algorithms.sums import row_sums


def blocker(alg) -> str | None:
    """None when this module can solve the plan of `alg` (a ShardedAlgorithm running its own run_iteration), else
    why the event engine must run it."""
    if alg.n % alg.group_size:
        return f"the {alg.n} ranks do not split into groups of {alg.group_size}"
    plan = alg.plan
    if any(plan.colls[c].stream == "compute" for step in plan.steps for c in step.issue):
        return "a step issues a collective on the compute stream without waiting for it"
    if any(plan.colls[c].stream != "compute" for c in plan.after_optimizer):
        return "a collective after the optimizer step is not on the compute stream"
    return None


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
            end[k] = start[k] + prog.duration(k, it)
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
    """Simulate `sim` (a simfog.simulation.Simulation of a sharded algorithm whose closed_form_blocker() is None).
    Returns its Result, which names `path`."""
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
    return sim.result(cols, path=path, started=started, finished=finished, make_records=lambda: records(sim, prog),
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
