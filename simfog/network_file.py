"""The network file (`network.toml`): a calibrated NCCL network, written by `simfog calibrate`, read by
experiments (`[cluster] network = "network.toml"`), `simfog collective`, sweep, curve, tune, plan and validate.

    [nccl]
    version = "2.21.5"            # the NCCL release, X.Y or X.Y.Z (its constant tables: simfog.nccl.releases)
    gpu_arch = "ampere"           # volta | ampere | hopper | blackwell
    cpu_vendor = "intel"          # intel | amd | arm
    intra_transport = "nvswitch"  # nvlink | nvswitch | pci
    nics_per_node = 4             # optional: rails, GPU i sends through NIC i mod 4 (default: unknown, no rails)
    nic_bandwidth = "200Gbit/s"   # optional: one NIC's line rate (derives channels and unfitted bandwidths)
    gpu_nic_path = "pxb"          # pix | pxb | pxn | phb | sys (LL128 is off beyond PXB, PXN on Hopper)
    channels = 8                  # the graph's nChannels with every NIC in use, or "hardware": derived per layout
    intra_bus_bandwidth = "204GB/s"    # nChannels·bwIntra on one node
    inter_bus_bandwidth = "130GB/s"    # nChannels·bw between nodes, every NIC in use
    latency_inter = "2.9us"            # the graph's latencyInter
    launch = "8.8us"                   # per operation, outside NCCL's model
    tree_fill = "0B"                   # simfog's additions, 0 / 1 = off: tree pipeline fill,
    two_node_tree_gain = 1.0           #   a 2-node tree's bandwidth / the inter-node one,
    net_latency_ll = "0us"             #   extra latency per inter-node step, by protocol
    net_latency_ll128 = "0us"
    net_latency_simple = "0us"
    p2p_latency = "6us"                # optional: alltoall / sendrecv (simfog.nccl.p2p), else derived
    p2p_nic_bandwidth = "20GB/s"
    p2p_intra_bandwidth = "200GB/s"
    nvls = false
    collnet = false

    [calibrated]                  # written by simfog calibrate: what the logs covered (extrapolation notes)
    release = "2.21.5"
    layouts = ["1x8", "2x8"]           # nodes x GPUs per node
    sizes = ["8B", "8GiB"]
    collectives = ["allreduce"]
    interval_source = "leave-a-scale-out: ..."  # the model's error on the logs' own larger scales, each predicted
    interval_levels = [0.5, 0.8, 0.9, 0.95, 0.99]   # from a fit of the smaller ones (simfog.nccl_intervals):
    interval_small = [0.03, 0.06, 0.08, 0.1, nan]   # conformal half-widths, ln(measured / predicted), per level,
    interval_medium = [...]                         # by message size: small < 64 KiB <= medium < 16 MiB <= large;
    interval_large = [...]                          # nan: too few points for that level
    interval_points = [40, 30, 24]                  # held-out points per regime (small, medium, large)

    [p2p]                         # optional: per-flow caps of the point-to-point model (simfog.p2p)
    nic_flow_bandwidth = "850Mbit/s"   # what ONE flow between nodes reaches (default: the NIC's bandwidth)
    intra_flow_bandwidth = "20GB/s"    # what one flow inside a node reaches (default: the intra link's)

    [provenance]                  # what the numbers rest on (free-form strings)
    fitted_from = "..."

Human units in the file, SI inside (simfog.units). Unknown keys are errors. A flow cap bounds each message of a
point-to-point exchange: k flows through one NIC run at min(cap, NIC bandwidth / k) each (simfog.cluster.Link).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from simfog import files, units
from simfog.errors import ConfigError
from simfog.nccl import NcclNetwork
from simfog.nccl.calibrated import Calibrated

_QUANTITIES = {"intra_bus_bandwidth": ("intra_bus_Bps", "bandwidth"),
               "inter_bus_bandwidth": ("inter_bus_Bps", "bandwidth"),
               "latency_inter": ("latency_inter_s", "time"), "launch": ("launch_s", "time"),
               "tree_fill": ("tree_fill_B", "bytes"), "nic_bandwidth": ("nic_Bps", "bandwidth"),
               "p2p_latency": ("p2p_latency_s", "time"), "p2p_nic_bandwidth": ("p2p_nic_Bps", "bandwidth"),
               "p2p_intra_bandwidth": ("p2p_intra_Bps", "bandwidth")}
_NET_LATENCY = ("net_latency_ll", "net_latency_ll128", "net_latency_simple")  # NcclNetwork.net_latency_s
_PLAIN = {"version": str, "gpu_arch": str, "cpu_vendor": str, "intra_transport": str, "channels": int,
          "nvls": bool, "collnet": bool, "nics_per_node": int, "gpu_nic_path": str, "two_node_tree_gain": float}
_REQUIRED = ("intra_bus_bandwidth", "inter_bus_bandwidth")
_FLOW_KEYS = {"nic_flow_bandwidth": "nic_Bps", "intra_flow_bandwidth": "intra_Bps"}
_FLOW_ALLOWED = 'a bandwidth > 0 with its unit, e.g. "850Mbit/s" (what one flow reaches; leave the key out for none)'


@dataclass(frozen=True)
class FlowCaps:
    """Per-flow caps (B/s) of the point-to-point model: between nodes (`nic_Bps`) and inside a node
    (`intra_Bps`); None: the link's bandwidth (simfog.cluster.Link.flow_bandwidth_Bps)."""

    nic_Bps: float | None = None
    intra_Bps: float | None = None

    def __post_init__(self):
        for key, name in _FLOW_KEYS.items():
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf):
                raise ConfigError(f"p2p.{key}", v, _FLOW_ALLOWED)

    @property
    def any(self) -> bool:
        return self.nic_Bps is not None or self.intra_Bps is not None


