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

- "together" (`message_times`, the default): all messages of a step start together and keep their share: equal
  shares of each resource at the start (not max-min: a flow slowed elsewhere leaves its share unused), rates
  unchanged when other messages end. Exact when every message of a step starts at the same instant, has the same
  size and sees the same busiest load (the symmetric exchanges the algorithms send in lockstep); when ranks drift
  apart it charges flows that in truth overlap only in part.
- "fluid" (simfog.algorithms.dataflow.fluid): each resource shared at each instant among the messages on it, of any
  step, in time order (processor sharing, rates recomputed at every arrival and completion).
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


def resource_keys(cluster: Cluster, src, dst) -> tuple[np.ndarray, np.ndarray, int]:
    """Per message (src[i] -> dst[i]) the two resources it crosses, as indices below `size`: (out, in, size).
    Resources: a rank's intra-node link out and in (messages inside a node), a node's NIC out and in."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    n, L = cluster.ranks, cluster.ranks_per_node
    a, b = src // L, dst // L
    same = a == b
    out_key = np.where(same, src, 2 * n + a)              # intra-out rank | nic-out node
    in_key = np.where(same, n + dst, 2 * n + cluster.nodes + b)  # intra-in rank | nic-in node
    return out_key, in_key, 2 * n + 2 * cluster.nodes


def flows_of(cluster: Cluster, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per message (src[i] -> dst[i]): the most concurrent messages on a resource it crosses (0 for a message to
    oneself; resource_keys)."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    out_key, in_key, size = resource_keys(cluster, src, dst)
    live = src != dst
    load = np.bincount(np.concatenate([out_key[live], in_key[live]]), minlength=size)
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

