"""Per-call variation of collective times: every rank's time in every call drawn around the cost model's, and a
synchronous call ending with its slowest participant; the spread measured from a microbenchmark's repetitions.

The model. Rank r's time in one call of a collective that the cost model (simfog.collectives) prices at T is
T·(1 + s·Y_r), with s the per-call spread of the link classes the call crosses (`simfog.cluster.Link.spread`: the
coefficient of variation of one call's time) and Y_r a standardized Gumbel variable (mean 0, standard deviation 1):
Y = (G − γ)·√6/π, G a standard Gumbel, γ Euler's constant. A call among n ranks ends when its slowest participant
does: T·(1 + s·max_r Y_r). The Gumbel is closed under the maximum (the largest of n standard Gumbels is G + ln n),
so, exactly, at any n:

    max_r Y_r  ~  (G + ln n − γ)·√6/π          E[max_r Y_r] = (√6/π)·ln n          (0 for one rank)

The slowest of n is therefore drawn with ONE draw per call (the per-rank draws are never needed one by one), and
its expectation is a closed form: at 2,048 ranks (√6/π)·ln 2048 = 5.95 spreads. Its standard deviation stays s·T
at every n. Why a Gumbel rather than a normal: call times are skewed to the right (a call cannot beat its wire time
by much; a stall can make it much longer), and the normal's expected maximum has no closed form. Point-to-point
messages draw one factor each (a message is a call of its own, n = 1): a rank that waits for k of them pays the
slowest of k draws by itself; in "expected" mode each message pays the expected slowest of the k messages its
receiver takes part in (simfog.algorithms.dataflow: exact when they run together, as the start-together model has
them).

How a run evaluates it (comm.variation):
- "draw": each call draws its factor from a seeded stream of its own (the experiment's seed and the table's key:
  turning the spread on changes no compute draw), in a table per (iteration, call[, group]) that every evaluator
  of the run reads, so the event engine and the closed forms agree bit for bit;
- "expected": each call pays its expected slowest, T·(1 + s·(√6/π)·ln n), deterministic: the mean straggler cost
  without the noise of the draws (what `simfog curve` shows at 2,048 ranks with few iterations).
With every spread 0 nothing is drawn or multiplied: the numbers are those of a model without variation, bit for bit.

Measured spread (`spread_of`): a microbenchmark's repetitions of one call among n ranks are samples of that call's
slowest participant, T·(1 + s·max_r Y_r), whose standard deviation is s·T and whose median is T·(1 + s·(√6/π)·
(ln n − γ − ln ln 2)). The standard deviation is read from the interquartile range (a Gumbel's σ = 0.8156·IQR,
robust to the odd stalled repetition of a shared host), s solved from the two, and the class's spread is the median
over its measurements. `base_time` is then T itself, what the links are fitted on, so that the model gives back the
microbenchmark's median at its own n. Logs that carry only means (nccl-tests) say nothing of the spread: 0 is
assumed there, and an experiment may set one ([cluster] nic_spread, intra_spread).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MODES = ("draw", "expected")
# A spread above this would give negative call times with a probability no longer negligible (at 0.25,
# P(1 + s·Y < 0) = exp(−e^4.55) ≈ 1e-41); a host that noisy is not calibrated by an α-β line anyway.
MAX_SPREAD = 0.25
EULER_GAMMA = 0.5772156649015329
SCALE = math.sqrt(6.0) / math.pi  # a Gumbel's β per unit of standard deviation
MEDIAN_OFFSET = EULER_GAMMA + math.log(math.log(2.0))  # a standard Gumbel's mean minus its median: 0.2107
IQR_TO_STD = (math.pi / math.sqrt(6.0)) / (math.log(math.log(4.0)) - math.log(-math.log(0.75)))  # 0.8156
STREAM = 0x5EED_CA11  # the draws' stream beside the compute draws (simfog.simulation's generator)


def expected_slowest(n: int) -> float:
    """E[max of n standardized Gumbels] = (√6/π)·ln n: the expected slowest of n ranks, in spreads."""
    return SCALE * math.log(n)


def expected_factor(spread: float, n: int) -> float:
    """What a call among `n` ranks costs on average, as a multiple of the cost model's time: 1 + s·(√6/π)·ln n."""
    return 1.0 + spread * expected_slowest(n)


