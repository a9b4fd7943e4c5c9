"""Trace format 1: what a model computes per layer (ModelTrace) and what collectives cost (NetworkTrace).

All times are seconds, all sizes bytes. Files are JSON, optionally gzipped; traces/README.md documents the format.
Every sample is kept (warm-up already dropped by the collector): sample k of every layer belongs to recorded
iteration k, which is why every layer must have the same number of samples.

Over 400 lines: the format's dataclasses, its writer (which refuses what its reader would refuse) and its checking
reader are one contract, the format 1 of traces/README.md; apart, a key's check and its field would drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from simfog import files
from simfog.errors import ConfigError
from simfog.gpu.ops import check as check_ops

MODEL_FORMAT = "simfog.model-trace/1"
NETWORK_FORMAT = "simfog.network-trace/1"

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1,
               "int32": 4, "int64": 8}
SOURCES = ("measured", "estimated", "imported")
# Bounds that keep every sum and product simfog forms from a trace finite and exact: counts (elements, batch size,
# ranks, bytes) up to 2**53, the largest integer a float holds exactly; durations up to 10**9 s (31 years), so
# that layers x iterations x ranks of them still add up to a finite time.
MAX_COUNT = 2**53
MAX_SECONDS = 1e9
# The least forward + backward time of one recorded iteration: no compute at all (or a subnormal time) left one rank
# with a 0 s iteration (a division by zero) and many ranks with a scaling efficiency of 0.
MIN_COMPUTE_SECONDS = 1e-9
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv")
# What a network trace may name: calibrate picks its model by the backend (NCCL's for "nccl"), so a misspelt one
# changed the model without a word. "synthetic" / "none": measurements a program made up (tests, generators);
# transport "nccl": whatever NCCL chose (the validator's collector); "mixed": merged logs of several.
BACKENDS = ("nccl", "gloo", "mpi", "ucc", "synthetic", "unknown")
TRANSPORTS = ("tcp", "ib", "roce", "nvlink", "pci", "shm", "nccl", "none", "mixed", "unknown")
MEASUREMENT_KEYS = ("collective", "ranks", "nodes", "bytes", "time_s")


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor: its gradient is what gets communicated."""

    name: str
    elements: int
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        return self.elements * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Layer:
    """A module with its own forward/backward timing; `params` may be empty (e.g. ReLU)."""

    name: str
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    params: tuple[Tensor, ...] = ()
    flops: float | None = None          # forward FLOPs (backward is usually about 2x)
    bytes_accessed: float | None = None  # forward memory traffic, for roofline retargeting
    activation_bytes: float | None = None  # what autograd keeps from this layer's forward until its backward
    output_bytes: float | None = None  # its outputs that need a gradient: the gradient backward hands the layer
    # its operators with their shapes (simfog.gpu.ops), for retargeting to another GPU; empty: not recorded
    ops: tuple[Mapping, ...] = field(default=(), hash=False)


@dataclass(frozen=True)
class Provenance:
    """Where, when and how a trace was made. `estimated` is true for anything not measured as is."""

    command: str
    date: str
    host: str
    source: str = "measured"
    estimated: bool = False
    notes: str = ""


@dataclass(frozen=True)
class ModelTrace:
    model: str
    batch_size: int
    dtype: str
    device: Mapping[str, object]
    software: Mapping[str, str]
    provenance: Provenance
    layers: tuple[Layer, ...]
    grad_ready_order: tuple[str, ...]
    optimizer_s: tuple[float, ...] = ()
    extra: Mapping[str, object] = field(default_factory=dict)
    # Per recorded iteration: time the step spent outside the layers' and optimizer's compute and outside exposed
    # communication (data loading, host launch gaps, Python); empty = none recorded (0). The engine runs it in the
    # step's serial tail, with the optimizer step, so it never overlaps communication.
    host_s: tuple[float, ...] = ()
    # Per sample: the rank it was recorded on, for a trace of several ranks (`simfog import kineto DIR`); empty =
    # one rank, or not known. Every rank then has the same number of samples, and its j-th sample (in order) is
    # recorded iteration j, the one its peers' j-th samples ran with. The engine draws one recorded iteration per
    # simulated iteration and gives simulated rank r recorded rank r mod R's sample of it (simfog.engine.compute).
    sample_ranks: tuple[int, ...] = ()

    @property
    def samples(self) -> int:
        """Recorded iterations (samples per layer)."""
        return len(self.layers[0].forward_s)

    @property
    def tensors(self) -> dict[str, Tensor]:
        return {t.name: t for layer in self.layers for t in layer.params}

    @property
    def parameters(self) -> int:
        return sum(t.elements for layer in self.layers for t in layer.params)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for layer in self.layers for t in layer.params)

    def layer_index(self) -> dict[str, int]:
        """Parameter name -> index of the layer that owns it."""
        return {t.name: i for i, layer in enumerate(self.layers) for t in layer.params}

    def ready_tensors(self) -> tuple[Tensor, ...]:
        """Parameter tensors in the order their gradients become ready in backward."""
        by_name = self.tensors
        return tuple(by_name[n] for n in self.grad_ready_order)

    def to_dict(self) -> dict:
        return {
            "format": MODEL_FORMAT, "model": self.model, "batch_size": self.batch_size, "dtype": self.dtype,
            "device": dict(self.device), "software": dict(self.software),
            "provenance": _provenance_dict(self.provenance),
            "layers": [_layer_dict(layer) for layer in self.layers],
            "grad_ready_order": list(self.grad_ready_order),
            "optimizer_s": list(self.optimizer_s), **({"host_s": list(self.host_s)} if self.host_s else {}),
            **({"sample_ranks": list(self.sample_ranks)} if self.sample_ranks else {}),
            **dict(self.extra),
        }

    def save(self, path: str | Path) -> None:
        """Write the trace (gzipped for .gz) atomically; ConfigError, nothing written, if it would not load."""
        files.write_json(path, _loadable(self.to_dict(), model_trace_from_dict, path))


