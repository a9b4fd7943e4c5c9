"""Open MPI's collectives as its coll/tuned component picks them: collective algorithm "ompi".

Source: open-mpi/ompi, ompi/mca/coll/tuned/coll_tuned_decision_fixed.c (ompi_coll_tuned_allreduce_intra_dec_fixed,
ompi_coll_tuned_allgather_intra_dec_fixed), the same file in every release v4.1.0 … v4.1.8 and v5.0.0 … v5.0.9 (tag
v5.0.9 = commit b79100b3fb, v4.1.8 = ea8f4d0308; tables from ce40cfbaa5 "Change the default collective algorithm
selection", keyed on per-rank bytes since f670364d76). The algorithms' bodies: ompi/mca/coll/base/coll_base_allreduce.c
and coll_base_allgather.c of the same tags. Not modelled: the new allreduce tables on main after 539038a4c8 (January
2026, in no release), non-commutative operations (their own table; gradients are summed), and coll/han, which in 5.0
outranks tuned (priority 35 vs 30) for communicators spanning several nodes, so "ompi" is Open MPI 4.1, or 5.0 on one
node or with `--mca coll_han_priority 0`.

Notation as in simfog.collectives: n ranks, L per node, M bytes per rank (the whole buffer), p = 2^⌊log2 n⌋, r = n − p.
Counts: Open MPI decides on bytes but its fallbacks compare element counts; elements are taken as ELEMENT_BYTES = 4
(float32). A pairwise step between ranks d apart costs the intra link when d < L, else the NIC shared by the L ranks
of a node (L flows), as `_rhd_pass` does; exact for n and L powers of two, an approximation otherwise.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from simfog.cluster import Cluster, Group
from simfog.collectives.core import ALGORITHMS, CostModel, _clog2, _reduce_s, _rhd_pass, _ring, _ring_step
from simfog.errors import ConfigError

ELEMENT_BYTES = 4

#: Open MPI's allreduce algorithm ids 1..6 (coll_tuned_allreduce_decision.c), by name.
ALLREDUCE_ALGORITHMS = ("basic_linear", "nonoverlapping", "recursive_doubling", "ring", "segmented_ring",
                        "rabenseifner")
#: Open MPI's allgather algorithm ids 1..6 (coll_tuned_allgather_decision.c), by name.
ALLGATHER_ALGORITHMS = ("linear", "bruck", "recursive_doubling", "ring", "neighbor", "two_proc")

_INF = math.inf
# (communicator size below which a row applies, ((bytes below which, algorithm id), ...)), commutative ops.
_ALLREDUCE_TABLE = (
    (4, ((8, 4), (4096, 3), (8192, 4), (16384, 3), (65536, 4), (262144, 5), (_INF, 6))),
    (8, ((16, 4), (8192, 3), (_INF, 6))),
    (16, ((8192, 3), (_INF, 6))),
    (32, ((64, 5), (4096, 3), (_INF, 6))),
    (64, ((128, 5), (_INF, 6))),
    (128, ((262144, 3), (_INF, 6))),
    (256, ((131072, 2), (262144, 3), (_INF, 6))),
    (512, ((4096, 2), (_INF, 6))),
    (2048, ((2048, 2), (16384, 3), (_INF, 6))),
    (4096, ((2048, 2), (4096, 5), (16384, 3), (_INF, 6))),
    (_INF, ((2048, 2), (16384, 5), (32768, 3), (_INF, 6))),
)
# The same for allgather, keyed on the bytes each rank contributes (M/n); 2 ranks always use two_proc (6).
_ALLGATHER_TABLE = (
    (32, ((_INF, 3),)),
    (64, ((1024, 3), (65536, 5), (_INF, 4))),
    (128, ((512, 3), (65536, 5), (_INF, 4))),
    (256, ((512, 3), (131072, 5), (524288, 4), (1048576, 5), (_INF, 4))),
    (512, ((32, 3), (128, 2), (1024, 3), (131072, 5), (524288, 4), (1048576, 5), (_INF, 4))),
    (1024, ((64, 3), (256, 2), (2048, 3), (_INF, 5))),
    (2048, ((4, 3), (8, 2), (16, 3), (32, 2), (256, 3), (512, 2), (4096, 3), (_INF, 5))),
    (4096, ((32, 2), (128, 3), (512, 2), (4096, 3), (_INF, 5))),
    (_INF, ((2, 3), (8, 2), (16, 3), (512, 2), (4096, 3), (_INF, 5))),
)


def _lookup(table, ranks: int, nbytes: float) -> int:
    row = next(cells for below, cells in table if ranks < below)
    return next(alg for below, alg in row if nbytes < below)


def _check_args(ranks: object, nbytes: object) -> None:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError("ranks", ranks, "an integer >= 1")
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real) or not (math.isfinite(nbytes) and nbytes >= 0):
        raise ConfigError("nbytes", nbytes, "a size in bytes >= 0")


def ompi_allreduce_algorithm(ranks: int, nbytes: float, switch_bytes: float | None = None) -> str:
    """The allreduce algorithm (a name in ALLREDUCE_ALGORITHMS) Open MPI 4.1/5.0's tuned fixed decision runs for a
    commutative op on `nbytes` per rank among `ranks` ranks; thresholds are "below" (<), as in the source:

      ranks < 4     <8 B ring, <4 KiB recursive_doubling, <8 KiB ring, <16 KiB recursive_doubling, <64 KiB ring,
                    <256 KiB segmented_ring, else rabenseifner
      4 … 7         <16 B ring, <8 KiB recursive_doubling, else rabenseifner
      8 … 15        <8 KiB recursive_doubling, else rabenseifner
      16 … 31       <64 B segmented_ring, <4 KiB recursive_doubling, else rabenseifner
      32 … 63       <128 B segmented_ring, else rabenseifner
      64 … 127      <256 KiB recursive_doubling, else rabenseifner
      128 … 255     <128 KiB nonoverlapping, <256 KiB recursive_doubling, else rabenseifner
      256 … 511     <4 KiB nonoverlapping, else rabenseifner
      512 … 2047    <2 KiB nonoverlapping, <16 KiB recursive_doubling, else rabenseifner
      2048 … 4095   <2 KiB nonoverlapping, <4 KiB segmented_ring, <16 KiB recursive_doubling, else rabenseifner
      >= 4096       <2 KiB nonoverlapping, <16 KiB segmented_ring, <32 KiB recursive_doubling, else rabenseifner

    `switch_bytes` (a fitted switch point) replaces the table: recursive_doubling below it, segmented_ring at or
    above. Raises ConfigError for ranks < 1, negative or non-finite bytes, or a negative or NaN switch_bytes."""
    _check_args(ranks, nbytes)
    if switch_bytes is not None:
        if isinstance(switch_bytes, bool) or not isinstance(switch_bytes, numbers.Real) or not switch_bytes >= 0:
            raise ConfigError("switch_bytes", switch_bytes, "a size in bytes >= 0, or None for Open MPI's table")
        return "recursive_doubling" if nbytes < switch_bytes else "segmented_ring"
    return ALLREDUCE_ALGORITHMS[_lookup(_ALLREDUCE_TABLE, ranks, nbytes) - 1]


def ompi_allgather_algorithm(ranks: int, nbytes: float) -> str:
    """The allgather algorithm (a name in ALLGATHER_ALGORITHMS) of Open MPI 4.1/5.0's tuned fixed decision for an
    allgather whose result is `nbytes` per rank (each rank contributing nbytes/ranks, the size Open MPI decides on):
    2 ranks two_proc; 3 … 31 recursive_doubling; 32 … 63: contribution <1 KiB recursive_doubling, <64 KiB neighbor,
    else ring; 64 … 127: <512 B recursive_doubling, <64 KiB neighbor, else ring; larger communicators as in the
    source (mostly bruck / recursive_doubling below 4 KiB and neighbor or ring above). recursive_doubling runs Bruck on
    a non-power-of-two count and neighbor runs ring on an odd one (coll_base_allgather.c); the costs do that."""
    _check_args(ranks, nbytes)
    if ranks == 2:
        return "two_proc"
    return ALLGATHER_ALGORITHMS[_lookup(_ALLGATHER_TABLE, ranks, nbytes / ranks) - 1]


# --- steps --------------------------------------------------------------------------------------------------------

def _pair(c: Cluster, g: Group, d: int, x: float) -> float:
    """All ranks exchange x bytes with a partner d ranks away at once."""
    return c.intra.time(x) if d < g.per_node else c.inter.time(x, flows=g.per_node)


def _shift(c: Cluster, g: Group, d: int, x: float) -> float:
    """Every rank sends x bytes to the rank d ahead (Bruck): min(d, L) flows leave each node."""
    t = c.intra.time(x) if d < g.per_node else 0.0
    return max(t, c.inter.time(x, flows=min(d, g.per_node))) if g.nodes > 1 else t


def _binomial(c: Cluster, g: Group, x: float) -> float:
    """One binomial tree (broadcast, or reduce without arithmetic): ⌈log2 n⌉ rounds of x, one sender per node on
    the rounds that cross nodes."""
    return sum(c.intra.time(x) if (1 << k) < g.per_node else c.inter.time(x) for k in range(_clog2(g.ranks)))


# --- allreduce algorithms -----------------------------------------------------------------------------------------

def _basic_linear(cm: CostModel, g: Group, M: float) -> float:
    """Reduce to rank 0 receiving one message after the other, then rank 0 sends to all at once (L−1 intra and
    n−L inter messages sharing its links): (L−1)(α_i+Mβ_i) + (n−L)(α_n+Mβ_n) + (n−1)Mγ + max(α_i+(L−1)Mβ_i,
    α_n+(n−L)Mβ_n); on a uniform link (n−1)(α+Mβ+Mγ) + α + (n−1)Mβ."""
    c, local = cm.cluster, g.per_node - 1
    remote = g.ranks - 1 - local
    reduce = local * c.intra.time(M) + remote * c.inter.time(M) + _reduce_s(c, (g.ranks - 1) * M)
    bcast = max(c.intra.time(M, flows=local) if local else 0.0, c.inter.time(M, flows=remote) if remote else 0.0)
    return reduce + bcast


def _nonoverlapping(cm: CostModel, g: Group, M: float) -> float:
    """coll_reduce then coll_bcast, not overlapped; both costed as binomial trees (what the reduce decision picks at
    these sizes; bcast picks knomial/binary trees of the same depth): 2·⌈log2 n⌉(α+Mβ) + ⌈log2 n⌉·Mγ uniform."""
    c = cm.cluster
    return 2 * _binomial(c, g, M) + _clog2(g.ranks) * _reduce_s(c, M)


def _recursive_doubling(cm: CostModel, g: Group, M: float) -> float:
    """log2 p exchanges of the whole M at distance 1, 2, 4, …, each reduced; when n is not a power of two, the first
    2r ranks pair up before (send M, reduce) and after (send the result back): on a uniform link
    (log2 p + 2·[r>0])(α+Mβ) + (log2 p + [r>0])·Mγ."""
    c, n = cm.cluster, g.ranks
    p, extra = 1 << (n.bit_length() - 1), n & (n - 1) != 0
    steps = p.bit_length() - 1
    t = sum(_pair(c, g, 1 << k, M) for k in range(steps)) + (steps + extra) * _reduce_s(c, M)
    return t + 2 * _pair(c, g, 1, M) if extra else t


def _ring_allreduce(cm: CostModel, g: Group, M: float) -> float:
    """simfog's "ring" (2(n−1) steps of M/n); fewer elements than ranks run recursive doubling."""
    if M < ELEMENT_BYTES * g.ranks:
        return _recursive_doubling(cm, g, M)
    return _ring("allreduce", M, g, cm)


