"""Calibrate simfog's NCCL model (simfog.nccl) from nccl-tests measurements of any mix of layouts.

The fitted parameters are what NCCL's tuner reads from its topology search and simfog cannot see (NcclNetwork):
bus bandwidth on one node and on several, the graph's inter-node latency, a per-operation launch time, the tree
pipeline fill and the channel count. Everything else (step counts, per-protocol hardware latencies, protocol and
tree caps, correction factors, NCCL's choice of algorithm and protocol) is NCCL's own, from the release named.

Loss: each measurement counts by log(predicted / measured), so 8 B and 8 GiB weigh alike, under a soft-L1 loss
(scipy.optimize.least_squares, f_scale = 5 %): a point far off (a noisy scale, a warm-up row) pulls on the fit
like a point 5 % off, not quadratically. The channel count is discrete: every value in CHANNELS is tried.
A measurement's time is the minimum of its samples (min of out-of-place and in-place for nccl-tests), the
uncontended run, unless `statistic` says otherwise.

Flags: after the fit, a point is flagged "off" when the model misses it by more than FLAG_ERROR, and
"non-monotone" when it took FLAG_SLOWER times longer than the next larger size of the same log: a time no
model of a collective can give, so it says the run was disturbed (or NCCL chose badly there), not the network.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from simfog import nccl, units
from simfog.calibrate import MIN_TIME_S
from simfog.errors import ConfigError, Infeasible
from simfog.trace import NetworkTrace

CHANNELS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32)
# Tree pipeline fill when the data cannot tell it (fewer than 3 multi-node scales: at 2 nodes the tree has one
# level and the fill hides in the launch and latency terms). 64 KiB is an estimate: the value that, with the
# other parameters fitted on <= 2 nodes, best predicted the 4-32-node A100 and V100 logs of shared/ref (chosen
# by looking at those logs, so bench/collectives.py is not blind to it; fitted whenever 3+ scales are given).
DEFAULT_TREE_FILL_B = 64 * 2**10
STATISTICS = {"min": np.min, "median": np.median, "mean": np.mean}
FLAG_ERROR = 0.25
FLAG_SLOWER = 1.2
# log GB/s, log GB/s, latencyInter µs, launch µs, log fill bytes (1 KiB .. 64 MiB)
# and the launch per extra GPU of one thread, µs
_BOUNDS = ([math.log(0.01), math.log(0.01), 0.0, 0.0, math.log(2**10), 0.0],
           [math.log(1e4), math.log(1e4), 200.0, 1000.0, math.log(2**26), 100.0])
_ARCH_BY_NAME = (("B200", "blackwell"), ("GB200", "blackwell"), ("B100", "blackwell"), ("H100", "hopper"),
                 ("H200", "hopper"), ("H800", "hopper"), ("GH200", "hopper"), ("A100", "ampere"),
                 ("A800", "ampere"), ("A30", "ampere"), ("A10", "ampere"), ("V100", "volta"))


@dataclass(frozen=True)
class Point:
    """One measurement against the fitted model (SI units)."""

    op: str
    ranks: int
    nodes: int
    bytes: int
    measured_s: float
    predicted_s: float
    algorithm: str
    protocol: str
    flag: str = ""

    @property
    def rel_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class NcclCalibration:
    """The fitted network and every measurement's residual."""

    network: nccl.NcclNetwork
    points: tuple[Point, ...]
    fitted: tuple[str, ...]      # which parameters the data determined
    source: str = ""

    def errors(self, *, flagged: bool = True) -> np.ndarray:
        """|relative error| of every point (without flagged ones when `flagged` is False)."""
        return np.array([abs(p.rel_error) for p in self.points if flagged or not p.flag])

    def report(self) -> str:
        """Parameters, per-size residuals, flagged points and the median/worst error, for people."""
        n = self.network
        out = [f"NCCL model {n.version} ({n.gpu_arch}, {n.cpu_vendor} CPUs, {n.intra_transport} inside a node)"
               f"{' from ' + self.source if self.source else ''}",
               f"  channels {n.channels}; bus bandwidth one node {n.intra_bus_Bps / 1e9:.4g} GB/s, several nodes "
               f"{n.inter_bus_Bps / 1e9:.4g} GB/s; latencyInter {n.latency_inter_s * 1e6:.3g} us; launch "
               f"{n.launch_s * 1e6:.3g} us; tree fill {units.format_bytes(n.tree_fill_B)}",
               f"  fitted: {', '.join(self.fitted)}; the rest is NCCL's own constants", "",
               f"{'op':10s} {'ranks':>5s} {'nodes':>5s} {'size':>10s} {'measured':>10s} {'predicted':>10s} "
               f"{'error':>7s}  {'choice':14s} flag"]
        for p in self.points:
            out.append(f"{p.op:10s} {p.ranks:5d} {p.nodes:5d} {units.format_bytes(p.bytes):>10s} "
                       f"{units.format_time(p.measured_s):>10s} {units.format_time(p.predicted_s):>10s} "
                       f"{p.rel_error:+7.1%}  {p.algorithm + '/' + p.protocol:14s} {p.flag}")
        e, ok = self.errors(), self.errors(flagged=False)
        flagged = sum(1 for p in self.points if p.flag)
        out += ["", f"{len(e)} points: median |error| {np.median(e):.1%}, worst {e.max():.1%}; "
                    f"{flagged} flagged" + (f" (without them: median {np.median(ok):.1%}, worst {ok.max():.1%})"
                                            if flagged and len(ok) else "")]
        rms = math.sqrt(float(np.mean(np.log1p(np.array([p.rel_error for p in self.points])) ** 2)))
        if rms > 0.2:
            out.append(f"POOR FIT: rms log error {rms:.2f}; check the flagged points and the options "
                       "(--nccl-version, --gpu-arch) before using this network")
        return "\n".join(out)