@dataclass(frozen=True)
class Measurement:
    collective: str
    ranks: int
    nodes: int
    bytes: int
    time_s: tuple[float, ...]


@dataclass(frozen=True)
class NetworkTrace:
    backend: str
    transport: str
    provenance: Provenance
    measurements: tuple[Measurement, ...]
    extra: Mapping[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "format": NETWORK_FORMAT, "backend": self.backend, "transport": self.transport,
            "provenance": _provenance_dict(self.provenance),
            "measurements": [
                {"collective": m.collective, "ranks": m.ranks, "nodes": m.nodes, "bytes": m.bytes,
                 "time_s": list(m.time_s)} for m in self.measurements],
            **dict(self.extra),
        }

    def save(self, path: str | Path) -> None:
        """Write the trace (gzipped for .gz) atomically; ConfigError, nothing written, if it would not load."""
        files.write_json(path, _loadable(self.to_dict(), network_trace_from_dict, path))


def _loadable(d: dict, parse, path: str | Path) -> dict:
    """`d` (a trace's to_dict) if `parse`, the loader's own check, takes it, else ConfigError naming `path`: no
    command (import, retarget, collect) writes what simfog cannot read back (a 1e302 s layer, layers of 0 s)."""
    try:
        parse(d)
    except ConfigError as e:
        raise ConfigError(e.field, e.value, f"{e.allowed}; this trace would not load, so it is not written",
                          source=str(path)) from None
    return d


def _provenance_dict(p: Provenance) -> dict:
    d = {"command": p.command, "date": p.date, "host": p.host, "source": p.source, "estimated": p.estimated}
    if p.notes:
        d["notes"] = p.notes
    return d


def _layer_dict(layer: Layer) -> dict:
    d = {"name": layer.name, "forward_s": list(layer.forward_s), "backward_s": list(layer.backward_s),
         "params": [{"name": t.name, "elements": t.elements, "dtype": t.dtype} for t in layer.params]}
    if layer.flops is not None:
        d["flops"] = layer.flops
    if layer.bytes_accessed is not None:
        d["bytes_accessed"] = layer.bytes_accessed
    if layer.activation_bytes is not None:
        d["activation_bytes"] = layer.activation_bytes
    if layer.output_bytes is not None:
        d["output_bytes"] = layer.output_bytes
    if layer.ops:
        d["ops"] = [dict(o) for o in layer.ops]
    return d


# ---- validation: every check names the field, the value and what is allowed ----

def _get(d: Mapping, key: str, where: str, kind: type | tuple, allowed: str):
    if not isinstance(d, Mapping):
        raise ConfigError(where or "(top level)", type(d).__name__, "an object")
    if key not in d:
        raise ConfigError(f"{where}{key}", "(missing)", allowed)
    value = d[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"{where}{key}", value, allowed)
    return value


def _count(d: Mapping, key: str, where: str, minimum: int = 1) -> int:
    allowed = f"an integer in {minimum}..{MAX_COUNT} (2**53)"
    v = _get(d, key, where, int, allowed)
    if not minimum <= v <= MAX_COUNT:
        raise ConfigError(f"{where}{key}", v, allowed)
    return v


def _times(d: Mapping, key: str, where: str, *, allow_empty: bool = False) -> tuple[float, ...]:
    allowed = f"a list of durations in seconds (numbers from 0 to {MAX_SECONDS:g})"
    values = _get(d, key, where, list, allowed)
    if not values and not allow_empty:
        raise ConfigError(f"{where}{key}", values, allowed + ", at least one")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_SECONDS:
            raise ConfigError(f"{where}{key}[{i}]", v, allowed)
    return tuple(float(v) for v in values)


