"""The settings of the algorithms decided at run time (WAGMA's groups, BAGUA's asynchronous rounds; Horovod's
fusion is bucketing: simfog.algorithms.allreduce.settings): one frozen dataclass whose __post_init__ is the one
place its values are checked."""

from __future__ import annotations

from dataclasses import dataclass

from simfog.algorithms import checks


@dataclass(frozen=True, kw_only=True)
class DynamicSettings:
    """WAGMA's group averaging and BAGUA's asynchronous period (None: the algorithm's own default)."""

    group_size: int | None = None
    """WAGMA group size S, >= 2 (default 8, at most the rank count)."""
    global_every: int | None = None
    """WAGMA: a global average every this many iterations, >= 1 (tau + 1, default 11)."""
    wait_for_group: bool = False
    """WAGMA: a group operation starts when its LAST member arrives (blocking)."""
    global_collective: bool = False
    """WAGMA: cost the global step as comm.collective's allreduce."""
    group_collective: bool = False
    """WAGMA: cost each group operation as a ring allreduce among its members."""
    async_period_s: float | None = None
    """BAGUA async: seconds between two averaging rounds, > 0 (default 500 ms)."""

    def __post_init__(self):
        self.check_dynamic()

    def check_dynamic(self) -> None:
        """Raise ConfigError (naming the [comm] key) unless every field holds what its docstring allows."""
        checks.integer(self.group_size, "comm.group_size", 2)
        checks.integer(self.global_every, "comm.global_every", 1)
        for key in ("wait_for_group", "global_collective", "group_collective"):
            checks.flag(getattr(self, key), f"comm.{key}")
        checks.positive(self.async_period_s, "comm.async_period", 'a time > 0 such as "500ms"')
