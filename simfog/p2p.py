"""Point-to-point traffic that runs at the same time: neighbour exchanges of decentralized algorithms.

Pure cost function. Messages that leave a node share that node's NIC (each direction separately); messages
between ranks of one node use the intra-node link of the sending and the receiving rank. A message is slowed by
the busiest resource it crosses: its time is α + M·β·flows, where `flows` is the largest number of concurrent
messages on any resource it uses (fair sharing). So a rank sending to d peers at once divides its NIC bandwidth
by d, and L ranks of a node sending off-node share the node's NIC L ways.
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


def exchange_times(cluster: Cluster, messages: Sequence[Message]) -> list[float]:
    """Seconds each message takes when all of `messages` start together (self-messages cost 0)."""
    live = [m for m in messages if m.src != m.dst]
    load = Counter(r for m in live for r in _resources(cluster, m))
    out = []
    for m in messages:
        if m.src == m.dst:
            out.append(0.0)
            continue
        send, recv = _resources(cluster, m)
        flows = max(load[send], load[recv])
        link = cluster.link_between(m.src, m.dst)
        out.append(link.time(m.nbytes, flows=flows))
    return out


def exchange_makespan(cluster: Cluster, messages: Sequence[Message]) -> float:
    """Seconds until every message of a simultaneous exchange has arrived."""
    return max(exchange_times(cluster, messages), default=0.0)
