"""A fabric from the experiment's `[fabric]` table: human units in, a frozen fabric in SI out.

    [fabric]
    kind = "fat_tree"              # flat (default) | fat_tree | rail | dragonfly
    ecmp = "split"                 # split (default): each flow evenly over equal-cost paths | hash: one path each
    switch_latency = "1us"         # per switch crossed (default 0)
    # fat_tree
    tiers = 3                      # 2 (default) or 3
    nodes_per_leaf = 4
    leaves = 64                    # two tiers; default: as many as the cluster's nodes need
    leaves_per_pod = 16            # three tiers
    pods = 8                       # three tiers; default: as many as the cluster's nodes need
    leaf_uplinks = 16              # any two of uplinks, their bandwidth and the tier's oversubscription;
    leaf_uplink_bandwidth = "400Gbit/s"   # the third follows (a missing oversubscription is 1)
    # leaf_oversubscription = 2.0
    spines_per_pod = 16            # three tiers (default leaf_uplinks)
    spine_uplinks = 16             # three tiers: uplinks per spine, their bandwidth, spine_oversubscription
    spine_uplink_bandwidth = "400Gbit/s"
    # rail: nodes_per_group (default every node), groups, rail_uplinks / rail_uplink_bandwidth /
    #       oversubscription (a rail switch's), rail_only = true (no spine)
    # dragonfly: groups, routers_per_group, nodes_per_router, local_bandwidth, global_bandwidth,
    #            global_links_per_pair (default 1), routing = "minimal" | "valiant"
    # flat: oversubscription (default 1, what cluster.oversubscription means)

NICs come from the caller: `nics_per_node` (the network file's) NICs of `nic_Bps` each (the cluster's NIC rate), so
a fabric is never told its NICs twice. Counts left out are the fewest that hold the cluster's `nodes`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from simfog import units
from simfog.errors import ConfigError, one_of, unknown_key
from simfog.fabric.base import MOST_NODES, Fabric
from simfog.fabric.clos import FatTree
from simfog.fabric.dragonfly import Dragonfly
from simfog.fabric.flat import Flat
from simfog.fabric.rail import RailOptimized

KINDS = ("flat", "fat_tree", "rail", "dragonfly")
_COMMON = {"kind", "ecmp", "switch_latency"}
_KEYS = {
    "flat": {"oversubscription"},
    "fat_tree": {"tiers", "nodes_per_leaf", "leaves", "leaves_per_pod", "pods", "leaf_uplinks",
                 "leaf_uplink_bandwidth", "leaf_oversubscription", "spines_per_pod", "spine_uplinks",
                 "spine_uplink_bandwidth", "spine_oversubscription"},
    "rail": {"nodes_per_group", "groups", "rail_uplinks", "rail_uplink_bandwidth", "oversubscription", "rail_only"},
    "dragonfly": {"groups", "routers_per_group", "nodes_per_router", "local_bandwidth", "global_bandwidth",
                  "global_links_per_pair", "routing"},
}


def from_table(table: Mapping | None, *, nodes: int, nic_Bps: float, nics_per_node: int = 1,
               source: str | None = None) -> Fabric:
    """The fabric a `[fabric]` table describes (module docstring), holding at least `nodes` nodes; no table (None
    or empty) is the flat default. Raises ConfigError naming `source`, the field, the value and what is allowed."""
    if not table:
        return default_fabric(nodes, nic_Bps, nics_per_node=nics_per_node)
    try:
        return _build(dict(table), nodes, nic_Bps, nics_per_node, source)
    except ConfigError as e:
        raise e.in_file(source) if source else e from None


def default_fabric(nodes: int, nic_Bps: float, *, nics_per_node: int = 1, oversubscription: float = 1.0) -> Flat:
    """Today's fabric for a cluster without a [fabric] table: `nodes` nodes on one core, `oversubscription` as
    simfog.cluster.Cluster's."""
    return Flat(nodes=nodes, nic_Bps=nic_Bps, nics_per_node=nics_per_node, oversubscription=oversubscription)


