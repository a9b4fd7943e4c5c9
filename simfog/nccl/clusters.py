"""Shipped clusters: calibrated network files of real clusters, each named after its folder of the public
nccl-tests corpus (bench/data/nccl-tests and the reference set), which `[cluster] network = "NAME"`, a jobs file,
a catalogue option's `network` and every `--network NAME` take wherever a network file path is accepted
(simfog.network_file.load_named).

Each is simfog/data/clusters/NAME.toml: a network file (simfog.network_file) calibrated by `simfog.nccl.fit` on
every log of the cluster, written by `python bench/ship_clusters.py`, with a [cluster] section saying what the
cluster is (its GPU, GPUs per node, NICs, fabric, transport, NCCL release, the node counts its logs measured) and
the calibration's own held-out error: the median |error| of each measured node count predicted from a calibration
on the smaller ones (simfog.nccl.bands.scale_out_points).

    [cluster]
    name = "polaris-a100-ofi"
    gpu = "NVIDIA A100-SXM4-40GB"
    gpu_memory = "40GB"             # optional: the experiment's gpu_memory when it states none
    gpus_per_node = 4
    nics = "2 x Slingshot 11"       # as the sources state them (free text)
    transport = "slingshot"         # ib | roce | efa | slingshot | tcp (simfog.nccl.prior)
    fabric = "HPE Slingshot 11 dragonfly"   # free text: stated or inferred, as the corpus's facts say
    nccl = "2.21.5"
    nodes_measured = [2, 8, 256]
    held_out_error = 0.12           # fraction; nan where no scale could be predicted from a smaller one
    held_out_points = 120
    source = "bench/data/nccl-tests/polaris-a100-ofi (PROVENANCE.md there)"

A network file of a user's own (simfog calibrate -o) may carry the section too. Naming a cluster takes its layout:
its GPUs per node (an experiment stating others is refused, simfog.network_file.use), its NICs and links; the
experiment gives the node count.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from simfog import units
from simfog.errors import ConfigError, SimfogWarning

if TYPE_CHECKING:
    from simfog.trace import ModelTrace

CLUSTERS_DIR = Path(__file__).parents[1] / "data" / "clusters"
TRANSPORTS = ("ib", "roce", "efa", "slingshot", "tcp")
_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_KEYS = {"name", "gpu", "gpu_memory", "gpus_per_node", "nics", "transport", "fabric", "nccl", "nodes_measured",
         "held_out_error", "held_out_points", "source"}
_REQUIRED = ("name", "gpu", "gpus_per_node", "transport", "nodes_measured")


@dataclass(frozen=True)
class ClusterFacts:
    """What a named cluster is (module docstring): SI inside (gpu_memory_B), the held-out error a fraction (nan:
    none measured)."""

    name: str
    gpu: str
    gpus_per_node: int
    transport: str
    nodes_measured: tuple[int, ...]
    nics: str = ""
    fabric: str = ""
    nccl: str = ""
    gpu_memory_B: float | None = None
    held_out_error: float = math.nan
    held_out_points: int = 0
    source: str = ""

    @property
    def largest_nodes(self) -> int:
        """The most nodes any of its logs measured."""
        return max(self.nodes_measured)

    @staticmethod
    def from_toml(d: object, source: str) -> ClusterFacts:
        """The [cluster] section of a network file. Raises ConfigError naming the file and the key."""
        if not isinstance(d, dict):
            raise ConfigError("cluster", d, "a table (the cluster a network file describes)", source=source)
        for key in d:
            if key not in _KEYS:
                raise ConfigError(f"cluster.{key}", d[key], f"one of {', '.join(sorted(_KEYS))}", source=source)
        for key in _REQUIRED:
            if key not in d:
                raise ConfigError(f"cluster.{key}", "(missing)", "a value (module simfog.nccl.clusters)",
                                  source=source)
        for key in ("name", "gpu", "nics", "fabric", "nccl", "source"):
            if key in d and not isinstance(d[key], str):
                raise ConfigError(f"cluster.{key}", d[key], "a string", source=source)
        gpus = d["gpus_per_node"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 64:
            raise ConfigError("cluster.gpus_per_node", gpus, "an integer in 1..64", source=source)
        if d["transport"] not in TRANSPORTS:
            raise ConfigError("cluster.transport", d["transport"], f"one of {', '.join(TRANSPORTS)}", source=source)
        nodes = d["nodes_measured"]
        if not (isinstance(nodes, list) and nodes and all(type(n) is int and n >= 1 for n in nodes)):
            raise ConfigError("cluster.nodes_measured", nodes, "a list of node counts >= 1", source=source)
        error = d.get("held_out_error", math.nan)
        if isinstance(error, bool) or not isinstance(error, int | float) or not (math.isnan(error) or error >= 0):
            raise ConfigError("cluster.held_out_error", error, "a fraction >= 0 (or nan: none measured)",
                              source=source)
        points = d.get("held_out_points", 0)
        if isinstance(points, bool) or not isinstance(points, int) or points < 0:
            raise ConfigError("cluster.held_out_points", points, "an integer >= 0", source=source)
        memory = (units.parse(d["gpu_memory"], "bytes", field="cluster.gpu_memory", source=source)
                  if "gpu_memory" in d else None)
        return ClusterFacts(d["name"], d["gpu"], gpus, d["transport"], tuple(sorted(set(nodes))), d.get("nics", ""),
                            d.get("fabric", ""), d.get("nccl", ""), memory, float(error), points,
                            d.get("source", ""))

    def to_toml(self) -> dict:
        """The [cluster] section's keys (human units; from_toml reads them back)."""
        out = {"name": self.name, "gpu": self.gpu}
        if self.gpu_memory_B is not None:
            out["gpu_memory"] = f"{self.gpu_memory_B / 1e9:g}GB"
        out |= {"gpus_per_node": self.gpus_per_node, "nics": self.nics, "transport": self.transport,
                "fabric": self.fabric, "nccl": self.nccl, "nodes_measured": list(self.nodes_measured),
                "held_out_error": round(self.held_out_error, 4) if not math.isnan(self.held_out_error) else math.nan,
                "held_out_points": self.held_out_points, "source": self.source}
        return out

    def describe(self) -> str:
        """One line for `simfog list clusters` (after the name): GPU, GPUs per node, NICs, fabric, NCCL release,
        node counts measured and the held-out error."""
        error = ("no held-out error (one node count)" if math.isnan(self.held_out_error) else
                 f"held-out error {100 * self.held_out_error:.1f} % ({self.held_out_points} points, each node count "
                 "predicted from the smaller ones)")
        return (f"{self.gpu}, {self.gpus_per_node} GPUs/node, NICs {self.nics or 'not stated'}, transport "
                f"{self.transport}, fabric {self.fabric or 'not stated'}, NCCL {self.nccl or 'unknown'}, nodes "
                f"measured {', '.join(map(str, self.nodes_measured))}, {error}")


