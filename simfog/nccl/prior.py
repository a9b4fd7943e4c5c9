"""The learned prior of a network nobody measured: what a link of nominal rate R and transport T (InfiniBand, RoCE,
EFA, Slingshot through a plugin, TCP sockets) delivers to NCCL, as bus bandwidth and per-step latency, and how far
a prediction on it is from measured times.

Learned from the public nccl-tests corpus by `python bench/network_prior.py` (simfog/data/network_prior.toml,
provenance there): each cluster's calibrated inter-node bus bandwidth over its NICs' nominal rate (its
`efficiency`, the delivered fraction) and its latencyInter; a transport's prior is the geometric mean of its
clusters' efficiencies and the median of their latencies. The band is held out by cluster: every cluster's logs
predicted from the hardware it states and the prior of its transport learned WITHOUT it, the conformal half-widths
of those scores per message-size regime ("stated"); the same with the prior of every transport pooled, for a
network whose transport nobody states ("unstated"). A transport with no public data (RoCE and EFA at 3+ nodes
today) takes the pooled prior and the unstated band, and says so.

Where it is used: an experiment's `[cluster] transport = "tcp"` with links nobody measured (nic_bandwidth, no
network file): the NIC delivers nic_bandwidth x the transport's efficiency, its latency (when nic_latency is not
given) the prior's; the interval's network part of every run on links nobody measured is the prior's band
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

    def describe(self) -> str:
        """One line: what the prior says and what it rests on."""
        what = ("links of unstated transport" if self.transport == POOLED else f"{self.transport} links" if
                self.learned else f"{self.transport} links (no public data: the pooled prior)")
        return (f"{what} deliver {self.efficiency:.2g} x their nominal rate, latencyInter "
                f"{units.format_time(self.latency_inter_s)} (learned from {len(self.clusters)} public clusters: "
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
    out = {POOLED: Prior(POOLED, *pooled, widths["unstated"])}
    for t in TRANSPORTS:
        out[t] = Prior(t, *rows[t], widths["stated"]) if t in rows else Prior(t, *pooled, widths["unstated"], False)
    return out


def _row(d: dict, path: Path) -> tuple[float, float, tuple[str, ...]]:
    e = float(d["efficiency"])
    if not 0 < e <= 1.5:
        raise ValueError(path)
    return e, units.parse(d["latency_inter"], "time", field="latency_inter", source=str(path)), tuple(d["clusters"])


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
    derived from the hardware, between nodes the NICs' nominal rate x the efficiency, the prior's latencyInter, the
    channels derived per layout; no launch. Raises ConfigError without NICs or their rate."""
    k, rate = hardware.nics_per_node, hardware.nic_Bps
    if k is None or rate is None:
        raise ConfigError("nics_per_node", k, "NICs per node and their rate (a prior scales their nominal rate)")
    return replace(hardware, intra_bus_Bps=derived_bus_Bps(hardware, nodes=1), inter_bus_Bps=p.efficiency * k * rate,
                   latency_inter_s=p.latency_inter_s, launch_s=0.0, channels=None)


def delivered(nic: Link, transport: str, *, latency_given: bool) -> Link:
    """A NIC link of nominal bandwidth as the prior of `transport` says it delivers: the bandwidth x its efficiency,
    the latency its latencyInter unless one was given (`latency_given`)."""
    p = prior(transport)
    return Link(nic.latency_s if latency_given else p.latency_inter_s, nic.bandwidth_Bps * p.efficiency,
                nic.flow_bandwidth_Bps)