@dataclass(frozen=True)
class NetworkFile:
    """A loaded network file: the NCCL network, the point-to-point flow caps and its provenance strings."""

    nccl: NcclNetwork
    provenance: dict = field(default_factory=dict)
    path: str = ""
    flows: FlowCaps = FlowCaps()
    calibrated: Calibrated | None = None  # what the calibration's logs covered (None: not recorded)


def load(path: str | Path) -> NetworkFile:
    """Read a network file. Raises ConfigError naming the file, key, value and what is allowed."""
    path = str(path)
    text = files.read_text(path)
    doc = files.parse_toml(text, path, "a valid TOML network file")
    unknown = set(doc) - {"nccl", "p2p", "provenance", "calibrated"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "(section)", "one of the sections nccl, p2p, provenance, calibrated",
                          source=path)
    n = doc.get("nccl")
    if not isinstance(n, dict):
        raise ConfigError("nccl", "(missing)", "a [nccl] section (write one with `simfog calibrate ... -o`)",
                          source=path)
    kwargs: dict = {}
    latency = [0.0] * len(_NET_LATENCY)
    for key, value in n.items():
        if key in _QUANTITIES:
            name, kind = _QUANTITIES[key]
            kwargs[name] = units.parse(value, kind, field=f"nccl.{key}", source=path)
        elif key in _NET_LATENCY:
            latency[_NET_LATENCY.index(key)] = units.parse(value, "time", field=f"nccl.{key}", source=path)
        elif key == "channels" and value == "hardware":
            kwargs[key] = None
        elif key in _PLAIN:
            want = _PLAIN[key]
            if type(value) is not want and not (want is float and type(value) is int):
                raise ConfigError(f"nccl.{key}", value, f"a {want.__name__}" + (
                    ' or "hardware" (derived per layout)' if key == "channels" else ""), source=path)
            kwargs[key] = float(value) if want is float else value
        else:
            raise ConfigError(f"nccl.{key}", value, f"one of {', '.join([*_QUANTITIES, *_NET_LATENCY, *_PLAIN])}",
                              source=path)
    kwargs["net_latency_s"] = tuple(latency)
    for key in _REQUIRED:
        if key not in n:
            raise ConfigError(f"nccl.{key}", "(missing)", 'a bandwidth such as "120GB/s"', source=path)
    try:
        net = NcclNetwork(**kwargs)
    except ConfigError as e:
        raise e.in_file(path) from None
    prov = doc.get("provenance", {})
    if not isinstance(prov, dict):
        raise ConfigError("provenance", prov, "a table of strings", source=path)
    covered = Calibrated.from_toml(doc["calibrated"], path) if "calibrated" in doc else None
    return NetworkFile(net, prov, path, _flow_caps(doc.get("p2p", {}), path), covered)


