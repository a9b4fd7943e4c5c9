"""Point-to-point traffic that runs at the same time: neighbour exchanges of decentralized algorithms.

Pure cost function, flow level. Messages that leave a node share that node's NIC (each direction separately);
messages between ranks of one node use the intra-node link of the sending and the receiving rank. Each message is
a flow; `flows` is the largest number of concurrent messages on any resource it crosses, and the message runs at

    rate = min(flow cap, bandwidth / flows)      time = α + M / rate = α + max(M / flow cap, flows·M / bandwidth)

with α, bandwidth and flow cap those of its link class (simfog.cluster.Link: the NIC, slowed by oversubscription
or a degraded NIC, for messages between nodes; the intra link otherwise). The bandwidth is what the resource
carries in all (a NIC's rate); the flow cap what one flow reaches alone (a TCP stream, a CPU-bound sender), the
bandwidth when none is given, and then time = α + flows·M / bandwidth: a rank sending to d peers at once divides
its NIC by d, L ranks of a node sending off-node share its NIC L ways. With a cap below the bandwidth, flows add up
until they fill the resource: 2 flows on one NIC take no longer than 1 while the cap is at most half its bandwidth.

Two sharing models (comm.p2p_sharing):

- "together" (`message_times`): all messages of a step start together and keep their share: equal shares of each
  resource at the start (not max-min: a flow slowed elsewhere leaves its share unused), rates unchanged when other
  messages end. Exact when every message of a step starts at the same instant, has the same size and sees the same
  busiest load (the symmetric exchanges the algorithms send in lockstep).
- "fluid" (`fluid_times`, the default): each message starts at its own time (its sender and receiver ready), and
  each resource is shared equally among the messages on it AT EACH INSTANT (processor sharing: a message's rate
  is min(flow cap, bandwidth / messages on the resource now), recomputed at every arrival and completion there);
  a message has crossed once it has drained on both of its resources (the slower). Ranks of one node that drift
  apart (neighbour averaging has no barrier; a rank whose peer is on its own node finishes early) then use the NIC
  one after the other rather than at half rate each: measured on the emulated cluster (BlueFog one-peer exp2,
  4 nodes x 2 ranks, 1 Gbit/s), transfers took ~9 ms where "together" charges two flows, 15.7 ms. When all
  messages on a message's resources start together the two models agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simfog.cluster import Cluster


@dataclass(frozen=True)
class Message:
    src: int
    dst: int
    nbytes: float


def flows_of(cluster: Cluster, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per message (src[i] -> dst[i]): the most concurrent messages on a resource it crosses (0 for a message to
    oneself). Resources: a rank's intra-node link out and in (messages inside a node), a node's NIC out and in."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    n, L = cluster.ranks, cluster.ranks_per_node
    a, b = src // L, dst // L
    same = a == b
    out_key = np.where(same, src, 2 * n + a)              # intra-out rank | nic-out node
    in_key = np.where(same, n + dst, 2 * n + cluster.nodes + b)  # intra-in rank | nic-in node
    live = src != dst
    load = np.bincount(np.concatenate([out_key[live], in_key[live]]), minlength=2 * n + 2 * cluster.nodes)
    return np.where(live, np.maximum(load[out_key], load[in_key]), 0)


def _flows(cluster: Cluster, messages: Sequence[Message]) -> list[int]:
    return flows_of(cluster, [m.src for m in messages], [m.dst for m in messages]).tolist()


def flow_rates(cluster: Cluster, messages: Sequence[Message]) -> list[float]:
    """Bytes/s each message runs at when all of `messages` start together: min(flow cap, bandwidth / flows) of
    its link (see the module docstring); inf for a message to oneself."""
    out = []
    for m, k in zip(messages, _flows(cluster, messages), strict=True):
        if not k:
            out.append(float("inf"))
            continue
        link = cluster.link_between(m.src, m.dst)
        out.append(min(link.flow_Bps, link.bandwidth_Bps / k))
    return out


def exchange_times(cluster: Cluster, messages: Sequence[Message]) -> list[float]:
    """Seconds each message takes when all of `messages` start together: α + M / rate (flow_rates); a message to
    oneself costs 0."""
    src, dst = [m.src for m in messages], [m.dst for m in messages]
    return message_times(cluster, src, dst, np.array([m.nbytes for m in messages], dtype=float)).tolist()


def links_of(cluster: Cluster, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per message, what cluster.link_between(src, dst) gives: (latency_s, bandwidth_Bps, flow cap or nan)."""
    L = cluster.ranks_per_node
    a, b = np.asarray(src) // L, np.asarray(dst) // L
    same = a == b
    intra, inter = cluster.intra, cluster.inter
    lat = np.where(same, intra.latency_s, inter.latency_s)
    bw = np.where(same, intra.bandwidth_Bps, inter.bandwidth_Bps)
    cap = np.where(same, _cap(intra), _cap(inter))
    if cluster.degraded_nics:  # slowest_inter((a, b)): the slower of the two NICs, when below the NIC's rate
        node_bw = np.full(cluster.nodes, np.inf)
        nodes, bws = zip(*cluster.degraded_nics)
        np.minimum.at(node_bw, np.array(nodes), np.array(bws, dtype=float))
        low = np.minimum(node_bw[a], node_bw[b])
        slow = ~same & (low < cluster.nic.bandwidth_Bps)
        bw = np.where(slow, low / (cluster.oversubscription if cluster.nodes > 1 else 1.0), bw)
        lat = np.where(slow, cluster.nic.latency_s, lat)
        cap = np.where(slow, _cap(cluster.nic), cap)
    return lat, bw, cap


