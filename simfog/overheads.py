"""What communication costs beyond the wire: bucket copies, per-collective launch overhead, overlap slowdown.

Three inputs of the allreduce algorithm, each with where it came from (the sharded algorithms, fsdp, hsdp and
zero1-3, model the per-collective overhead only: each of their all-gathers and reduce-scatters takes it on top of
its network cost; FSDP2's copy-in and copy-out are not modelled; so does wagma, per group and global operation):

- `bucket_copy_Bps`: bytes/s at which a rank copies gradients into a flat bucket buffer before the collective
  (pack) and back out after it (unpack). Each bucket of M bytes pays M/bw before and M/bw after its collective,
  on the rank's communication stream. 0: copies are free (not modelled).
- `collective_overhead_s`: seconds paid per collective launch before it can start (DDP's hooks, Horovod's and
  BlueFog's negotiation), on the communication stream.
- `overlap_slowdown`: a factor >= 1 by which backward compute runs slower while a collective runs beside it
  (Echo measured up to 1.48x in DDP on GPUs). 1.0: no slowdown.

Each comes from the experiment file ([comm] bucket_copy_bandwidth, collective_overhead, overlap_slowdown) when
given, else from the model trace's `comm_overheads` (recorded by `simfog collect model` on the device it measured),
else it is unmeasured and 0 (1.0 for the slowdown). The result's summary says which, per input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from simfog.errors import ConfigError

EXPERIMENT_FILE = "experiment file"
#: the trace key the collector writes: {"bucket_copy_Bps", "collective_overhead_s"?, "overlap_slowdown"?,
#: "how", "<input>_how"?, "device"}; a key that is absent or null was not measured. "<input>_how", when given,
#: says how that input was measured (else "how" does).
TRACE_KEY = "comm_overheads"
#: (Comm attribute, trace key, value when unmeasured)
INPUTS = (("bucket_copy_Bps", "bucket_copy_Bps", 0.0), ("collective_overhead_s", "collective_overhead_s", 0.0),
          ("overlap_slowdown", "overlap_slowdown", 1.0))
SHARDED = ("fsdp", "hsdp", "zero1", "zero2", "zero3")
#: input -> the algorithms that model it
APPLIED_BY = {"bucket_copy_Bps": ("allreduce",), "collective_overhead_s": ("allreduce", *SHARDED, "wagma"),
              "overlap_slowdown": ("allreduce",)}


@dataclass(frozen=True)
class CommOverheads:
    bucket_copy_Bps: float = 0.0
    collective_overhead_s: float = 0.0
    overlap_slowdown: float = 1.0
    sources: Mapping[str, str] = field(default_factory=dict)  # input name -> where its value came from

    def copy_s(self, nbytes: float) -> float:
        """Seconds to pack (or unpack) one bucket of `nbytes`: 0 when copies are not modelled."""
        return nbytes / self.bucket_copy_Bps if self.bucket_copy_Bps > 0 else 0.0

    @property
    def any(self) -> bool:
        return self.bucket_copy_Bps > 0 or self.collective_overhead_s > 0 or self.overlap_slowdown != 1.0

    def summary(self) -> dict:
        """Flat summary fields: each input's value and its `<name>_source`."""
        out: dict = {}
        for name, _, _ in INPUTS:
            out[name] = getattr(self, name)
            out[f"{name}_source"] = self.sources.get(name, "")
        return out


def _measured(trace, key: str):
    """(value, source) from the trace's recorded comm_overheads, or None when it was not measured there."""
    rec = getattr(trace, "extra", {}).get(TRACE_KEY)
    if not isinstance(rec, Mapping):
        return None
    v = rec.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (
            key == "overlap_slowdown" and v < 1):
        allowed = "a finite number >= 1" if key == "overlap_slowdown" else "a finite number >= 0"
        raise ConfigError(f"{TRACE_KEY}.{key}", v, allowed + " (or null: not measured)")
    device = rec.get("device") or _device_name(trace.device)
    how = rec.get(f"{key}_how") or rec.get("how")  # a measurement's own note, else the record's
    by = rec.get("by") or "the collector"  # the validator records its own measurements of the host it runs on
    return float(v), f"measured on {device} by {by}" + (f" ({how})" if how else "")


def _device_name(device: Mapping) -> str:
    return str(device.get("name") or device.get("kind") or "an unnamed device")


def resolve(comm, trace) -> CommOverheads:
    """The overheads an experiment runs with: the experiment file's values, else the trace's measurements, else
    unmeasured (0; 1.0 for the slowdown). An input its algorithm does not model (APPLIED_BY): 0 and said so."""
    values, sources = {}, {}
    for name, key, unmeasured in INPUTS:
        given = getattr(comm, name)
        if comm.algorithm not in APPLIED_BY[name]:
            values[name], sources[name] = unmeasured, f"not modelled by algorithm {comm.algorithm}: {unmeasured:g}"
        elif given is not None:
            values[name], sources[name] = float(given), EXPERIMENT_FILE
        elif (m := _measured(trace, key)) is not None:
            values[name], sources[name] = m
        else:
            values[name], sources[name] = unmeasured, f"unmeasured: {unmeasured:g}"
    return CommOverheads(**values, sources=sources)


def stretch_after(t, start, factor: float):
    """Times `t` (from backward's start) when everything after `start` runs `factor` times slower."""
    import numpy as np

    t, start = np.asarray(t, dtype=float), np.asarray(start, dtype=float)
    return np.where(t > start, start + (t - start) * factor, t)
