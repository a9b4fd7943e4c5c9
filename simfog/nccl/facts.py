"""The hardware facts a calibration rests on: what the nccl-tests logs state (the importer's per-run records: NCCL
release, GPU model, NCCL_DEBUG=INFO lines: NICs, channels, GPU-NIC path, NVLS, CPU vendor) merged with what the
user gives (`simfog calibrate` flags). A flag wins over the log and a warning names both; logs of different NCCL
releases or GPU generations are refused together; what neither states takes a default, reported as assumed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from simfog.errors import ConfigError
from simfog.nccl.releases import parse_release
from simfog.trace import NetworkTrace

_ARCH_BY_NAME = (("GB200", "blackwell"), ("B200", "blackwell"), ("B100", "blackwell"), ("GH200", "hopper"),
                 ("H100", "hopper"), ("H200", "hopper"), ("H800", "hopper"), ("H20", "hopper"), ("A100", "ampere"),
                 ("A800", "ampere"), ("A30", "ampere"), ("A10", "ampere"), ("V100", "volta"))
# What NcclNetwork takes when neither a log nor a flag states it.
DEFAULTS = {"version": "2.30", "gpu_arch": "ampere", "cpu_vendor": "intel", "intra_transport": "nvlink",
            "gpu_nic_path": "pxb", "nvls": False, "collnet": False, "nics_per_node": None, "nic_Bps": None}
HARDWARE = tuple(DEFAULTS)


@dataclass(frozen=True)
class Facts:
    """NcclNetwork keyword arguments for the hardware, the channel count the logs state (None: not stated), where
    each fact came from ("log: ...", "given", "assumed"), and warnings for people."""

    hardware: dict
    channels: int | None
    sources: dict
    warnings: tuple[str, ...] = field(default=())


def arch_of(trace: NetworkTrace) -> str | None:
    """The GPU generation named anywhere in the trace's extra data (GPU model strings), or None."""
    return arch_of_name(repr(trace.extra))


def arch_of_name(text: str) -> str | None:
    """The GPU generation of a GPU model named in `text` ("NVIDIA A100-SXM4-80GB" -> "ampere"), or None."""
    return next((arch for name, arch in _ARCH_BY_NAME if re.search(name, text)), None)


def model_of_name(text: str) -> str | None:
    """The GPU model named in `text` ("NVIDIA H100 80GB HBM3" -> "H100", "h200" -> "H200"), or None: what tells an
    H200 from an H100, which share a generation."""
    return next((name for name, _ in _ARCH_BY_NAME if re.search(name, text.upper())), None)


def other_device(device: object, gpu: str) -> str | None:
    """Why a trace whose `device` (its {"kind", "name"} table) is not the GPU model `gpu` ("H100", "NVIDIA H100
    80GB HBM3") cannot stand for that GPU's compute, as one phrase; None when it is that model, or is synthetic, or
    either side names nothing to compare. Models compare by name (H200 is not H100), not by generation."""
    if not isinstance(device, dict) or device.get("kind") == "synthetic" or not gpu.strip():
        return None
    name = str(device.get("name") or device.get("kind") or "")
    if not name:
        return None
    wanted = model_of_name(gpu) or gpu.strip().upper()
    found = model_of_name(name)
    if found == wanted or (found is None and device.get("kind") not in ("cpu",) and wanted in name.upper()):
        return None
    estimated = " (estimated)" if device.get("estimated") else ""
    return f"the trace's compute times are of {name}{estimated}, not of {gpu}"


