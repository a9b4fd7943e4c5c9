"""Max-min fair sharing of links among flows: progressive filling (water-filling), vectorised with numpy.

All unfrozen flows grow at one rate; when a link fills, the flows crossing it freeze at that rate; the others go on
growing in what is left. A flow that spreads over several paths (an ECMP split) puts `weight` of its rate on each
link, so a link fills when Σ weight·rate reaches its capacity. The result is the max-min fair allocation: no flow
can get more without taking from a flow of an equal or smaller rate; each flow has a bottleneck link, full, on
which no flow runs faster than it. Levels within a relative 1e-12 of each other are taken as one (ties that
rounding split apart), so a rate may sit up to 1e-12 below its exact value.

`groups` couples flows: the flows of a group share one rate, as the flows of one pipelined collective step do (a
ring moves at its slowest hop's pace, so its other hops cannot use more). Groups are then shared max-min fairly
with a group's weight on a link the sum of its flows' weights there: on a link two groups cross, each of their
flows gets an equal share until one group is held back elsewhere.

The slowest flow is the first level of the filling: min over links of capacity / Σ weights (`slowest_rate`), a
closed form in one pass over the routes.
"""

from __future__ import annotations

import numpy as np

from simfog.fabric.links import Routes

TIE = 1e-12  # relative: levels this close are one level


def max_min_rates(routes: Routes, *, groups=None, max_Bps=None) -> np.ndarray:
    """Each flow's rate (B/s) under max-min fair sharing of `routes`' links (module docstring). `groups` (an
    integer per flow) makes the flows of a group share one rate; `max_Bps` (one number or one per flow) is the most
    a flow reaches alone (a TCP stream's cap; the least over a group's flows). A flow that crosses no link runs at
    its cap (inf without one)."""
    flows = routes.flows
    if groups is None:
        key, count, inverse = routes.flow, flows, None
    else:
        groups = np.asarray(groups)
        if groups.shape != (flows,):
            raise ValueError(f"groups: one per flow ({flows}), got shape {groups.shape}")
        _, inverse = np.unique(groups, return_inverse=True)
        count = int(inverse.max()) + 1 if flows else 0
        key = inverse[routes.flow]
    limit = np.full(count, np.inf)
    if max_Bps is not None:
        per_flow = np.broadcast_to(np.asarray(max_Bps, dtype=float), (flows,))
        np.minimum.at(limit, np.arange(flows) if inverse is None else inverse, per_flow)
    cap, link, weight = routes.capacity, routes.link, routes.weight
    rate = limit.copy()
    active = np.zeros(count, dtype=bool)
    active[key] = True
    frozen_load = np.zeros(len(cap))
    while active.any():
        live = active[key]
        w = np.bincount(link[live], weights=weight[live], minlength=len(cap))
        used = w > 0
        level_of = np.full(len(cap), np.inf)
        level_of[used] = np.maximum(cap[used] - frozen_load[used], 0.0) / w[used]
        level = min(level_of.min(), limit[active].min())
        edge = level + level * TIE
        freeze = np.zeros(count, dtype=bool)
        freeze[key[live & (level_of[link] <= edge)]] = True
        freeze |= limit <= edge
        freeze &= active
        rate[freeze] = level
        done = freeze[key]
        frozen_load += np.bincount(link[done], weights=weight[done] * level, minlength=len(cap))
        active &= ~freeze
    return rate if inverse is None else rate[inverse]


def slowest_rate(routes: Routes) -> float:
    """The slowest flow's max-min rate (B/s) in closed form: min over links of capacity / Σ weights of the flows
    on it (inf when no flow crosses a link). Equals max_min_rates(routes).min() over flows that cross a link, and
    the rate of all of `routes` coupled as one group."""
    w = np.bincount(routes.link, weights=routes.weight, minlength=len(routes.capacity))
    used = w > 0
    return float((routes.capacity[used] / w[used]).min()) if used.any() else float("inf")
