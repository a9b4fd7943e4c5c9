"""Human units at the edges, SI inside.

Inside simfog every time is in seconds, every size in bytes, every bandwidth in bytes per second and every
inverse bandwidth in seconds per byte. Decimal prefixes are powers of 10 (1 GB = 10**9 B, 1 Gbit = 10**9 bit),
binary prefixes powers of 2 (1 GiB = 2**30 B). A number without a unit is an error, never a guess.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from simfog.errors import ConfigError

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}

_NUMBER = r"(?P<num>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*"
_PATTERN = re.compile(_NUMBER + r"(?P<unit>\S.*)?$")

KINDS = ("time", "bytes", "bandwidth", "inverse_bandwidth")
# The largest value of each kind (SI) and how it is said: far beyond any real cluster, and small enough that sums
# and products of a simulation stay finite.
LIMITS = {"time": (1e9, "1e9 s (about 31 years)"), "bytes": (1e21, "1e21 B (a zettabyte)"),
          "bandwidth": (1e18, "1e18 B/s (an exabyte per second)"),
          "inverse_bandwidth": (1e3, "1e3 s/B")}
# The least positive bandwidth, the inverse of the largest inverse bandwidth: "1e-300B/s" made a message last 1e306 s,
# which overflowed MG-WFBP's fit and printed a 1e306 s iteration. (0 passes: some fields mean "free" by it.)
LEAST_BANDWIDTH = (1e-3, "1e-3 B/s (1e3 s per byte)")


def _prefix(p: str) -> float | None:
    if p in _BINARY:
        return _BINARY[p]
    return _DECIMAL.get(p)


def _size_unit(unit: str) -> float | None:
    """Bytes in one `unit` ("MiB", "GB", "B", "Gbit", "kb"); None when not a size unit."""
    for suffix, per in (("bit", 1 / 8), ("b", 1 / 8), ("B", 1.0)):
        if unit.endswith(suffix):
            scale = _prefix(unit[: -len(suffix)])
            if scale is not None:
                return scale * per
    return None


def _unit_factor(unit: str, kind: str) -> float | None:
    unit = unit.strip()
    if kind == "time":
        return _TIME.get(unit)
    if kind == "bytes":
        return _size_unit(unit) if unit.endswith("B") else None
    if kind == "bandwidth":
        if unit.endswith("ps"):  # "Gbps" = 10**9 bit/s, "GBps" = 10**9 B/s
            return _size_unit(unit[:-2])
        if "/" in unit:
            size, per = unit.split("/", 1)
            s, t = _size_unit(size.strip()), _TIME.get(per.strip())
            return None if s is None or t is None else s / t
        return None
    if kind == "inverse_bandwidth":
        if "/" in unit:
            time, per = unit.split("/", 1)
            t, s = _TIME.get(time.strip()), _size_unit(per.strip())
            return None if s is None or t is None else t / s
        return None
    raise ValueError(f"unknown quantity kind {kind!r}; allowed: {', '.join(KINDS)}")


_SI = {"time": "a time in seconds", "bytes": "a size in bytes", "bandwidth": "a bandwidth in bytes per second",
       "inverse_bandwidth": "an inverse bandwidth in seconds per byte"}
_EXAMPLES = {
    "time": '"5us", "1.5ms", "2s"',
    "bytes": '"25MiB", "4KB", "512B"',
    "bandwidth": '"25Gbit/s", "12.5GB/s", "100Gbps"',
    "inverse_bandwidth": '"0.8ns/B", "1us/KiB"',
}


def parse(text: object, kind: str, *, field: str = "value", source: str | None = None) -> float:
    """Parse a quantity of `kind` into SI (s, B, B/s or s/B).

    Raises ConfigError naming `field` (and `source`) when the text has no unit, the wrong unit or a negative value.
    """
    allowed = f"a {kind.replace('_', ' ')} with its unit, e.g. {_EXAMPLES[kind]}"
    if isinstance(text, bool) or not isinstance(text, str):
        raise ConfigError(field, text, allowed + " (a number without a unit is not accepted)", source=source)
    match = _PATTERN.match(text.strip())
    if not match or not match.group("unit"):
        raise ConfigError(field, text, allowed, source=source)
    factor = _unit_factor(match.group("unit"), kind)
    if factor is None:
        raise ConfigError(field, text, allowed, source=source)
    # Decimal keeps "10us" exactly 1e-05 rather than 10 * 1e-06 = 9.999999999999999e-06.
    value = float(Decimal(match.group("num")) * Decimal(repr(factor)))
    return check(value, kind, field=field, source=source, shown=text, allowed=allowed)


def check(value: object, kind: str, *, field: str = "value", source: str | None = None, shown: object = None,
          allowed: str | None = None) -> float:
    """`value`, a quantity of `kind` already in SI (a number: the Python API's sizes in bytes), as a float. Raises
    ConfigError naming `field` (showing `shown`, default the value) when it is not a number, negative, infinite or
    NaN, over LIMITS[kind], or a bandwidth above 0 and below LEAST_BANDWIDTH."""
    shown = value if shown is None else shown
    allowed = allowed or f"{_SI[kind]} (a number)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, shown, allowed, source=source)
    if value < 0:
        raise ConfigError(field, shown, allowed + " (not negative)", source=source)
    value = float(value) if value <= LIMITS[kind][0] else math.inf  # a 400-digit integer is no float
    if not math.isfinite(value) or value > LIMITS[kind][0]:
        # "1e400us" is inf as a float, "1e308s" overflows the simulator's sums: SimPy never fires an infinite
        # timeout, and a run built on one printed nonsense and exited 0
        raise ConfigError(field, shown, f"{allowed}, at most {LIMITS[kind][1]}", source=source)
    if kind == "bandwidth" and 0 < value < LEAST_BANDWIDTH[0]:
        raise ConfigError(field, shown, f"{allowed}, at least {LEAST_BANDWIDTH[1]}", source=source)
    return float(value)


def seconds(text: object, **kw) -> float:
    return parse(text, "time", **kw)


def nbytes(text: object, **kw) -> float:
    return parse(text, "bytes", **kw)


def bandwidth(text: object, **kw) -> float:
    return parse(text, "bandwidth", **kw)


def inverse_bandwidth(text: object, **kw) -> float:
    return parse(text, "inverse_bandwidth", **kw)


def format_time(s: float) -> str:
    """'1.50 ms', '12.0 us', '3.20 s' (for people)."""
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= f:
            return f"{s / f:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def format_bytes(b: float) -> str:
    """'25 MiB', '1.5 KiB' (binary prefixes, for people)."""
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= f:
            return f"{b / f:.4g} {unit}"
    return f"{b:.4g} B"


def format_bandwidth(bps: float) -> str:
    """'25 Gbit/s' (network convention: decimal bits per second)."""
    bits = bps * 8
    for unit, f in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if abs(bits) >= f:
            return f"{bits / f:.4g} {unit}"
    return f"{bits:.4g} bit/s"