def _flow_caps(section: object, path: str) -> FlowCaps:
    """The [p2p] section: per-flow caps, each a bandwidth > 0 with its unit."""
    if not isinstance(section, dict):
        raise ConfigError("p2p", section, f"a table with {' and/or '.join(_FLOW_KEYS)}", source=path)
    caps = {}
    for key, value in section.items():
        if key not in _FLOW_KEYS:
            raise ConfigError(f"p2p.{key}", value, f"one of {', '.join(_FLOW_KEYS)}", source=path)
        bw = units.parse(value, "bandwidth", field=f"p2p.{key}", source=path)
        if not bw > 0:
            raise ConfigError(f"p2p.{key}", value, _FLOW_ALLOWED, source=path)
        caps[_FLOW_KEYS[key]] = bw
    return FlowCaps(**caps)


def dumps(net: NcclNetwork, provenance: dict[str, str] | None = None, flows: FlowCaps = FlowCaps(),
          calibrated: Calibrated | None = None) -> str:
    """The TOML text of a network file (human units, 6 significant figures; flow caps, when any, in bit/s with
    every digit, so that a cap written and read back is the same float)."""
    lines = ["# simfog network file: NCCL's cost model with calibrated parameters (see simfog/nccl/)", "[nccl]"]
    for key in ("version", "gpu_arch", "cpu_vendor", "intra_transport", "gpu_nic_path"):
        lines.append(f'{key} = "{getattr(net, key)}"')
    if net.nics_per_node is not None:
        lines.append(f"nics_per_node = {net.nics_per_node}")
    if net.nic_Bps is not None:
        lines.append(f'nic_bandwidth = "{net.nic_Bps * 8 / 1e9:.6g}Gbit/s"')
    lines.append(f"channels = {net.channels}" if net.channels is not None else 'channels = "hardware"')
    lines.append(f'intra_bus_bandwidth = "{net.intra_bus_Bps / 1e9:.6g}GB/s"')
    lines.append(f'inter_bus_bandwidth = "{net.inter_bus_Bps / 1e9:.6g}GB/s"')
    lines.append(f'latency_inter = "{net.latency_inter_s * 1e6:.6g}us"')
    lines.append(f'launch = "{net.launch_s * 1e6:.6g}us"')
    lines.append(f'tree_fill = "{net.tree_fill_B:.6g}B"')
    lines.append(f"two_node_tree_gain = {net.two_node_tree_gain:.6g}")
    for key, value in zip(_NET_LATENCY, net.net_latency_s, strict=True):
        lines.append(f'{key} = "{value * 1e6:.6g}us"')
    if net.p2p_latency_s is not None:
        lines.append(f'p2p_latency = "{net.p2p_latency_s * 1e6:.6g}us"')
    for key, name in (("p2p_nic_bandwidth", "p2p_nic_Bps"), ("p2p_intra_bandwidth", "p2p_intra_Bps")):
        if getattr(net, name) is not None:
            lines.append(f'{key} = "{getattr(net, name) / 1e9:.6g}GB/s"')
    lines.append(f"nvls = {str(net.nvls).lower()}")
    lines.append(f"collnet = {str(net.collnet).lower()}")
    if flows.any:
        lines += ["", "[p2p]"]
        for key, name in _FLOW_KEYS.items():
            if getattr(flows, name) is not None:
                lines.append(f'{key} = "{getattr(flows, name) * 8!r}bit/s"')
    if calibrated is not None:
        lines += ["", "[calibrated]"]
        for k, v in calibrated.to_toml().items():
            lines.append(f"{k} = " + (_toml_string(v) if isinstance(v, str) else
                                      "[" + ", ".join(_toml_value(x) for x in v) + "]"))
    if provenance:
        lines += ["", "[provenance]"]
        for k, v in provenance.items():
            lines.append(f"{k} = {_toml_string(str(v))}")
    return "\n".join(lines) + "\n"


def save(path: str | Path, net: NcclNetwork, provenance: dict[str, str] | None = None,
         flows: FlowCaps = FlowCaps(), calibrated: Calibrated | None = None) -> None:
    """Write a network file atomically."""
    with files.atomic_open(path) as f:
        f.write(dumps(net, provenance, flows, calibrated))


def _toml_value(x) -> str:
    """A number as TOML writes it (repr: read back as the same float; nan as nan), anything else as a string."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return "nan" if x != x else repr(x)
    return _toml_string(str(x))


def _toml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