def _build(t: dict, nodes: int, nic_Bps: float, nics: int, source: str | None) -> Fabric:
    kind = t.get("kind", "flat")
    if kind not in KINDS:
        raise ConfigError("fabric.kind", kind, one_of(kind, KINDS), source=source)
    allowed = _COMMON | _KEYS[kind]
    for key in t:
        if key not in allowed:
            raise ConfigError(f"fabric.{key}", t[key], unknown_key(key, allowed, f"not a key of a {kind} fabric"),
                              source=source)
    r = _Reader(t, source)
    common = dict(nic_Bps=nic_Bps, nics_per_node=nics, ecmp=r.choice("ecmp", ("split", "hash"), "split"),
                  switch_latency_s=r.time("switch_latency"))
    if kind == "flat":
        return Flat(nodes=nodes, oversubscription=r.number("oversubscription", 1.0, least=1.0), **common)
    if kind == "fat_tree":
        return _fat_tree(r, nodes, nic_Bps, nics, common)
    if kind == "rail":
        return _rail(r, nodes, nic_Bps, common)
    a, p = r.integer("routers_per_group"), r.integer("nodes_per_router")
    groups = r.integer("groups", _enough(nodes, a * p))
    r.holds("groups", groups * a * p, nodes)
    return Dragonfly(groups=groups, routers_per_group=a, nodes_per_router=p,
                     local_Bps=r.bandwidth("local_bandwidth"), global_Bps=r.bandwidth("global_bandwidth"),
                     global_links_per_pair=r.integer("global_links_per_pair", 1),
                     routing=r.choice("routing", ("minimal", "valiant"), "minimal"), **common)


