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
    interval_levels = [0.5, 0.8, 0.9, 0.95, 0.99]   # from a fit of the smaller ones (simfog.nccl.bands):
    interval_small = [0.03, 0.06, 0.08, 0.1, nan]   # conformal half-widths, ln(measured / predicted), per level,
    interval_medium = [...]                         # by message size: small < 64 KiB <= medium < 16 MiB <= large;
    interval_large = [...]                          # nan: too few points for that level
    interval_points = [40, 30, 24]                  # held-out points per regime (small, medium, large)
    inside_source = "leave-a-scale-in: ..."  # the same keys for a prediction within the logs' node counts: each
    inside_levels = [0.5, 0.8, 0.9, 0.95, 0.99]     # count between the fewest and the most predicted from a fit
    inside_small = [...]                            # of every other (logs of 4+ node counts; else absent)
    inside_points = [20, 16, 12]

    [p2p]                         # optional: per-flow caps of the point-to-point model (simfog.p2p)
    nic_flow_bandwidth = "850Mbit/s"   # what ONE flow between nodes reaches (default: the NIC's bandwidth)
    intra_flow_bandwidth = "20GB/s"    # what one flow inside a node reaches (default: the intra link's)

    [provenance]                  # what the numbers rest on (free-form strings)
    fitted_from = "..."

    [scale_out]                   # optional: the switches between the nodes (simfog.nccl.scale_out): kind,
    kind = "rail"                 #   nodes_per_leaf, uplinks, oversubscription, ecmp

    [cluster]                     # optional: the cluster the file describes (simfog.nccl.clusters; the shipped
    name = "polaris-a100-ofi"     #   clusters have it): its GPU, GPUs per node, NICs, fabric, transport, ...

A shipped cluster's name stands for its network file wherever a path is accepted (`network = "polaris-a100-ofi"`,
`--network NAME`; `simfog list clusters`): `load_named`. A file with a [cluster] section gives the cluster's layout:
its GPUs per node unless the experiment states them, and an experiment stating others is refused (`use`).