def _segmented_ring(cm: CostModel, g: Group, M: float, segsize: int = 0) -> float:
    """Pipelined ring with segments of `segsize` bytes: np phases of n−1 reduce-scatter steps on M/(n·np) each, then
    one ring allgather of n−1 steps on M/n: (np+1)(n−1)α + 2(n−1)/n·Mβ + (n−1)/n·Mγ uniform. The fixed decision
    passes segsize 0, which leaves segcount = count (COLL_BASE_COMPUTED_SEGCOUNT), and count < n·segcount then
    runs the plain ring: "segmented_ring" from the table costs exactly "ring"."""
    n, count = g.ranks, math.floor(M / ELEMENT_BYTES)
    segcount = count
    if ELEMENT_BYTES <= segsize < ELEMENT_BYTES * count:
        segcount = segsize // ELEMENT_BYTES + (segsize % ELEMENT_BYTES > ELEMENT_BYTES // 2)
    if count < n * segcount or not count:
        return _ring_allreduce(cm, g, M)
    phases, rest = divmod(count, n * segcount)
    phases += rest >= n and rest > n * segcount / 2
    c = cm.cluster
    return (n - 1) * (phases * _ring_step(c, g, M / n / phases) + _ring_step(c, g, M / n)) + \
        _reduce_s(c, (n - 1) / n * M)


