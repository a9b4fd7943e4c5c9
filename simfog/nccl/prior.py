"""The learned prior of a network nobody measured: what a link of nominal rate R and transport T (InfiniBand, RoCE,
EFA, Slingshot through a plugin, TCP sockets) delivers to NCCL, as bus bandwidth and per-step latency, and how far
a prediction on it is from measured times.

Two forms, chosen by what limits the transport (not fitted): RDMA transports (ib, roce, efa, slingshot) deliver a
fraction of the line rate, `efficiency`; TCP sockets are bound by the CPU moving the bytes (NCCL's socket threads),
not by the line, so they deliver at most a rate per NIC, `cap` (min(R, cap)): a cap learned on 200 Gbit/s NICs
does not say that 25 Gbit/s ones lose the same fraction.

Learned from the public nccl-tests corpus by `python bench/network_prior.py` (simfog/data/network_prior.toml,
provenance there): each cluster's calibrated inter-node bus bandwidth over its NICs' nominal rate (its
`efficiency`, the delivered fraction; per NIC, its delivered rate) and its latencyInter; a transport's prior is the
geometric mean of its clusters' efficiencies (delivered rates for a cap) and the median of their latencies. The band
is held out by cluster: every cluster's multi-node logs predicted from the hardware it states and the prior of its
transport learned WITHOUT it, the conformal half-widths of those scores per message-size regime ("stated"); the
same with the prior of every transport pooled (a fraction), for a network whose transport nobody states
("unstated"). A transport with no public data (RoCE and EFA at 3+ nodes today), or whose only cluster is the one
predicted, takes the pooled prior and the unstated band, and says so.

Where it is used: an experiment's `[cluster] transport = "tcp"` with links nobody measured (nic_bandwidth, no
network file): the NIC delivers what the transport's prior says of nic_bandwidth, its latency (when nic_latency is
not given) the prior's; the interval's network part of every run on links nobody measured is the prior's band
(simfog.run_bands), not a default x/2. Gloo and MPI: the corpus holds no public Gloo or MPI log at 3+ nodes, so the
NCCL prior stands for them too, and the band's source says so.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from simfog import units
from simfog.bands import HalfWidths, Part
from simfog.cluster import Link
from simfog.errors import ConfigError
from simfog.nccl.clusters import TRANSPORTS
from simfog.nccl.network import NcclNetwork, derived_bus_Bps

PRIOR_TABLE = Path(__file__).parents[1] / "data" / "network_prior.toml"
POOLED = "pooled"
TRANSPORT_ALLOWED = f"one of {', '.join(TRANSPORTS)} (the link's transport; simfog.nccl.prior)"


@dataclass(frozen=True)
class Prior:
    """What links of one transport deliver (module docstring): `efficiency` (delivered bus bandwidth / the NICs'
    nominal rate), `latency_inter_s` (NCCL's latencyInter), the clusters it was learned from and the band of
    predictions on it."""

    transport: str
    efficiency: float
    latency_inter_s: float
    clusters: tuple[str, ...]
    widths: HalfWidths
    learned: bool = True  # False: no public cluster of this transport, the pooled prior stands in
    cap_Bps: float | None = None  # a CPU-bound transport's most per NIC (B/s); None: the fraction of the line

    def per_nic_Bps(self, nominal_Bps: float) -> float:
        """What one NIC of `nominal_Bps` delivers: min(nominal, cap) for a capped transport, else efficiency x it."""
        return min(nominal_Bps, self.cap_Bps) if self.cap_Bps is not None else self.efficiency * nominal_Bps

    def describe(self) -> str:
        """One line: what the prior says and what it rests on."""
        what = ("links of unstated transport" if self.transport == POOLED else f"{self.transport} links" if
                self.learned else f"{self.transport} links (no public data: the pooled prior)")
        rate = (f"at most {units.format_bandwidth(self.cap_Bps)} per NIC" if self.cap_Bps is not None else
                f"{self.efficiency:.2g} x their nominal rate")
        return (f"{what} deliver {rate}, latencyInter {units.format_time(self.latency_inter_s)} (learned from "
                f"{len(self.clusters)} public cluster{'s' if len(self.clusters) != 1 else ''}: "
                f"{', '.join(self.clusters)})")


def check_transport(value: object, *, field: str = "cluster.transport", source: str | None = None) -> str:
    """`value` as a transport name. Raises ConfigError naming `field` otherwise."""
    if value not in TRANSPORTS:
        raise ConfigError(field, value, TRANSPORT_ALLOWED, source=source)
    return str(value)


@cache
def priors(path: Path = PRIOR_TABLE) -> dict[str, Prior]:
    """Every transport's prior and the pooled one (POOLED), as the table holds them: a transport without its own
    section takes the pooled efficiency and latency and the unstated band. Raises ConfigError naming the file."""
    try:
        doc = tomllib.loads(path.read_text())
        widths = {k: HalfWidths.from_toml(doc["widths"][k], f"{path} [widths.{k}]") for k in ("stated", "unstated")}
        rows = {name: _row(doc["transport"][name], path) for name in doc["transport"]}
        pooled = _row(doc[POOLED], path)
    except (OSError, KeyError, TypeError, ValueError, tomllib.TOMLDecodeError):
        raise ConfigError("prior", "(unreadable)", "the table bench/network_prior.py --write writes",
                          source=str(path)) from None
    out = {POOLED: Prior(POOLED, *pooled[0], widths["unstated"])}
    for t in TRANSPORTS:
        out[t] = (Prior(t, *rows[t][0], widths["stated"], cap_Bps=rows[t][1]) if t in rows else
                  Prior(t, *pooled[0], widths["unstated"], False))
    return out


def _row(d: dict, path: Path) -> tuple:
    """(efficiency, latencyInter s, clusters) of a table row, and its cap (B/s, None without)."""
    e = float(d["efficiency"])
    if not 0 < e <= 1.5:
        raise ValueError(path)
    cap = units.parse(d["cap"], "bandwidth", field="cap", source=str(path)) if "cap" in d else None
    return (e, units.parse(d["latency_inter"], "time", field="latency_inter", source=str(path)),
            tuple(d["clusters"])), cap


def prior(transport: str | None) -> Prior:
    """The prior of `transport` (None: unstated, the pooled one)."""
    return priors()[POOLED if transport is None else check_transport(transport)]


def network_part(transport: str | None, sizes: Sequence[float], level: float, *, what: str = "") -> Part:
    """The network part of a run on links nobody measured whose collectives move messages of `sizes`: the prior's
    half-width (the widest over the sizes' regimes) for `transport` (None: unstated). Marked unmeasured (the user's
    network was not measured), its width the prior's held-out one; too few points for the level: the widest the
    prior's points show, at least the default."""
    p = prior(transport)
    widths = [p.widths.half_width(s, level) for s in sizes]
    note = (f"{what}links nobody measured: the prior of {p.describe()}; band held out by cluster "
            f"({p.widths.source}); NCCL logs, taken for Gloo / MPI too")
    if any(w is None for w in widths) or not widths:
        return Part.unmeasured("network", note, at_least=max((p.widths.widest(s) for s in sizes), default=0.0))
    w = max(widths)
    return Part("network", w, w, f"UNMEASURED ({note}): x/{math.exp(w):.3g}", measured=False)


def unmeasured_network(hardware: NcclNetwork, p: Prior) -> NcclNetwork:
    """The NCCL network a prior predicts for `hardware` (NICs and their rate given): one node's bus bandwidth as
    derived from the hardware, between nodes what the NICs deliver of their nominal rate, the prior's latencyInter, the
    channels derived per layout; no launch. Raises ConfigError without NICs or their rate."""
    k, rate = hardware.nics_per_node, hardware.nic_Bps
    if k is None or rate is None:
        raise ConfigError("nics_per_node", k, "NICs per node and their rate (a prior scales their nominal rate)")
    return replace(hardware, intra_bus_Bps=derived_bus_Bps(hardware, nodes=1), inter_bus_Bps=k * p.per_nic_Bps(rate),
                   latency_inter_s=p.latency_inter_s, launch_s=0.0, channels=None)


def delivered(nic: Link, transport: str, *, latency_given: bool) -> Link:
    """A NIC link of nominal bandwidth as the prior of `transport` says it delivers (Prior.per_nic_Bps), the
    latency its latencyInter unless one was given (`latency_given`)."""
    p = prior(transport)
    return Link(nic.latency_s if latency_given else p.latency_inter_s, p.per_nic_Bps(nic.bandwidth_Bps),
                nic.flow_bandwidth_Bps)