def _optional_number(d: Mapping, key: str, where: str) -> float | None:
    if d.get(key) is None:
        return None
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1e300:
        raise ConfigError(f"{where}{key}", v, "a number from 0 to 1e300, or null")
    return float(v)


def _provenance(d: Mapping) -> Provenance:
    p = _get(d, "provenance", "", dict, "an object with command, date, host, source, estimated")
    text = "a string"
    source = _get(p, "source", "provenance.", str, f"one of {', '.join(SOURCES)}")
    if source not in SOURCES:
        raise ConfigError("provenance.source", source, f"one of {', '.join(SOURCES)}")
    return Provenance(
        command=_get(p, "command", "provenance.", str, text), date=_get(p, "date", "provenance.", str, text),
        host=_get(p, "host", "provenance.", str, text), source=source,
        estimated=_get(p, "estimated", "provenance.", bool, "true or false"), notes=str(p.get("notes", "")))


def _format(d: object, expected: str) -> None:
    if not isinstance(d, Mapping):
        raise ConfigError("(top level)", type(d).__name__, "a JSON object")
    if d.get("format") != expected:
        raise ConfigError("format", d.get("format", "(missing)"), f'"{expected}"')


def model_trace_from_dict(d: Mapping) -> ModelTrace:
    """Validate a parsed model trace. Raises ConfigError naming the first bad field."""
    _format(d, MODEL_FORMAT)
    layers_raw = _get(d, "layers", "", list, "a non-empty list of layers")
    if not layers_raw:
        raise ConfigError("layers", [], "a non-empty list of layers")
    layers, seen, samples = [], set(), None
    for i, raw in enumerate(layers_raw):
        w = f"layers[{i}]."
        fwd, bwd = _times(raw, "forward_s", w), _times(raw, "backward_s", w)
        samples = samples if samples is not None else len(fwd)
        for key, values in (("forward_s", fwd), ("backward_s", bwd)):
            if len(values) != samples:
                raise ConfigError(f"{w}{key}", f"{len(values)} samples",
                                  f"{samples} samples, as layers[0].forward_s (sample k is iteration k)")
        params = []
        for j, p in enumerate(_get(raw, "params", w, list, "a list of parameter tensors")):
            pw = f"{w}params[{j}]."
            name = _get(p, "name", pw, str, "a parameter name")
            if name in seen:
                raise ConfigError(f"{pw}name", name, "a name not used by another parameter")
            seen.add(name)
            dtype = p.get("dtype", "float32")
            if dtype not in DTYPE_BYTES:
                raise ConfigError(f"{pw}dtype", dtype, f"one of {', '.join(DTYPE_BYTES)}")
            params.append(Tensor(name, _count(p, "elements", pw), dtype))
        layers.append(Layer(_get(raw, "name", w, str, "a layer name"), fwd, bwd, tuple(params),
                            _optional_number(raw, "flops", w), _optional_number(raw, "bytes_accessed", w),
                            _optional_number(raw, "activation_bytes", w), _optional_number(raw, "output_bytes", w),
                            check_ops(raw["ops"], f"{w}ops") if "ops" in raw else ()))
    forward, backward = (map(sum, zip(*(getattr(x, key) for x in layers))) for key in ("forward_s", "backward_s"))
    for k, compute in enumerate(f + b for f, b in zip(forward, backward)):
        if compute < MIN_COMPUTE_SECONDS:
            raise ConfigError("layers", f"sample {k}: forward and backward add up to {compute:g} s",
                              f"recorded iterations of at least {MIN_COMPUTE_SECONDS:g} s of forward and backward "
                              "(a model computes something)")
    if not seen:  # nothing to communicate: every algorithm needs at least one gradient
        raise ConfigError("layers", "(no parameters)", "at least one layer with a parameter tensor (params): "
                          "data-parallel training communicates their gradients")
    order = _get(d, "grad_ready_order", "", list, "a list naming every parameter once")
    for i, n in enumerate(order):
        if not isinstance(n, str):
            raise ConfigError(f"grad_ready_order[{i}]", n, "a parameter name (a string)")
    missing, extra = seen - set(order), [n for n in order if n not in seen]
    if extra or missing or len(order) != len(set(order)):
        bad = extra[:1] or sorted(missing)[:1] or [n for n in order if order.count(n) > 1][:1]
        raise ConfigError("grad_ready_order", bad[0],
                          "every parameter of the layers exactly once (missing, unknown or repeated)")
    known = {"format", "model", "batch_size", "dtype", "device", "software", "provenance", "layers",
             "grad_ready_order", "optimizer_s", "host_s", "sample_ranks"}
    host = _times(d, "host_s", "", allow_empty=True) if "host_s" in d else ()
    if host and len(host) != samples:
        raise ConfigError("host_s", f"{len(host)} samples",
                          f"{samples} samples, as layers[0].forward_s (sample k is iteration k), or none")
    return ModelTrace(
        model=_get(d, "model", "", str, "the model's name"), batch_size=_count(d, "batch_size", ""),
        dtype=_get(d, "dtype", "", str, "a dtype name"),
        device=_get(d, "device", "", dict, 'an object such as {"kind": "cpu", "name": "...", "threads": 2}'),
        software=_get(d, "software", "", dict, 'an object such as {"python": "3.11.7", "torch": "2.13.0"}'),
        provenance=_provenance(d), layers=tuple(layers), grad_ready_order=tuple(order),
        optimizer_s=_times(d, "optimizer_s", "", allow_empty=True) if "optimizer_s" in d else (),
        extra={k: v for k, v in d.items() if k not in known}, host_s=host,
        sample_ranks=_sample_ranks(d, samples))