def _cap(link) -> float:
    return np.nan if link.flow_bandwidth_Bps is None else link.flow_bandwidth_Bps


def message_times(cluster: Cluster, src, dst, nbytes, flows: np.ndarray | None = None) -> np.ndarray:
    """exchange_times over arrays: message i (src[i] -> dst[i], nbytes (scalar or per message)) takes
    α + max(M / flow cap, flows·M / bandwidth) of its link (Link.time, the same operations), 0 to oneself."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    k = flows_of(cluster, src, dst) if flows is None else flows
    lat, bw, cap = links_of(cluster, src, dst)
    t = lat + k * nbytes / bw
    capped = ~np.isnan(cap)
    if capped.any():
        t = np.where(capped, np.maximum(t, lat + nbytes / np.where(capped, cap, 1.0)), t)
    return np.where(k > 0, t, 0.0)


def exchange_makespan(cluster: Cluster, messages: Sequence[Message]) -> float:
    """Seconds until every message of a simultaneous exchange has arrived."""
    return max(exchange_times(cluster, messages), default=0.0)


def fluid_times(cluster: Cluster, src, dst, nbytes: float, starts) -> np.ndarray:
    """Seconds message i (src[i] -> dst[i], `nbytes` each) takes when it starts at starts[i], under processor
    sharing of each resource (module docstring, "fluid"): lat + its longer drain of the two resources it crosses.
    A message whose two resources see all their messages start together takes message_times' time, the same bits;
    so does every message on a resource whose messages differ in link (a degraded NIC on some of them: processor
    sharing of unequal flows is not first-in first-out, and such resources keep the start-together shares)."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    starts = np.asarray(starts, dtype=float)
    static = message_times(cluster, src, dst, nbytes)
    live = np.flatnonzero(src != dst)
    if len(live) < 2:
        return static
    n, L = cluster.ranks, cluster.ranks_per_node
    a, b = src[live] // L, dst[live] // L
    same = a == b
    keys = np.concatenate([np.where(same, src[live], 2 * n + a),                       # intra-out | nic-out
                           np.where(same, n + dst[live], 2 * n + cluster.nodes + b)])  # intra-in | nic-in
    msg = np.concatenate([live, live])
    lat, bw, cap = links_of(cluster, src, dst)
    cap = np.where(np.isnan(cap), np.inf, cap)
    size = 2 * n + 2 * cluster.nodes
    t = starts[msg]
    lo, hi = np.full(size, np.inf), np.full(size, -np.inf)
    np.minimum.at(lo, keys, t)
    np.maximum.at(hi, keys, t)
    bw_lo, bw_hi, cap_lo, cap_hi = np.full(size, np.inf), np.zeros(size), np.full(size, np.inf), np.zeros(size)
    np.minimum.at(bw_lo, keys, bw[msg])
    np.maximum.at(bw_hi, keys, bw[msg])
    np.minimum.at(cap_lo, keys, cap[msg])
    np.maximum.at(cap_hi, keys, cap[msg])
    uniform = (bw_lo == bw_hi) & (cap_lo == cap_hi)
    varied = np.zeros(len(src), dtype=bool)
    varied[msg[hi[keys] > lo[keys]]] = True
    blocked = np.zeros(len(src), dtype=bool)
    blocked[msg[~uniform[keys]]] = True
    varied &= ~blocked
    if not varied.any():
        return static
    # Processor sharing on every resource a varied message crosses, with all the messages on it.
    use = np.zeros(size, dtype=bool)
    use[keys[varied[msg]]] = True
    pick = use[keys] & ~blocked[msg]
    with np.errstate(invalid="ignore"):
        share = np.nan_to_num(cap[msg[pick]] / bw[msg[pick]], nan=np.inf)  # inf / inf: an unlimited link
    drain = _processor_sharing(keys[pick], t[pick], nbytes / bw[msg[pick]], share)
    longest = np.zeros(len(src))
    np.maximum.at(longest, msg[pick], drain)
    return np.where(varied, lat + longest, static)


