"""Fit the cluster's link classes (latency α, bandwidth 1/β) from a NetworkTrace, and report the residuals.

Model (docs/ALGORITHMS.md §3): a collective of M bytes over n ranks takes T = a·α + b·M·β, where (a, b) depend on the
collective, n and the algorithm (`coefficients`). The measurements of one link class are fitted together:

- intra: measurements on one node with more than one rank (loopback, shared memory, NVLink);
- nic:   one rank per node on several nodes (every message crosses a NIC);
- mixed layouts (several ranks per node on several nodes) are not fitted; they only get residuals, predicted with
  the same coefficients on the slower of the fitted links (a ring step lasts as long as its slowest hop).

α and β minimise the squared *relative* error Σ((T̂ − T)/T)² (least squares with weights 1/T), so 4 B and 256 MiB
count alike; T is the median of each measurement's samples, robust to the odd slow repetition (`statistic="min"`
takes the fastest instead: the uncontended path, when other work shares the CPUs). α, β >= 0.

Breakpoint: curves bend where a protocol changes (MPI eager -> rendezvous, NCCL LL -> Simple) or a buffer leaves
a cache. A two-segment fit (the split of least total error) is reported when it cuts the error more than
BREAKPOINT_GAIN-fold and one line is off by more than NOISE_FLOOR (rms); the Link then takes the small segment's α
(where latency dominates) and the large segment's β (the bytes of training). Bytes as nccl-tests counts them.

Over 400 lines because the fit and its report (the table, the POOR FIT flag, the residuals) read the same LinkFit
fields side by side: split, every field a fit gains would touch two modules.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simfog import units, variation
from simfog.cluster import Cluster, Link
from simfog.errors import ConfigError, Infeasible
from simfog.trace import NetworkTrace, load_network_trace

if TYPE_CHECKING:
    import pandas as pd  # for annotations: imported only where frames are made

ALGORITHMS = ("ring", "rhd", "tree")
CLASSES = ("intra", "nic")
STATISTICS = {"median": np.median, "min": np.min, "mean": np.mean}
BREAKPOINT_GAIN = 2.0  # a breakpoint must cut the squared relative error more than this factor
NOISE_FLOOR = 0.01     # ... and one line must be off by more than this (rms relative error)
BYTE_TERM_MIN = 0.01   # below this share of the largest message's time, β is noise: no bandwidth is fitted
MIN_TIME_S = 1e-12     # a measured time below a picosecond is no measurement (and 1/t overflows near denormals)
POOR_FIT = 0.2         # rms relative error above which a fit is flagged and its numbers shown to 2 digits
POOR_FIT_DIGITS = 2    # (4 significant figures at 50 % error would claim a precision the fit does not have)


def coefficients(collective: str, ranks: int, algorithm: str = "ring") -> tuple[float, float]:
    """(a, b) with T = a·α + b·M·β for `collective` on `ranks` ranks under `algorithm` (ring | rhd | tree).

    ring: allreduce 2(n−1), 2(n−1)/n; allgather, reduce_scatter, alltoall n−1, (n−1)/n; broadcast, reduce n−1, 1
    (pipelined chain, large-message limit). rhd: allreduce 2·⌈log2 n⌉, 2(n−1)/n; allgather, reduce_scatter
    ⌈log2 n⌉, (n−1)/n; broadcast, reduce (binomial tree) ⌈log2 n⌉, ⌈log2 n⌉; alltoall as ring.
    tree (pipelined): allreduce 2·⌈log2 n⌉, 2; broadcast, reduce ⌈log2 n⌉, 1; the rest as ring.
    sendrecv is 1, 1 everywhere. These are simfog.collectives' forms on a uniform link, so a fit and the
    simulator use the same model. Raises ConfigError for an unknown algorithm or collective."""
    if algorithm not in ALGORITHMS:
        raise ConfigError("algorithm", algorithm, f"one of {', '.join(ALGORITHMS)}")
    n = ranks
    f, lg = (n - 1) / n, math.ceil(math.log2(n)) if n > 1 else 0
    ring = {"allreduce": (2 * (n - 1), 2 * f), "allgather": (n - 1, f), "reduce_scatter": (n - 1, f),
            "alltoall": (n - 1, f), "broadcast": (n - 1, 1.0), "reduce": (n - 1, 1.0), "sendrecv": (1, 1.0)}
    table = dict(ring)
    if algorithm == "rhd":
        table.update(allreduce=(2 * lg, 2 * f), allgather=(lg, f), reduce_scatter=(lg, f),
                     broadcast=(lg, float(lg)), reduce=(lg, float(lg)))
    elif algorithm == "tree":
        table.update(allreduce=(2 * lg, 2.0), broadcast=(lg, 1.0), reduce=(lg, 1.0))
    if collective not in table:
        raise ConfigError("collective", collective, f"one of {', '.join(table)}")
    a, b = table[collective]
    return float(a), float(b)


def link_class(ranks: int, nodes: int) -> str | None:
    """'intra' (one node, several ranks), 'nic' (one rank per node, several nodes), 'mixed', or None (1 rank)."""
    if ranks <= 1:
        return None
    if nodes == 1:
        return "intra"
    return "nic" if ranks == nodes else "mixed"


@dataclass(frozen=True)
class LinkFit:
    """The fit of one link class. α in seconds, β in seconds per byte; `small`/`large` are (α, β) of the two
    segments (equal when there is no breakpoint); sizes below `breakpoint_bytes` use `small`."""

    link_class: str
    latency_s: float
    bandwidth_Bps: float
    breakpoint_bytes: int | None
    small: tuple[float, float]
    large: tuple[float, float]
    rms_rel_error: float          # of the fitted (one- or two-segment) model
    line_rms_rel_error: float     # of the best single line, for comparison
    points: int
    spread: float = 0.0           # per-call spread (fit's per_call: simfog.variation), 0 when not measured

    @property
    def poor(self) -> bool:
        """The α-β model does not describe these measurements well (rms relative error above POOR_FIT)."""
        return self.rms_rel_error > POOR_FIT

    @property
    def link(self) -> Link:
        """What goes into a Cluster: small-segment α, large-segment bandwidth, the per-call spread."""
        return Link(self.latency_s, self.bandwidth_Bps, spread=self.spread)

    def predict(self, a: float, bm: float, nbytes: int) -> float:
        """The fitted model's time (s) for coefficients a and b·M (bytes) of a message of `nbytes`."""
        alpha, beta = self.small if self.breakpoint_bytes is not None and nbytes < self.breakpoint_bytes \
            else self.large
        return a * alpha + bm * beta

    def link_time(self, a: float, bm: float) -> float:
        """The time (s) that the Link put into a Cluster gives for the same coefficients."""
        return a * self.latency_s + bm / self.bandwidth_Bps


