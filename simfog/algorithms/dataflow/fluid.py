"""Fluid sharing of point-to-point messages over the whole run (comm.p2p_sharing = "fluid"), for the dataflow
family's algorithms (neighbor, hierarchical_neighbor, decentralized, low_precision_decentralized, win_put).

Their iteration is a Plan of operations; the start-together model (p2p_sharing = "together", simfog.p2p) gives every
message a duration fixed by the number of messages of its step that share its links. Here a message lasts as long as the
links let it: each resource it crosses (its sender's and receiver's NIC, or their intra-node links; see
simfog.p2p.resource_keys) is shared equally AT EACH INSTANT among all the messages on it, of any step and any iteration
(processor sharing, simfog.engine.sharing: rate min(flow cap, bandwidth / messages there now), recomputed at every
arrival and completion), and the message has crossed when it has drained on both, plus its latency. Ranks that drift
apart (neighbour averaging has no barrier) then use a NIC one after the other, and a drifted rank's next message shares
the NIC with its node's previous one still draining, which a per-step model would miss.

Measured on the emulated cluster (BlueFog one-peer exp2 on 4 nodes x 2 ranks, MLP, gloo; validate bench rows):
at 1 Gbit/s the ranks drift and transfers take ~9 ms where "together" charges two flows, 15.7 ms (iterations
17.2-17.9 ms measured, 21.3 predicted by "together"); at 200 Mbit/s transfers (~40 ms) outlast the compute between
them and the NIC stays busy (65-74 ms measured; "together" 67-75 ms). A stand-alone model of this sharing gave 16.3
and 67-72 ms.

A discrete-event evaluation in time order (a heap of operation ends and resource completions, no SimPy): every
operation starts when its inputs have ended, as in the Plan; a rank's iteration runs forward, hands its launch
times to the Plan, runs backward, waits for its Plan part, then its optimizer step, as the event engine's rank
does. Python per operation: meant for the clusters one validates and debugs (thousands of ranks, not 10^5).
"""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from simfog.algorithms.dataflow.plan import P2PStep, Run
from simfog.engine.sharing import SharedLinks
from simfog.p2p import links_of, resource_keys
from simfog.results import PATH_FLUID


def _messages(alg, plan, phase: int) -> dict[int, tuple]:
    """Per message op of `plan`: (latency in all, bytes, bandwidth, flow cap, resource out, resource in)."""
    step = alg.phase_steps(phase)[1]
    latencies = step.latencies if isinstance(step, P2PStep) else 1
    cluster = alg.sim.experiment.cluster
    ops, src, dst, size = [], [], [], []
    for s, sends in enumerate(plan.sends):
        for op, d, nbytes in sends:
            ops.append(op)
            src.append(s)
            dst.append(d)
            size.append(nbytes)
    if not ops:
        return {}
    lat, bw, cap = links_of(cluster, np.array(src), np.array(dst))
    out_key, in_key, _ = resource_keys(cluster, src, dst)
    cap = np.where(np.isnan(cap), np.inf, cap)
    return {op: (latencies * float(lat[i]), float(size[i]), float(bw[i]), float(cap[i]), int(out_key[i]),
                 int(in_key[i])) for i, op in enumerate(ops)}


def run(sim):
    """Simulate `sim` (a simfog.simulation.Simulation of a DataflowAlgorithm with comm.p2p_sharing = "fluid").
    Returns its Result, path "fluid"."""
    started = time.perf_counter()
    alg, c = sim.algorithm, sim.compute
    n, iters = sim.simulated_ranks, sim.experiment.iterations
    record = sim.record
    heap: list = []
    seq = 0

    def push(t, *what):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, what))

    runs: dict[int, Run] = {}
    msgs: dict[int, dict] = {}
    links = SharedLinks()
    state: dict[tuple[int, int], tuple] = {}  # (rank, iteration) -> (end of backward, sample)
    drained: dict[int, int] = {}              # job -> resources it has drained on so far
    job_of: list[tuple[int, int]] = []        # job -> (iteration, message op)
    job_factor: list[float] = []              # job -> its message's per-call factor (simfog.variation)

    def plan_run(it: int) -> Run:
        if it not in runs:
            phase = it % alg.period
            plan = alg.plan(phase)
            runs[it] = Run(plan, it, lambda run, rank, t: rank_done(rank, run.iteration, t),
                           alg.op_factors(phase, it))
            if phase not in msgs:
                msgs[phase] = _messages(alg, plan, phase)
        return runs[it]

    def op_ended(it: int, op: int, t: float) -> None:
        r = runs[it]
        for s in r.ended(op, t):
            begin(it, s, r.start[s])

    def begin(it: int, op: int, t: float) -> None:
        m = msgs[it % alg.period].get(op)
        if m is None:
            push(t + runs[it].dur[op], "op", it, op)
            return
        _, nbytes, bw, cap, out_r, in_r = m
        factor = runs[it].factor(op)
        if factor != 1.0:  # per-call variation (simfog.variation): the message's bytes and latency scaled alike
            nbytes = nbytes * factor
        job = len(job_of)
        job_of.append((it, op))
        job_factor.append(factor)
        drained[job] = 0
        links.add(t, job, out_r, nbytes, bw, cap)
        links.add(t, job, in_r, nbytes, bw, cap)

    def rank_done(rank: int, it: int, t: float) -> None:
        t_e, s = state.pop((rank, it))
        if n > 1:
            alg._record(runs[it], rank)
            runs[it].finished += 1
            if runs[it].finished == n:  # every op of the iteration has ended
                del runs[it]
        t_o = max(t_e, t)
        t_end = t_o + c.optimizer_s[s] * sim.slowdown[rank]
        record(rank, it, "optimizer", "optimizer", t_o, t_end)
        sim.finished[rank] += 1
        if it + 1 < iters:
            push(t_end, "start", rank, it + 1)

    def start(rank: int, it: int, t0: float) -> None:
        s = int(sim.draws[it, rank])
        slow = sim.slowdown[rank]
        t_b = t0 + (c.forward_s[s] * slow + sim.delays[it, rank])
        t_e = t_b + sim.backward_s[s] * slow
        record(rank, it, "forward", "forward", t0, t_b)
        record(rank, it, "backward", "backward", t_b, t_e)
        state[(rank, it)] = (t_e, s)
        if n == 1:
            rank_done(rank, it, t_e)
            return
        r = plan_run(it)
        for op, x in zip(r.plan.inputs[rank], alg._inputs(rank, it, s, t_b), strict=True):
            r.start[op] = x
            push(x, "op", it, op)

    for rank in range(n):
        push(0.0, "start", rank, 0)
    while heap or links.next_time() < math.inf:
        t_link = links.next_time()
        if heap and heap[0][0] <= t_link:
            t, _, what = heapq.heappop(heap)
            if what[0] == "start":
                start(what[1], what[2], t)
            else:
                op_ended(what[1], what[2], t)
            continue
        for job, _ in links.pop(t_link):
            drained[job] += 1
            if drained[job] == 2:  # through both of its resources
                del drained[job]
                it, op = job_of[job]
                latency = msgs[it % alg.period][op][0]
                push(t_link + latency * job_factor[job], "op", it, op)
    return sim.result(path=PATH_FLUID, started=started, events=seq)