def _processor_sharing(resource: np.ndarray, start: np.ndarray, alone_s: np.ndarray, cap_share: np.ndarray):
    """Per job (resource[j], arriving at start[j], alone_s[j] seconds of work at the full rate, at most cap_share of
    the full rate): seconds from its arrival until it has drained, when each resource serves its jobs at equal
    rates min(cap_share, 1 / jobs there). A resource's jobs all have the same work and cap (fluid_times keeps
    the others out), so they leave in the order they came: the head leaves when the resource's virtual time (work
    one job received since time 0) has grown by alone_s since its arrival. All resources advance together, one
    event (an arrival or the head's departure) each per round."""
    order = np.lexsort((start, resource))
    res, arr = resource[order], start[order]
    work, share = alone_s[order], cap_share[order]
    first = np.flatnonzero(np.r_[True, res[1:] != res[:-1]])
    count = np.diff(np.r_[first, len(res)])
    m = len(first)
    now, virtual = arr[first].copy(), np.zeros(m)
    jobs, came, left = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    v_in, out = np.empty(len(res)), np.empty(len(res))
    active = np.arange(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        while active.size:
            base = first[active]
            k = jobs[active]
            nxt_in = np.where(came[active] < count[active], arr[np.minimum(base + came[active], len(arr) - 1)], np.inf)
            head = base + left[active]
            busy = k > 0
            rate = np.where(busy, np.minimum(share[head], 1.0 / k), 0.0)
            goal = np.where(busy, v_in[head] + work[head], 0.0)
            nxt_out = np.where(busy, now[active] + (goal - virtual[active]) / rate, np.inf)
            leaves = nxt_out <= nxt_in
            t_next = np.where(leaves, nxt_out, nxt_in)
            virtual[active] = np.where(leaves, goal, virtual[active] + rate * (t_next - now[active]))
            now[active] = t_next
            go, come = active[leaves], active[~leaves]
            out[first[go] + left[go]] = now[go]
            jobs[go] -= 1
            left[go] += 1
            v_in[first[come] + came[come]] = virtual[come]
            jobs[come] += 1
            came[come] += 1
            active = active[left[active] < count[active]]
    drain = np.empty(len(res))
    drain[order] = out - arr
    return drain
