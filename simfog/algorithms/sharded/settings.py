"""The settings of sharded data parallelism (FSDP2, HSDP, ZeRO 1-3): one frozen dataclass whose __post_init__ is
the one place its values are checked. The checks that need the trace or the cluster (fsdp_unit's layer counts, an
HSDP group that divides the ranks, ZeRO's all-gather shards) are the experiment's (simfog.experiment)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from simfog.algorithms import checks
from simfog.errors import ConfigError
from simfog.trace import DTYPE_BYTES, MAX_COUNT

ZERO_REDUCES = ("allreduce", "reduce")
FSDP_UNIT_ALLOWED = '"layer", "model", a list of layer counts such as [2, 3] or a size such as "50MB"'
_BUCKET_ALLOWED = (f"a number of elements in 1..{MAX_COUNT:.4g} (2**53; an integer such as 5e8 or 500000000: "
                   "DeepSpeed counts elements, not bytes)")


@dataclass(frozen=True, kw_only=True)
class ShardedSettings:
    """What FSDP, HSDP and ZeRO shard, gather and reduce, and when (None: the algorithm's own default)."""

    fsdp_unit: str | float | tuple[int, ...] = "layer"
    """fsdp/hsdp wrapping unit: "layer", "model", a tuple of consecutive layer counts, or a size in bytes."""
    reshard_after_forward: bool = True
    """fsdp/hsdp: free a unit's parameters after forward and gather them again for backward."""
    prefetch: int = 1
    """fsdp/hsdp: all-gathers issued this many units ahead, >= 0."""
    param_dtype: str | None = None
    """dtype parameters are gathered and computed in, a key of simfog.trace.DTYPE_BYTES (None: the trace's)."""
    reduce_dtype: str | None = None
    """dtype gradients are reduced in (None: param_dtype)."""
    hsdp_group: int | None = None
    """hsdp: ranks that shard one replica, >= 1 (None: gpus_per_node)."""
    reduce_bucket_size: int = 500_000_000
    """zero*: elements per gradient bucket (DeepSpeed's default 5e8)."""
    allgather_bucket_size: int = 500_000_000
    """zero1/2: elements per parameter all-gather shard (5e8)."""
    prefetch_bucket_size: int = 50_000_000
    """zero3: stage3_prefetch_bucket_size, elements prefetched (5e7)."""
    overlap_comm: bool | None = None
    """zero*: reduce on a side stream (None: true for zero3, else false)."""
    zero_reduce: str = "allreduce"
    """zero1/2: "allreduce" per bucket, or "reduce" to each owner."""

    def __post_init__(self):
        self.check_sharded()

    def check_sharded(self) -> None:
        """Raise ConfigError (naming the [comm] key) unless every field holds what its docstring allows."""
        _check_fsdp_unit(self.fsdp_unit)
        checks.flag(self.reshard_after_forward, "comm.reshard_after_forward")
        checks.flag(self.overlap_comm, "comm.overlap_comm")
        checks.integer(self.prefetch, "comm.prefetch", 0)
        checks.choice(self.param_dtype, "comm.param_dtype", DTYPE_BYTES)
        checks.choice(self.reduce_dtype, "comm.reduce_dtype", DTYPE_BYTES)
        checks.integer(self.hsdp_group, "comm.hsdp_group", 1)
        for key, value in (("reduce_bucket_size", self.reduce_bucket_size),
                           ("allgather_bucket_size", self.allgather_bucket_size),
                           ("stage3_prefetch_bucket_size", self.prefetch_bucket_size)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
                raise ConfigError(f"comm.{key}", value, _BUCKET_ALLOWED)
        checks.choice(self.zero_reduce, "comm.zero_reduce", ZERO_REDUCES)


def _check_fsdp_unit(v: object) -> None:
    field = "comm.fsdp_unit"
    if v in ("layer", "model"):
        return
    if isinstance(v, tuple):
        if not v or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in v):
            raise ConfigError(field, list(v), FSDP_UNIT_ALLOWED + " (counts are integers >= 1)")
        return
    if isinstance(v, bool) or not isinstance(v, int | float) or not (v > 0 and math.isfinite(v)):
        raise ConfigError(field, v, FSDP_UNIT_ALLOWED + (" (a size > 0)" if isinstance(v, int | float) else ""))
