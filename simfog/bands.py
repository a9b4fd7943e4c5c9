"""Prediction intervals: how far a predicted time may be from the measured one, at a stated level, and which part
of the prediction (the network, the compute, ...) makes the width.

Each part's half-width is conformal (split conformal prediction): its scores are |ln(measured / predicted)| of
held-out points, i.e. points the part's model was not fitted on, and its half-width at level L is the k-th smallest
of the n scores with k = ceil((n + 1)·L). If the held-out points and a new prediction are exchangeable, the new
point's score is at most that with probability >= L (and < L + 1/(n + 1) for distinct scores). With k > n (too few
points for the level) the scores cannot bound it: the part counts as unmeasured at that level.

Parts are combined as independent errors of one product of factors: in log space their half-widths add as a root
sum of squares, separately below and above the prediction (a part may move the result more one way than the
other). A part's share of the width is its square over the sum of squares. An input that nothing measured never
narrows the interval: it takes a stated default half-width (UNMEASURED_HALF_WIDTH) and the interval says so.

Pure: no simulation here (the propagation through a run is simfog.run_bands).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simfog.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

DEFAULT_LEVEL = 0.9
LEVEL_ALLOWED = "a level between 0 and 1 exclusive, e.g. 0.9 (90 %)"
# The half-width (ln) of an input nothing measured: ln 2, i.e. the true value may be half or twice the prediction
# (a roofline compute estimate was 6-35 % off measured H200 steps for most models, 4x for one; the held-out NCCL
# bench's 90 % half-widths are 0.4-1.3). An unmeasured input adds it, so it can only widen an interval.
UNMEASURED_HALF_WIDTH = math.log(2.0)


def check_level(level: object, field: str = "level") -> float:
    """`level` as a float in (0, 1). Raises ConfigError naming `field`."""
    if isinstance(level, bool) or not isinstance(level, int | float) or not 0.0 < float(level) < 1.0:
        raise ConfigError(field, level, LEVEL_ALLOWED)
    return float(level)


def log_scores(predicted: Sequence[float] | np.ndarray, measured: Sequence[float] | np.ndarray) -> np.ndarray:
    """|ln(measured / predicted)| per point (both > 0)."""
    import numpy as np  # here: reading a network file (which imports this module) needs no numpy

    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    return np.abs(np.log(m / p))


def conformal_rank(n: int, level: float) -> int:
    """k = ceil((n + 1)·level): the order statistic (1-based) of n scores that bounds a new one at `level`."""
    # the 1e-9 keeps ceil from rounding (n + 1)·level = 9.000000000000002 up to 10
    return math.ceil((n + 1) * level - 1e-9)


def conformal_quantile(scores: Sequence[float] | np.ndarray, level: float) -> float | None:
    """The conformal half-width of `scores` at `level` (module docstring); None when there are too few scores
    (k > n) to bound a new point at that level."""
    import numpy as np

    s = np.sort(np.asarray(scores, dtype=float))
    k = conformal_rank(len(s), check_level(level))
    return float(s[k - 1]) if k <= len(s) else None


@dataclass(frozen=True)
class Part:
    """One source of error: its half-widths (ln) below and above the prediction at the interval's level, where
    they come from, and whether anything measured them (an unmeasured part carries UNMEASURED_HALF_WIDTH)."""

    name: str
    below: float
    above: float
    source: str
    measured: bool = True

    def __post_init__(self):
        for side in ("below", "above"):
            v = getattr(self, side)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"{self.name}.{side}", v, "a half-width >= 0 (ln of a ratio)")

    @staticmethod
    def symmetric(name: str, half_width: float | None, source: str) -> Part:
        """A part of the same half-width either side; None (nothing measured it at this level) takes the default."""
        if half_width is None:
            return Part.unmeasured(name, source)
        return Part(name, half_width, half_width, source)

    @staticmethod
    def unmeasured(name: str, why: str, at_least: float = 0.0) -> Part:
        """A part nothing measured at this level: the default half-width, or `at_least` where the points there are
        (too few for the level) already lie wider; never narrower than what was seen."""
        w = max(UNMEASURED_HALF_WIDTH, at_least)
        return Part(name, w, w, f"UNMEASURED ({why}): {'default ' if w == UNMEASURED_HALF_WIDTH else ''}"
                    f"x/{math.exp(w):.3g}", measured=False)


@dataclass(frozen=True)
class Interval:
    """A predicted value and its interval [lo, hi] at `level`, with the parts it was built from and each part's
    share of the width (shares sum to 1; all 0 when the width is 0)."""

    level: float
    value: float
    lo: float
    hi: float
    parts: tuple[Part, ...] = ()
    shares: Mapping[str, float] = field(default_factory=dict)

    @property
    def unmeasured(self) -> tuple[str, ...]:
        """Names of the parts nothing measured (each widened the interval by the default)."""
        return tuple(p.name for p in self.parts if not p.measured)

    @property
    def relative_half_width(self) -> float:
        """(hi − lo) / 2 / value."""
        return (self.hi - self.lo) / 2 / self.value if self.value else 0.0

    def reciprocal(self, numerator: float) -> Interval:
        """The interval of numerator / value (e.g. samples/s from seconds per iteration): the bounds swap."""
        return Interval(self.level, numerator / self.value, numerator / self.hi, numerator / self.lo, self.parts,
                        self.shares)

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    def to_dict(self, prefix: str, unit: str = "") -> dict:
        """{prefix_lo<unit>, prefix_hi<unit>}: the JSON keys of a bound pair, e.g. iteration_time_lo_s."""
        return {f"{prefix}_lo{unit}": self.lo, f"{prefix}_hi{unit}": self.hi}


def combine(value: float, level: float, parts: Sequence[Part]) -> Interval:
    """The interval of `value` from independent parts (module docstring): lo = value·exp(−√Σ below²),
    hi = value·exp(√Σ above²)."""
    level = check_level(level)
    below = math.sqrt(sum(p.below ** 2 for p in parts))
    above = math.sqrt(sum(p.above ** 2 for p in parts))
    total = sum(p.below ** 2 + p.above ** 2 for p in parts)
    shares = {p.name: ((p.below ** 2 + p.above ** 2) / total if total > 0 else 0.0) for p in parts}
    return Interval(level, value, value * math.exp(-below), value * math.exp(above), tuple(parts), shares)


def effect(name: str, value: float, at_low: float, at_high: float, source: str, measured: bool = True) -> Part:
    """A part measured by its effect on a result: `value` re-computed with the part's inputs at their low and high
    bounds (`at_low`, `at_high`, either order). Its half-widths are the ln ratios to `value` below and above (0 on
    a side neither bound moves the result to)."""
    if not value > 0:
        raise ConfigError(f"{name}.value", value, "a predicted value > 0")
    logs = [math.log(x / value) for x in (at_low, at_high)]
    return Part(name, max(0.0, -min(logs)), max(0.0, max(logs)), source, measured)


def format_interval(iv: Interval, fmt) -> str:
    """'142 ms (90 %: 131–158 ms)' with `fmt` formatting one value (the unit is printed after the bounds only)."""
    lo, hi = fmt(iv.lo), fmt(iv.hi)
    lo_num, _, lo_unit = lo.partition(" ")
    hi_num, _, hi_unit = hi.partition(" ")
    bounds = f"{lo_num}–{hi}" if lo_unit == hi_unit else f"{lo}–{hi}"
    return f"{fmt(iv.value)} ({100 * iv.level:g} %: {bounds})"


# Message-size regimes of a network part's residuals (upper bounds, exclusive): below 64 KiB a collective's time is
# its latencies (NCCL's LL protocols), from 16 MiB its bandwidth (Simple), in between both.
SIZE_REGIMES = (("small", 64 * 2**10), ("medium", 16 * 2**20), ("large", math.inf))
LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)  # the levels half-widths are stored at


def size_regime(nbytes: float) -> str:
    """The SIZE_REGIMES name of a message of `nbytes`."""
    return next(name for name, upper in SIZE_REGIMES if nbytes < upper)


@dataclass(frozen=True)
class HalfWidths:
    """Conformal half-widths (ln) per size regime at LEVELS (None: too few points for that level), how many
    held-out points each regime had, and where they come from."""

    by_regime: Mapping[str, tuple[float | None, ...]]
    points: Mapping[str, int]
    source: str

    @staticmethod
    def from_scores(scores: Mapping[str, Sequence[float]], source: str) -> HalfWidths:
        """From |ln(measured / predicted)| of held-out points per regime (regimes without points left out)."""
        by = {r: tuple(conformal_quantile(scores[r], lv) for lv in LEVELS) for r, _ in SIZE_REGIMES if scores.get(r)}
        return HalfWidths(by, {r: len(scores[r]) for r in by}, source)

    def half_width(self, nbytes: float, level: float) -> float | None:
        """The half-width for a message of `nbytes` at `level`: the stored level equal to it or the next above (a
        wider interval, never a narrower one); None when the regime has no points or no stored level reaches."""
        level = check_level(level)
        row = self.by_regime.get(size_regime(nbytes))
        at = next((i for i, lv in enumerate(LEVELS) if lv >= level - 1e-12), None)
        return None if row is None or at is None else row[at]

    def widest(self, nbytes: float) -> float:
        """The widest half-width stored for the regime of a message of `nbytes` (0 where it has none): a level too
        high for its points is unmeasured, but never narrower than what a lower level measured."""
        return max((w for w in self.by_regime.get(size_regime(nbytes), ()) if w is not None), default=0.0)

    def to_toml(self, prefix: str = "interval") -> dict:
        """Flat keys for a TOML section: <prefix>_levels, <prefix>_<regime> (nan where None), <prefix>_points."""
        out: dict = {f"{prefix}_source": self.source, f"{prefix}_levels": list(LEVELS)}
        for r, row in self.by_regime.items():
            out[f"{prefix}_{r}"] = [round(x, 6) if x is not None else math.nan for x in row]
        out[f"{prefix}_points"] = [self.points.get(r, 0) for r, _ in SIZE_REGIMES]
        return out

    @staticmethod
    def from_toml(d: Mapping, source: str, prefix: str = "interval") -> HalfWidths | None:
        """The keys to_toml writes with `prefix` (None when there are none). Raises ConfigError naming the file and
        key."""
        if not any(k.startswith(f"{prefix}_") for k in d):
            return None
        levels = d.get(f"{prefix}_levels")
        if levels != list(LEVELS):
            raise ConfigError(f"calibrated.{prefix}_levels", levels, f"{list(LEVELS)} (as simfog calibrate writes)",
                              source=source)
        counts = d.get(f"{prefix}_points", [])
        if not (isinstance(counts, list) and len(counts) == len(SIZE_REGIMES)
                and all(type(c) is int and c >= 0 for c in counts)):
            raise ConfigError(f"calibrated.{prefix}_points", counts, f"{len(SIZE_REGIMES)} counts >= 0, one per "
                              f"regime ({', '.join(r for r, _ in SIZE_REGIMES)})", source=source)
        by, points = {}, {}
        for (r, _), n in zip(SIZE_REGIMES, counts, strict=True):
            row = d.get(f"{prefix}_{r}")
            if row is None:
                continue
            ok = isinstance(row, list) and len(row) == len(LEVELS) and all(
                isinstance(x, int | float) and not isinstance(x, bool) and (math.isnan(x) or x >= 0) for x in row)
            if not ok:
                raise ConfigError(f"calibrated.{prefix}_{r}", row, f"{len(LEVELS)} half-widths >= 0 (ln) or nan, "
                                  f"one per level of {prefix}_levels", source=source)
            by[r] = tuple(None if math.isnan(x) else float(x) for x in row)
            points[r] = n
        return HalfWidths(by, points, str(d.get(f"{prefix}_source", "")))


def one_sided_level(confidence: float | None, field: str = "confidence") -> float | None:
    """The two-sided interval level whose lower bound holds with one-sided `confidence` (0.9 -> 0.8: 10 % of
    outcomes lie below the 80 % interval, 5 % below the 90 % one); None for None. Raises ConfigError naming `field`
    unless 0.5 < confidence < 1."""
    if confidence is None:
        return None
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 < confidence < 1:
        raise ConfigError(field, confidence, "a probability in (0.5, 1), e.g. 0.9: the throughput is reached with "
                          "that confidence")
    return 2 * confidence - 1
