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

Fair shares are equal shares of each resource at the start (not max-min: a flow slowed elsewhere leaves its share
unused), and rates do not change when other messages end: exact when all messages of a step have the same size and
see the same busiest load (the symmetric exchanges the algorithms here send), otherwise an upper bound on what a
fluid max-min model with rates recomputed at each completion gives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from simfog.cluster import Cluster


@dataclass(frozen=True)
class Message:
    src: int
    dst: int
    nbytes: float


def _resources(cluster: Cluster, m: Message) -> tuple[tuple, tuple]:
    """(sender-side resource, receiver-side resource) used by message m."""
    a, b = cluster.node_of(m.src), cluster.node_of(m.dst)
    if a == b:
        return ("intra-out", m.src), ("intra-in", m.dst)
    return ("nic-out", a), ("nic-in", b)


def _flows(cluster: Cluster, messages: Sequence[Message]) -> list[int]:
    """Per message: the most concurrent messages on a resource it crosses (0 for a message to oneself)."""
    load = Counter(r for m in messages if m.src != m.dst for r in _resources(cluster, m))
    return [0 if m.src == m.dst else max(load[r] for r in _resources(cluster, m)) for m in messages]


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
    return [_message_time(cluster, m, k) for m, k in zip(messages, _flows(cluster, messages), strict=True)]


def _message_time(cluster: Cluster, m: Message, flows: int) -> float:
    """Seconds of message `m` while `flows` messages share the busiest resource it crosses (0 for flows = 0, a
    message to oneself): α + max(M / flow cap, flows·M / bandwidth) of its link."""
    if not flows:
        return 0.0
    return cluster.link_between(m.src, m.dst).time(m.nbytes, flows=flows)


def exchange_makespan(cluster: Cluster, messages: Sequence[Message]) -> float:
    """Seconds until every message of a simultaneous exchange has arrived."""
    return max(exchange_times(cluster, messages), default=0.0)
