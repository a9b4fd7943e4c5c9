"""A step's flows (NIC to NIC, bytes each) and how long each takes on a fabric.

`step_times` routes the flows (Fabric.route), shares the links max-min fairly (simfog.fabric.sharing) and gives each
flow time = latency_s + switches crossed · switch_latency_s + bytes / rate, the α + M/rate of simfog's flow-level
model with the rate the fabric leaves it. On a flat fabric with one flow per NIC that is α + M / (nic / s), bit for
bit what simfog.cluster.Link.time gives for the inter-node link today.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simfog.errors import ConfigError
from simfog.fabric.links import Routes
from simfog.fabric.sharing import max_min_rates


@dataclass(frozen=True, eq=False)
class Flows:
    """Flow i goes from NIC src_nic[i] of node src_node[i] to NIC dst_nic[i] of node dst_node[i] and carries
    nbytes[i] bytes (arrays of one length; build with `Flows.of`)."""

    src_node: np.ndarray
    src_nic: np.ndarray
    dst_node: np.ndarray
    dst_nic: np.ndarray
    nbytes: np.ndarray

    def __post_init__(self):
        n = len(self.nbytes)
        for name in ("src_node", "src_nic", "dst_node", "dst_nic"):
            arr = getattr(self, name)
            if arr.shape != (n,) or arr.dtype != np.int64:
                raise ValueError(f"Flows.{name}: an int64 array of {n} (use Flows.of)")
            if n and arr.min() < 0:
                raise ConfigError(f"flows.{name}", int(arr.min()), "an index >= 0")
        if n and not (np.isfinite(self.nbytes).all() and self.nbytes.min() >= 0):
            bad = self.nbytes[~(np.isfinite(self.nbytes) & (self.nbytes >= 0))][0]
            raise ConfigError("flows.nbytes", float(bad), "a size in bytes, finite and >= 0")

    @classmethod
    def of(cls, src_node, dst_node, nbytes, src_nic=0, dst_nic=0) -> Flows:
        """Flows from arrays (or numbers, broadcast to one length)."""
        parts = np.broadcast_arrays(*(np.asarray(x) for x in (src_node, src_nic, dst_node, dst_nic, nbytes)))
        ints = []
        for name, arr in zip(("src_node", "src_nic", "dst_node", "dst_nic"), parts[:4]):
            if arr.size and not np.issubdtype(arr.dtype, np.integer):
                raise ConfigError(f"flows.{name}", arr.ravel()[0].item(), "an integer index")
            ints.append(np.ascontiguousarray(arr, dtype=np.int64).ravel())
        return cls(*ints, np.ascontiguousarray(parts[4], dtype=float).ravel())

    @classmethod
    def from_list(cls, items: Sequence[tuple[int, int, int, int, float]]) -> Flows:
        """Flows from (src_node, src_nic, dst_node, dst_nic, nbytes) tuples."""
        cols = list(zip(*items)) if items else [[], [], [], [], []]
        return cls.of(np.array(cols[0], dtype=np.int64), np.array(cols[2], dtype=np.int64),
                      np.array(cols[4], dtype=float), np.array(cols[1], dtype=np.int64),
                      np.array(cols[3], dtype=np.int64))

    @staticmethod
    def concat(parts: Sequence[Flows]) -> Flows:
        return Flows(*(np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0, np.int64)
                       for f in ("src_node", "src_nic", "dst_node", "dst_nic")),
                     np.concatenate([p.nbytes for p in parts]) if parts else np.zeros(0))

    def __len__(self) -> int:
        return len(self.nbytes)


@dataclass(frozen=True, eq=False)
class StepTimes:
    """Per flow: its rate (B/s; inf inside a node, where no fabric link is crossed) and its time (s; 0 inside a
    node: the node's own links are the caller's), and the routes they came from."""

    rate_Bps: np.ndarray
    time_s: np.ndarray
    routes: Routes

    @property
    def makespan_s(self) -> float:
        """Seconds until the last flow has arrived (0 without flows)."""
        return float(self.time_s.max()) if len(self.time_s) else 0.0


def step_times(fabric, flows: Flows, *, latency_s: float = 0.0, ecmp: str | None = None, groups=None,
               max_Bps=None) -> StepTimes:
    """Rates and times of `flows` all starting together on `fabric` (module docstring). `latency_s` is the α of a
    message (the NIC's); `ecmp` "split" or "hash" (default the fabric's); `groups` and `max_Bps` as in
    simfog.fabric.sharing.max_min_rates. Raises ConfigError on a flow the fabric cannot carry."""
    routes = fabric.route(flows, ecmp)
    rate = max_min_rates(routes, groups=groups, max_Bps=max_Bps)
    crossing = np.zeros(len(flows), dtype=bool)
    crossing[routes.flow] = True
    with np.errstate(divide="ignore"):
        t = latency_s + routes.hops * fabric.switch_latency_s + flows.nbytes / rate
    return StepTimes(np.where(crossing, rate, np.inf), np.where(crossing, t, 0.0), routes)
