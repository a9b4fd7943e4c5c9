"""The co-simulation of several jobs' timelines (simfog.fabric.cosim) on hand-worked cases: comm phases aligned
(both slowed by the shared factor while they communicate), interleaved (no slowdown), partly overlapping (the
offset kept, each iteration longer by the overlap's share), a phase that locks when one job is slowed and the
other not, and a job alone or never beside another replayed bit for bit."""

from __future__ import annotations

import pytest

from simfog.errors import Infeasible
from simfog.fabric.cosim import Timeline, collectives, cosimulate

KEY = "bucket0"


def records(iterations: int, compute: float, comm: float, optimizer: float = 0.0) -> tuple:
    """One rank: per iteration forward for `compute`, one collective for `comm`, then the optimizer (s)."""
    out, t = [], 0.0
    for it in range(iterations):
        out += [(0, it, "forward", "forward", t, t + compute),
                (0, it, "comm", KEY, t + compute, t + compute + comm),
                (0, it, "optimizer", "optimizer", t + compute + comm, t + compute + comm + optimizer)]
        t += compute + comm + optimizer
    return tuple(out)


def timeline(recs: tuple, factor: float, other: int) -> Timeline:
    """Every collective `factor` times as long while job `other` communicates too."""
    return Timeline(recs, {frozenset({other}): {k: factor * d for k, d in collectives(recs).items()}})


def ends(recs) -> list[float]:
    return [r[5] for r in recs if r[2] == "optimizer"]


def test_aligned_comm_phases_are_both_slowed_by_the_shared_factor():
    """C = 3 s compute, c = 1 s collective, 0.5 s optimizer; at the same phase both collectives run together all
    the way, each at half speed: every iteration is 3 + 2 + 0.5 s."""
    recs = records(5, 3.0, 1.0, 0.5)
    a, b = cosimulate([timeline(recs, 2.0, 1), timeline(recs, 2.0, 0)], [0.0, 0.0])
    assert ends(a) == ends(b) == [5.5 * (k + 1) for k in range(5)]
    assert [r[4:] for r in a if r[2] == "comm"] == [(5.5 * k + 3, 5.5 * k + 5) for k in range(5)]


@pytest.mark.parametrize("compute, comm, offset", [(3.0, 1.0, 2.0), (1.0, 1.0, 1.0), (3.0, 1.0, 1.0)])
def test_interleaved_comm_phases_with_duty_at_most_half_are_not_slowed(compute, comm, offset):
    """Duty 1/4 at half an iteration apart, duty 1/2 exactly interleaved (one job's collective starts when the
    other's ends), duty 1/4 a quarter apart: no collective runs beside another, so both replay as alone."""
    recs = records(6, compute, comm)
    out = cosimulate([timeline(recs, 2.0, 1), timeline(recs, 2.0, 0)], [0.0, offset])
    assert out == [list(recs), list(recs)]


@pytest.mark.parametrize("delta", [0.25, 0.5, 0.75])
def test_partly_overlapping_identical_jobs_keep_their_offset(delta):
    """Job b's collective starts delta < c after a's. a runs alone for delta, then both at half speed: a ends
    after delta + 2 (c - delta), b then has delta left alone and ends delta later, as it started. The offset is
    kept (fair sharing of identical jobs neither pulls nor pushes them) and each iteration is longer by
    (f - 1)(c - delta) = c - delta."""
    recs = records(8, 3.0, 1.0)
    a, b = cosimulate([timeline(recs, 2.0, 1), timeline(recs, 2.0, 0)], [0.0, delta])
    period = 4.0 + (1.0 - delta)
    assert ends(a) == pytest.approx([period * (k + 1) for k in range(8)], rel=1e-12)
    assert ends(b) == pytest.approx(ends(a), rel=1e-12)  # each in its own time: the same phase every iteration


def test_a_phase_locks_where_the_dynamics_converge():
    """Job a (4 s iteration: 3 s compute, 1 s collective) is slowed to half speed while b communicates; b (4.1 s:
    3.1 + 1) is not slowed by a. With a's collective starting phi after b's, a loses (1 - phi)/2 per iteration,
    so phi' = phi + (1 - phi)/2 - 0.1: a contraction by 1/2 to phi* = 0.8, where a's iteration is b's, 4.1 s."""
    a_recs, b_recs = records(40, 3.0, 1.0), records(40, 3.1, 1.0)
    b_line = Timeline(b_recs, {frozenset({0}): collectives(b_recs)})  # unchanged beside a
    a, b = cosimulate([timeline(a_recs, 2.0, 1), b_line], [0.6, 0.0])  # phi = 3.6 - 3.1 = 0.5 at first
    a_comm = [0.6 + r[4] for r in a if r[2] == "comm"]
    b_comm = [r[4] for r in b if r[2] == "comm"]
    phi = [x - y for x, y in zip(a_comm, b_comm)]
    expected = [0.5]
    for _ in range(10):
        expected.append(expected[-1] + (1 - expected[-1]) / 2 - 0.1)
    assert phi[:11] == pytest.approx(expected, rel=1e-9)
    assert phi[-1] == pytest.approx(0.8, abs=1e-9)
    periods = [y - x for x, y in zip(ends(a), ends(a)[1:])]
    assert periods[-1] == pytest.approx(4.1, abs=1e-9) and b == list(b_recs)


def test_a_job_alone_or_never_beside_another_comes_back_bit_for_bit():
    recs = records(4, 3.0, 1.0, 0.5)
    assert cosimulate([timeline(recs, 2.0, 1)], [0.0]) == [list(recs)]
    far = cosimulate([timeline(recs, 2.0, 1), timeline(recs, 2.0, 0)], [0.0, 100.0])
    assert far == [list(recs), list(recs)]


def test_waits_and_several_ranks_follow_their_collective():
    """Rank 1 launches the collective 0.5 s before rank 0 (a wait on rank 1): the collective is one for both
    ranks, slowed once; the wait keeps its launch and ends when the collective starts."""
    recs = ((0, 0, "forward", "forward", 0.0, 3.0), (1, 0, "forward", "forward", 0.0, 2.5),
            (1, 0, "wait", KEY, 2.5, 3.0), (0, 0, "comm", KEY, 3.0, 4.0), (1, 0, "comm", KEY, 3.0, 4.0),
            (0, 0, "optimizer", "optimizer", 4.0, 4.5), (1, 0, "optimizer", "optimizer", 4.0, 4.5))
    a, b = cosimulate([timeline(recs, 2.0, 1), timeline(recs, 2.0, 0)], [0.0, 0.0])
    assert a == b and a[2] == (1, 0, "wait", KEY, 2.5, 3.0)
    assert a[3][4:] == a[4][4:] == (3.0, 5.0) and a[5][4:] == a[6][4:] == (5.0, 5.5)


def test_kinds_it_cannot_replay_are_refused():
    with pytest.raises(Infeasible, match="not 'gossip'"):
        cosimulate([Timeline(((0, 0, "gossip", "x", 0.0, 1.0),), {})], [0.0])
