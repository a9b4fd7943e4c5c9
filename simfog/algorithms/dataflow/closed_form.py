"""The dataflow family's closed form (neighbor, hierarchical_neighbor, win_put: bluefog.py; decentralized,
low_precision_decentralized: bagua.py): their iteration is a `Plan` fixed before the run, so it is evaluated over
every rank at once (numpy vectors), structure by structure, without building the Plan.

Per bucket b of the chain, with x_b the rank's launch input (the algorithm's `_inputs`, given arrays):

    ready_b = x_0 (b = 0) | max(x_b, last_{b−1})                        the rank may launch bucket b
    P2PStep: (negotiate: max over all ranks) → (hierarchical: node allreduce) → (codec: encode) → messages
             start = max(go[src], go[dst]) (one-sided: go[src]), end = start + duration (simfog.p2p) →
             after = max(go, ends of its messages) (+ decode) → (hierarchical: node broadcast) = last_b
    AllreduceStep: one allreduce of every rank (hierarchical: node allreduce, leaders', node broadcast)

Every op ends at max(its inputs' ends) + its duration, as dataflow.Run adds it, so ends are bit for bit the
engine's. The engine learns that rank r is done while handling the backward start of the last rank its result
depends on, at that rank's time `avail` (the same sweep over t_b with no durations: a max only); its optimizer
then starts at max(t_e, avail + (done − avail)) (the SimPy timeout's `now + delay`), or max(t_e, avail) when
done ≤ avail. Comm and wait records are DataflowAlgorithm._record's (each bucket's ops sorted by (start, end),
merged into a running cover), summed as pandas sums the engine's records (simfog.algorithms.sums.row_sums).
"""

from __future__ import annotations

import time

import numpy as np

from simfog.algorithms.dataflow.plan import P2PStep, message_durations
from simfog.algorithms.sums import row_sums


def _node_costs(alg, op: str, nbytes: float) -> np.ndarray:
    """Per node, cost.time(op, nbytes, the node's ranks): one call per distinct answer (only a degraded NIC on
    the node changes it)."""
    cluster = alg.sim.experiment.cluster
    slow = {node for node, _ in cluster.degraded_nics}
    memo: dict = {}
    out = np.empty(cluster.nodes)
    for u in range(cluster.nodes):
        key = u if u in slow else -1
        if key not in memo:
            memo[key] = alg.sim.cost.time(op, nbytes, alg.node_ranks(u))
        out[u] = memo[key]
    return out