def _rabenseifner(cm: CostModel, g: Group, M: float) -> float:
    """Reduce-scatter by recursive halving then allgather by recursive doubling over p ranks (simfog's "rhd" pass,
    2·log2 p·α + 2(p−1)/p·Mβ + (p−1)/p·Mγ uniform); when r > 0 the first 2r ranks first swap halves (α + M/2·β),
    reduce M/2 and send it on (α + M/2·β), and get the result back at the end (α + Mβ). Fewer elements than p run
    basic_linear."""
    c, n = cm.cluster, g.ranks
    p = 1 << (n.bit_length() - 1)
    if M < ELEMENT_BYTES * p:
        return _basic_linear(cm, g, M)
    t = 2 * _rhd_pass(c, Group(p, g.nodes, g.per_node), M) + _reduce_s(c, (p - 1) / p * M)
    if p < n:
        t += 2 * _pair(c, g, 1, M / 2) + _reduce_s(c, M / 2) + _pair(c, g, 1, M)
    return t


_ALLREDUCE = {"basic_linear": _basic_linear, "nonoverlapping": _nonoverlapping,
              "recursive_doubling": _recursive_doubling, "ring": _ring_allreduce,
              "segmented_ring": _segmented_ring, "rabenseifner": _rabenseifner}


# --- allgather ----------------------------------------------------------------------------------------------------

