"""The clusters of the held-out NCCL bench (bench/collectives.py): discovery, facts, the calibration / held-out split
and the rule that sets disturbed points aside. Kept apart from the bench's driver so that tests can run it on a
small synthetic corpus.

A cluster is a folder with a `facts.toml` (format: bench/data/nccl-tests/README.md) and its logs: every folder of
bench/data/nccl-tests, and every folder of bench/data/nccl-tests-ref-facts whose logs lie in the reference set
(bench/data/ref/nccl-tests/<same name>, copied byte for byte with the rest of the reference set; the facts
are kept apart).

Split: a log is held out when it has 3 or more nodes, or more GPUs per node than every log of at most 2 nodes;
the others (single-node and 2-node logs) calibrate.

Facts: the top level of facts.toml (what the source states) is given to the calibration; an [inferred] value only
where simfog would otherwise take a default of its own (release, GPU generation, CPU vendor, NVLink / NVSwitch /
PCIe, GPU-NIC path, NVLS, CollNet, the fabric's switches: `scale_out`, else non-blocking), never for what simfog can
calibrate without (NICs per node, their rate).

Disturbed points (DISTURBED_RULE, fixed before any held-out prediction was looked at; the same for every cluster,
calibration and held-out logs alike): within one log and collective, a size that took more than SLOWER times as
long as some larger size of the same log (no collective gets faster with more data; 1.2 leaves room for NCCL
switching protocol), and every point of a log whose facts entry notes network timeouts.
"""

from __future__ import annotations

import json
import math
import tomllib
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from simfog import units
from simfog.importers import import_file
from simfog.nccl.bands import subset
from simfog.nccl.facts import DEFAULTS
from simfog.nccl.scale_out import FabricSpec
from simfog.trace import NetworkTrace

SLOWER = 1.2
DISTURBED_RULE = (f"a size slower than {SLOWER:g} x some larger size of the same log and collective; every point of "
                  "a log whose facts note network timeouts")
# facts.toml key -> nccl_fit.fit keyword
FIT_KEYS = {"nccl_version": "version", "gpu_arch": "gpu_arch", "cpu_vendor": "cpu_vendor", "intra": "intra_transport",
            "nics_per_node": "nics_per_node", "nic_bandwidth": "nic_Bps", "gpu_nic_path": "gpu_nic_path",
            "nvls": "nvls", "collnet": "collnet", "scale_out": "fabric"}
# inferred values used although simfog's default for them is None: the fabric (None: non-blocking, a default too)
_DEFAULT_NONE_USED = ("fabric",)
_CPU = {"intel": "intel", "amd": "amd", "arm": "arm", "nvidia-grace": "arm"}
_PATHS = ("pix", "pxb", "pxn", "phb", "sys")


@dataclass(frozen=True)
class Log:
    """One log file of a cluster, as its facts.toml [files] entry describes it."""

    path: str            # relative to the cluster's log folder
    nodes: int
    gpus_per_node: int
    ranks: int
    collectives: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Cluster:
    name: str
    logs_dir: Path
    facts: dict
    logs: tuple[Log, ...]
    reference: bool = False  # logs in the external reference set

    def split(self) -> tuple[tuple[Log, ...], tuple[Log, ...]]:
        """(calibration logs, held-out logs): module docstring."""
        small = [g for g in self.logs if g.nodes <= 2]
        most = max((g.gpus_per_node for g in small), default=0)
        held = tuple(g for g in self.logs if g.nodes >= 3 or g.gpus_per_node > most)
        return tuple(g for g in self.logs if g not in held), held


def reference_logs(root: Path) -> Path | None:
    """The reference set's nccl-tests folder, bench/data/ref/nccl-tests (None where a checkout lacks it)."""
    where = root / "bench" / "data" / "ref" / "nccl-tests"
    return where if where.is_dir() else None


def discover(corpus: Path, ref_facts: Path | None = None, ref_logs: Path | None = None) -> list[Cluster]:
    """Every cluster folder of `corpus` with a facts.toml, then every folder of `ref_facts` whose logs are under
    `ref_logs`/<name> (one missing there is left out), sorted by name within each."""
    out = [_cluster(d / "facts.toml", d) for d in sorted(corpus.iterdir()) if (d / "facts.toml").is_file()]
    if ref_facts is not None and ref_facts.is_dir():
        for d in sorted(ref_facts.iterdir()):
            if (d / "facts.toml").is_file() and ref_logs is not None and (ref_logs / d.name).is_dir():
                out.append(replace(_cluster(d / "facts.toml", ref_logs / d.name), reference=True))
    return out


