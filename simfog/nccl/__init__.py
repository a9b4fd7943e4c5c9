"""NCCL's own cost model as pure functions: the time of one collective per algorithm and protocol, and the choice
NCCL makes (the least predicted time, or what NCCL_ALGO / NCCL_PROTO force), for every release from 2.8 on.

- `releases`: the constants of each release (tables per release where they changed; `tables("2.21.5")`);
- `network`: NcclNetwork, the cluster as NCCL's tuner sees it (hardware facts, fitted parameters, rails);
- `model`: the formulas of tuning.cc for allreduce, allgather, reduce-scatter, broadcast, reduce;
- `p2p`: alltoall and send/recv through NCCL's point-to-point path (simfog's model: no tuning table covers them);
- `batch`: the same, vectorized over message sizes (for fitting);
- `calibrated`: what a calibration covered, and how a prediction leaves it.

Units: NCCL's tables are µs and GB/s; everything crossing this package's boundary is SI (s, B/s).
"""

from __future__ import annotations

from dataclasses import dataclass

from simfog.errors import ConfigError, Infeasible
from simfog.nccl import p2p
from simfog.nccl.model import COLLECTIVES, bandwidth_GBps, latency_us, ll128_enabled, runtime_channels
from simfog.nccl.model import time_s as _collective_time_s
from simfog.nccl.network import CPU_VENDORS, TRANSPORTS, NcclNetwork, derived_bus_Bps, derived_channels
from simfog.nccl.releases import ALGOS, ARCHS, NEWEST, PATHS, PROTOS, parse_release, tables

OPS = COLLECTIVES + p2p.OPS
P2P = "p2p"  # the "algorithm" NCCL's point-to-point path stands for in a Choice

__all__ = ["ALGOS", "ARCHS", "CPU_VENDORS", "NEWEST", "OPS", "PATHS", "PROTOS", "TRANSPORTS", "Choice", "NcclNetwork",
           "bandwidth_Bps", "choose", "derived_bus_Bps", "derived_channels", "estimate_s", "latency_s", "ll128_enabled",
           "parse_release", "runtime_channels", "tables", "time_s"]


@dataclass(frozen=True)
class Choice:
    """NCCL's pick for one operation: seconds, algorithm and protocol ("p2p"/"Simple" for alltoall, sendrecv)."""

    time_s: float
    algorithm: str
    protocol: str


def bandwidth_Bps(op: str, algo: str, proto: str, ranks: int, nodes: int, net: NcclNetwork) -> float:
    """NCCL's algorithm bandwidth (B/s) before the size-dependent corrections (simfog.nccl.model)."""
    _check(op, algo, proto)
    return bandwidth_GBps(op, algo, proto, ranks, nodes, net) * 1e9


def latency_s(op: str, algo: str, proto: str, ranks: int, nodes: int, net: NcclNetwork) -> float:
    """NCCL's latency (s) before the ring plateau (simfog.nccl.model)."""
    _check(op, algo, proto)
    return latency_us(op, algo, proto, ranks, nodes, net) * 1e-6


def time_s(op: str, nbytes: float, ranks: int, nodes: int, net: NcclNetwork, algo: str, proto: str) -> float | None:
    """Seconds for one `op` of `nbytes` (nccl-tests' size) with the given algorithm and protocol as the network
    delivers it (NCCL's formula on the channels it launches, simfog.nccl.model.launched_fraction), plus
    net.launch_s; None where NCCL would not use that pair. A single rank costs 0. Raises ConfigError for an
    unknown op, algorithm or protocol."""
    _check(op, algo, proto)
    return _collective_time_s(op, nbytes, ranks, nodes, net, algo, proto)


def estimate_s(op: str, nbytes: float, ranks: int, nodes: int, net: NcclNetwork, algo: str,
               proto: str) -> float | None:
    """NCCL's own estimate for one `op` of `nbytes` (ncclTopoGetAlgoTime: what it chooses with, the number its
    tuning tables print): every channel, a 2-node tree at the bandwidth its search assumes, no launch; None where
    NCCL would not use the pair. time_s is what the network delivers."""
    _check(op, algo, proto)
    return _collective_time_s(op, nbytes, ranks, nodes, net, algo, proto, nccl_view=True)


def choose(op: str, nbytes: float, ranks: int, nodes: int, net: NcclNetwork, *,
           algorithms: tuple[str, ...] | None = None, protocols: tuple[str, ...] | None = None) -> Choice:
    """NCCL's choice: the (algorithm, protocol) with the least predicted time among those allowed (and among
    `algorithms` / `protocols` when given, as NCCL_ALGO / NCCL_PROTO restrict them). Ties keep NCCL's loop
    order (ALGOS, then LL, LL128, Simple). NCCL chooses with its own estimates; the time returned is the chosen
    pair's with what the network delivers (they differ only for 2-node trees and CollNet: model.graph_bus_GBps).
    alltoall and sendrecv take the point-to-point path (simfog.nccl.p2p),
    whatever is forced. Raises Infeasible when nothing is left, ConfigError for an unknown op."""
    if op not in OPS:
        raise ConfigError("op", op, f"one of {', '.join(OPS)}")
    if ranks <= 1:
        return Choice(0.0, "none", "none")
    if op in p2p.OPS:
        return Choice(p2p.time_s(op, nbytes, ranks, nodes, net), P2P, "Simple")
    best: tuple[float, str, str] | None = None
    for algo in algorithms or ALGOS:
        for proto in protocols or PROTOS:
            _check(op, algo, proto)
            t = _collective_time_s(op, nbytes, ranks, nodes, net, algo, proto, nccl_view=True)
            if t is not None and (best is None or t < best[0]):
                best = (t, algo, proto)
    if best is None:
        raise Infeasible(f"NCCL {net.version} has no algorithm for {op} on {ranks} ranks over {nodes} nodes among "
                         f"algorithms {', '.join(algorithms or ALGOS)} and protocols {', '.join(protocols or PROTOS)}")
    _, algo, proto = best  # chosen by NCCL's view; the time is what the network delivers
    return Choice(_collective_time_s(op, nbytes, ranks, nodes, net, algo, proto), algo, proto)


def _check(op: str, algo: str, proto: str) -> None:
    if op not in COLLECTIVES:
        raise ConfigError("op", op, f"one of {', '.join(COLLECTIVES)} (alltoall and sendrecv: choose)")
    if algo not in ALGOS:
        raise ConfigError("nccl.algorithm", algo, f"one of {', '.join(ALGOS)}")
    if proto not in PROTOS:
        raise ConfigError("nccl.protocol", proto, f"one of {', '.join(PROTOS)}")
