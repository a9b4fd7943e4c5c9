"""Links of a fabric and the routes of flows over them, as flat numpy arrays.

A `LinkTable` numbers every directed link of a fabric: it is a list of segments (a label such as "leaf up", a
shape such as (leaves, uplinks) and one capacity in B/s for the whole segment), so a link's index is its segment's
offset plus the row-major index of its coordinates, and routing code computes indices arithmetically instead of
walking a graph. `Routes` says which links each flow crosses and with which share of its rate: entry e puts
weight[e] of flow[e]'s rate on link[e] (1 on a single path; 1/P on each of P paths of an even ECMP split).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ECMP = ("split", "hash")  # an even split over the equal-cost paths, or one path chosen by a hash of (src, dst)


@dataclass(frozen=True)
class Segment:
    """`shape` links named `label`, each of `capacity_Bps` (bytes/s, one direction); `dims` names the axes."""

    label: str
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    capacity_Bps: float

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class LinkTable:
    """The directed links of a fabric, segment after segment (module docstring)."""

    def __init__(self, segments: list[Segment]):
        self.segments = tuple(segments)
        sizes = [s.size for s in self.segments]
        self.offsets = dict(zip((s.label for s in self.segments), np.cumsum([0, *sizes[:-1]]).tolist()))
        if len(self.offsets) != len(self.segments):
            raise ValueError("segment labels must be distinct")
        self.capacity = np.repeat([s.capacity_Bps for s in self.segments], sizes).astype(float)
        self.capacity.setflags(write=False)

    def __len__(self) -> int:
        return len(self.capacity)

    def ids(self, label: str, *coords) -> np.ndarray:
        """Indices of the links of segment `label` at `coords` (arrays or ints, one per axis of its shape)."""
        seg = self.segments[list(self.offsets).index(label)]
        return self.offsets[label] + np.ravel_multi_index(tuple(np.asarray(c, dtype=np.int64) for c in coords),
                                                          seg.shape)

    def name(self, index: int) -> str:
        """'leaf up [leaf 3, link 1]': which link index `index` is."""
        for seg in self.segments:
            start = self.offsets[seg.label]
            if start <= index < start + seg.size:
                coords = np.unravel_index(index - start, seg.shape)
                return f"{seg.label} [" + ", ".join(f"{d} {int(c)}" for d, c in zip(seg.dims, coords)) + "]"
        raise IndexError(f"link {index} of {len(self)}")


@dataclass(frozen=True, eq=False)
class Routes:
    """Flows on links: entry e puts `weight[e]` of flow `flow[e]`'s rate on link `link[e]` of `table`. `hops[f]`
    is the number of switches flow f crosses (its longest path); a flow with no entry stays inside its node."""

    flow: np.ndarray
    link: np.ndarray
    weight: np.ndarray
    hops: np.ndarray
    flows: int
    table: LinkTable
    ecmp: str

    @property
    def capacity(self) -> np.ndarray:
        return self.table.capacity

    def load(self, rates: np.ndarray) -> np.ndarray:
        """B/s each link carries when flow f runs at rates[f] (finite rates)."""
        return np.bincount(self.link, weights=self.weight * rates[self.flow], minlength=len(self.table))

    def links_of(self, flow: int) -> list[str]:
        """Names of the links flow `flow` crosses (for reports and tests)."""
        return [self.table.name(int(x)) for x in np.unique(self.link[self.flow == flow])]


class RouteBuilder:
    """Collects (flow, link, weight) entries; `build` makes the Routes."""

    def __init__(self):
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, flow, link, weight=1.0, present=None) -> None:
        """Entries for flows `flow` on links `link` (arrays of one length) with `weight`; `present` (a boolean
        array) keeps only some of them."""
        flow, link = np.asarray(flow, dtype=np.int64), np.asarray(link, dtype=np.int64)
        weight = np.broadcast_to(np.asarray(weight, dtype=float), flow.shape)
        if present is not None:
            flow, link, weight = flow[present], link[present], weight[present]
        self._parts.append((flow, link, weight))

    def build(self, flows: int, hops: np.ndarray, table: LinkTable, ecmp: str) -> Routes:
        if self._parts:
            flow, link, weight = (np.concatenate(a) for a in zip(*self._parts))
        else:
            flow, link, weight = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        return Routes(flow, link, weight, np.asarray(hops, dtype=np.int64), flows, table, ecmp)


_MIX1, _MIX2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def ecmp_hash(*keys: np.ndarray) -> np.ndarray:
    """A deterministic 64-bit hash per element of the integer arrays `keys` (splitmix64 chained over the keys): the
    same (src, dst) always picks the same path, on every run and platform, as a switch's ECMP hash of a flow's
    header does."""
    h = np.zeros(np.broadcast(*keys).shape, dtype=np.uint64)
    for k in keys:
        h = h + np.asarray(k).astype(np.uint64) + _GOLDEN  # uint64 arithmetic wraps, which a hash wants
        h = (h ^ (h >> np.uint64(30))) * _MIX1
        h = (h ^ (h >> np.uint64(27))) * _MIX2
        h = h ^ (h >> np.uint64(31))
    return h


def pick(h: np.ndarray, n: int, salt: int = 0) -> np.ndarray:
    """An index below `n` from hash `h`; another `salt` gives an independent choice (another switch's hash)."""
    if salt:
        h = ecmp_hash(h, np.uint64(salt))
    return (h % np.uint64(n)).astype(np.int64)
