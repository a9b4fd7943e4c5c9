"""Collective "ompi" (simfog.collectives.ompi): Open MPI 4.1/5.0's tuned fixed decision, read by hand from
ompi/mca/coll/tuned/coll_tuned_decision_fixed.c, and the algorithms' α-β-γ closed forms written out here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from simfog.cluster import Cluster, Link
from simfog.collectives import ALGORITHMS, CostModel
from simfog.collectives.ompi import (
    ALLREDUCE_ALGORITHMS,
    ELEMENT_BYTES,
    ompi_allgather_algorithm,
    ompi_allreduce_algorithm,
    ompi_allreduce_time,
)
from simfog.errors import ConfigError

A, B, G = 5e-6, 2.5e-10, 1e-10          # uniform link: α (s), β (s/B); γ (s/B)
LINK = Link(A, 1 / B)
M = 3 * 2**20 + 17.0
AI, BI = 1e-6, 1e-11                    # two-level cluster: intra link
AN, BN = 1e-5, 8e-10                    # and the NIC
KiB, MiB = 1024, 2**20


def uniform(n: int, layout: str) -> Cluster:
    nodes, per_node = (1, n) if layout == "one_node" else (n, 1)
    return Cluster(nodes, per_node, intra=LINK, nic=LINK, reduce_Bps=1 / G)


def two_level(nodes: int = 4, per_node: int = 4) -> Cluster:
    return Cluster(nodes, per_node, intra=Link(AI, 1 / BI), nic=Link(AN, 1 / BN), reduce_Bps=1 / G)


def test_registered():
    assert "ompi" in ALGORITHMS
    assert ALLREDUCE_ALGORITHMS == ("basic_linear", "nonoverlapping", "recursive_doubling", "ring",
                                    "segmented_ring", "rabenseifner")


# --- the decision table ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("ranks", "nbytes", "expected"), [
    (4, 1 * KiB, "recursive_doubling"),     # 4..7 ranks: 16 B <= 1 KiB < 8 KiB
    (8, 1 * MiB, "rabenseifner"),           # 8..15 ranks: >= 8 KiB
    (64, 64 * MiB, "rabenseifner"),         # 64..127 ranks: >= 256 KiB
    (8, 8 * KiB - 1, "recursive_doubling"), (8, 8 * KiB, "rabenseifner"),   # the switch is "below"
    (64, 256 * KiB - 1, "recursive_doubling"),
    (2, 4, "ring"), (2, 4 * KiB, "ring"), (3, 8 * KiB - 1, "ring"), (3, 8 * KiB, "recursive_doubling"),
    (2, 100 * KiB, "segmented_ring"), (3, 1 * MiB, "rabenseifner"),
    (4, 15, "ring"), (4, 16, "recursive_doubling"), (7, 8 * KiB, "rabenseifner"),
    (16, 32, "segmented_ring"), (16, 64, "recursive_doubling"), (31, 4 * KiB, "rabenseifner"),
    (32, 100, "segmented_ring"), (63, 128, "rabenseifner"),
    (128, 1 * KiB, "nonoverlapping"), (200, 200 * KiB, "recursive_doubling"), (255, 256 * KiB, "rabenseifner"),
    (300, 2 * KiB, "nonoverlapping"), (511, 4 * KiB, "rabenseifner"),
    (1000, 8 * KiB, "recursive_doubling"), (2047, 16 * KiB, "rabenseifner"),
    (3000, 3 * KiB, "segmented_ring"), (3000, 8 * KiB, "recursive_doubling"),
    (5000, 20 * KiB, "recursive_doubling"), (5000, 32 * KiB, "rabenseifner"), (5000, 1 * KiB, "nonoverlapping"),
])
def test_allreduce_decision_table(ranks, nbytes, expected):
    assert ompi_allreduce_algorithm(ranks, nbytes) == expected


@pytest.mark.parametrize(("ranks", "nbytes", "expected"), [
    (2, 1 * MiB, "two_proc"),
    (8, 1 * MiB, "recursive_doubling"), (31, 31 * MiB, "recursive_doubling"),
    (48, 48 * 512, "recursive_doubling"),   # decided on the per-rank contribution M/n: 512 B < 1 KiB
    (48, 48 * 2 * KiB, "neighbor"), (48, 48 * 64 * KiB, "ring"),
    (100, 100 * 512, "neighbor"), (300, 300 * 64, "bruck"), (5000, 5000 * 1, "recursive_doubling"),
    (5000, 5000 * 8 * KiB, "neighbor"),
])
def test_allgather_decision_table(ranks, nbytes, expected):
    assert ompi_allgather_algorithm(ranks, nbytes) == expected


def test_switch_point_replaces_the_table():
    for ranks in (2, 8, 64, 5000):
        assert ompi_allreduce_algorithm(ranks, 65535, switch_bytes=65536) == "recursive_doubling"
        assert ompi_allreduce_algorithm(ranks, 65536, switch_bytes=65536) == "segmented_ring"
        assert ompi_allreduce_algorithm(ranks, 0, switch_bytes=0) == "segmented_ring"
        assert ompi_allreduce_algorithm(ranks, 1e12, switch_bytes=math.inf) == "recursive_doubling"
    c = uniform(8, "one_per_node")
    rd, ring = (ompi_allreduce_time(c, M, algorithm=a) for a in ("recursive_doubling", "ring"))
    assert ompi_allreduce_time(c, M, switch_bytes=M + 1) == rd
    assert ompi_allreduce_time(c, M, switch_bytes=M) == ring
    assert ompi_allreduce_time(c, M) == CostModel(c, "ompi").allreduce(M)   # no switch: the table (rabenseifner)


def test_bad_arguments():
    with pytest.raises(ConfigError, match="switch_bytes"):
        ompi_allreduce_algorithm(8, 1, switch_bytes=-1)
    with pytest.raises(ConfigError, match="switch_bytes"):
        ompi_allreduce_algorithm(8, 1, switch_bytes=math.nan)
    with pytest.raises(ConfigError, match="ranks"):
        ompi_allreduce_algorithm(0, 1)
    with pytest.raises(ConfigError, match="nbytes"):
        ompi_allgather_algorithm(4, -1)
    c = uniform(4, "one_node")
    with pytest.raises(ConfigError, match="algorithm.*rabenseifner"):
        ompi_allreduce_time(c, M, algorithm="butterfly")
    with pytest.raises(ConfigError, match="switch_bytes"):
        ompi_allreduce_time(c, M, algorithm="ring", switch_bytes=10)
    with pytest.raises(ConfigError, match="segsize"):
        ompi_allreduce_time(c, M, algorithm="segmented_ring", segsize_bytes=-1)
    with pytest.raises(ConfigError, match="members"):
        ompi_allreduce_time(c, M, members=[0, 4])


# --- closed forms on a uniform link ------------------------------------------------------------------------------

def closed_form(alg: str, n: int, m: float = M) -> float:
    f, lg = (n - 1) / n, math.ceil(math.log2(n))
    p = 2 ** int(math.log2(n))
    lp, extra = int(math.log2(p)), n != p
    return {
        "recursive_doubling": (lp + 2 * extra) * (A + m * B) + (lp + extra) * m * G,
        "ring": 2 * (n - 1) * A + 2 * f * m * B + f * m * G,
        "segmented_ring": 2 * (n - 1) * A + 2 * f * m * B + f * m * G,     # segsize 0: the plain ring
        "rabenseifner": 2 * lp * A + 2 * (p - 1) / p * m * B + (p - 1) / p * m * G
        + extra * (3 * A + 2 * m * B + m / 2 * G),
        "nonoverlapping": 2 * lg * (A + m * B) + lg * m * G,
        "basic_linear": (n - 1) * (A + m * B + m * G) + A + (n - 1) * m * B,
    }[alg]


@pytest.mark.parametrize("alg", ALLREDUCE_ALGORITHMS)
@pytest.mark.parametrize("layout", ["one_node", "one_per_node"])
@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 13, 64, 100])
def test_forced_allreduce_closed_forms(alg, layout, n):
    got = ompi_allreduce_time(uniform(n, layout), M, algorithm=alg)
    assert got == pytest.approx(closed_form(alg, n), rel=1e-12)


def test_recursive_doubling_non_power_of_two_by_hand():
    # 6 ranks: p = 4, two exchange steps + the pre and post pair steps, three reductions of M
    assert ompi_allreduce_time(uniform(6, "one_per_node"), M, algorithm="recursive_doubling") == pytest.approx(
        4 * (A + M * B) + 3 * M * G, rel=1e-12)
    # 8 ranks: log2 8 = 3 steps of the whole message
    assert ompi_allreduce_time(uniform(8, "one_node"), M, algorithm="recursive_doubling") == pytest.approx(
        3 * (A + M * B) + 3 * M * G, rel=1e-12)


@pytest.mark.parametrize("layout", ["one_node", "one_per_node"])
def test_ompi_costs_what_the_table_picks(layout):
    # 4 ranks, 1 KiB: recursive doubling, 2 steps
    assert CostModel(uniform(4, layout), "ompi").allreduce(KiB) == pytest.approx(
        2 * (A + KiB * B) + 2 * KiB * G, rel=1e-12)
    # 6 ranks, 1 KiB: recursive doubling on p = 4 plus the two pair steps
    assert CostModel(uniform(6, layout), "ompi").allreduce(KiB) == pytest.approx(
        4 * (A + KiB * B) + 3 * KiB * G, rel=1e-12)
    # 8 ranks, 1 MiB: Rabenseifner = simfog's "rhd"
    c8 = uniform(8, layout)
    assert CostModel(c8, "ompi").allreduce(MiB) == pytest.approx(
        6 * A + 2 * 7 / 8 * MiB * B + 7 / 8 * MiB * G, rel=1e-12)
    assert CostModel(c8, "ompi").allreduce(MiB) == pytest.approx(CostModel(c8, "rhd").allreduce(MiB), rel=1e-12)
    # 64 ranks, 64 MiB: Rabenseifner; 2 ranks, 100 KiB: segmented ring with segsize 0 = ring
    assert CostModel(uniform(64, layout), "ompi").allreduce(64 * MiB) == pytest.approx(
        closed_form("rabenseifner", 64, 64 * MiB), rel=1e-12)
    assert CostModel(uniform(2, layout), "ompi").allreduce(100 * KiB) == pytest.approx(
        CostModel(uniform(2, layout), "ring").allreduce(100 * KiB), rel=1e-12)
    # 200 ranks, 1 KiB: nonoverlapping = binomial reduce + binomial broadcast, depth 8
    assert CostModel(uniform(200, layout), "ompi").allreduce(KiB) == pytest.approx(
        16 * (A + KiB * B) + 8 * KiB * G, rel=1e-12)


def test_segmented_ring_with_a_segment_size():
    c, n, seg = uniform(4, "one_per_node"), 4, 4096               # segcount = 1024 elements
    for count, phases in ((3 * n * 1024, 3), (int(3.6 * n * 1024), 4), (int(3.4 * n * 1024), 3)):
        m = count * ELEMENT_BYTES
        t = ompi_allreduce_time(c, m, algorithm="segmented_ring", segsize_bytes=seg)
        assert t == pytest.approx((phases + 1) * (n - 1) * A + 2 * 3 / 4 * m * B + 3 / 4 * m * G, rel=1e-12)
    # fewer than n segments' worth: the plain ring
    m = (n * 1024 - 1) * ELEMENT_BYTES
    assert ompi_allreduce_time(c, m, algorithm="segmented_ring", segsize_bytes=seg) == pytest.approx(
        closed_form("ring", n, m), rel=1e-12)


def test_tiny_counts_fall_back_as_open_mpi_does():
    c = uniform(16, "one_per_node")                                # p = 16
    small = ELEMENT_BYTES * 16 - 1                                 # 15 elements < 16 ranks
    assert ompi_allreduce_time(c, small, algorithm="ring") == ompi_allreduce_time(
        c, small, algorithm="recursive_doubling")
    assert ompi_allreduce_time(c, small, algorithm="rabenseifner") == ompi_allreduce_time(
        c, small, algorithm="basic_linear")
    assert ompi_allreduce_time(c, small + 1, algorithm="ring") == pytest.approx(
        closed_form("ring", 16, small + 1), rel=1e-12)


# --- two-level cluster ---------------------------------------------------------------------------------------------

def test_two_level_recursive_doubling_and_rabenseifner():
    c = two_level(4, 4)
    # distances 1, 2 stay on a node; 4, 8 cross it with all 4 ranks of a node on the NIC
    assert ompi_allreduce_time(c, M, algorithm="recursive_doubling") == pytest.approx(
        2 * (AI + M * BI) + 2 * (AN + 4 * M * BN) + 4 * M * G, rel=1e-12)
    assert ompi_allreduce_time(c, M, algorithm="rabenseifner") == pytest.approx(
        CostModel(c, "rhd").allreduce(M), rel=1e-12)
    # a subset on two nodes, one rank each: 2 ranks, 3 MiB -> Rabenseifner over the NIC
    c2 = two_level(2, 8)
    assert CostModel(c2, "ompi").time("allreduce", M, members=[0, 8]) == pytest.approx(
        2 * (AN + M / 2 * BN) + M / 2 * G, rel=1e-12)


# --- other ops -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "total", "expected"), [
    (2, M, A + M / 2 * B),                                           # two_proc
    (8, M, 3 * A + 7 / 8 * M * B),                                   # recursive doubling: s, 2s, 4s
    (6, M, 3 * A + 5 / 6 * M * B),                                   # bruck: 1, 2, 2 blocks
    (5, M, 3 * A + 4 / 5 * M * B),                                   # bruck: 1, 2, 1 blocks
    (48, 48 * 2 * KiB, 24 * A + 47 * 2 * KiB * B),                   # neighbor exchange: n/2 steps
    (47, 47 * 2 * KiB, 46 * A + 46 * 2 * KiB * B),                   # neighbor on an odd count: ring
    (48, 48 * 64 * KiB, 47 * A + 47 * 64 * KiB * B),                 # ring
])
@pytest.mark.parametrize("layout", ["one_node", "one_per_node"])
def test_allgather_closed_forms(n, total, expected, layout):
    assert CostModel(uniform(n, layout), "ompi").time("allgather", total) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [2, 5, 8, 13])
def test_reduce_scatter_is_ring_and_broadcast_binomial(n):
    c = uniform(n, "one_per_node")
    ompi = CostModel(c, "ompi")
    assert ompi.time("reduce_scatter", M) == CostModel(c, "ring").time("reduce_scatter", M)
    assert ompi.time("broadcast", M) == pytest.approx(math.ceil(math.log2(n)) * (A + M * B), rel=1e-12)


# --- properties ----------------------------------------------------------------------------------------------------

clusters = st.builds(
    lambda nodes, per_node, a_i, bw_i, a_n, bw_n, over, red: Cluster(
        nodes, per_node, intra=Link(a_i, bw_i), nic=Link(a_n, bw_n), oversubscription=over, reduce_Bps=red),
    st.integers(1, 40), st.integers(1, 12),
    st.floats(0, 1e-4), st.floats(1e6, 1e12), st.floats(0, 1e-3), st.floats(1e6, 1e12),
    st.floats(1, 8), st.none() | st.floats(1e8, 1e12))
sizes = st.floats(0, 1e11)


@settings(max_examples=200, deadline=None)
@given(c=clusters, alg=st.sampled_from(ALLREDUCE_ALGORITHMS), m1=sizes, m2=sizes,
       segsize=st.sampled_from([0, 1, 4, 4096, 65536, 2**20]))
def test_monotone_in_bytes_within_one_algorithm(c, alg, m1, m2, segsize):
    # above Open MPI's tiny-count fallbacks (fewer elements than ranks), which switch algorithm
    lo, hi = sorted((max(m1, ELEMENT_BYTES * c.ranks), max(m2, ELEMENT_BYTES * c.ranks)))
    kw = {"segsize_bytes": segsize} if alg == "segmented_ring" else {}
    t_lo, t_hi = (ompi_allreduce_time(c, x, algorithm=alg, **kw) for x in (lo, hi))
    assert 0 <= t_lo <= t_hi * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(c=clusters, alg=st.sampled_from(["basic_linear", "nonoverlapping", "recursive_doubling", "ring",
                                        "rabenseifner"]), m=sizes)
def test_continuous_in_bytes_within_one_algorithm(c, alg, m):
    m = max(m, ELEMENT_BYTES * c.ranks)
    t, t2 = (ompi_allreduce_time(c, x, algorithm=alg) for x in (m, m * (1 + 1e-9)))
    assert t <= t2 <= t * (1 + 1e-8) + 1e-15


@settings(max_examples=150, deadline=None)
@given(c=clusters, m=sizes, switch=st.none() | sizes)
def test_ompi_time_is_the_picked_algorithms_time(c, m, switch):
    name = ompi_allreduce_algorithm(c.ranks, m, switch)
    t = ompi_allreduce_time(c, m, switch_bytes=switch)
    assert t == ompi_allreduce_time(c, m, algorithm=name)
    if switch is None:
        assert t == CostModel(c, "ompi").allreduce(m)
    assert math.isfinite(t) and t >= 0 and (t == 0 if c.ranks == 1 else True)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 5000), layout=st.sampled_from(["one_node", "one_per_node"]),
       op=st.sampled_from(["allreduce", "allgather", "reduce_scatter", "broadcast"]), m=sizes)
def test_any_rank_count_gives_a_finite_time(n, layout, op, m):
    t = CostModel(uniform(n, layout), "ompi").time(op, m)
    assert math.isfinite(t) and (t > 0 if n > 1 else t == 0)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 300), m=st.floats(1, 1e10), switch=sizes)
def test_switch_point_splits_the_sizes(n, m, switch):
    assume(m != switch)
    name = ompi_allreduce_algorithm(n, m, switch_bytes=switch)
    assert name == ("recursive_doubling" if m < switch else "segmented_ring")


def test_time_can_drop_at_a_switch_point():
    # 8 ranks on a slow link: recursive doubling moves 3·M, Rabenseifner 1.75·M, so 8 KiB is cheaper than 8 KiB − 1
    link = Link(1e-6, 1e8)
    cm = CostModel(Cluster(8, 1, intra=link, nic=link), "ompi")
    assert cm.allreduce(8 * KiB) < cm.allreduce(8 * KiB - 1)


def test_fitted_switch_point_through_cost_model_and_experiment(tmp_path):
    """[comm] mpi_switch (a breakpoint `simfog calibrate` finds) makes "ompi" run recursive doubling below it and
    the ring at or above it, in CostModel and from an experiment file; refused with any other collective."""
    from simfog import experiment as experiment_module
    from simfog.cluster import Cluster, Link
    from simfog.collectives import CostModel
    from simfog.collectives.ompi import ompi_allreduce_time
    from simfog.errors import ConfigError as _ConfigError

    cluster = Cluster(8, 1, Link(1e-6, 1e10), Link(50e-6, 1.25e9))
    cm = CostModel(cluster, "ompi", mpi_switch_bytes=10000)
    for nbytes in (4096, 9999, 10000, 2**20):
        want = ompi_allreduce_time(cluster, nbytes, switch_bytes=10000)
        assert cm.allreduce(nbytes) == want
    assert cm.allreduce(9999) == ompi_allreduce_time(cluster, 9999, algorithm="recursive_doubling")
    assert cm.allreduce(10000) == ompi_allreduce_time(cluster, 10000, algorithm="segmented_ring")
    trace = (Path(__file__).resolve().parents[1] / "traces" / "mlp-cpu-b1024.json.gz")
    text = (f'[workload]\ntrace = "{trace}"\n[cluster]\nnodes = 8\nnic_bandwidth = "10Gbit/s"\n'
            '[comm]\ncollective = "ompi"\nmpi_switch = "10000B"\n')
    (tmp_path / "e.toml").write_text(text)
    exp = experiment_module.load(tmp_path / "e.toml")
    assert exp.cost_model().mpi_switch_bytes == 10000
    (tmp_path / "bad.toml").write_text(text.replace('collective = "ompi"', 'collective = "ring"'))
    with pytest.raises(_ConfigError, match="comm.mpi_switch"):
        experiment_module.load(tmp_path / "bad.toml")