def _fat_tree(r: _Reader, nodes: int, nic_Bps: float, nics: int, common: dict) -> FatTree:
    tiers = r.choice("tiers", (2, 3), 2)
    per_leaf = r.integer("nodes_per_leaf")
    u1, rate1 = r.uplinks("leaf", per_leaf * nics * nic_Bps, per_leaf * nics)
    if tiers == 2:
        for key in ("leaves_per_pod", "pods", "spines_per_pod", "spine_uplinks", "spine_uplink_bandwidth",
                    "spine_oversubscription"):
            r.refuse(key, "only with tiers = 3")
        leaves = r.integer("leaves", _enough(nodes, per_leaf))
        r.holds("leaves", leaves * per_leaf, nodes)
        return FatTree(nodes_per_leaf=per_leaf, leaves=leaves, leaf_uplinks=u1, leaf_uplink_Bps=rate1, **common)
    r.refuse("leaves", "pods with tiers = 3 (leaves = pods × leaves_per_pod)")
    per_pod = r.integer("leaves_per_pod")
    pods = r.integer("pods", _enough(nodes, per_leaf * per_pod))
    r.holds("pods", pods * per_pod * per_leaf, nodes)
    spines = r.integer("spines_per_pod", u1)
    if spines > u1:  # no uplink of a leaf would reach some spine (and none would be left per spine to count)
        raise r._error("spines_per_pod", spines, f"at most the leaves' uplinks ({u1}; a multiple of spines_per_pod): "
                      "every leaf links to every spine of its pod")
    u2, rate2 = r.uplinks("spine", per_pod * u1 * rate1 / spines, per_pod * u1 // spines)
    return FatTree(nodes_per_leaf=per_leaf, leaves=pods * per_pod, leaf_uplinks=u1, leaf_uplink_Bps=rate1,
                   leaves_per_pod=per_pod, spines_per_pod=spines, spine_uplinks=u2, spine_uplink_Bps=rate2,
                   **common)


def _rail(r: _Reader, nodes: int, nic_Bps: float, common: dict) -> RailOptimized:
    per_group = r.integer("nodes_per_group", nodes)
    groups = r.integer("groups", _enough(nodes, per_group))
    r.holds("groups", groups * per_group, nodes)
    if r.flag("rail_only"):
        for key in ("rail_uplinks", "rail_uplink_bandwidth", "oversubscription"):
            r.refuse(key, "none with rail_only = true (no spine)")
        return RailOptimized(nodes_per_group=per_group, groups=groups, **common)
    uplinks, rate = r.uplinks("rail", per_group * nic_Bps, per_group, over_key="oversubscription")
    return RailOptimized(nodes_per_group=per_group, groups=groups, rail_uplinks=uplinks, rail_uplink_Bps=rate,
                         **common)


def _enough(nodes: int, per: int) -> int:
    return max(1, -(-nodes // per))


class _Reader:
    """Reads keys of one [fabric] table, each error naming fabric.<key> and the file."""

    def __init__(self, table: dict, source: str | None):
        self.t, self.source = table, source

    def _error(self, key: str, value: object, allowed: str) -> ConfigError:
        return ConfigError(f"fabric.{key}", value, allowed, source=self.source)

    def integer(self, key: str, default: int | None = None, least: int = 1) -> int:
        if key not in self.t:
            if default is None:
                raise self._error(key, "(missing)", f"an integer >= {least}")
            return default
        v = self.t[key]
        # at most MOST_NODES: the rates derived from counts stay finite floats (a 400-digit count overflowed)
        if isinstance(v, bool) or not isinstance(v, int) or not least <= v <= MOST_NODES:
            raise self._error(key, v, f"an integer >= {least} and at most {MOST_NODES:,}")
        return v

    def number(self, key: str, default: float | None, least: float = 0.0) -> float | None:
        if key not in self.t:
            return default
        v = self.t[key]
        big = isinstance(v, int) and abs(v) > 1e300  # a 400-digit integer: no float holds it
        if isinstance(v, bool) or not isinstance(v, int | float) or big or not (least < v < math.inf or v == least > 0):
            raise self._error(key, v, f"a finite number >= {least:g}" if least else "a finite number > 0")
        return float(v)

    def bandwidth(self, key: str, required: bool = True) -> float | None:
        if key not in self.t:
            if required:
                raise self._error(key, "(missing)", 'a bandwidth with its unit, e.g. "400Gbit/s"')
            return None
        v = units.bandwidth(self.t[key], field=f"fabric.{key}", source=self.source)
        if not v > 0:
            raise self._error(key, self.t[key], "a bandwidth > 0 with its unit")
        return v

    def time(self, key: str) -> float:
        return units.seconds(self.t[key], field=f"fabric.{key}", source=self.source) if key in self.t else 0.0

    def choice(self, key: str, allowed: tuple, default):
        v = self.t.get(key, default)
        if isinstance(v, bool) or v not in allowed:
            raise self._error(key, v, one_of(v, map(str, allowed)))
        return v

    def flag(self, key: str) -> bool:
        v = self.t.get(key, False)
        if not isinstance(v, bool):
            raise self._error(key, v, "true or false")
        return v

    def refuse(self, key: str, why: str) -> None:
        if key in self.t:
            raise self._error(key, self.t[key], why)

    def holds(self, key: str, capacity: int, nodes: int) -> None:
        if capacity < nodes:
            raise self._error(key, self.t.get(key), f"a fabric of at least {nodes} nodes (the cluster's); this "
                              f"one holds {capacity}")

    def uplinks(self, tier: str, down_Bps: float, ports_below: int, over_key: str | None = None) -> tuple[int, float]:
        """(count, rate) of one switch's uplinks in `tier` from any two of {tier}_uplinks,
        {tier}_uplink_bandwidth and the oversubscription (what the switch's `down_Bps` of downlinks can send over
        what its uplinks carry; 1 when not given). Without a count, ports_below uplinks (or what the rate gives)."""
        count_key, rate_key = f"{tier}_uplinks", f"{tier}_uplink_bandwidth"
        over_key = over_key or f"{tier}_oversubscription"
        count = self.integer(count_key, 0) or None
        rate = self.bandwidth(rate_key, required=False)
        over = self.number(over_key, None)
        if count is not None and rate is not None:
            if over is not None and not math.isclose(down_Bps / (count * rate), over, rel_tol=1e-9):
                raise self._error(over_key, over, f"{down_Bps / (count * rate):g}, what {count} uplinks of "
                                  f"{units.format_bandwidth(rate)} give (or leave one of the three out)")
            return count, rate
        over = 1.0 if over is None else over
        if rate is not None:
            exact = down_Bps / (over * rate)
            if not math.isclose(exact, round(exact), rel_tol=1e-9) or round(exact) < 1:
                raise self._error(rate_key, self.t[rate_key], f"a rate that gives a whole number of uplinks at "
                                  f"oversubscription {over:g} ({exact:g} here); or give {count_key}")
            return round(exact), rate
        count = count or ports_below
        return count, down_Bps / (over * count)
