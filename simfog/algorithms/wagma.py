"""WAGMA-SGD (Li et al., TPDS'21): wait-avoiding group model averaging.

P ranks (a power of two) average their weights in groups of S every iteration; groups come from recursive doubling
(ALGORITHMS.md §6): the log2 P bits of a rank id are cut into layouts of log2 S consecutive bits, and at iteration k
a rank's group is the ranks that differ from it only in the bits of layout k mod (number of layouts), so groups
are blocks of S consecutive ranks, then stride-S groups, ... and every rank has averaged with all others after
log_S P iterations. Every `global_every` = τ+1 iterations (τ = 10 in the released code) a global allreduce replaces
the group one: it is a real synchronization (every rank waits for the last), which bounds staleness by τ.

A group collective is externally triggered: it starts when the FIRST member launches it; members that arrive later
do not hold it up (their communication thread contributes their current, stale, weights) and wait only for what is
left of it, not at all when it has already finished. Whole-model simplification: the paper averages tensor by
tensor as gradients become ready, overlapping backward; here the whole model is one group operation launched at
the member's backward start. Costs by recursive doubling, round by round: every rank sends M bytes to its partner
(rank XOR 2^bit) at once, round times from simfog.p2p.exchange_times (intra-node partners use the intra link; the
L ranks of a node crossing its NIC share it), the group's time is the sum over its rounds of its slowest message:
log2(S)·(α + M·β) on a flat network, log2(P)·(α + M·β) for the global step. Concurrent group operations of one rank
(when it lags behind) are not serialized and do not share its NIC.

A late member's share of a group operation is recorded on it when it arrives, split over its iterations as they
ran (the operation may have run during its previous iteration).

Options for implementations that are not wait-avoiding (e.g. a blocking group allreduce over gloo or NCCL
subgroups, which validate.ranks.decentralized runs): comm.wait_for_group = true starts a group operation when its last
member arrives and makes every member wait for it, as the global step does; comm.global_collective = true costs the
global step as comm.collective's allreduce among all ranks (a ring for gloo) instead of recursive doubling;
comm.group_collective = true costs each group operation as the ring allreduce a subgroup runs there (gloo's ring):
2(S-1) steps in which every member sends M/S bytes to the next member of its group, all groups at once, each step
timed by simfog.p2p.exchange_times (so groups crossing one NIC share it) and lasting its group's slowest message.
For S = 2 that is 2α + M·β where recursive doubling pays α + M·β.

Every group and global operation also takes comm.collective_overhead_s (simfog.overheads: the host's work per
operation, e.g. the validator's measured in-step excess) on top of its network cost; 0 unless given or measured.
"""

from __future__ import annotations

import numpy as np

from simfog.algorithms.dataflow import DEFAULT_CONSENSUS_EPS, split_by_iteration
from simfog.algorithms.registry import REGISTRY
from simfog.errors import ConfigError, Infeasible
from simfog.events import Collective
from simfog.p2p import message_times

WAGMA_GROUP_SIZE = 8     # the released configuration: P = 64, S = 8
WAGMA_GLOBAL_EVERY = 11  # τ = 10: a global average every τ + 1 iterations