def _runs(traces) -> list[dict]:
    out = []
    for trace in traces:
        runs = trace.extra.get("nccl_tests") if isinstance(trace.extra, dict) else None
        out += [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []
    return out


def _from_logs(traces) -> tuple[dict, dict]:
    """(facts the logs state, where each is stated). Raises ConfigError for logs of different releases or GPUs."""
    runs = _runs(traces)
    stated, where = {}, {}
    releases = {}
    for r in runs:
        debug = r.get("nccl_debug") if isinstance(r.get("nccl_debug"), dict) else {}
        for text in (r.get("nccl_version"), debug.get("release")):
            if isinstance(text, str):
                try:
                    releases.setdefault(parse_release(text), f"{r.get('file', '?')} ({text})")
                except ConfigError:
                    pass
    if len(releases) > 1:
        raise ConfigError("trace", sorted(releases.values()), "logs of one NCCL release (calibrate each release "
                          "apart: its constants differ)")
    if releases:
        (release, why), = releases.items()
        stated["version"], where["version"] = ".".join(map(str, release)), f"log: {why}"
    archs = {a for a in map(arch_of, traces) if a}
    if len(archs) > 1:
        raise ConfigError("trace", sorted(archs), "logs of one GPU generation")
    if archs:
        stated["gpu_arch"], where["gpu_arch"] = archs.pop(), "log: GPU model"
    debug = [r["nccl_debug"] for r in runs if isinstance(r.get("nccl_debug"), dict)]
    for key, name in (("cpu_vendor", "cpu_vendor"), ("gpu_nic_path", "gpu_nic_path"), ("nvls", "nvls"),
                      ("nics", "nics_per_node")):
        values = {d[key] for d in debug if key in d}
        if len(values) == 1 or (key == "nics" and values):
            stated[name] = max(values) if key == "nics" else values.pop()
            where[name] = f"log: NCCL_DEBUG ({key})"
    graph = [d["graph_channels"] for d in debug if "graph_channels" in d]
    runtime = [d["runtime_channels"] for d in debug if "runtime_channels" in d]
    if graph or runtime:  # comm->nChannels is twice the graph's (connect.cc)
        stated["channels"] = max(graph) if graph else max(1, max(runtime) // 2)
        where["channels"] = "log: NCCL_DEBUG " + ("Pattern lines" if graph else "channel count / 2")
    return stated, where


def resolve(traces, given: dict) -> Facts:
    """Merge what the logs state with `given` (keys of DEFAULTS and "channels"; None = not given). Raises
    ConfigError for a bad value or logs that must not be calibrated together."""
    stated, where = _from_logs(traces)
    warnings, hardware, sources = [], {}, {}
    for key in (*HARDWARE, "channels"):
        flag, log = given.get(key), stated.get(key)
        if flag is not None and log is not None and _differs(key, flag, log):
            warnings.append(f"{_flag(key)} {_show(key, flag)} contradicts the logs ({where[key]}: {_show(key, log)}); "
                            f"using {_show(key, flag)}")
        if flag is not None:
            value, sources[key] = flag, "given"
        elif log is not None:
            value, sources[key] = log, where[key]
        else:
            value, sources[key] = DEFAULTS.get(key), "assumed"
        if key == "channels":
            channels = value
        else:
            hardware[key] = value
    if hardware["version"] is not None:
        parse_release(hardware["version"], "--nccl-version")
    if hardware["nvls"]:
        warnings += _without_nvls(hardware, sources)
    return Facts(hardware, channels, sources, tuple(warnings))


def _without_nvls(hardware: dict, sources: dict) -> list[str]:
    """NVLink SHARP runs on the NVSwitches of Hopper and newer nodes (NCCL enables it only there): with GPUs of
    an older generation, or GPUs on PCIe or linked directly (a transport given, not assumed), it is turned off
    (`hardware` changed), and the warning says which fact rules it out."""
    against = [f"gpu_arch {hardware['gpu_arch']} ({sources['gpu_arch']})"] \
        if hardware["gpu_arch"] not in ("hopper", "blackwell") else []
    transport = hardware["intra_transport"]
    if transport == "pci" or (transport == "nvlink" and sources["intra_transport"] != "assumed"):
        against.append(f"intra_transport {transport} ({sources['intra_transport']})")
    if not against:
        return []
    hardware["nvls"] = False
    return [f"nvls ({sources['nvls']}) needs Hopper or newer GPUs on NVSwitch, not {' and '.join(against)}; "
            "fitted without NVLS (nvls = false)"]


def _differs(key, a, b) -> bool:
    if key == "version":
        return parse_release(str(a)) != parse_release(str(b))
    return a != b


def _flag(key: str) -> str:
    return {"version": "--nccl-version", "nic_Bps": "--nic-bandwidth", "nvls": "--nvls"}.get(
        key, "--" + key.replace("_", "-"))


def _show(key: str, value) -> str:
    return f"{value * 8 / 1e9:g}Gbit/s" if key == "nic_Bps" and value is not None else str(value)