def _allgather(cm: CostModel, g: Group, M: float) -> float:
    """s = M/n per rank. two_proc: one exchange of s. recursive_doubling (n a power of two): log2 n exchanges of
    s, 2s, 4s, … at distance 1, 2, 4, …; else bruck: ⌈log2 n⌉ shifts by 2^k of min(2^k, n−2^k)·s. neighbor (n even):
    n/2 steps, one of s then n/2−1 of 2s, each between neighbours (costed as a ring step); odd n and ring: ring."""
    c, n = cm.cluster, g.ranks
    s, alg = M / n, ompi_allgather_algorithm(n, M)
    if alg == "two_proc":
        return _pair(c, g, 1, s)
    if alg == "recursive_doubling" and not n & (n - 1):
        return sum(_pair(c, g, 1 << k, (1 << k) * s) for k in range(_clog2(n)))
    if alg in ("recursive_doubling", "bruck"):
        return sum(_shift(c, g, 1 << k, min(1 << k, n - (1 << k)) * s) for k in range(_clog2(n)))
    if alg == "neighbor" and n % 2 == 0:
        return _ring_step(c, g, s) + (n // 2 - 1) * _ring_step(c, g, 2 * s)
    return _ring("allgather", M, g, cm)


# --- public -------------------------------------------------------------------------------------------------------

@ALGORITHMS.register("ompi")
def _ompi(op: str, nbytes: float, g: Group, cm: CostModel) -> float:
    """Open MPI 4.1/5.0 coll/tuned: allreduce and allgather as its fixed decision picks them by ranks and bytes.

    allreduce       the algorithm ompi_allreduce_algorithm(n, M) names (with CostModel.mpi_switch_bytes, a fitted
                    switch point: recursive doubling below, ring at or above), costed as in its function here
                    (recursive_doubling, ring = segmented_ring, rabenseifner, nonoverlapping, basic_linear)
    allgather       the algorithm ompi_allgather_algorithm(n, M) names (see _allgather)
    reduce_scatter  simfog's "ring" (a fallback: Open MPI's table also picks recursive halving and butterfly)
    broadcast       a binomial tree, ⌈log2 n⌉(α+Mβ) on a uniform link (an approximation: the unsegmented bcast
                    table picks knomial, binomial, binary trees, linear and scatter-allgather)
    Time is not monotone in M across a table switch point (Open MPI's is not either); within one algorithm it is.
    """
    c = cm.cluster
    if op == "allreduce":
        return _ALLREDUCE[ompi_allreduce_algorithm(g.ranks, nbytes, cm.mpi_switch_bytes)](cm, g, nbytes)
    if op == "allgather":
        return _allgather(cm, g, nbytes)
    if op == "broadcast":
        return _binomial(c, g, nbytes)
    return _ring(op, nbytes, g, cm)


def ompi_allreduce_time(cluster: Cluster, nbytes: float, members: Sequence[int] | None = None, *,
                        algorithm: str | None = None, switch_bytes: float | None = None,
                        segsize_bytes: int = 0) -> float:
    """Seconds for an Open MPI allreduce of `nbytes` per rank among `members` (None: all ranks) of `cluster`.

    `algorithm` forces one of ALLREDUCE_ALGORITHMS (as `--mca coll_tuned_allreduce_algorithm` does, with its
    fallbacks for tiny counts); else `switch_bytes` (see ompi_allreduce_algorithm) or Open MPI's table picks it.
    `segsize_bytes` is the segment size of segmented_ring (`coll_tuned_allreduce_algorithm_segmentsize`, default 0:
    the plain ring). Degraded NICs are not applied here; CostModel(cluster, "ompi").time applies them. Raises
    ConfigError for an unknown algorithm, both algorithm and switch_bytes, a negative segsize, or bad sizes."""
    if members is not None and (not len(members) or any(
            not (isinstance(r, numbers.Integral) and 0 <= r < cluster.ranks) for r in members)):
        raise ConfigError("members", list(members), f"one or more ranks in 0..{cluster.ranks - 1}")
    cm, g = CostModel(cluster, "ompi"), Group.of(cluster, members)
    if algorithm is not None and switch_bytes is not None:
        raise ConfigError("switch_bytes", switch_bytes, "None when an algorithm is forced")
    name = algorithm if algorithm is not None else ompi_allreduce_algorithm(g.ranks, nbytes, switch_bytes)
    _check_args(g.ranks, nbytes)
    if name not in _ALLREDUCE:
        raise ConfigError("algorithm", name, f"one of {', '.join(ALLREDUCE_ALGORITHMS)}")
    if isinstance(segsize_bytes, bool) or not isinstance(segsize_bytes, int) or segsize_bytes < 0:
        raise ConfigError("segsize_bytes", segsize_bytes, "an integer >= 0")
    if g.ranks <= 1:
        return 0.0
    if name == "segmented_ring":
        return _segmented_ring(cm, g, float(nbytes), segsize_bytes)
    return _ALLREDUCE[name](cm, g, float(nbytes))