@dataclass(frozen=True)
class Residual:
    link_class: str
    collective: str
    ranks: int
    nodes: int
    bytes: int
    measured_s: float
    predicted_s: float   # the fitted model (two segments when there is a breakpoint)
    link_s: float        # the single Link that apply() installs

    @property
    def rel_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def link_rel_error(self) -> float:
        return (self.link_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class Calibration:
    """Fitted link classes and the residuals of every measurement. Build it with `fit`."""

    algorithm: str
    fits: Mapping[str, LinkFit]
    rows: tuple[Residual, ...]
    source: str = ""
    statistic: str = "median"

    @property
    def fitted_classes(self) -> tuple[str, ...]:
        """The link classes the trace had data for, in CLASSES order."""
        return tuple(c for c in CLASSES if c in self.fits)

    @property
    def residuals(self) -> pd.DataFrame:
        """One row per measurement: link_class, collective, ranks, nodes, bytes, measured_s, predicted_s,
        rel_error, link_s, link_rel_error (relative errors signed: (predicted − measured) / measured)."""
        cols = ["link_class", "collective", "ranks", "nodes", "bytes", "measured_s", "predicted_s", "rel_error",
                "link_s", "link_rel_error"]
        import pandas as pd  # here: pandas takes most of a command's start-up

        return pd.DataFrame([[getattr(r, c) for c in cols] for r in self.rows], columns=cols)

    def apply(self, cluster: Cluster) -> Cluster:
        """`cluster` with its intra and/or nic Link replaced by the fitted ones; classes without data are kept.
        The nic fit is the bandwidth a flow saw; the cluster's oversubscription still applies on top."""
        return replace(cluster, **{c: self.fits[c].link for c in self.fitted_classes})

    def link_scores(self) -> tuple[tuple[int, float], ...]:
        """(bytes, |ln(measured / link time)|) per measurement of a fitted class (in sample): interval scores."""
        return tuple((r.bytes, abs(math.log(r.measured_s / r.link_s))) for r in self.rows
                     if r.link_class in self.fits and r.measured_s > 0 and r.link_s > 0)

    def summary(self) -> pd.DataFrame:
        """Per (link_class, collective, ranks, nodes): points, median and worst |relative error| of the fitted
        model and of the installed Link."""
        df = self.residuals.assign(abs_err=lambda d: d.rel_error.abs(), abs_link=lambda d: d.link_rel_error.abs())
        g = df.groupby(["link_class", "collective", "ranks", "nodes"], sort=False)
        return g.agg(points=("bytes", "size"), median_rel_error=("abs_err", "median"),
                     worst_rel_error=("abs_err", "max"), link_median_rel_error=("abs_link", "median"),
                     link_worst_rel_error=("abs_link", "max")).reset_index()

    def report(self, *, rows: bool = False) -> str:
        """A table of the fits and of the residuals per collective (and of every measurement when `rows`)."""
        out = [f"Calibration ({self.algorithm} coefficients, {self.statistic} of samples)"
               f"{': ' + self.source if self.source else ''}", "",
               f"{'class':6s} {'points':>6s} {'latency':>9s} {'bandwidth':>12s} {'breakpoint':>11s}"
               f" {'small α':>9s} {'small bw':>12s} {'large α':>9s} {'large bw':>12s} {'rms: 1 line':>12s}"
               f" {'fitted':>7s}"]
        poor = []
        for c in self.fitted_classes:
            f = self.fits[c]
            digits = POOR_FIT_DIGITS if f.poor else None
            bp = units.format_bytes(f.breakpoint_bytes) if f.breakpoint_bytes is not None else "none"
            t = functools.partial(_time, digits=digits)
            out.append(f"{c:6s} {f.points:6d} {t(f.latency_s):>9s} "
                       f"{_bandwidth(f.bandwidth_Bps, digits):>12s} {bp:>11s} "
                       f"{t(f.small[0]):>9s} {_bw(f.small[1], digits):>12s} "
                       f"{t(f.large[0]):>9s} {_bw(f.large[1], digits):>12s} "
                       f"{f.line_rms_rel_error:12.1%} {f.rms_rel_error:7.1%}")
            if f.poor:
                poor.append(f"{c} {f.rms_rel_error:.0%}")
        if poor:
            out += ["", f"POOR FIT: rms relative error {', '.join(poor)} (over {POOR_FIT:.0%}): the α-β line does not "
                        f"describe these measurements, so its numbers are shown to {POOR_FIT_DIGITS} significant "
                        "figures; check the residuals (--rows) and the algorithm (--algorithm) before using it"]
        bends = [f"{c} at {units.format_bytes(self.fits[c].breakpoint_bytes)}" for c in self.fitted_classes
                 if self.fits[c].breakpoint_bytes is not None]
        if bends:
            out += ["", f"Breakpoint ({', '.join(bends)}): for MPI, a protocol or algorithm switch; with "
                        '[comm] collective = "ompi", mpi_switch = "<size>" costs recursive doubling below it and '
                        "the ring above."]
        out += ["", "Residuals |relative error| (fit = fitted segments, link = the Link installed in the cluster):",
                f"{'class':6s} {'collective':15s} {'ranks':>5s} {'nodes':>5s} {'points':>6s} {'fit median':>10s}"
                f" {'fit worst':>10s} {'link median':>11s} {'link worst':>10s}"]
        for r in self.summary().itertuples():
            out.append(f"{r.link_class:6s} {r.collective:15s} {r.ranks:5d} {r.nodes:5d} {r.points:6d} "
                       f"{r.median_rel_error:10.1%} {r.worst_rel_error:10.1%} {r.link_median_rel_error:11.1%} "
                       f"{r.link_worst_rel_error:10.1%}")
        df = self.residuals
        out.append(f"{'all':6s} {'':15s} {'':5s} {'':5s} {len(df):6d} {df.rel_error.abs().median():10.1%} "
                   f"{df.rel_error.abs().max():10.1%} {df.link_rel_error.abs().median():11.1%} "
                   f"{df.link_rel_error.abs().max():10.1%}")
        if rows:
            out += ["", f"{'class':6s} {'collective':15s} {'ranks':>5s} {'nodes':>5s} {'bytes':>10s} "
                        f"{'measured':>9s} {'fit':>9s} {'err':>7s} {'link':>9s} {'err':>7s}"]
            for r in self.rows:
                out.append(f"{r.link_class:6s} {r.collective:15s} {r.ranks:5d} {r.nodes:5d} "
                           f"{units.format_bytes(r.bytes):>10s} {units.format_time(r.measured_s):>9s} "
                           f"{units.format_time(r.predicted_s):>9s} {r.rel_error:+7.1%} "
                           f"{units.format_time(r.link_s):>9s} {r.link_rel_error:+7.1%}")
        return "\n".join(out)

    def to_dict(self) -> dict:
        """JSON-ready: algorithm, source, fits per class (SI units), summary and residual rows."""
        fits = {c: {"latency_s": f.latency_s, "bandwidth_Bps": f.bandwidth_Bps,
                    "breakpoint_bytes": f.breakpoint_bytes,
                    "small": {"alpha_s": f.small[0], "beta_s_per_B": f.small[1]},
                    "large": {"alpha_s": f.large[0], "beta_s_per_B": f.large[1]}, "rms_rel_error": f.rms_rel_error,
                    "line_rms_rel_error": f.line_rms_rel_error, "poor_fit": f.poor, "points": f.points,
                    "spread": f.spread}
                for c, f in self.fits.items()}
        return {"algorithm": self.algorithm, "statistic": self.statistic, "source": self.source,
                "fitted_classes": list(self.fitted_classes),
                "fits": fits, "summary": self.summary().to_dict(orient="records"),
                "residuals": self.residuals.to_dict(orient="records")}


@dataclass(frozen=True)
class _Points:
    """The medians of one link class's measurements and their model coefficients."""

    collective: tuple[str, ...]
    ranks: np.ndarray
    nodes: np.ndarray
    nbytes: np.ndarray
    t: np.ndarray
    a: np.ndarray
    bm: np.ndarray  # b·M

    def take(self, mask: np.ndarray) -> _Points:
        return _Points(tuple(c for c, k in zip(self.collective, mask, strict=True) if k), self.ranks[mask],
                       self.nodes[mask], self.nbytes[mask], self.t[mask], self.a[mask], self.bm[mask])


def fit(trace: NetworkTrace, *, algorithm: str = "ring", statistic: str = "median",
        mixed_as_nic: bool = False, per_call: bool = False) -> Calibration:
    """Fit every link class that `trace` has data for (see the module docstring); each measurement counts with
    the `statistic` (median | min | mean) of its samples. `mixed_as_nic`: fit mixed-layout measurements (several
    ranks per node on several nodes) as the nic class: a ring laid out node by node waits for its NIC hops, so
    such a collective measures the NIC as a run of that very layout sees it (with its intra-node traffic sharing
    the hosts), which is what a calibration for that run wants. `per_call` (median only): also fit each class's
    per-call spread from the samples' spread (simfog.variation.spread_of, the median over its measurements), and
    fit the links on each measurement's time without its expected slowest rank (variation.base_time), so that the
    model with that spread gives back the measured medians.

    Returns a Calibration. Raises ConfigError for an empty trace, an unknown algorithm or statistic, or a
    measurement whose statistic is 0 s; Infeasible when no measurement calibrates a link class, or a class has
    fewer than two distinct message sizes, or its times do not grow with size (no bandwidth to fit)."""
    if algorithm not in ALGORITHMS:
        raise ConfigError("algorithm", algorithm, f"one of {', '.join(ALGORITHMS)}")
    if statistic not in STATISTICS:
        raise ConfigError("statistic", statistic, f"one of {', '.join(STATISTICS)}")
    if not trace.measurements:
        raise ConfigError("measurements", [], "at least one measurement (a trace with nothing measured)")
    by_class: dict[str, list] = {}
    samples: dict[str, list] = {}
    for i, m in enumerate(trace.measurements):
        cls = link_class(m.ranks, m.nodes)
        if cls is None:
            continue
        if cls == "mixed" and mixed_as_nic:
            cls = "nic"
        t = float(STATISTICS[statistic](m.time_s))
        if not t >= MIN_TIME_S:  # 0 s or a denormal: relative errors and 1/t blow up (no timer resolves it)
            raise ConfigError(f"measurements[{i}].time_s", list(m.time_s),
                              f"samples whose {statistic} is >= {MIN_TIME_S:g} s (errors are relative)")
        a, b = coefficients(m.collective, m.ranks, algorithm)
        by_class.setdefault(cls, []).append((m.collective, m.ranks, m.nodes, m.bytes, t, a, b * m.bytes))
        samples.setdefault(cls, []).append((m.time_s, m.ranks))
    if per_call and statistic != "median":
        raise ConfigError("statistic", statistic, "median when the per-call spread is fitted too")
    spreads = {c: variation.class_spread(samples[c]) if per_call else 0.0 for c in by_class}
    fits = {c: replace(_fit_class(c, _points(by_class[c], spreads[c])), spread=spreads[c])
            for c in CLASSES if c in by_class}
    if not fits:
        raise Infeasible("no measurement calibrates a link: need several ranks on one node (intra) or one rank "
                         "per node on several nodes (nic); mixed layouts are only used for residuals")
    rows = []
    for cls in (*CLASSES, "mixed"):
        for coll, ranks, nodes, nbytes, t, a, bm in by_class.get(cls, ()):
            if cls == "mixed" and "nic" not in fits:
                continue  # the intra link alone says nothing about crossing a node
            use = [fits[cls]] if cls in fits else [fits[c] for c in CLASSES if c in fits]
            # the bottleneck class's spread, as the model draws it (simfog.collectives.CostModel.spread); 1 without
            slowest = variation.median_factor(max(use, key=lambda f: f.link_time(a, bm)).spread, ranks)
            rows.append(Residual(cls, coll, ranks, nodes, nbytes, t,
                                 max(f.predict(a, bm, nbytes) for f in use) * slowest,
                                 max(f.link_time(a, bm) for f in use) * slowest))
    p = trace.provenance
    source = f"{trace.backend}/{trace.transport}, {p.source} {p.date} on {p.host}"
    return Calibration(algorithm, fits, tuple(rows), source, statistic)


def link_calibration(path_or_trace: str | Path | NetworkTrace, **how) -> Calibration:
    """The Calibration of a NetworkTrace (file or loaded; `how`: fit's keywords); ConfigError names the file."""
    trace = path_or_trace if isinstance(path_or_trace, NetworkTrace) else load_network_trace(path_or_trace)
    try:
        return fit(trace, **how)
    except ConfigError as e:
        raise (e if isinstance(path_or_trace, NetworkTrace) else e.in_file(str(path_or_trace))) from None


def cluster_from_network_trace(path_or_trace: str | Path | NetworkTrace, base: Cluster, **how) -> Cluster:
    """`base` with the link classes the NetworkTrace calibrates replaced (`how`: link_calibration's keywords)."""
    return link_calibration(path_or_trace, **how).apply(base)


def _points(rows: Sequence[tuple], spread: float = 0.0) -> _Points:
    """The class's points; with a per-call `spread`, each time without its expected slowest rank."""
    coll, ranks, nodes, nbytes, t, a, bm = zip(*rows, strict=True)
    if spread:
        t = [variation.base_time(x, spread, n) for x, n in zip(t, ranks, strict=True)]
    return _Points(tuple(coll), np.array(ranks), np.array(nodes), np.array(nbytes), np.array(t), np.array(a),
                   np.array(bm, dtype=float))


def _fit_line(p: _Points) -> tuple[float, float, float]:
    """(α, β, Σ relative error²) of T = a·α + bM·β, α, β >= 0."""
    x = np.column_stack([p.a / p.t, p.bm / p.t])
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0  # all-zero column (only 0-byte messages): β is undetermined, stays 0
    y = np.ones(len(p.t))
    sol = np.linalg.lstsq(x / scale, y, rcond=None)[0] / scale
    candidates = [sol] if (sol >= 0).all() else []
    for j in (0, 1):  # the best fit on the boundary α = 0 or β = 0
        c, col = np.zeros(2), x[:, j]
        if col @ col > 0:
            c[j] = (col @ y) / (col @ col)
            candidates.append(c)
    best = min(candidates, key=lambda c: float(np.sum((x @ c - y) ** 2)))
    return float(best[0]), float(best[1]), float(np.sum((x @ best - y) ** 2))


def _fit_class(cls: str, p: _Points) -> LinkFit:
    sizes = np.unique(p.nbytes)
    if len(sizes) < 2:
        raise Infeasible(f"link class {cls!r}: {len(sizes)} distinct message size(s); α and β need at least 2 "
                         f"(sizes seen: {[int(s) for s in sizes]})")
    if np.ptp(p.t) <= 1e-9 * p.t.max():
        raise Infeasible(f"link class {cls!r}: the times do not grow with message size (every measurement takes "
                         f"{units.format_time(p.t[0])}), so no bandwidth can be fitted")
    alpha, beta, sse1 = _fit_line(p)
    small = large = (alpha, beta)
    best, breakpoint_bytes = sse1, None
    split = None
    for j in range(2, len(sizes) - 1):  # each segment keeps at least 2 distinct sizes
        lo = p.nbytes < sizes[j]
        s, l_ = _fit_line(p.take(lo)), _fit_line(p.take(~lo))
        if split is None or s[2] + l_[2] < split[0]:
            split = (s[2] + l_[2], int(sizes[j]), s[:2], l_[:2])
    n = len(p.t)
    if split is not None and split[0] * BREAKPOINT_GAIN < sse1 and math.sqrt(sse1 / n) > NOISE_FLOOR:
        best, breakpoint_bytes, small, large = split
    k = int(np.argmax(p.bm))
    if not large[1] * p.bm[k] > BYTE_TERM_MIN * p.t[k]:
        raise Infeasible(f"link class {cls!r}: the times do not grow with message size (the byte term is under "
                         f"{BYTE_TERM_MIN:.0%} of the time even at {units.format_bytes(int(p.nbytes[k]))}), so no "
                         "bandwidth can be fitted; measure larger messages")
    return LinkFit(cls, small[0], 1.0 / large[1], breakpoint_bytes, small, large, math.sqrt(best / n),
                   math.sqrt(sse1 / n), n)


def _bw(beta: float, digits: int | None = None) -> str:
    return _bandwidth(1.0 / beta, digits) if beta > 0 else "inf"


def _time(s: float, digits: int | None) -> str:
    return units.format_time(_significant(s, digits))


def _bandwidth(Bps: float, digits: int | None) -> str:
    # rounded in bit/s, the unit shown: 1.4e9 B/s rounded in bytes would still print as 11.2 Gbit/s
    return units.format_bandwidth(_significant(Bps * 8, digits) / 8)


def _significant(x: float, digits: int | None) -> float:
    """`x` rounded to `digits` significant figures (None: unchanged), so that the usual formatting prints no
    more digits than the fit supports."""
    if digits is None or x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))