def _cluster(facts_file: Path, logs_dir: Path) -> Cluster:
    facts = tomllib.loads(facts_file.read_text())
    logs = tuple(Log(path, int(e["nodes"]), int(e["gpus_per_node"]), int(e["ranks"]),
                     tuple(e.get("collectives", ())), str(e.get("note", "")))
                 for path, e in facts.get("files", {}).items())
    return Cluster(str(facts.get("cluster", facts_file.parent.name)), logs_dir, facts, logs)


def fit_arguments(facts: dict) -> tuple[dict, list[str], list[str], list[str]]:
    """(nccl_fit.fit keywords, facts given as stated, inferred facts used, inferred facts left out) (module
    docstring)."""
    kwargs, given, used, left = {}, [], [], []
    inferred = facts.get("inferred", {})
    for key, arg in FIT_KEYS.items():
        if key in facts:
            kwargs[arg] = _value(key, facts[key])
            given.append(f"{key}={_show(facts[key])}")
        elif key in inferred:
            value = inferred[key]["value"] if isinstance(inferred[key], dict) else inferred[key]
            if DEFAULTS.get(arg) is not None or arg in _DEFAULT_NONE_USED:
                kwargs[arg] = _value(key, value)
                used.append(f"{key}={_show(value)}")
            else:
                left.append(f"{key}={_show(value)}")
    return kwargs, given, used, left


def _value(key: str, value):
    if key == "nic_bandwidth":
        return units.bandwidth(value, field=key)
    if key == "cpu_vendor":
        return _CPU.get(str(value).lower(), "intel")  # NCCL treats every host but AMD's as Intel's
    if key == "scale_out":
        return FabricSpec.from_toml(value, "facts.toml")
    if key == "gpu_nic_path" and isinstance(value, list):
        # NCCL's search starts and ends a node's rings on the GPUs nearest a NIC: the nearest path is the graph's
        return min(value, key=_PATHS.index)
    return value


def _show(value) -> str:
    if isinstance(value, dict):
        return f"{value.get('kind')} ({value.get('nodes_per_leaf')} nodes a leaf, {value.get('uplinks')} uplinks, " \
            f"{value.get('ecmp', 'hash')})"
    return "/".join(map(str, value)) if isinstance(value, list) else str(value)


def read(cluster: Cluster, log: Log) -> NetworkTrace:
    """The log imported as `simfog import nccl-tests` does, the collective given where the facts name one alone (old
    formats do not print it)."""
    kinds = set(log.collectives)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncated / uneven logs: their facts.toml says so
        return import_file("nccl-tests", cluster.logs_dir / log.path,
                           **({"collective": kinds.pop()} if len(kinds) == 1 else {}))


def disturbed(trace: NetworkTrace, log: Log) -> set[int]:
    """Indices of the trace's measurements the rule sets aside (module docstring); times as the calibration reads
    them (the least of out-of-place and in-place)."""
    if "timeout" in log.note.lower():
        return set(range(len(trace.measurements)))
    out = set()
    by: dict[tuple, list[tuple[int, float, int]]] = {}
    for i, m in enumerate(trace.measurements):
        if m.time_s:
            by.setdefault((m.collective, m.ranks), []).append((m.bytes, min(m.time_s), i))
    for points in by.values():
        points.sort()
        fastest_larger = math.inf  # least time of any strictly larger size
        k = len(points)
        while k > 0:
            j = k
            while j > 0 and points[j - 1][0] == points[k - 1][0]:
                j -= 1
            out.update(i for _, t, i in points[j:k] if t > SLOWER * fastest_larger)
            fastest_larger = min(fastest_larger, min(t for _, t, _ in points[j:k]))
            k = j
    return out


def without(trace: NetworkTrace, drop: set[int]) -> NetworkTrace:
    """The trace less the measurements `drop`, its per-run records' measurement spans renumbered."""
    return subset(trace, [i for i in range(len(trace.measurements)) if i not in drop])


def every_log(cluster: Cluster) -> tuple[list[NetworkTrace], int]:
    """(every log of the cluster imported, its disturbed points set aside; how many were set aside): what a
    calibration on all of them reads (bench/ship_clusters.py, bench/network_prior.py)."""
    traces, aside = [], 0
    for log in cluster.logs:
        trace = read(cluster, log)
        drop = disturbed(trace, log)
        aside += len(drop)
        if len(drop) < len(trace.measurements):
            traces.append(without(trace, drop))
    return traces, aside


def toml_value(v) -> str:
    """A value of the tables the benches write (TOML): a string as JSON writes it, a list of numbers (nan: too few
    points)."""
    return json.dumps(v) if isinstance(v, str) else "[" + ", ".join("nan" if x != x else repr(x) for x in v) + "]"
