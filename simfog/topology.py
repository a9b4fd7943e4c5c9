"""Decentralized averaging graphs, static and dynamic, as BlueFog and BAGUA define them. Over 400 lines because every
graph of BlueFog's topology_util and BAGUA is here beside the one Topology interface they share, each with its
source cited: one registry a reader checks against the frameworks in one place.

A `Topology` answers two questions. For the engine: at iteration k, what every rank sends, to whom, and with which
weights it combines what it receives (`exchanges(k)`, O(n·degree), no dense matrix). For the report: how well it
mixes (`mixing_matrix`, `spectral_gap`, `iterations_to_consensus`).

Convention: W[i, j] is the weight rank i gives to x_j, so one step is x ← W x, x_i ← w_ii·x_i + Σ_j w_ij·x_j.
BlueFog stores the transpose (its networkx edge i→j carries the weight j gives to x_i; topology_util.GetRecvWeights).

Sources (bluefog/common/topology_util.py, bluefog/common/nccl_controller.cc; BAGUA
rust/bagua-core/bagua-core-internal/src/comm_ops/decentralized_full_precision_synchronous.rs and
bagua/torch_api/algorithms/decentralized.py; docs/ALGORITHMS.md §4.3, §5):

- Static graphs use the weights stored in BlueFog's graph, i.e. neighbor_allreduce after
  `set_topology(G, is_weighted=True)`. With is_weighted=False BlueFog averages uniformly, 1/(in-degree+1); that
  differs only for `star` and `mesh2d` (the other static graphs are regular with uniform weights).
- Dynamic graphs take BlueFog's example weights 1/(len(recv)+1) (examples/pytorch_*.py), ½/½ for one peer.
- Hierarchical graphs (`intra_node` set) reduce the parameters inside each node to local rank 0, let local ranks 0
  exchange (the `exchanges`), then broadcast inside the node: BlueFog's hierarchical_neighbor_allreduce uses an
  intra-node allreduce (nccl_controller.cc), BAGUA's hierarchical decentralized an intra-node reduce.

Mixing quality (all mixing matrices here are doubly stochastic; J = 11ᵀ/n; Π_k = W_{k−1}···W_0, Π_0 = I):
- consensus error after k steps: ‖Π_k − J‖₂, the worst-case ratio ‖x_k − x̄‖/‖x_0 − x̄‖; it never increases.
- spectral gap: 1 − ρ(Π_p − J)^(1/p) over one period p (p = 1 for a static graph: 1 − SLEM(W)); ρ is the spectral
  radius. 1 = exact average within one period; 0 = never mixes.
Both are exact and cheap at 2048 ranks: hierarchical graphs reduce to their node-level graph (Π_k = Π_k^node ⊗ J_L,
so errors and gaps are equal); circulant graphs, BAGUA's shift_one and inner_outer_exp2 are block-circulant, so a
DFT turns every step into small independent blocks; static graphs are normal (circulant or symmetric), so their
error is ρᵏ; only mesh2d and star need a dense n×n eigenproblem (symmetric).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from simfog.errors import ConfigError, Infeasible
from simfog.registry import Registry

_DENSE_SVD_LIMIT = 1024  # above this an exact 2-norm via eigvalsh(A·Aᵀ) is ~10× faster than an SVD


@dataclass(frozen=True)
class Exchange:
    """What one rank does in one step: send its parameters to `send_to`; receive from `recv_from`; then
    x ← self_weight·x + Σ recv_weights[k]·x_{recv_from[k]}. Weights are fractions that sum to 1."""

    rank: int
    send_to: tuple[int, ...]
    recv_from: tuple[int, ...]
    self_weight: float
    recv_weights: tuple[float, ...]


@dataclass(frozen=True, eq=False)
class Topology:
    """A graph over `ranks` ranks whose exchanges repeat every `period` steps (1 for a static graph).

    `rule(phase)` gives the exchanges of a phase 0 <= phase < period, one `Exchange` per rank. `intra_node` is
    None, or "allreduce" (BlueFog) / "reduce" (BAGUA) for hierarchical graphs: each step first averages inside every
    node, the exchanges (between local ranks 0 only) then run, and local rank 0 finally broadcasts inside its node.
    `detail` says in words what was built (e.g. the grid shape of mesh2d). `symmetry` names a translation symmetry
    of the (node-level, when hierarchical) graph that the mixing analysis exploits: "circulant" (W[i, j] depends on
    j − i mod m), "node_blocks" (blocks of ranks_per_node ranks, block-circulant over nodes), "halves" (two halves
    shifted together, BAGUA's shift_one), or None (dense analysis).
    """

    name: str
    ranks: int
    period: int
    rule: Callable[[int], tuple[Exchange, ...]] = field(repr=False)
    ranks_per_node: int = 1
    intra_node: str | None = None
    detail: str = ""
    symmetry: str | None = field(default=None, repr=False)

    def __post_init__(self):
        for fname in ("ranks", "period", "ranks_per_node"):
            v = getattr(self, fname)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"topology {fname}", v, "an integer >= 1")
        if self.intra_node not in (None, "allreduce", "reduce"):
            raise ConfigError("topology intra_node", self.intra_node, "None, 'allreduce' or 'reduce'")
        if self.symmetry not in (None, "circulant", "node_blocks", "halves"):
            raise ConfigError("topology symmetry", self.symmetry, "None, 'circulant', 'node_blocks' or 'halves'")
        object.__setattr__(self, "_rule", lru_cache(maxsize=min(self.period, 64))(self.rule))
        object.__setattr__(self, "_memo", {})

    # --- what the engine asks ------------------------------------------------------------------------------------

    def exchanges(self, step: int) -> tuple[Exchange, ...]:
        """One `Exchange` per rank (index = rank) for iteration `step` (0-based). O(n·degree); cached per phase."""
        return self._rule(step % self.period)

    def messages_per_rank(self, step: int) -> int:
        """The most point-to-point messages any rank sends at `step` (intra-node collectives not counted)."""
        return max(len(e.send_to) for e in self.exchanges(step))

    # --- mixing quality ------------------------------------------------------------------------------------------

    def mixing_matrix(self, step: int = 0) -> np.ndarray:
        """Dense n×n W of iteration `step`: W[i, j] the weight rank i gives to x_j; rows sum to 1."""
        w = self._matrix(step)
        if self.intra_node:
            L = self.ranks_per_node
            w = np.kron(w, np.full((L, L), 1.0 / L))
        return w

    def spectral_gap(self) -> float:
        """1 − ρ(Π_p − J)^(1/p), p = period (module docstring); a number in [0, 1]."""
        if "gap" not in self._memo:
            rho = self._rho(self._period_product())
            self._memo["gap"] = float(min(1.0, max(0.0, 1.0 - rho ** (1.0 / self.period))))
        return self._memo["gap"]

    def mixing_quality(self, eps: float = 1e-2, max_steps: int = 10000) -> dict[str, object]:
        """A flat record for results: topology, detail, period, spectral_gap, consensus_eps, iterations_to_consensus
        (None when not reached within max_steps)."""
        return {"topology": self.name, "detail": self.detail, "period": self.period,
                "spectral_gap": self.spectral_gap(), "consensus_eps": eps,
                "iterations_to_consensus": self.iterations_to_consensus(eps, max_steps)}

    def iterations_to_consensus(self, eps: float, max_steps: int = 10000) -> int | None:
        """Smallest k with ‖Π_k − J‖₂ <= eps (steps counted from iteration 0), or None if not reached within
        `max_steps`. Exact (module docstring). Raises ConfigError for eps <= 0 or max_steps < 0."""
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps > 0:
            raise ConfigError("eps", eps, "a consensus error > 0")
        if isinstance(max_steps, bool) or not isinstance(max_steps, numbers.Integral) or max_steps < 0:
            raise ConfigError("max_steps", max_steps, "an integer >= 0")
        if eps >= 1.0:  # ‖I − J‖₂ = 1
            return 0
        if self.period == 1 and (self.symmetry == "circulant" or self._symmetric()):  # normal W: error ρᵏ
            return _first_power_below(self._rho(self._period_product()), eps, max_steps)
        # Whole periods first (Π_{qp} = Pᵠ), then the steps inside the last one.
        P, p = self._period_product(), self.period
        q, before = _first_step_below(eps, -(-max_steps // p), self._start(), lambda s, _: P @ s, self._error)
        if q is None or q == 0:
            return q
        r, _ = _first_step_below(eps, p, before, lambda s, k: self._advance(s, (q - 1) * p + k), self._error)
        k = (q - 1) * p + (p if r is None else r)  # None only if rounding puts step p's error a hair above eps
        return k if k <= max_steps else None

    # --- the reduced graph: over nodes when hierarchical (Π_k = Π_k^node ⊗ J_L), over ranks otherwise ----------

    @property
    def _size(self) -> int:
        return self.ranks // self.ranks_per_node if self.intra_node else self.ranks

    def _unit(self, step: int, u: int) -> tuple[float, Sequence[int], Sequence[float]]:
        """(self weight, source units, their weights) of unit u (a node's local rank 0 when hierarchical)."""
        if not self.intra_node:
            e = self.exchanges(step)[u]
            return e.self_weight, e.recv_from, e.recv_weights
        L = self.ranks_per_node
        e = self.exchanges(step)[u * L]
        return e.self_weight, [r // L for r in e.recv_from], e.recv_weights

    def _matrix(self, step: int) -> np.ndarray:
        out = np.zeros((self._size, self._size))
        for u in range(self._size):
            self_w, src, ws = self._unit(step, u)
            out[u, u] += self_w
            np.add.at(out[u], list(src), ws)
        return out

    def _symmetric(self) -> bool:
        w = self._matrix(0)
        return bool(np.allclose(w, w.T, rtol=0, atol=1e-14))

    def _layout(self) -> tuple[int, int]:
        """(h blocks, block size b) of the symmetry; unit (block q, position l) is q·b + l, or l·h + q for "halves"."""
        b = {"circulant": 1, "halves": 2}.get(self.symmetry, self.ranks_per_node)
        return self._size // b, b

    def _blocks(self, step: int) -> np.ndarray:
        """W of `step` as (h, b, b) complex blocks, frequency 0 first: W[(q, l), (q', l')] = C_{q'−q}[l, l'] is
        block-diagonalised by the DFT over q, block f = Σ_d C_d·e^{−2πi·df/h} (for b = 1 the eigenvalues)."""
        h, b = self._layout()
        c = np.zeros((h, b, b))
        for pos in range(b):
            self_w, src, ws = self._unit(step, pos * h if self.symmetry == "halves" else pos)
            c[0, pos, pos] += self_w
            for s, w in zip(src, ws, strict=True):
                q, to = (s % h, s // h) if self.symmetry == "halves" else divmod(s, b)
                c[q, pos, to] += w
        return np.fft.fft(c, axis=0)

    def _start(self) -> np.ndarray:
        if self.symmetry is None:
            return np.eye(self._size)
        h, b = self._layout()
        return np.broadcast_to(np.eye(b, dtype=complex), (h, b, b)).copy()

    def _advance(self, state: np.ndarray, step: int) -> np.ndarray:
        """W_step · state."""
        return (self._matrix(step) if self.symmetry is None else self._blocks(step)) @ state

    def _walk(self, state: np.ndarray, first: int, stop: int) -> np.ndarray:
        for step in range(first, stop):
            state = self._advance(state, step)
        return state

    def _period_product(self) -> np.ndarray:
        """Π_p = W_{p−1}···W_0 (dense, or as Fourier blocks); memoized."""
        if "P" not in self._memo:
            if self.symmetry is None and self.period == 1:
                self._memo["P"] = self._matrix(0)
            else:
                self._memo["P"] = self._walk(self._start(), 0, self.period)
        return self._memo["P"]

    def _minus_j(self, state: np.ndarray) -> np.ndarray:
        """Π − J; J is 11ᵀ/m, or in the Fourier basis the frequency-0 block filled with 1/b."""
        out = np.array(state, dtype=state.dtype)
        if self.symmetry is None:
            out -= 1.0 / self._size
        else:
            out[0] -= 1.0 / self._layout()[1]
        return out

    def _error(self, state: np.ndarray) -> float:
        """‖Π − J‖₂ for the state Π (dense or Fourier blocks; the DFT is unitary)."""
        a = self._minus_j(state)
        if self.symmetry is not None:
            return float(np.max(np.abs(a[:, 0, 0]) if a.shape[1] == 1 else np.linalg.norm(a, 2, axis=(1, 2))))
        if len(a) <= _DENSE_SVD_LIMIT:
            return float(np.linalg.norm(a, 2))
        return float(math.sqrt(max(0.0, np.linalg.eigvalsh(a @ a.T)[-1])))

    def _rho(self, state: np.ndarray) -> float:
        """Spectral radius of Π − J; memoized for the period product."""
        if state is self._memo.get("P") and "rho" in self._memo:
            return self._memo["rho"]
        rho = self._spectral_radius(self._minus_j(state))
        if state is self._memo.get("P"):
            self._memo["rho"] = rho
        return rho

    def _spectral_radius(self, a: np.ndarray) -> float:
        if self.symmetry is None and np.allclose(a, a.T, rtol=0, atol=1e-14):
            return float(np.max(np.abs(np.linalg.eigvalsh((a + a.T) / 2))))
        return float(np.max(np.abs(np.linalg.eigvals(a))))


def _first_power_below(rho: float, eps: float, max_steps: int) -> int | None:
    """Smallest k >= 1 with ρᵏ <= eps (0 < eps < 1), or None past max_steps."""
    if rho <= eps:
        k = 1
    elif rho >= 1.0 - 1e-15:
        return None
    else:
        k = max(1, math.ceil(math.log(eps) / math.log(rho)))
        while k > 1 and rho ** (k - 1) <= eps:  # guard the logarithms' rounding
            k -= 1
        while rho**k > eps:
            k += 1
    return k if k <= max_steps else None


def _first_step_below(eps, max_steps, start, advance, error):
    """(smallest k <= max_steps with error(state_k) <= eps, state_{k−1}), or (None, None); state_{k+1} =
    advance(state_k, k). By doubling then bisection, so error must not increase with k (true for doubly stochastic
    steps: Π_{k+1} − J = (W_k − J)(Π_k − J) and ‖W_k − J‖₂ <= 1)."""
    if error(start) <= eps:
        return 0, None
    lo, lo_state, span = 0, start, 1
    while True:
        hi = min(lo + span, max_steps)
        if hi == lo:
            return None, None
        state = lo_state
        for k in range(lo, hi):
            state = advance(state, k)
        if error(state) <= eps:
            break
        lo, lo_state, span = hi, state, span * 2
    while hi - lo > 1:
        mid, state = (lo + hi) // 2, lo_state
        for k in range(lo, mid):
            state = advance(state, k)
        if error(state) <= eps:
            hi = mid
        else:
            lo, lo_state = mid, state
    return hi, lo_state


# --- builders ---------------------------------------------------------------------------------------------------

#: name -> builder(ranks, ranks_per_node, **options) -> Topology.
TOPOLOGIES: Registry[Callable[..., Topology]] = Registry("topology")


def topology(name: str, ranks: int, *, ranks_per_node: int = 1, **options) -> Topology:
    """The topology `name` (one of TOPOLOGIES) over `ranks` ranks placed node by node, `ranks_per_node` per node.

    Raises ConfigError for an unknown name or option, ranks < 2, or ranks_per_node not dividing ranks; Infeasible
    when the graph cannot exist at this size (odd N for shift_one; one node, or too few ranks per node, for the
    machine-level graphs)."""
    build = TOPOLOGIES.get(name, field="topology")
    for fname, v in (("ranks", ranks), ("ranks_per_node", ranks_per_node)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < (2 if fname == "ranks" else 1):
            raise ConfigError(fname, v, "an integer >= 2" if fname == "ranks" else "an integer >= 1")
    if ranks % ranks_per_node:
        raise ConfigError("ranks_per_node", ranks_per_node, f"a divisor of ranks = {ranks}")
    allowed = [p for p in inspect.signature(build).parameters if p not in ("n", "L")]
    for key in options:
        if key not in allowed:
            raise ConfigError(f"topology option ({name})", key, f"one of: {', '.join(allowed) or 'none'}")
    return build(int(ranks), int(ranks_per_node), **options)


def _circulant(name: str, n: int, L: int, offsets: Sequence[int], detail: str) -> Topology:
    """Rank i sends to i + d and receives from i − d for every offset d, all weights 1/(len(offsets)+1) (BlueFog
    builds these as np.roll of one row normalised to sum 1)."""
    weight = 1.0 / (len(offsets) + 1)
    weights = (weight,) * len(offsets)
    # Rows of i ± d mod n made with numpy (exact integers; % floors as Python's does): 131,072 ranks in a
    # fraction of the time a per-rank generator takes.
    i, d = np.arange(n)[:, None], np.asarray(offsets, dtype=np.int64)[None, :]
    send, recv = map(tuple, ((i + d) % n).tolist()), map(tuple, ((i - d) % n).tolist())
    ex = tuple(Exchange(r, s, v, weight, weights) for r, s, v in zip(range(n), send, recv))
    return Topology(name, n, 1, lambda _phase: ex, L, detail=detail, symmetry="circulant")


def _undirected(name: str, n: int, L: int, nbrs: list[list[int]], weight, detail: str) -> Topology:
    """Symmetric graph: neighbours both ways, weight(i, j) for j ≠ i, self weight 1 − the rest."""
    ex = []
    for i, js in enumerate(nbrs):
        ws = tuple(weight(i, j) for j in js)
        ex.append(Exchange(i, tuple(js), tuple(js), 1.0 - math.fsum(ws), ws))
    ex = tuple(ex)
    return Topology(name, n, 1, lambda _phase: ex, L, detail=detail)


def _pairs(name, n, L, period, peer_of, *, unit=1, intra=None, symmetry=None, detail="") -> Topology:
    """Dynamic one-peer graph: at phase k, unit u sends to peer_of(u, k)[0], receives from peer_of(u, k)[1], ½/½.
    With unit = L (hierarchical) only local ranks 0 exchange; the other ranks keep weight 1 (see intra_node)."""
    def rule(k: int) -> tuple[Exchange, ...]:
        out = []
        for r in range(n):
            if r % unit:
                out.append(Exchange(r, (), (), 1.0, ()))
            else:
                to, frm = peer_of(r // unit, k)
                out.append(Exchange(r, (to * unit,), (frm * unit,), 0.5, (0.5,)))
        return tuple(out)
    return Topology(name, n, period, rule, L, intra_node=intra, detail=detail, symmetry=symmetry)


@TOPOLOGIES.register("exp2")
def _exp2(n: int, L: int) -> Topology:
    """Static exponential-2 graph, BlueFog's default: i sends to i+1, i+2, i+4, … < n; weights 1/(degree+1)."""
    # ExponentialGraph(size, base=2) tests powers with math.log; it agrees with exact integers for every n < 5000.
    offsets = [2**j for j in range((n - 1).bit_length())]
    return _circulant("exp2", n, L, offsets, f"out-degree {len(offsets)}")


@TOPOLOGIES.register("symmetric_exp")
def _symmetric_exp(n: int, L: int, base: int = 4) -> Topology:
    """Static symmetric exponential graph (base 4): neighbours at ±1, ±4, ±16, … up to n/2; uniform weights."""
    if isinstance(base, bool) or not isinstance(base, int) or base < 2:
        raise ConfigError("topology option base", base, "an integer >= 2")
    powers, p = set(), 1
    while p <= n // 2:
        powers.add(p)
        p *= base
    # SymmetricExponentialGraph: offset d is kept when min(d, n − d) (d itself when d <= n // 2) is a power.
    offsets = [d for d in range(1, n) if (d if d <= n // 2 else n - d) in powers]
    return _circulant("symmetric_exp", n, L, offsets, f"base {base}, degree {len(offsets)}")


@TOPOLOGIES.register("ring")
def _ring(n: int, L: int) -> Topology:
    """Static bidirectional ring: neighbours i ± 1, weights 1/3 (½ when n = 2)."""
    return _circulant("ring", n, L, sorted({1, n - 1}), "")


@TOPOLOGIES.register("full")
def _full(n: int, L: int) -> Topology:
    """Static fully connected graph: every rank averages all n ranks, weights 1/n."""
    everyone, weights = tuple(range(n)), (1.0 / n,) * (n - 1)
    others = [everyone[:i] + everyone[i + 1:] for i in range(n)]  # shared ints: 2048 ranks stay ~70 MB
    ex = tuple(Exchange(i, others[i], others[i], 1.0 / n, weights) for i in range(n))
    return Topology("full", n, 1, lambda _phase: ex, L, symmetry="circulant")


@TOPOLOGIES.register("mesh2d")
def _mesh2d(n: int, L: int, shape: Sequence[int] | None = None) -> Topology:
    """Static 2-D grid (not a torus), the most square one, with Metropolis-Hastings weights."""
    if shape is None:
        rows = math.isqrt(n)  # MeshGrid2DGraph: the largest divisor <= √n, so rows <= cols
        while n % rows:
            rows -= 1
        cols = n // rows
    else:
        ok = (isinstance(shape, Sequence) and len(shape) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape))
        if not ok or shape[0] * shape[1] != n:
            raise ConfigError("topology option shape", shape,
                              f"two positive integers [rows, columns] whose product is ranks = {n}")
        rows, cols = shape
    nbrs = [[] for _ in range(n)]
    for i in range(n):
        if (i + 1) % cols:
            nbrs[i].append(i + 1)
            nbrs[i + 1].append(i)
        if i + cols < n:
            nbrs[i].append(i + cols)
            nbrs[i + cols].append(i)
    nbrs = [sorted(js) for js in nbrs]
    # Hastings rule as MeshGrid2DGraph: w_ij = 1 / max(deg_i, deg_j), degrees counting the node itself.
    def weight(i, j):
        return 1.0 / (1 + max(len(nbrs[i]), len(nbrs[j])))
    line = " (a line: ranks is prime)" if rows == 1 and n > 3 else ""
    return _undirected("mesh2d", n, L, nbrs, weight, f"grid {rows}x{cols} (rows x columns), not a torus{line}")


@TOPOLOGIES.register("star")
def _star(n: int, L: int, center_rank: int = 0) -> Topology:
    """Static star: the centre averages everyone (1/n each); every other rank keeps 1 − 1/n and takes 1/n of it."""
    if isinstance(center_rank, bool) or not isinstance(center_rank, int) or not 0 <= center_rank < n:
        raise ConfigError("topology option center_rank", center_rank, f"a rank in 0..{n - 1}")
    nbrs = [[j for j in range(n) if j != i] if i == center_rank else [center_rank] for i in range(n)]
    return _undirected("star", n, L, nbrs, lambda i, j: 1.0 / n, f"centre rank {center_rank}")


@TOPOLOGIES.register("one_peer_exp2")
def _one_peer_exp2(n: int, L: int) -> Topology:
    """Dynamic one-peer exp2: at step k rank i sends to i + 2^(k mod D), receives from i − 2^(k mod D); ½/½."""
    # GetDynamicOnePeerSendRecvRanks(ExponentialGraph(n)): cycles through the sorted out-neighbours, D of them.
    D = (n - 1).bit_length()
    return _pairs("one_peer_exp2", n, L, D, lambda i, k: ((i + 2**k) % n, (i - 2**k) % n),
                  symmetry="circulant", detail=f"period {D}")


def _machines(name: str, n: int, L: int, least_L: int) -> int:
    M = n // L
    if M < 2:
        raise Infeasible(f"topology {name} needs at least 2 nodes; got {n} ranks with {L} per node")
    if L < least_L:
        raise Infeasible(f"topology {name} needs at least {least_L} ranks per node (as in BlueFog); got {L}; "
                         f"use one_peer_exp2 instead")
    return M


@TOPOLOGIES.register("inner_outer_exp2")
def _inner_outer_exp2(n: int, L: int) -> Topology:
    """Dynamic inner-outer exp2: local rank k mod L pairs across nodes, the others in an exp2 ring in the node."""
    # GetInnerOuterExpo2DynamicSendRecvRanks asserts local_size > 2 and needs two machines (log2(M − 1)).
    M = _machines("inner_outer_exp2", n, L, 3)
    d_out = (M - 1).bit_length()  # int(log2(M − 1)) + 1 machine distances 1, 2, 4, …
    d_in = (L - 2).bit_length()   # int(log2(L − 2)) + 1 inner distances among the L − 1 ranks left in the node

    def rule(k: int) -> tuple[Exchange, ...]:
        out, outside = [], k % L
        for r in range(n):
            m, lr = divmod(r, L)
            if lr == outside:  # to the same local rank on machine m + 2^(k mod d_out)
                dist = 2 ** (k % d_out)
                to, frm = ((m + dist) % M) * L + lr, ((m - dist) % M) * L + lr
            else:  # exp2 ring over the other L − 1 local ranks: step over the outgoing one
                s = 2 ** (k % d_in)
                fwd = s + 1 if s >= (outside - lr) % L else s
                back = s + 1 if s >= (lr - outside) % L else s
                to, frm = m * L + (lr + fwd) % L, m * L + (lr - back) % L
            out.append(Exchange(r, (to,), (frm,), 0.5, (0.5,)))
        return tuple(out)

    period = math.lcm(L, d_out, d_in)
    return Topology("inner_outer_exp2", n, period, rule, L, detail=f"{M} nodes x {L} ranks, period {period}",
                    symmetry="node_blocks")


@TOPOLOGIES.register("machine_one_peer_exp2")
def _machine_one_peer_exp2(n: int, L: int) -> Topology:
    """Hierarchical one-peer exp2 over nodes (BlueFog): node average, local ranks 0 pair at 2^(k mod D), broadcast."""
    # GetExp2DynamicSendRecvMachineRanks + hierarchical_neighbor_allreduce (needs local_size >= 2, two machines).
    M = _machines("machine_one_peer_exp2", n, L, 2)
    D = (M - 1).bit_length()
    return _pairs("machine_one_peer_exp2", n, L, D, lambda m, k: ((m + 2**k) % M, (m - 2**k) % M), unit=L,
                  intra="allreduce", symmetry="circulant", detail=f"{M} nodes, period {D}")


@TOPOLOGIES.register("shift_one")
def _shift_one(n: int, L: int, hierarchical: bool = True) -> Topology:
    """BAGUA decentralized shift_one: r < N/2 pairs with ((t + r) mod N/2) + N/2; x ← ½(x + x_peer)."""
    if not isinstance(hierarchical, bool):
        raise ConfigError("topology option hierarchical", hierarchical, "true or false")
    hier = hierarchical and L > 1  # BAGUA's default: N counts nodes, leaders exchange node averages
    N = n // L if hier else n
    if N % 2:
        raise Infeasible(f"topology shift_one needs an even number of {'nodes' if hier else 'ranks'}; got {N}"
                         + (" (hierarchical: N counts nodes; set hierarchical = false to pair ranks)" if hier else ""))
    h = N // 2

    # decentralized_full_precision_synchronous.rs: the first branch takes mod (N + 1) / 2, which is h for even N.
    def peer(r, t):
        p = (t + r) % h + h if r < h else (r - h - t) % h
        return p, p
    return _pairs("shift_one", n, L, h, peer, unit=L if hier else 1, intra="reduce" if hier else None,
                  symmetry="halves", detail=f"{N} {'nodes' if hier else 'ranks'}, period {h}")
