"""The run-time-decided family's plan: what can be known before the run. WAGMA's group layouts and the cost of a
group operation (recursive doubling, or the ring a subgroup runs), BAGUA async's period, and how an interval that
ran across iterations is split among them (a late WAGMA member, an asynchronous averaging round).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simfog.p2p import message_times

WAGMA_GROUP_SIZE = 8     # the released configuration: P = 64, S = 8
WAGMA_GLOBAL_EVERY = 11  # τ = 10: a global average every τ + 1 iterations
BAGUA_ASYNC_PERIOD_S = 0.5  # AsyncModelAverageAlgorithm(sync_interval_ms=500)


def wagma_layouts(ranks: int, group_size: int) -> list[tuple[int, ...]]:
    """WAGMA's group layouts: the log2 P bits of a rank id cut into runs of log2 S consecutive bits; at iteration k
    a rank's group is the ranks that differ from it only in the bits of layout k mod (number of layouts)."""
    bits, width = ranks.bit_length() - 1, group_size.bit_length() - 1
    return [tuple(range(lo, min(lo + width, bits))) for lo in range(0, bits, width)] or [()]


def recursive_doubling_seconds(cluster, n: int, nbytes: float, bits: tuple[int, ...]) -> np.ndarray:
    """Per rank: seconds of its group's recursive doubling over `bits` (sum over rounds of the slowest message
    in the group; all groups run their rounds at once)."""
    ranks = np.arange(n)
    mask = sum(1 << b for b in bits)
    group = ranks & ~mask
    total = np.zeros(n)
    for b in bits:
        times = message_times(cluster, ranks, ranks ^ (1 << b), nbytes)  # exchange_times over arrays
        worst = np.zeros(n)
        np.maximum.at(worst, group, times)
        total += worst[group]
    return total


def group_ring_seconds(cluster, n: int, nbytes: float, bits: tuple[int, ...]) -> np.ndarray:
    """Per rank: seconds of its group's ring allreduce over `bits` (comm.group_collective: 2(S-1) steps in which
    every member sends M/S bytes to the next member of its group, all groups at once, each step lasting its
    group's slowest message)."""
    ranks = np.arange(n)
    mask = sum(1 << b for b in bits)
    group = ranks & ~mask
    size = 1 << len(bits)  # every group: the ranks that differ from its id only in `bits`
    members = ranks[np.lexsort((ranks, group))].reshape(-1, size)  # per group its members, ascending
    successor = np.empty(n, dtype=np.int64)
    successor[members] = np.roll(members, -1, axis=1)
    times = message_times(cluster, ranks, successor, nbytes / size)
    worst = np.zeros(n)
    np.maximum.at(worst, group, times)
    return 2 * (size - 1) * worst[group]


def split_by_iteration(starts: Sequence[float], iteration: int, s: float, e: float) -> list[tuple[int, float, float]]:
    """Pieces (iteration, start, end) of the interval [s, e] of a rank whose iteration j began at starts[j]
    (known up to `iteration`; iterations follow each other without gaps in the engine). The part before
    starts[0] stays with iteration 0."""
    out, j = [], iteration
    while j > 0 and s < starts[j]:
        if e > starts[j]:
            out.append((j, starts[j], e))
            e = starts[j]
        j -= 1
    if e > s:
        out.append((j, s, e))
    return out[::-1]


def split_rounds(starts: np.ndarray, known: np.ndarray, s: float, e: float) -> tuple[np.ndarray, ...]:
    """split_by_iteration(starts[r, :known[r] + 1], known[r], s, e) for every rank r at
    once, step for step (the same comparisons and choices, so the same pieces): (ranks, iterations, starts, ends)
    of the pieces, rank by rank, each rank's in iteration order."""
    n = len(known)
    end = np.full(n, e)                      # each rank's e as its walk down the iterations shortens it
    at = known.copy()                        # where each rank's walk stands (it stops where s >= starts)
    walking = np.ones(n, dtype=bool)
    pieces = []
    j = int(known.max()) if n else 0
    while j > 0 and walking.any():
        here = walking & (known >= j)        # ranks whose walk has reached j
        t = starts[:, j]
        go = here & (s < t)
        cut = go & (end > t)
        if cut.any():
            rows = np.flatnonzero(cut)
            pieces.append((rows, np.full(len(rows), j), t[rows], end[rows]))
            end[rows] = t[rows]
        walking &= ~(here & ~go)             # the loop's condition failed: the walk stops at j
        at[go] = j - 1
        j -= 1
    last = end > s
    rows = np.flatnonzero(last)
    pieces.append((rows, at[rows], np.full(len(rows), s), end[rows]))
    ranks, its, lo, hi = (np.concatenate(x) for x in zip(*pieces))
    order = np.lexsort((its, ranks))
    return ranks[order], its[order], lo[order], hi[order]