@dataclass(frozen=True)
class Variation:
    """How one run evaluates per-call variation: `mode` (MODES), the experiment's `seed` and `iterations`."""

    mode: str
    seed: int
    iterations: int

    def factors(self, key: str, spread, n) -> np.ndarray | None:
        """(iterations, *shape) factors of the calls whose spreads and participant counts are `spread` and `n`
        (arrays of one shape, or scalars); None when every spread is 0 (nothing varies). "draw": one Gumbel draw
        per (iteration, call) from the stream of `key` (a name the caller keeps for one table: the same key, seed
        and shape give the same draws); "expected": each call's expected slowest."""
        spread, n = np.broadcast_arrays(np.asarray(spread, dtype=float), np.asarray(n, dtype=float))
        if not spread.any():
            return None
        shape = (self.iterations, *spread.shape)
        if self.mode == "expected":
            return np.broadcast_to(1.0 + spread * (SCALE * np.log(n)), shape).copy()
        g = self.generator(key).gumbel(size=shape)
        return 1.0 + spread * (SCALE * (g + np.log(n) - EULER_GAMMA))

    def generator(self, key: str) -> np.random.Generator:
        """The seeded stream of table `key`: the experiment's seed, STREAM and the key's CRC-32."""
        return np.random.default_rng([self.seed, STREAM, zlib.crc32(key.encode())])

    def sequence(self, key: str) -> _Sequence:
        """Draws one call at a time, in the order the calls ask (an algorithm that decides its calls while running,
        on the event engine only, whose order of events is itself deterministic): `next_factor(spread, n)`."""
        return _Sequence(self, key)


class _Sequence:
    def __init__(self, variation: Variation, key: str):
        self.variation, self.rng = variation, variation.generator(key)

    def next_factor(self, spread: float, n: int) -> float:
        if not spread:
            return 1.0
        if self.variation.mode == "expected":
            return expected_factor(spread, n)
        return 1.0 + spread * (SCALE * (float(self.rng.gumbel()) + math.log(n) - EULER_GAMMA))


def spread_of(samples: Sequence[float], ranks: int) -> float:
    """The per-call spread s of a call among `ranks` ranks from its repeated samples (seconds; each the slowest
    rank of one repetition): s = c / (1 − c·(√6/π)·(ln n − 0.2107)), c = σ/median, σ = 0.8156·IQR (module
    docstring); 0 with fewer than 4 samples or none spread; capped at MAX_SPREAD."""
    x = np.asarray(samples, dtype=float)
    if x.size < 4:
        return 0.0
    q1, median, q3 = np.percentile(x, [25, 50, 75])
    if not median > 0:
        return 0.0
    c = IQR_TO_STD * (q3 - q1) / median
    denominator = 1.0 - c * SCALE * (math.log(ranks) - MEDIAN_OFFSET)
    return float(min(MAX_SPREAD, c / denominator)) if denominator > 0 else MAX_SPREAD


def class_spread(measurements: Sequence[tuple[Sequence[float], int]]) -> float:
    """The per-call spread of a link class: the median of `spread_of` over its measurements ((samples, ranks))."""
    values = [spread_of(samples, ranks) for samples, ranks in measurements]
    return float(np.median(values)) if values else 0.0


def median_factor(spread: float, ranks: int) -> float:
    """The median of a call among `ranks` ranks, as a multiple of the cost model's T: 1 + s·(√6/π)·(ln n −
    0.2107); exactly 1 without a spread."""
    return 1.0 + spread * SCALE * (math.log(ranks) - MEDIAN_OFFSET) if spread else 1.0


def base_time(median_s: float, spread: float, ranks: int) -> float:
    """The cost model's T of a call among `ranks` ranks whose measured median is `median_s` under `spread`."""
    return median_s / median_factor(spread, ranks)