def arch_of(trace: NetworkTrace) -> str | None:
    """The GPU generation named anywhere in the trace's extra data (GPU model strings), or None."""
    text = repr(trace.extra)
    for name, arch in _ARCH_BY_NAME:
        if re.search(name, text):
            return arch
    return None


def gpus_per_thread(trace: NetworkTrace) -> list[int]:
    """For each measurement, how many GPUs one thread of the benchmark drove (nccl-tests' `-g`, the header's
    nGpus), from the importer's per-run records in extra["nccl_tests"]; 1 where unrecorded. One thread launches
    its GPUs' kernels one after another, so a single-process run of 8 GPUs pays about 8 launches per operation:
    the 2/4/8-GPU A100 logs' 8 B times grow 8.5 -> 16 -> 31 us while the network does not change."""
    out = [1] * len(trace.measurements)
    runs = trace.extra.get("nccl_tests") if isinstance(trace.extra, dict) else None
    for run in runs if isinstance(runs, list) else ():
        span = run.get("measurements") if isinstance(run, dict) else None
        m = re.search(r"nGpus\s+(\d+)", str(run.get("header", ""))) if isinstance(run, dict) else None
        if m and isinstance(span, list) and len(span) == 2:
            for i in range(max(0, span[0]), min(len(out), span[1])):
                out[i] = max(1, int(m.group(1)))
    return out


def _series(traces: Sequence[NetworkTrace], statistic: str) -> list[tuple[str, int, int, int, float, int]]:
    pts = []
    for trace in traces:
        gpus = gpus_per_thread(trace)
        for m, g in zip(trace.measurements, gpus, strict=True):
            if m.ranks < 2 or m.collective not in nccl.model.COLLECTIVES or not m.time_s or m.bytes == 0:  # 0 B
                continue
            t = float(STATISTICS[statistic](m.time_s))
            if not (math.isfinite(t) and t >= MIN_TIME_S):  # 0 s or a denormal: relative errors blow up
                raise ConfigError("measurements.time_s", list(m.time_s),
                                  f"times >= {MIN_TIME_S:g} s (errors are relative)")
            pts.append((m.collective, m.ranks, m.nodes, m.bytes, t, g))
    return pts


