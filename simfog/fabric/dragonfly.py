"""Dragonfly fabrics: groups of routers linked all-to-all inside a group, groups linked by global links.

`groups` groups of `routers_per_group` routers, `nodes_per_router` nodes (all their NICs) on each router. Inside a
group every ordered pair of routers has one local link of `local_Bps`; every ordered pair of groups has
`global_links_per_pair` global links of `global_Bps` (each direction its own link). Global link t between groups i
and j attaches in group i to router ((j − i − 1) mod G · m + t) mod a (G groups, a routers, m links per pair): each
group's links to the other groups dealt round robin over its routers, as in the canonical dragonfly.

Routing between groups:
- "minimal": local hop to the router holding a global link to the destination group (none when the source router
  holds it), that global link, local hop to the destination router. ECMP "split" spreads a flow evenly over the m
  global links of the pair; "hash" picks one from a hash of its NICs.
- "valiant": through an intermediate group (neither source nor destination): minimal to it, then minimal on; "split"
  spreads a flow evenly over every intermediate group and global link (G − 2 groups × m × m paths), "hash" picks
  one. Valiant needs three groups or more.
Inside a group both routings take the direct local link. Switches crossed: the routers on the path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simfog.errors import ConfigError
from simfog.fabric.base import MOST_NODES, Fabric, check_int, check_rate
from simfog.fabric.links import Segment, pick

ROUTING = ("minimal", "valiant")


@dataclass(frozen=True, kw_only=True)
class Dragonfly(Fabric):
    """A dragonfly (module docstring)."""

    groups: int
    routers_per_group: int
    nodes_per_router: int
    local_Bps: float
    global_Bps: float
    global_links_per_pair: int = 1
    routing: str = "minimal"

    def __post_init__(self):
        super().__post_init__()
        for name in ("groups", "routers_per_group", "nodes_per_router"):
            check_int(name, getattr(self, name), most=MOST_NODES)
        if self.nodes > MOST_NODES:
            raise ConfigError("fabric.groups", self.groups, f"at most {MOST_NODES:,} nodes in all")
        check_int("global_links_per_pair", self.global_links_per_pair, most=64)
        check_rate("local_bandwidth", self.local_Bps)
        check_rate("global_bandwidth", self.global_Bps)
        if self.routing not in ROUTING:
            raise ConfigError("fabric.routing", self.routing, f"one of {', '.join(ROUTING)}")
        if self.routing == "valiant" and self.groups < 3:
            raise ConfigError("fabric.routing", self.routing, f"minimal with {self.groups} groups (valiant routes "
                              "through a third group)")

    @property
    def nodes(self) -> int:
        return self.groups * self.routers_per_group * self.nodes_per_router

    def global_router(self, group: np.ndarray, peer: np.ndarray, link: np.ndarray) -> np.ndarray:
        """The router of `group` that holds global link `link` to group `peer`."""
        g, m = self.groups, self.global_links_per_pair
        return ((peer - group - 1) % g * m + link) % self.routers_per_group

    def _segments(self, ecmp: str) -> list[Segment]:
        g, a = self.groups, self.routers_per_group
        return [Segment("local", (g, a, a), ("group", "from router", "to router"), self.local_Bps),
                Segment("global", (g, g, self.global_links_per_pair), ("from group", "to group", "link"),
                        self.global_Bps)]

    def _core(self, out, table, idx, src, s_nic, dst, d_nic, ecmp) -> np.ndarray:
        a, p = self.routers_per_group, self.nodes_per_router
        gs, rs = src // p // a, src // p % a
        gd, rd = dst // p // a, dst // p % a
        hops = np.ones(len(idx), dtype=np.int64)
        inside = (gs == gd) & (rs != rd)
        out.add(idx, table.ids("local", gs, rs, rd), present=inside)
        hops[inside] = 2
        far = np.flatnonzero(gs != gd)
        if not len(far):
            return hops
        m, h = self.global_links_per_pair, self.flow_hash(src, s_nic, dst, d_nic)[far]
        if self.routing == "minimal":
            f, weight, (t,) = _paths(len(far), (m,), h if ecmp == "hash" else None)
            f = far[f]
            routers = self._minimal(out, table, idx[f], weight, gs[f], rs[f], gd[f], t, end=rd[f])
        else:
            f, weight, (k, t1, t2) = _paths(len(far), (self.groups - 2, m, m), h if ecmp == "hash" else None)
            f = far[f]
            lo, hi = np.minimum(gs[f], gd[f]), np.maximum(gs[f], gd[f])
            gi = k + (k >= lo)
            gi = gi + (gi >= hi)  # the k-th group that is neither source nor destination
            ry1 = self.global_router(gi, gs[f], t1)
            first = self._minimal(out, table, idx[f], weight, gs[f], rs[f], gi, t1, end=None)
            routers = first + self._minimal(out, table, idx[f], weight, gi, ry1, gd[f], t2, end=rd[f]) - 1
        np.maximum.at(hops, f, routers)  # the longest of a flow's paths
        return hops

    def _minimal(self, out, table, flow, weight, g_from, r_from, g_to, link, end) -> np.ndarray:
        """Entries from router r_from of group g_from over global link `link` into g_to, then on to router `end`
        of g_to (None: stop at the router the link arrives at); returns the routers crossed."""
        rx, ry = self.global_router(g_from, g_to, link), self.global_router(g_to, g_from, link)
        out.add(flow, table.ids("local", g_from, r_from, rx), weight, present=r_from != rx)
        out.add(flow, table.ids("global", g_from, g_to, link), weight)
        routers = 2 + (r_from != rx)
        if end is not None:
            out.add(flow, table.ids("local", g_to, ry, end), weight, present=ry != end)
            routers = routers + (ry != end)
        return routers


def _paths(flows: int, choices: tuple[int, ...], h: np.ndarray | None):
    """Paths of `flows` flows over the choices (one axis per choice): every combination with weight 1/count under
    an even split (h None), else one from each flow's hash h. Returns (flow of each path, weight, choice arrays)."""
    if h is None:
        count = int(np.prod(choices))
        f = np.repeat(np.arange(flows), count)
        coords = np.unravel_index(np.tile(np.arange(count), flows), choices)
        return f, 1.0 / count, [np.asarray(c, dtype=np.int64) for c in coords]
    return np.arange(flows), 1.0, [pick(h, n, salt=i) for i, n in enumerate(choices)]
