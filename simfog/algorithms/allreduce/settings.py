"""The settings of bucketing (static-bucket allreduce and its compressed variants; the other families bucket with
the same merge policies): one frozen dataclass whose __post_init__ is the one place its rules are checked."""

from __future__ import annotations

from dataclasses import dataclass

from simfog import merge, units
from simfog.algorithms import checks
from simfog.errors import ConfigError

# Collectives one rank keeps in flight ([comm] streams): each is a stream the analytic path and the engine keep state
# for, so 2**63 of them never finished; real libraries run 1 (NCCL) or 2 (gloo).
MAX_STREAMS = 64


def check_merge(name: object, *, field: str = "comm.merge", source: str | None = None) -> None:
    """The one check of a merge policy's name: ConfigError naming `field` and every registered policy."""
    merge.POLICIES.get(name, field=field, source=source)


@dataclass(frozen=True, kw_only=True)
class AllreduceSettings:
    """How gradients are put into buckets and how many collectives are in flight (SI units)."""

    merge: str = "ddp"
    """The merge policy: a name in simfog.merge.POLICIES (`simfog list`)."""
    threshold_bytes: float | None = None
    """Bucket size in bytes: required by merge = "threshold"; overrides ddp/horovod/bagua's own sizes."""
    cycle_time_s: float | None = None
    """Horovod's cycle time in seconds, > 0 (None: 1 ms)."""
    streams: int = 1
    """Collectives one rank keeps in flight, 1..MAX_STREAMS (gloo: 2 worker threads; NCCL: 1)."""
    powersgd_rank: int | None = None
    """PowerSGD's matrix approximation rank, >= 1 (None: 1)."""
    encode_bandwidth_Bps: float | None = None
    """Compression codec throughput in bytes of uncompressed data per second, > 0 (None: the codec's own)."""

    def __post_init__(self):
        self.check_allreduce()

    def check_allreduce(self) -> None:
        """Raise ConfigError (naming the [comm] key) unless every field holds what its docstring allows."""
        check_merge(self.merge)
        if self.threshold_bytes is not None:
            units.check(self.threshold_bytes, "bytes", field="comm.threshold")  # a number of bytes within LIMITS
        # a threshold's and a cycle time's values are checked too where the merge policies take them
        merge.MergeSettings(threshold_bytes=self.threshold_bytes, cycle_time_s=self.cycle_time_s)
        if self.merge == "threshold" and self.threshold_bytes is None:
            raise ConfigError("comm.threshold", "(missing)", 'a size such as "25MiB" when merge = "threshold"')
        checks.integer(self.streams, "comm.streams", 1, MAX_STREAMS, " (collectives one rank keeps in flight: gloo 2, "
                       "NCCL 1)")
        checks.integer(self.powersgd_rank, "comm.powersgd_rank", 1)
        checks.positive(self.encode_bandwidth_Bps, "comm.encode_bandwidth", 'a bandwidth > 0 such as "5GB/s"')