def fit(traces: Sequence[NetworkTrace], *, version: str = "2.30", gpu_arch: str | None = None,
        cpu_vendor: str = "intel", intra_transport: str = "nvlink", channels: int | None = None,
        statistic: str = "min", source: str = "") -> NcclCalibration:
    """Fit an NcclNetwork to the measurements of `traces` (nccl-tests logs of any layouts; 1-rank runs and
    collectives NCCL's model does not cover, alltoall and sendrecv, are left out). `gpu_arch` None: read from the
    GPU names in the traces (else "ampere"); `channels` None: the best of CHANNELS.

    Raises Infeasible when nothing can be fitted (no measurement with 2+ ranks, or a single message size),
    ConfigError for bad options or times."""
    from scipy.optimize import least_squares  # only calibration needs scipy

    if statistic not in STATISTICS:
        raise ConfigError("statistic", statistic, f"one of {', '.join(STATISTICS)}")
    pts = _series(traces, statistic)
    if not pts:
        raise Infeasible("nothing to calibrate: no measurement of allreduce, allgather, reduce_scatter, broadcast "
                         "or reduce on 2 or more ranks (a 1-rank log only measures the launch)")
    if len({p[3] for p in pts}) < 2:
        raise Infeasible(f"nothing to calibrate: every measurement has the same size ({pts[0][3]} B); latency "
                         "and bandwidth need at least two sizes")
    times = [p[4] for p in pts]
    if max(times) - min(times) <= 1e-9 * max(times):
        raise Infeasible(f"nothing to calibrate: the times do not grow with message size (every measurement takes "
                         f"{units.format_time(times[0])}), so no bandwidth can be fitted")
    arch = gpu_arch or next((a for a in map(arch_of, traces) if a), None) or "ampere"
    base = nccl.NcclNetwork(1e9, 1e9, version=version, gpu_arch=arch, cpu_vendor=cpu_vendor,
                            intra_transport=intra_transport)
    single, multi = any(p[2] == 1 for p in pts), any(p[2] > 1 for p in pts)
    fit_fill = len({p[2] for p in pts if p[2] > 1}) >= 3
    big = max(pts, key=lambda p: p[3])
    guess = max(1.0, 2 * big[3] / big[4] / 1e9)  # bus bandwidth of the largest message, GB/s

    def network(x: np.ndarray, ch: int) -> nccl.NcclNetwork:
        intra = math.exp(x[0]) if single else math.exp(x[1])
        inter = math.exp(x[1]) if multi else intra
        return replace(base, intra_bus_Bps=intra * 1e9, inter_bus_Bps=inter * 1e9, channels=ch,
                       latency_inter_s=float(x[2]) * 1e-6 if multi else 0.0, launch_s=float(x[3]) * 1e-6,
                       tree_fill_B=math.exp(x[4]) if fit_fill else float(DEFAULT_TREE_FILL_B))

    lo, hi = list(_BOUNDS[0]), list(_BOUNDS[1])
    if not fit_fill:
        lo[4], hi[4] = math.log(DEFAULT_TREE_FILL_B) - 1e-9, math.log(DEFAULT_TREE_FILL_B) + 1e-9
    threaded = any(p[5] > 1 for p in pts)
    if not threaded:
        hi[5] = 1e-9

    def residuals(x: np.ndarray, ch: int) -> np.ndarray:
        net = network(x, ch)
        return np.array([math.log(_predict(op, r, n, b, g, net, x[5] * 1e-6) / t) for op, r, n, b, t, g in pts])

    best = None
    for ch in (channels,) if channels else CHANNELS:
        for fill in (1.6e4, 1e6) if fit_fill else (DEFAULT_TREE_FILL_B,):
            x0 = np.clip(np.array([math.log(guess), math.log(guess), 5.0, 5.0, math.log(fill), 2.0]), lo, hi)
            r = least_squares(residuals, x0, args=(ch,), loss="soft_l1", f_scale=0.05, bounds=(lo, hi))
            if best is None or r.cost < best[0]:
                best = (r.cost, ch, r.x)
    _, ch, x = best
    net = network(x, ch)
    fitted = (["bus bandwidth on one node"] if single else []) + (
        ["bus bandwidth on several nodes", "latencyInter"] if multi else []) + (
        ["tree fill"] if fit_fill else []) + ["launch"] + (
        [] if channels else ["channels"])
    if threaded:
        fitted.append(f"launch per extra GPU of one thread ({x[5]:.3g} us; for the fit only)")
    return NcclCalibration(net, _points(pts, net, float(x[5]) * 1e-6), tuple(fitted), source)


def _predict(op: str, ranks: int, nodes: int, nbytes: int, gpus_per_thread: int, net: nccl.NcclNetwork,
             thread_launch_s: float) -> float:
    """The model's time for a measurement whose thread drove `gpus_per_thread` GPUs: each GPU after the first
    adds one serial launch (`thread_launch_s`, fitted apart from NcclNetwork.launch_s, which holds for the usual
    one GPU per process and is what simulations use)."""
    return nccl.choose(op, nbytes, ranks, nodes, net).time_s + (gpus_per_thread - 1) * thread_launch_s


def _points(pts, net: nccl.NcclNetwork, thread_launch_s: float = 0.0) -> tuple[Point, ...]:
    """Residual of every measurement with its flag, sorted by (op, ranks, nodes, bytes)."""
    pts = sorted(pts, key=lambda p: p[:4])
    out = []
    for i, (op, r, n, b, t, g) in enumerate(pts):
        c = nccl.choose(op, b, r, n, net)
        c = replace(c, time_s=c.time_s + (g - 1) * thread_launch_s)  # as _predict, without choosing twice
        nxt = pts[i + 1] if i + 1 < len(pts) and pts[i + 1][:3] == (op, r, n) else None
        flag = ""
        if nxt is not None and t > FLAG_SLOWER * nxt[4]:
            flag = "non-monotone"
        elif abs(c.time_s - t) / t > FLAG_ERROR:
            flag = "off"
        out.append(Point(op, r, n, b, t, c.time_s, c.algorithm, c.protocol, flag))
    return tuple(out)


def predict(net: nccl.NcclNetwork, traces: Sequence[NetworkTrace], *, statistic: str = "min") -> tuple[Point, ...]:
    """Every measurement of `traces` against `net` (no fitting): for held-out checks."""
    return _points(_series(traces, statistic), net)