def _sample_ranks(d: Mapping, samples: int) -> tuple[int, ...]:
    """The optional `sample_ranks`: one rank (0..MAX_COUNT) per sample, every rank present with the same count."""
    if "sample_ranks" not in d:
        return ()
    allowed = f"a list of {samples} ranks (integers >= 0), one per sample, each rank with the same number of samples"
    ranks = _get(d, "sample_ranks", "", list, allowed)
    if len(ranks) != samples or any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= MAX_COUNT
                                    for r in ranks):
        raise ConfigError("sample_ranks", ranks[:8] if len(ranks) > 8 else ranks, allowed)
    counts = {r: ranks.count(r) for r in set(ranks)}
    if len(set(counts.values())) > 1:
        raise ConfigError("sample_ranks", f"samples per rank {dict(sorted(counts.items()))}", allowed)
    return tuple(ranks)


def network_trace_from_dict(d: Mapping) -> NetworkTrace:
    """Validate a parsed network trace. Raises ConfigError naming the first bad field."""
    _format(d, NETWORK_FORMAT)
    raw = _get(d, "measurements", "", list, "a non-empty list of measurements")
    if not raw:
        raise ConfigError("measurements", [], "a non-empty list of measurements")
    out = []
    for i, m in enumerate(raw):
        w = f"measurements[{i}]."
        coll = _get(m, "collective", w, str, f"one of {', '.join(COLLECTIVES)}").replace("-", "_")
        if coll not in COLLECTIVES:
            raise ConfigError(f"{w}collective", m["collective"], f"one of {', '.join(COLLECTIVES)}")
        unknown = sorted(k for k in m if k not in MEASUREMENT_KEYS)
        if unknown:
            raise ConfigError(f"{w}{unknown[0]}", m[unknown[0]], f"not a key of a measurement; allowed: "
                              f"{', '.join(MEASUREMENT_KEYS)}")
        ranks, nodes = _count(m, "ranks", w), _count(m, "nodes", w)
        if nodes > ranks:
            raise ConfigError(f"{w}nodes", nodes, f"at most ranks ({ranks})")
        times = _times(m, "time_s", w)
        if not any(times):
            raise ConfigError(f"{w}time_s", m["time_s"], "durations with at least one > 0 s (a collective takes "
                              "time: a log's 0.00 is below its resolution)")
        out.append(Measurement(coll, ranks, nodes, _count(m, "bytes", w, 0), times))
    known = {"format", "backend", "transport", "provenance", "measurements"}
    return NetworkTrace(
        backend=_name(d, "backend", BACKENDS), transport=_name(d, "transport", TRANSPORTS),
        provenance=_provenance(d), measurements=tuple(out),
        extra={k: v for k, v in d.items() if k not in known})


def _name(d: Mapping, key: str, allowed: tuple[str, ...]) -> str:
    value = _get(d, key, "", str, f"one of {', '.join(allowed)}")
    if value not in allowed:
        raise ConfigError(key, value, f"one of {', '.join(allowed)}")
    return value


def _load(path: str | Path, parse):
    data = files.read_json(path)
    try:
        return parse(data)
    except ConfigError as e:
        raise e.in_file(str(path)) from None


def load_model_trace(path: str | Path) -> ModelTrace:
    """Read and validate a ModelTrace file (.json or .json.gz)."""
    return _load(path, model_trace_from_dict)


def load_network_trace(path: str | Path) -> NetworkTrace:
    """Read and validate a NetworkTrace file (.json or .json.gz)."""
    return _load(path, network_trace_from_dict)