def names() -> list[str]:
    """The shipped clusters' names, sorted."""
    return sorted(p.stem for p in CLUSTERS_DIR.glob("*.toml")) if CLUSTERS_DIR.is_dir() else []


def looks_like_name(value: str) -> bool:
    """Whether `value` is spelled as a cluster name (lower-case letters, digits and dashes: no path separator, no
    suffix), not as a path."""
    return bool(_NAME.fullmatch(value))


def path_of(name: str) -> Path | None:
    """The network file of shipped cluster `name`, or None."""
    return CLUSTERS_DIR / f"{name}.toml" if looks_like_name(name) and name in names() else None


def unknown(value: str, field: str, source: str | None = None) -> ConfigError:
    """The error for a name that is no shipped cluster: the ones that are, and how to name a file instead."""
    return ConfigError(field, value, f"a shipped cluster ({', '.join(names()) or 'none installed'}; `simfog list "
                       "clusters`) or a path to a network file (e.g. network.toml, from simfog calibrate -o)",
                       source=source)


def entries() -> list[tuple[str, str]]:
    """(name, description) of every shipped cluster, for `simfog list clusters`."""
    from simfog import files

    out = []
    for name in names():
        path = CLUSTERS_DIR / f"{name}.toml"
        doc = files.parse_toml(files.read_text(path), str(path), "a shipped network file")
        out.append((name, ClusterFacts.from_toml(doc.get("cluster"), str(path)).describe()))
    return out


class ClusterGpuWarning(SimfogWarning):
    """An estimated trace that cannot be re-estimated for the named cluster's GPU: no device spec of it."""


def device_of(gpu: str) -> str | None:
    """The simfog.retarget device whose name is a word of the GPU model `gpu` ("NVIDIA A100-SXM4-40GB" -> "a100"),
    or None where the device table has none."""
    from simfog.retarget import DEVICES

    words = set(re.split(r"[^a-z0-9]+", gpu.lower()))
    return next((name for name in DEVICES.names() if name in words), None)


def trace_for_cluster(trace: ModelTrace, cluster: ClusterFacts, *, source: str | None = None) -> ModelTrace:
    """`trace` on the GPU of `cluster` (a network named by it): an estimated trace of another device re-estimated
    for the cluster's GPU (simfog.retarget, the trace's precision setting kept; its command says it was
    re-estimated, so every summary's compute source does); a measured one (or one pinned to a measured step) kept,
    with a ClusterGpuWarning when its GPU is another generation; an estimated one kept, with a warning, where
    simfog's device table has no spec of that GPU."""
    from simfog.retarget import TORCH_DEFAULT, retarget

    where = f"{source}: " if source else ""
    name = str(trace.device.get("name", "")) if isinstance(trace.device, dict) else ""
    pinned = isinstance(trace.extra, dict) and "pinned_step_s" in trace.extra
    if not trace.provenance.estimated or pinned:  # a mismatch: simfog.network_file.use warns (the GPU generation)
        return trace
    device = device_of(cluster.gpu)
    if device is None:
        warnings.warn(f"{where}simfog's device table has no spec of {cluster.gpu} (cluster {cluster.name}): the trace "
                      f"stays estimated for {name or 'its device'} (a mismatch)", ClusterGpuWarning, stacklevel=3)
        return trace
    if device == name:
        return trace
    precision = trace.device.get("precision", TORCH_DEFAULT) if isinstance(trace.device, dict) else TORCH_DEFAULT
    out = retarget(trace, device, precision=precision)
    note = f"re-estimated for {cluster.gpu}, the GPU of cluster {cluster.name} (the experiment's trace: {name})"
    return replace(out, provenance=replace(out.provenance, command=f"{out.provenance.command}; {note}",
                                           notes=f"{note.upper()[:1]}{note[1:]}. {out.provenance.notes}"))