What a network file means for a cluster (`use`, the one function every reader calls): its calibrated bus bandwidths
and inter-node latency are the links (intra: intra_bus_bandwidth; between nodes: inter_bus_bandwidth and
latency_inter; the intra-node latency stays the cluster's), its [p2p] caps their per-flow caps, and the collective
defaults to "nccl". A link key written beside it (intra_bandwidth, nic_bandwidth, nic_latency) is ignored with a
warning naming both; a flow cap both there and in the file's [p2p] section is an error. A cluster the file was not
calibrated for (GPUs per node, NICs, GPU generation) and a parameter its calibration fitted to a bound are named in
one-line warnings.

Human units in the file, SI inside (simfog.units). Unknown keys are errors. A flow cap bounds each message of a
point-to-point exchange: k flows through one NIC run at min(cap, NIC bandwidth / k) each (simfog.cluster.Link).

Over 400 lines: the file's format, its reader, its writer and its one meaning for a cluster (`use`) are one contract;
split, a key would have to be changed in several modules at once.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from simfog import files, units
from simfog.cluster import Link
from simfog.errors import Caveat, ConfigError, SimfogWarning, did_you_mean, one_of
from simfog.nccl import NcclNetwork, clusters
from simfog.nccl.calibrated import Calibrated
from simfog.nccl.clusters import ClusterFacts
from simfog.nccl.scale_out import FabricSpec

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
    cluster: ClusterFacts | None = None    # the cluster the file describes (the shipped ones do; None: not said)


def load(path: str | Path) -> NetworkFile:
    """Read a network file. Raises ConfigError naming the file, key, value and what is allowed."""
    path = str(path)
    text = files.read_text(path)
    doc = files.parse_toml(text, path, "a valid TOML network file")
    unknown = set(doc) - {"nccl", "p2p", "provenance", "calibrated", "cluster", "scale_out"}
    if unknown:
        sections = ("nccl", "p2p", "provenance", "calibrated", "cluster", "scale_out")
        raise ConfigError(sorted(unknown)[0], "(section)", "one of the sections " + ", ".join(sections)
                          + did_you_mean(sorted(unknown)[0], sections), source=path)
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
            raise ConfigError(f"nccl.{key}", value, one_of(key, [*_QUANTITIES, *_NET_LATENCY, *_PLAIN]),
                              source=path)
    kwargs["net_latency_s"] = tuple(latency)
    if "scale_out" in doc:
        kwargs["fabric"] = FabricSpec.from_toml(doc["scale_out"], path)
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
    described = ClusterFacts.from_toml(doc["cluster"], path) if "cluster" in doc else None
    return NetworkFile(net, prov, path, _flow_caps(doc.get("p2p", {}), path), covered, described)


class NetworkFileWarning(SimfogWarning):
    """A network file used where it does not quite fit: another layout or GPU than it was calibrated on."""


# The cluster keys a network file sets, and the key of the file that sets each.
LINK_KEYS = {"intra_bandwidth": "nccl.intra_bus_bandwidth", "nic_bandwidth": "nccl.inter_bus_bandwidth",
             "nic_latency": "nccl.latency_inter"}
FLOW_CLUSTER_KEYS = {"nic_flow_bandwidth": "nic_Bps", "intra_flow_bandwidth": "intra_Bps"}


def given_keys(table: Mapping, given: Mapping) -> dict:
    """A cluster table ([cluster], a catalogue's [[option]]) with the keys `given` elsewhere (the command line's
    --network, --nic-bandwidth, ...) in place of its own. A network given replaces the table's network_trace and the
    links its file sets (LINK_KEYS) unless those are given too: the links are then the new file's, with no warning
    about keys the user did not write beside it."""
    out = dict(table)
    if "network" in given:
        for key in ("network_trace", *LINK_KEYS):
            out.pop(key, None)
    return {**out, **given}


def use(value: object, base_dir: str | Path, *, field: str, source: str | None = None, gpus_per_node: int | None,
        intra_latency_s: float = 0.0, written: Mapping[str, object] = {}, prefix: str = "",
        device: str | None = None) -> tuple[NetworkFile, Link, Link]:
    """The network file that `field` names (`value`, a path relative to `base_dir` or a shipped cluster's name)
    loaded and applied to a cluster of `gpus_per_node` GPUs per node (None: the file's cluster's, else 1;
    `layout_gpus`): (the file, the intra-node link, the inter-node link). The one loader of `[cluster] network`, a
    catalogue option's `network` and `simfog collective --network`, with the one meaning the module's docstring
    gives.

    Raises ConfigError naming `field` for a path that is not a network file (a measured NetworkTrace: run `simfog
    calibrate` first) or a name no shipped cluster has, naming `prefix` + gpus_per_node for GPUs per node other
    than the file's cluster's, or naming `prefix` + key for a flow cap of `written` (the keys given beside it) that
    the file's [p2p] section sets too. Warns (NetworkFileWarning, one line naming both sides) for a link key of
    `written`, which the file's value replaces; when the file was calibrated on other GPUs per node, on more
    NICs than GPUs per node, or on another GPU generation than `device` (the trace's GPU); and for a parameter its
    calibration fitted to a bound of the fit, or two it could not separate."""
    net = load_named(value, base_dir, field=field, source=source)
    gpus_per_node = layout_gpus(net, gpus_per_node, field=f"{prefix}gpus_per_node", named=f"{field} = {value!r}",
                                source=source)
    where = f"{source}: " if source else ""
    for key, theirs in LINK_KEYS.items():
        if key in written:
            warnings.warn(f"{where}{prefix}{key} = {written[key]!r} is ignored: the network file {net.path} sets the "
                          f"links ({theirs}); leave the key out", NetworkFileWarning, stacklevel=2)
    for key, name in FLOW_CLUSTER_KEYS.items():
        if key in written and getattr(net.flows, name) is not None:
            raise ConfigError(f"{prefix}{key}", written[key], f"either here or in the network file's [p2p] section "
                              f"({net.path}), not both", source=source)
    _warn_if_mismatched(net, gpus_per_node, device, where=f"{source}: {field}" if source else field)
    _warn_if_fit_at_bound(net, where=f"{source}: {field}" if source else field)
    n = net.nccl
    return (net, Link(intra_latency_s, n.intra_bus_Bps, net.flows.intra_Bps),
            Link(n.latency_inter_s, n.inter_bus_Bps, net.flows.nic_Bps))


def layout_gpus(net: NetworkFile, stated: int | None, *, field: str, named: str, source: str | None = None) -> int:
    """The GPUs per node of a cluster on `net`: the file's cluster's (its [cluster] section) or `stated`, which must
    then be the same (ConfigError naming `field` and both numbers); 1 where neither says."""
    if net.cluster is None:
        return 1 if stated is None else stated
    if stated is not None and stated != net.cluster.gpus_per_node:
        raise ConfigError(field, stated, f"{net.cluster.gpus_per_node}, the GPUs per node of cluster "
                          f"{net.cluster.name} ({named}): leave gpus_per_node out to take the cluster's, or name "
                          "another network", source=source)
    return net.cluster.gpus_per_node


def load_named(value: object, base_dir: str | Path, *, field: str, source: str | None = None) -> NetworkFile:
    """The network file a key or option names: a path, or a shipped cluster's name (simfog.nccl.clusters).
    ConfigError naming `field` for anything but an existing network file or a shipped name (a NetworkTrace's JSON,
    the input of `simfog calibrate`, is named as such; an unknown name gets the list of the shipped ones), and for
    a value that names both a file and a shipped cluster."""
    allowed = "a path to a network file (simfog calibrate NET.json.gz -o network.toml) or a shipped cluster's name"
    if not isinstance(value, str) or not value:
        raise ConfigError(field, value, allowed + f" ({', '.join(clusters.names())})", source=source)
    path = files.resolve(base_dir, value, field=field, source=source)
    shipped = clusters.path_of(value)
    if shipped is not None:
        if path.is_file():
            raise ConfigError(field, value, f"either the network file {path} or the shipped cluster {value}, not both "
                              f"(this names both): write ./{value} for the file, or rename it", source=source)
        return load(shipped)
    if not path.is_file():
        if clusters.looks_like_name(value):
            raise clusters.unknown(value, field, source)
        raise ConfigError(field, value, f"an existing network file ({path})", source=source)
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if path.name.endswith((".json", ".json.gz")) or head.startswith((b"{", b"\x1f\x8b")):
        raise ConfigError(field, value, f"a network file (TOML); this is JSON, a measured network trace: run "
                          f"`simfog calibrate {value} -o network.toml` first and name network.toml here",
                          source=source)
    return load(path)


def _warn_if_mismatched(net: NetworkFile, gpus_per_node: int, device: str | None, where: str) -> None:
    """One NetworkFileWarning per way the cluster leaves what the file was calibrated on."""
    from simfog.nccl.facts import arch_of_name, other_device

    said = []
    covered = net.calibrated
    calibrated_gpus = sorted({g for _, g in covered.layouts}) if covered is not None else []
    if calibrated_gpus and gpus_per_node not in calibrated_gpus:
        layouts = ", ".join(f"{n}x{g}" for n, g in covered.layouts)
        said.append(f"{gpus_per_node} GPUs per node, but {net.path} was calibrated on "
                    f"{' and '.join(map(str, calibrated_gpus))} GPUs per node (layouts {layouts})")
    nics = net.nccl.nics_per_node
    if nics is not None and gpus_per_node < nics:
        said.append(f"{gpus_per_node} GPUs per node, but {net.path} has nics_per_node = {nics}: its inter-node bus "
                    "bandwidth assumes every NIC in use, more than these GPUs drive")
    arch = arch_of_name(device) if device else None
    other = other_device({"name": device}, covered.gpu) if device and covered is not None and covered.gpu else None
    if other:  # by name: an H200 trace on H100 logs shares the generation, not the compute times
        said.append(f"{other}, the GPU of the logs {net.path} was calibrated on")
    elif arch is not None and arch != net.nccl.gpu_arch:
        said.append(f"the trace's GPU is {device} ({arch}), but {net.path} has gpu_arch = {net.nccl.gpu_arch!r}")
    for text in said:
        warnings.warn(f"{where}: {text}", NetworkFileWarning, stacklevel=3)


# The fitted parameters, as `simfog calibrate` names them in [provenance] fitted, that can be pushed against a bound
# of the fit: a latency or launch time against 0, the inter-node bus bandwidth against the NICs' line rate.
_AT_ZERO = {"latencyInter": "latency_inter_s", "latencyInter (simfog's before NCCL 2.12)": "latency_inter_s",
            "launch": "launch_s", "p2p latency per peer": "p2p_latency_s"}
_AT_BOUND = 1e-9  # s: a fitted time this close to 0 sits on the bound (a fit on A100 logs gave 6.13e-12 s)


def _warn_if_fit_at_bound(net: NetworkFile, where: str) -> None:
    """One NetworkFileWarning per fitted parameter at a bound of the fit (at_bound)."""
    for short, why in at_bound(net):
        warnings.warn(f"{where}: {short}: {why}", NetworkFileWarning, stacklevel=3)


def at_bound(net: NetworkFile) -> list[tuple[str, str]]:
    """(what, why) per fitted parameter (its [provenance] fitted) that sits at a bound of the fit: the logs did not
    determine it. Launch and latencyInter both fitted, one of them at 0: the logs cannot separate them."""
    fitted = {f.strip() for f in str(net.provenance.get("fitted", "")).split(",")}
    n = net.nccl
    latency = next((f for f in fitted if f.startswith("latencyInter")), None)
    out = []
    for name in sorted(fitted & set(_AT_ZERO)):
        value = getattr(n, _AT_ZERO[name]) or 0.0
        if value > _AT_BOUND:
            continue
        shown = f"{name} = {value * 1e6:.3g} us, at its fit's bound 0 us"
        pair = latency if name == "launch" else "launch" if name == latency else None
        if pair in fitted:
            out.append((shown, f"the logs of {net.path} cannot separate {name} from {pair} (another log, e.g. one "
                               "node's, would)"))
        else:
            out.append((shown, f"the logs of {net.path} do not determine it"))
    if "bus bandwidth between nodes" in fitted and n.nics_per_node and n.nic_Bps:
        wire = n.nics_per_node * n.nic_Bps
        if n.inter_bus_Bps >= wire * (1 - 1e-5):  # the file keeps 6 significant figures
            out.append((f"bus bandwidth between nodes = {n.inter_bus_Bps / 1e9:.4g} GB/s, at its fit's bound "
                        f"{wire / 1e9:.4g} GB/s (nics_per_node x nic_bandwidth)",
                        f"the logs of {net.path} do not determine it"))
    return out


def caveats(net: NetworkFile) -> list[Caveat]:
    """What every prediction on this network file carries about its calibration: POOR FIT and FLAGGED (its
    [calibrated] fit_* keys) and AT BOUND per parameter the fit left at a bound."""
    quality = net.calibrated.quality if net.calibrated is not None else None
    return [*(quality.caveats() if quality is not None else []),
            *(Caveat("AT BOUND", short) for short, _ in at_bound(net))]


def _flow_caps(section: object, path: str) -> FlowCaps:
    """The [p2p] section: per-flow caps, each a bandwidth > 0 with its unit."""
    if not isinstance(section, dict):
        raise ConfigError("p2p", section, f"a table with {' and/or '.join(_FLOW_KEYS)}", source=path)
    caps = {}
    for key, value in section.items():
        if key not in _FLOW_KEYS:
            raise ConfigError(f"p2p.{key}", value, one_of(key, _FLOW_KEYS), source=path)
        bw = units.parse(value, "bandwidth", field=f"p2p.{key}", source=path)
        if not bw > 0:
            raise ConfigError(f"p2p.{key}", value, _FLOW_ALLOWED, source=path)
        caps[_FLOW_KEYS[key]] = bw
    return FlowCaps(**caps)


def dumps(net: NcclNetwork, provenance: dict[str, str] | None = None, flows: FlowCaps = FlowCaps(),
          calibrated: Calibrated | None = None, cluster: ClusterFacts | None = None) -> str:
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
            lines.append(f"{k} = {_toml_any(v)}")
    for name, section in (("scale_out", net.fabric.to_toml() if net.fabric is not None else {}),
                          ("cluster", cluster.to_toml() if cluster is not None else {}),
                          ("provenance", {k: str(v) for k, v in (provenance or {}).items()})):
        if section:
            lines += ["", f"[{name}]"]
            lines += [f"{k} = {_toml_any(v)}" for k, v in section.items()]
    return "\n".join(lines) + "\n"


def save(path: str | Path, net: NcclNetwork, provenance: dict[str, str] | None = None,
         flows: FlowCaps = FlowCaps(), calibrated: Calibrated | None = None,
         cluster: ClusterFacts | None = None) -> None:
    """Write a network file atomically."""
    with files.atomic_open(path) as f:
        f.write(dumps(net, provenance, flows, calibrated, cluster))


def _toml_any(x) -> str:
    """A list as a TOML array of _toml_value, anything else as _toml_value."""
    return "[" + ", ".join(map(_toml_value, x)) + "]" if isinstance(x, list) else _toml_value(x)


def _toml_value(x) -> str:
    """A number as TOML writes it (repr: read back as the same float; nan as nan), anything else as a string."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return "nan" if x != x else repr(x)
    return _toml_string(str(x))


def _toml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
