"""The checks the families' settings dataclasses make in __post_init__, written once: each raises ConfigError
naming the [comm] key, the value and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Iterable

from simfog.errors import ConfigError, one_of


def integer(value: object, field: str, least: int, most: int | None = None, why: str = "") -> None:
    """An int (not a bool) in least..most (most None: no upper bound); None passes (the default)."""
    if value is None:
        return
    allowed = f"an integer >= {least}{why}" if most is None else f"an integer in {least}..{most:,}{why}"
    if isinstance(value, bool) or not isinstance(value, int) or value < least or most is not None and value > most:
        raise ConfigError(field, value, allowed)


def flag(value: object, field: str) -> None:
    """True or False; None passes (the algorithm's own default)."""
    if value is not None and not isinstance(value, bool):
        raise ConfigError(field, value, "true or false")


def choice(value: object, field: str, names: Iterable[str]) -> None:
    """One of `names`; None passes."""
    names = list(names)
    if value is not None and value not in names:
        raise ConfigError(field, value, one_of(value, names))


def positive(value: object, field: str, allowed: str) -> None:
    """A finite number > 0; None passes."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                              or not 0 < value < math.inf):
        raise ConfigError(field, value, allowed)