@REGISTRY.register("wagma")
class WAGMA:
    """WAGMA-SGD: wait-avoiding group averaging (groups of comm.group_size, a global average every global_every)."""

    symmetric = False

    def __init__(self, sim):
        self.sim = sim
        exp, comm = sim.experiment, sim.experiment.comm
        self.n = n = sim.simulated_ranks
        self.nbytes = float(exp.workload.trace.nbytes)
        self.eps = comm.consensus_eps or DEFAULT_CONSENSUS_EPS
        if n & (n - 1):
            raise Infeasible(f"algorithm wagma needs a power of two ranks; got {n}")
        self.group_size = comm.group_size or min(WAGMA_GROUP_SIZE, n)
        s = self.group_size
        if s & (s - 1) or not 2 <= s <= max(n, 2):
            raise ConfigError("comm.group_size", s, f"a power of two from 2 to the rank count ({n})")
        self.global_every = comm.global_every or WAGMA_GLOBAL_EVERY
        self.wait_for_group = bool(comm.wait_for_group)
        self.overhead_s = exp.overheads().collective_overhead_s  # per group or global operation
        bits, width = n.bit_length() - 1, s.bit_length() - 1
        self.layouts = [tuple(range(lo, min(lo + width, bits))) for lo in range(0, bits, width)] or [()]
        self.masks = [sum(1 << b for b in layout) for layout in self.layouts]  # a rank's group id: rank & ~mask
        self.sizes = [2 ** len(layout) for layout in self.layouts]            # members per group
        self._group_s: dict[int, np.ndarray] = {}
        if n == 1:
            self.global_s = 0.0
        elif comm.global_collective:
            self.global_s = sim.cost.allreduce(self.nbytes) + self.overhead_s
        else:
            self.global_s = self._rounds(tuple(range(bits))).max() + self.overhead_s
        self.ops: dict[tuple[int, int], list] = {}     # (iteration, group id) -> [start, end, event, members seen]
        self.blocking: dict[tuple[int, int], object] = {}  # wait_for_group: (iteration, group id) -> Collective
        self.globals: dict[int, object] = {}
        self.starts = [[] for _ in range(n)]            # per rank: when each of its iterations began

    # --- costs --------------------------------------------------------------------------------------------------

    def _rounds(self, bits: tuple[int, ...]) -> np.ndarray:
        """Per rank: seconds of its group's recursive doubling over `bits` (sum over rounds of the slowest message
        in the group; all groups run their rounds at once)."""
        cluster, n = self.sim.experiment.cluster, self.n
        ranks = np.arange(n)
        mask = sum(1 << b for b in bits)
        group = ranks & ~mask
        total = np.zeros(n)
        for b in bits:
            times = message_times(cluster, ranks, ranks ^ (1 << b), self.nbytes)  # exchange_times over arrays
            worst = np.zeros(n)
            np.maximum.at(worst, group, times)
            total += worst[group]
        return total

    def _ring(self, bits: tuple[int, ...]) -> np.ndarray:
        """Per rank: seconds of its group's ring allreduce over `bits` (comm.group_collective; see the docstring)."""
        cluster, n = self.sim.experiment.cluster, self.n
        ranks = np.arange(n)
        mask = sum(1 << b for b in bits)
        group = ranks & ~mask
        size = 1 << len(bits)  # every group: the ranks that differ from its id only in `bits`
        members = ranks[np.lexsort((ranks, group))].reshape(-1, size)  # per group its members, ascending
        successor = np.empty(n, dtype=np.int64)
        successor[members] = np.roll(members, -1, axis=1)
        times = message_times(cluster, ranks, successor, self.nbytes / size)
        worst = np.zeros(n)
        np.maximum.at(worst, group, times)
        return 2 * (size - 1) * worst[group]

    def group_seconds(self, layout: int) -> np.ndarray:
        """Seconds of the group operation of each rank's group under layout `layout` (rank-indexed)."""
        if layout not in self._group_s:
            cost = self._ring if self.sim.experiment.comm.group_collective else self._rounds
            self._group_s[layout] = cost(self.layouts[layout]) + self.overhead_s
        return self._group_s[layout]

    def is_global(self, iteration: int) -> bool:
        return (iteration + 1) % self.global_every == 0

    # --- engine interface -----------------------------------------------------------------------------------------

    def backward_started(self, rank, iteration, sample, t_backward):
        sim = self.sim
        c = sim.compute
        self.starts[rank].append(t_backward - c.forward_s[sample] * sim.slowdown[rank] - sim.delays[iteration, rank])
        if self.n == 1:
            return None
        if self.is_global(iteration):
            return sim.env.process(self._global(rank, iteration))
        layout = iteration % len(self.layouts)
        gid = rank & ~self.masks[layout]
        if self.wait_for_group:
            return sim.env.process(self._blocking_group(rank, iteration, layout, gid))
        key, now = (iteration, gid), sim.env.now
        op = self.ops.get(key)
        if op is None:  # the first member triggers the group's collective
            d = float(self.group_seconds(layout)[rank])
            op = self.ops[key] = [now, now + d, sim.env.timeout(d), 0]
        op[3] += 1
        if op[3] == self.sizes[layout]:
            del self.ops[key]
        for it, s, e in split_by_iteration(self.starts[rank], iteration, op[0], op[1]):
            sim.record(rank, it, "comm", "group", s, e)
        return op[2] if op[1] > now else None

    def _blocking_group(self, rank, iteration, layout, gid):
        """wait_for_group: the group's operation starts when its last member has arrived; every member waits."""
        key = (iteration, gid)
        coll = self.blocking.get(key)
        if coll is None:
            coll = self.blocking[key] = Collective(self.sim.env, 2 ** len(self.layouts[layout]),
                                                   float(self.group_seconds(layout)[rank]), "group")
        arrived = self.sim.env.now
        done = coll.join()
        if coll.arrived == coll.expected:
            del self.blocking[key]
        yield done
        if coll.start > arrived:
            self.sim.record(rank, iteration, "wait", "group", arrived, coll.start)
        self.sim.record(rank, iteration, "comm", "group", coll.start, coll.end)

    def _global(self, rank, iteration):
        coll = self.globals.get(iteration)
        if coll is None:
            coll = self.globals[iteration] = Collective(self.sim.env, self.n, self.global_s, "global")
        arrived = self.sim.env.now
        yield coll.join()
        if coll.start > arrived:
            self.sim.record(rank, iteration, "wait", "global", arrived, coll.start)
        self.sim.record(rank, iteration, "comm", "global", coll.start, coll.end)

    def describe_buckets(self) -> list[dict]:
        if self.n == 1:
            return []
        return [{"bucket": 0, "bytes": int(self.nbytes), "group_size": self.group_size, "layouts": len(self.layouts),
                 "group_s": float(self.group_seconds(0).max()), "global_s": float(self.global_s),
                 "global_every": self.global_every}]

    def mixing(self) -> dict | None:
        """Group averaging without staleness: one layout averages its bits exactly, so the product over all layouts
        (or one global step) is the exact average J; before that the error is 1 (‖Π − J‖₂ over a direction no
        layout has touched yet). Spectral gap over that period: 1."""
        if self.n == 1:
            return None
        covered, full, k = set(), set(range(self.n.bit_length() - 1)), 0
        while covered != full:
            covered = full if self.is_global(k) else covered | set(self.layouts[k % len(self.layouts)])
            k += 1
        return {"topology": f"wagma groups of {self.group_size}", "spectral_gap": 1.0,
                "iterations_to_consensus": k if self.eps < 1 else 0, "consensus_eps": self.eps,
                "averaging_rounds_per_iteration": 1.0}