class Phase:
    """One phase's plan as arrays: bucket sizes, the step, and per bucket what its ops last."""

    def __init__(self, alg, phase: int):
        self.alg, self.n = alg, alg.n
        self.sizes, self.step = alg.phase_steps(phase)
        cluster = alg.sim.experiment.cluster
        self.L, self.nodes = cluster.ranks_per_node, cluster.nodes
        st = self.step
        hier = st.hierarchical if isinstance(st, P2PStep) else alg.hier
        full = [b if not isinstance(st, P2PStep) or st.intra_bytes is None else st.intra_bytes for b in self.sizes]
        self.intra = [_node_costs(alg, "allreduce", f) for f in full] if hier else None
        self.bcast = [_node_costs(alg, "broadcast", f) for f in full] if hier else None
        self.hier = hier
        self.factors = alg.flow_factors(phase) or {}  # per-call variation (simfog.variation), as the engine's Runs
        if not isinstance(st, P2PStep):
            leaders = list(range(0, self.n, self.L))
            self.inter = [alg.sim.cost.time("allreduce", b, leaders) for b in self.sizes] if hier else \
                [alg.sim.cost.allreduce(b) for b in self.sizes]
            return
        self.dur = [message_durations(cluster, st.src, st.dst, b, st.latencies) for b in self.sizes]
        G = self.nodes if hier else self.n  # ranks that exchange (go): leaders by node, or every rank
        self.spos, self.dpos = (st.src // self.L, st.dst // self.L) if hier else (st.src, st.dst)
        go_ranks = np.arange(G) * (self.L if hier else 1)
        self.sender = st.named[go_ranks] if st.codec is not None else None
        if st.codec is not None:
            self.enc, self.dec = (np.asarray(x, dtype=float)[go_ranks] for x in st.codec)
        # Per go rank the messages it takes part in (sender, unless buffered; receiver, unless one-sided), -1 padded.
        m = len(st.src)
        owners = self.spos if st.one_sided else self.dpos if st.buffered else np.concatenate([self.spos, self.dpos])
        ids = np.arange(len(owners)) % max(m, 1)
        order = np.argsort(owners, kind="stable")
        counts = np.bincount(owners, minlength=G)
        self.idx = np.full((G, int(counts.max()) if m else 0), -1, dtype=np.int64)
        if m:
            col = np.arange(len(owners)) - np.repeat(np.cumsum(counts) - counts, counts)
            self.idx[owners[order], col] = ids[order]

    def bucket(self, b: int, ready: np.ndarray, timed: bool, it: int = 0):
        """Evaluate bucket b of iteration `it` from each rank's ready time: (last (n,), owned starts, owned ends
        (n, K), nan where none) — owned only when timed; untimed adds no durations (the engine's `avail`)."""
        add = np.add if timed else (lambda x, _d: x)
        if isinstance(self.step, P2PStep):
            return self._p2p(b, ready, add, timed, it)
        return self._allreduce(b, ready, add, timed, it)

    def _d(self, kind: str, base, b: int, it: int):
        """The duration(s) of bucket b's ops of `kind` in iteration `it`: `base` times their per-call factors when
        they vary (the engine's Run multiplies the same operands)."""
        table = self.factors.get(kind)
        if table is None:
            return base
        return base * (table[it, b, 0] if kind == "inter" else table[it, b])

    def _allreduce(self, b, ready, add, timed, it):
        n, L = self.n, self.L
        if not self.hier:
            s = ready.max()
            e = add(s, self._d("inter", self.inter[b], b, it))
            last = np.full(n, e)
            return last, (np.full((n, 1), s), np.full((n, 1), e)) if timed else None
        i_s = ready.reshape(self.nodes, L).max(1)
        i_e = add(i_s, self._d("intra", self.intra[b], b, it))
        x_s = i_e.max()
        x_e = add(x_s, self._d("inter", self.inter[b], b, it))
        b_e = add(np.full(self.nodes, x_e), self._d("bcast", self.bcast[b], b, it))
        last = np.repeat(b_e, L)
        if not timed:
            return last, None
        leader = (np.arange(n) % L) == 0
        S = np.stack([np.repeat(i_s, L), np.full(n, x_e), np.where(leader, x_s, np.nan)], axis=1)
        E = np.stack([np.repeat(i_e, L), last, np.where(leader, x_e, np.nan)], axis=1)
        return last, (S, E)

    def _exchange(self, b, ready, add, it):
        """The exchange of bucket b up to its messages: (node allreduce starts or None, first: when a go rank's
        node average ended (else its ready), go: when it starts sending (after any encode), message starts,
        message ends)."""
        st, i_s, first = self.step, None, ready
        if self.alg.negotiate:  # nothing moves before every rank has requested the operation
            first = np.full(self.n, ready.max())
        if self.hier:
            i_s = first.reshape(self.nodes, self.L).max(1)
            first = add(i_s, self._d("intra", self.intra[b], b, it))
        go = first if self.sender is None else np.where(self.sender, add(first, self.enc), first)
        ms = go[self.spos] if st.one_sided else np.maximum(go[self.spos], go[self.dpos])
        return i_s, first, go, ms, add(ms, self._d("message", self.dur[b], b, it))

    def _p2p(self, b, ready, add, timed, it):
        n, L = self.n, self.L
        i_s, first, go, ms, me = self._exchange(b, ready, add, it)
        has = self.idx >= 0
        acc = np.maximum(go, np.where(has, me[self.idx], -np.inf).max(1, initial=-np.inf))
        after = np.where(self.sender, add(acc, self.dec), acc) if self.sender is not None else acc
        if self.hier:
            b_e = add(after, self._d("bcast", self.bcast[b], b, it))
            last = np.repeat(b_e, L)
        else:
            last = after
        if not timed:
            return last, None
        cols_s = [np.where(has, ms[self.idx], np.nan)]
        cols_e = [np.where(has, me[self.idx], np.nan)]
        if self.sender is not None:
            cols_s += [np.where(self.sender, first, np.nan)[:, None], np.where(self.sender, acc, np.nan)[:, None]]
            cols_e += [np.where(self.sender, go, np.nan)[:, None], np.where(self.sender, after, np.nan)[:, None]]
        S, E = np.concatenate(cols_s, axis=1), np.concatenate(cols_e, axis=1)
        if self.hier:  # leaders' rows hold the exchange; every rank owns its node's allreduce and broadcast
            pad = np.full((n, S.shape[1]), np.nan)
            S2, E2 = pad.copy(), pad
            S2[::L], E2[::L] = S, E
            node = np.repeat(np.arange(self.nodes), L)
            S = np.concatenate([S2, i_s[node, None], after[node, None]], axis=1)
            E = np.concatenate([E2, first[node, None], last[:, None]], axis=1)
        return last, (S, E)

    def messages(self, b: int, ready: np.ndarray, it: int = 0):
        """(start, end) of every message of bucket b in iteration `it` (the engine's message log), from the ranks'
        ready times."""
        return self._exchange(b, ready, np.add, it)[3:]


def _merge(L: np.ndarray, owned, last: np.ndarray) -> dict:
    """DataflowAlgorithm._record over arrays: the rank's ops of one bucket (zero-length ones dropped) sorted by
    (start, end); from its launch L on, a running cover `cur` (the latest end so far): an op ending after it adds
    a comm record (max(start, cur), end), after a wait record (cur, start) when it starts later; a final wait
    runs to the bucket's last op."""
    S, E = owned
    S, E = S.copy(), E.copy()
    drop = ~(E > S)
    S[drop], E[drop] = np.nan, np.nan
    order = np.lexsort((E, S), axis=-1)
    S, E = np.take_along_axis(S, order, 1), np.take_along_axis(E, order, 1)
    run = np.fmax.accumulate(E, axis=1)
    cur = np.empty_like(E)
    cur[:, :1] = L[:, None]
    cur[:, 1:] = np.fmax(L[:, None], run[:, :-1])
    kept = E > cur
    end = np.fmax(L, run[:, -1]) if E.shape[1] else L
    return {"L": L, "S": S, "E": E, "cur": cur, "kept": kept, "wait": kept & (S > cur),
            "start": np.maximum(S, cur), "end": end, "last": last, "final": last > end}


def _phase(alg, phase: int) -> Phase:
    """Phase `phase` of `alg`, built once (kept on the algorithm, as its Plans are)."""
    phases = alg.__dict__.setdefault("_flow_phases", {})
    if phase not in phases:
        phases[phase] = Phase(alg, phase)
    return phases[phase]


def iterate(sim, it: int, t0: np.ndarray, messages: bool = False) -> dict:
    """Iteration `it` of every rank from t0 (n,): its compute times, optimizer start and per bucket the merged
    records (_merge); with `messages`, each bucket's (ready, message starts, ends) too."""
    alg, c = sim.algorithm, sim.compute
    n = sim.simulated_ranks
    s, slow = sim.draws[it, :n], sim.slowdown[:n]
    t_b = t0 + (c.forward_s[s] * slow + sim.delays[it, :n])
    t_e = t_b + sim.backward_s[s] * slow
    out = {"t0": t0, "t_b": t_b, "t_e": t_e, "buckets": [], "sent": []}
    t_o = t_e
    if n > 1:
        ph = _phase(alg, it % alg.period)
        inputs = [np.broadcast_to(np.asarray(x, dtype=float), (n,)) for x in alg._inputs(np.arange(n), it, s, t_b)]
        done = avail = None
        for b in range(len(ph.sizes)):
            ready = inputs[b] if done is None else np.maximum(inputs[b], done)
            if messages:
                out["sent"].append(ph.messages(b, ready, it))
            done, owned = ph.bucket(b, ready, True, it)
            out["buckets"].append(_merge(ready, owned, done))
            avail = t_b if avail is None else np.maximum(t_b, avail)
            avail, _ = ph.bucket(b, avail, False, it)
        t_o = np.maximum(t_e, np.where(done > avail, avail + (done - avail), avail))
    out["t_o"], out["t_end"] = t_o, t_o + c.optimizer_s[s] * slow
    return out


def _sums(itn: dict, n: int) -> dict:
    """Per rank: comm_s, wait_s and comm_exposed_s of one iteration, the record start and end, in record order."""
    t_e, t_o = itn["t_e"], itn["t_o"]
    comm, wait, exposed = [], [], []
    first, rec_end = np.full(n, np.nan), itn["t_end"]
    for m in reversed(itn["buckets"]):
        has = m["kept"].any(1) | m["final"]
        first = np.where(has, m["L"], first)
    for m in itn["buckets"]:
        kept = m["kept"]
        comm.append((m["E"] - m["start"], kept))
        wait += [(m["S"] - m["cur"], m["wait"]), ((m["last"] - m["end"])[:, None], m["final"][:, None])]
        lo, hi = np.maximum(m["start"], t_e[:, None]), np.minimum(m["E"], t_o[:, None])
        exposed.append((hi - lo, kept & (hi > lo)))
        rec_end = np.fmax(rec_end, np.fmax(np.fmax.reduce(np.where(kept, m["E"], np.nan), axis=1, initial=-np.inf),
                                           np.where(m["final"], m["last"], np.nan)))

    def total(parts):
        if not parts:
            return np.zeros(n)
        return row_sums(np.concatenate([v for v, _ in parts], axis=1), np.concatenate([k for _, k in parts], axis=1))

    return {"comm_s": total(comm), "wait_s": total(wait), "comm_exposed_s": total(exposed),
            "start_s": np.fmin(itn["t0"], first), "end_s": rec_end}


def run(sim, path: str):
    """Simulate `sim` (a simfog.simulation.Simulation of a DataflowAlgorithm). Returns its Result, which names
    `path`."""
    started = time.perf_counter()
    alg = sim.algorithm
    n, iters = sim.simulated_ranks, sim.experiment.iterations
    cols = {k: np.zeros((n, iters)) for k in ("start_s", "end_s", "forward_s", "backward_s", "optimizer_s", "comm_s",
                                              "comm_exposed_s", "idle_s", "wait_s")}
    t0 = np.zeros(n)
    finished = np.zeros(n, dtype=int)
    for it in range(iters):
        itn = iterate(sim, it, t0)
        sums = _sums(itn, n)
        for k in ("start_s", "end_s", "comm_s", "comm_exposed_s", "wait_s"):
            cols[k][:, it] = sums[k]
        cols["forward_s"][:, it] = itn["t_b"] - t0
        cols["backward_s"][:, it] = itn["t_e"] - itn["t_b"]
        cols["optimizer_s"][:, it] = itn["t_end"] - itn["t_o"]
        cols["idle_s"][:, it] = np.maximum((itn["t_o"] - itn["t_e"]) - sums["comm_exposed_s"], 0.0)
        finished += np.isfinite(itn["t_end"])
        t0 = itn["t_end"]
    alg.make_log = lambda: message_log(sim)
    return sim.result(cols, path=path, started=started, finished=finished, make_records=lambda: records(sim))


def _kept(sim, messages: bool = False):
    t0 = np.zeros(sim.simulated_ranks)
    for it in range(sim.experiment.iterations):
        itn = iterate(sim, it, t0, messages)
        yield it, itn
        t0 = itn["t_end"]


def message_log(sim) -> list[tuple]:
    """The engine's message log (iteration, src, dst, bytes, start_s, end_s), rank by rank per bucket."""
    alg, out = sim.algorithm, []
    for it, itn in _kept(sim, messages=True):
        ph = _phase(alg, it % alg.period)
        for nbytes, (ms, me) in zip(ph.sizes, itn["sent"]):
            out += [(it, s, d, nbytes, a, e) for s, d, a, e in zip(ph.step.src.tolist(), ph.step.dst.tolist(),
                                                                   ms.tolist(), me.tolist())]
    return out


def records(sim) -> list[tuple]:
    """The event engine's records (rank, iteration, kind, name, start_s, end_s), from the evaluation."""
    alg, n, out = sim.algorithm, sim.simulated_ranks, []
    for it, itn in _kept(sim):
        ph = _phase(alg, it % alg.period) if n > 1 else None
        names = [alg.name if len(ph.sizes) == 1 else f"{alg.name}{b}" for b in range(len(ph.sizes))] if ph else []
        lists = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in m.items()} for m in itn["buckets"]]
        t0, t_b, t_e, t_o, t_end = (itn[k].tolist() for k in ("t0", "t_b", "t_e", "t_o", "t_end"))
        for r in range(n):
            out.append((r, it, "forward", "forward", t0[r], t_b[r]))
            out.append((r, it, "backward", "backward", t_b[r], t_e[r]))
            for name, m in zip(names, lists):
                for j, kept in enumerate(m["kept"][r]):
                    if not kept:
                        continue
                    if m["wait"][r][j]:
                        out.append((r, it, "wait", name, m["cur"][r][j], m["S"][r][j]))
                    out.append((r, it, "comm", name, m["start"][r][j], m["E"][r][j]))
                if m["final"][r]:
                    out.append((r, it, "wait", name, m["end"][r], m["last"][r]))
            out.append((r, it, "optimizer", "optimizer", t_o[r], t_end[r]))
    return out
