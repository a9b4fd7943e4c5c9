"""The GPUs simfog knows: their specifications, each value with its source (simfog/data/gpus.toml, `simfog list
devices`). The per-layer model (simfog.gpu.layers) reads only these figures of a GPU, never its name: SMs, boost
clock, peak arithmetic per precision, memory bandwidth and L2 size."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from simfog.errors import ConfigError
from simfog.registry import Registry

TABLE = Path(__file__).resolve().parents[1] / "data" / "gpus.toml"
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
ARCHITECTURES = ("maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
MIB = 2**20
SHARED_FP32_LANES = ("8.6", "8.7", "8.9")


@dataclass(frozen=True)
class Gpu:
    """A GPU's specifications in SI units: peak_flops per precision (FLOP/s, dense), memory_Bps, l2_bytes; and
    where each value comes from (`sources`: field -> citation)."""

    name: str
    architecture: str
    compute_capability: str
    sms: int
    clock_Hz: float
    peak_flops: dict
    memory_Bps: float
    l2_bytes: float
    memory_bytes: float
    power_W: float
    aliases: tuple[str, ...] = ()
    sources: dict | None = None
    note: str = ""

    @property
    def source(self) -> str:
        """One line naming the figures and their sources, for a trace's notes."""
        return (f"{self.name}: {self.sms} SMs at {self.clock_Hz / 1e6:g} MHz, FP32 {self.peak_flops['fp32'] / 1e12:g} "
                f"/ TF32 {self.peak_flops['tf32'] / 1e12:g} / FP16 {self.peak_flops['fp16'] / 1e12:g} / BF16 "
                f"{self.peak_flops['bf16'] / 1e12:g} TFLOP/s, {self.memory_Bps / 1e9:g} GB/s, L2 "
                f"{self.l2_bytes / MIB:g} MiB (simfog/data/gpus.toml: " + "; ".join(
                    sorted({self.sources.get(f, "?") for f in ("sms", "fp32_TFLOPS", "memory_GBps")})) + ")")

    @property
    def fp32_lanes(self) -> int:
        """FP32 lanes per SM (64 or 128): the FP32 peak over 2 x SMs x clock."""
        return round(self.peak_flops["fp32"] / (2 * self.sms * self.clock_Hz) / 32) * 32

    @property
    def shared_fp32_lanes(self) -> bool:
        """Whether half the FP32 lanes also run INT32 (GA10x and AD10x: sm_86, sm_87, sm_89, per NVIDIA's GA102 and
        Ada whitepapers), so that FP32 code with any integer work cannot keep all 128 busy."""
        return self.compute_capability in SHARED_FP32_LANES

    def has_tensor_cores(self, precision: str) -> bool:
        """Whether `precision` runs on tensor cores (its peak above the FP32 peak)."""
        return self.peak_flops[precision] > self.peak_flops["fp32"] * 1.01

    def describe(self) -> str:
        """One line for `simfog list devices`."""
        tc = ", ".join(f"{p.upper()} {self.peak_flops[p] / 1e12:g}" for p in PRECISIONS)
        return (f"{self.architecture} sm_{self.compute_capability.replace('.', '')}, {self.sms} SMs, {tc} "
                f"TFLOP/s, {self.memory_Bps / 1e9:g} GB/s, L2 {self.l2_bytes / MIB:g} MiB")


def normalise(name: str) -> str:
    """A GPU name as looked up: lower case, vendor words dropped, spaces and underscores as dashes."""
    s = re.sub(r"^(nvidia|tesla|geforce)[\s_-]+", "", name.strip().lower())
    s = re.sub(r"^(nvidia|tesla|geforce)[\s_-]+", "", s)
    return re.sub(r"[\s_]+", "-", s)


class DeviceRegistry(Registry[Gpu]):
    """The registry of GPUs, looked up by name or alias (simfog.gpu.specs.normalise)."""

    def __init__(self):
        super().__init__("device")
        self._aliases: dict[str, str] = {}

    def add(self, gpu: Gpu) -> None:
        self.register(gpu.name)(gpu)
        for a in (gpu.name, *gpu.aliases):
            self._aliases[normalise(a)] = gpu.name

    def get(self, name: object, *, field: str | None = None, source: str | None = None) -> Gpu:
        key = self._aliases.get(normalise(name)) if isinstance(name, str) else None
        return super().get(key if key is not None else name, field=field, source=source)

    def find(self, name: str) -> Gpu | None:
        """The GPU called `name` (or an alias), or None."""
        key = self._aliases.get(normalise(name))
        return None if key is None else super().get(key)

    def describe(self) -> list[tuple[str, str]]:
        return [(n, self.get(n).describe()) for n in self.names()]


def _gpu(raw: dict, sources: dict) -> Gpu:
    where = f"gpu {raw.get('name', '?')}"
    try:
        cited = {field: sources[key] for field, key in raw.get("source", {}).items()}
        arch = raw["architecture"]
        if arch not in ARCHITECTURES:
            raise ConfigError(f"{where}.architecture", arch, f"one of {', '.join(ARCHITECTURES)}", source=str(TABLE))
        return Gpu(name=raw["name"], architecture=arch, compute_capability=raw["compute_capability"],
                   sms=int(raw["sms"]), clock_Hz=raw["boost_clock_MHz"] * 1e6,
                   peak_flops={p: raw[f"{p}_TFLOPS"] * 1e12 for p in PRECISIONS},
                   memory_Bps=raw["memory_GBps"] * 1e9, l2_bytes=raw["l2_MB"] * MIB,
                   memory_bytes=raw["memory_GB"] * 1e9, power_W=float(raw["board_power_W"]),
                   aliases=tuple(raw.get("aliases", ())), sources=cited,
                   note=raw.get("note", ""))
    except KeyError as e:
        raise ConfigError(f"{where}: {e.args[0]}", "(missing or an unknown source key)",
                          "every field of the table's header, its sources named in [sources]", source=str(TABLE)) \
            from None


@cache
def devices(path: Path = TABLE) -> DeviceRegistry:
    """The table at `path` as a registry (read once)."""
    data = tomllib.loads(path.read_text())
    registry = DeviceRegistry()
    for raw in data["gpu"]:
        registry.add(_gpu(raw, data["sources"]))
    return registry


DEVICES = devices()
