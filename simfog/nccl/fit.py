"""Calibrate simfog's NCCL model (simfog.nccl) from nccl-tests measurements of any mix of layouts and collectives
(allreduce, allgather, reduce-scatter, broadcast, reduce, alltoall, sendrecv): one parameter set for them all.

What is fitted is what NCCL reads from its topology search and simfog cannot see: the bus bandwidth on one node
and between nodes (the whole node's; a layout uses its NICs' share, rails), the graph's latencyInter (a network
plugin's latency; 2.12 on), a per-operation launch time, and the point-to-point rates and per-peer latency of
alltoall / sendrecv. Everything else (steps, per-protocol latencies, caps, corrections, NCCL's choice) is NCCL's
own, from the release the logs state (simfog.nccl.facts). Each parameter is fitted only where the logs hold the
measurements it acts on (one-node bandwidth from one-node logs, ...); the rest take the hardware's value
(simfog.nccl.network) and are reported as assumed.

simfog's additions to NCCL's formulas are fitted only when the logs identify them, i.e. fitting one cuts the loss
by more than IDENTIFY_GAIN of it (and by more than 1 % rms noise): the tree's pipeline fill, the bandwidth a 2-node
tree delivers above the inter-node rate, extra inter-node latency per protocol (a fabric's plugin making LL or
Simple costlier than NCCL's tables), and before 2.12 the graph latency; otherwise the fill and the gain take
UNIDENTIFIED (learned across clusters), the others stay off. Channels likewise: the logs' count when NCCL_DEBUG
printed one, else the hardware's (search.cc, derived from the NICs; at the rate the logs measure where the NICs'
is not given), replaced by a fitted count only when that is identified; without NICs the best count is fitted.
NICs per node, when nobody states them, are fitted where logs at several GPUs per node on several nodes identify
them (rails); with no one-node log no launch is fitted (a constant the inter-node latency cannot be told from).

Loss: log(predicted / measured) per measurement, so 8 B and 8 GiB weigh alike, under a soft-L1 loss
(scipy.optimize.least_squares, f_scale = 5 %). Each fit is bounded (MAX_NFEV iterations); layouts are evaluated
vectorized over their sizes (simfog.nccl.batch), so calibration takes seconds. A measurement's time is the minimum
of its samples (out-of-place, in-place) unless `statistic` says otherwise; residuals: nccl.report.residual_points.
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
from simfog.nccl import batch
from simfog.nccl.calibrated import Calibrated
from simfog.nccl.facts import arch_of, resolve  # noqa: F401  (arch_of re-exported: callers read the GPU generation here)
from simfog.nccl.report import FLAG_ERROR, FLAG_SLOWER, NcclCalibration, Point, residual_points  # noqa: F401
from simfog.nccl.scale_out import FabricSpec
from simfog.trace import NetworkTrace

CHANNELS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32)
STATISTICS = {"min": np.min, "median": np.median, "mean": np.mean}
IDENTIFY_GAIN = 0.2
NOISE_RMS = 0.01
MAX_NFEV = 40
F_SCALE = 0.05
SCAN_NFEV = 12  # iterations of each channel count's fit before the best count is fitted to the end
_LOG_BW = (math.log(0.01), math.log(1e4))  # GB/s; _PARAMS: name -> (bounds, start), bandwidths log GB/s, times µs
_PARAMS = {"intra": (_LOG_BW, None), "inter": (_LOG_BW, None), "latency_inter": ((0.0, 200.0), 2.0),
           "launch": ((0.0, 1000.0), 5.0), "thread_launch": ((0.0, 100.0), 2.0), "p2p_intra": (_LOG_BW, None),
           "p2p_nic": (_LOG_BW, None), "p2p_latency": ((0.0, 1000.0), 5.0),
           "tree_fill": ((math.log(2**10), math.log(2**26)), math.log(2**16)), "tree_gain": ((1.0, 2.0), 1.2),
           "net_ll": ((0.0, 500.0), 5.0), "net_ll128": ((0.0, 500.0), 5.0), "net_simple": ((0.0, 500.0), 5.0)}
# The tree fill and the 2-node tree gain where the logs cannot identify them (logs of at most 2 nodes cannot: the
# fill grows with the tree's depth, the gain relates a 2-node tree to the ring of 3+ nodes). Learned across
# clusters: the grid point of bench/collectives.py (fill 0-512 KiB x gain 1-2) with the least mean of per-cluster
# median errors over the held-out (3+ node) logs of all its 8 clusters (nccl-tests logs of A100, H100, GH200, B200 and
# V100 clusters on InfiniBand, Slingshot and TCP, NCCL 2.8-2.30); the bench reports each cluster with the values
# learned from the others and says when these are no longer what all of them give.
UNIDENTIFIED = {"tree_fill_B": 131072.0, "two_node_tree_gain": 1.0}
UNIDENTIFIED_SOURCE = "learned across the bench's clusters"
_ADDITIONS = {"latency_inter": "latencyInter (simfog's before NCCL 2.12)", "tree_gain": "2-node tree gain",
              "tree_fill": "tree fill", "net_ll": "LL inter-node latency", "net_ll128": "LL128 inter-node latency",
              "net_simple": "Simple inter-node latency"}


@dataclass(frozen=True)
class _Group:
    op: str
    ranks: int
    nodes: int
    gpt: int              # GPUs one benchmark thread drove
    sizes: np.ndarray
    times: np.ndarray


def gpus_per_thread(trace: NetworkTrace) -> list[int]:
    """For each measurement, how many GPUs one thread of the benchmark drove (nccl-tests' `-g`, the header's
    nGpus), from the importer's per-run records; 1 where unrecorded. One thread launches its GPUs' kernels one
    after another, so a single-process run of 8 GPUs pays about 8 launches per operation (the A100 logs' 8 B
    times grow 8.5 -> 16 -> 31 us from 2 to 8 GPUs while the network does not change)."""
    out = [1] * len(trace.measurements)
    runs = trace.extra.get("nccl_tests") if isinstance(trace.extra, dict) else None
    for run in runs if isinstance(runs, list) else ():
        span = run.get("measurements") if isinstance(run, dict) else None
        m = re.search(r"nGpus\s+(\d+)", str(run.get("header", ""))) if isinstance(run, dict) else None
        if m and isinstance(span, list) and len(span) == 2:
            for i in range(max(0, span[0]), min(len(out), span[1])):
                out[i] = max(1, int(m.group(1)))
    return out


def _series(traces: Sequence[NetworkTrace], statistic: str) -> list[tuple]:
    """(op, ranks, nodes, bytes, seconds, GPUs per thread) of every measurement NCCL's model covers."""
    pts = []
    for trace in traces:
        for m, g in zip(trace.measurements, gpus_per_thread(trace), strict=True):
            if m.ranks < 2 or m.collective not in nccl.OPS or not m.time_s or m.bytes == 0:  # 0 B: no transfer
                continue
            t = float(STATISTICS[statistic](m.time_s))
            if not (math.isfinite(t) and t >= MIN_TIME_S):  # 0 s or a denormal: relative errors blow up
                raise ConfigError("measurements.time_s", list(m.time_s),
                                  f"times >= {MIN_TIME_S:g} s (errors are relative)")
            pts.append((m.collective, m.ranks, m.nodes, m.bytes, t, g))
    return pts


def _groups(pts) -> list[_Group]:
    by: dict[tuple, list] = {}
    for op, r, n, b, t, g in pts:
        by.setdefault((op, r, n, g), []).append((b, t))
    return [_Group(*k, np.array([b for b, _ in v], dtype=float), np.array([t for _, t in v]))
            for k, v in sorted(by.items())]


class _Model:
    """The parameters being fitted (`active`, in order) on top of a network, and the loss over every group."""

    def __init__(self, base: nccl.NcclNetwork, groups: list[_Group], fallback: dict, inter_from_p2p: bool = False):
        self.base, self.groups, self.fallback, self.inter_from_p2p = base, groups, fallback, inter_from_p2p
        self.bounds = {k: b for k, (b, _) in _PARAMS.items()}
        if base.nics_per_node is not None and base.nic_Bps is not None:
            # the wire: a node's inter-node bus bandwidth is at most its NICs' line rate, one NIC's p2p rate its own
            wire = math.log(base.nics_per_node * base.nic_Bps / 1e9)
            self.bounds["inter"] = (_LOG_BW[0], wire)
            self.bounds["p2p_nic"] = (_LOG_BW[0], math.log(base.nic_Bps / 1e9))
        self.prepared = [{} for _ in groups]  # batch.choose_many's per-layout work, kept across evaluations

    def network(self, values: dict, channels) -> nccl.NcclNetwork:
        v = {**self.fallback, **values}
        intra = math.exp(v["intra"]) if "intra" in v else None
        inter = math.exp(v["inter"]) if "inter" in v else None
        if inter is None and self.inter_from_p2p and "p2p_nic" in v:  # the NICs' measured rate
            inter = math.exp(v["p2p_nic"]) * (self.base.nics_per_node or 1)
        intra, inter = intra or inter, inter or intra
        lat = (v.get("net_ll", 0.0), v.get("net_ll128", 0.0), v.get("net_simple", 0.0))
        return replace(
            self.base, intra_bus_Bps=intra * 1e9, inter_bus_Bps=inter * 1e9, channels=channels,
            latency_inter_s=v.get("latency_inter", 0.0) * 1e-6, launch_s=v.get("launch", 0.0) * 1e-6,
            tree_fill_B=(math.exp(values["tree_fill"]) if "tree_fill" in values
                         else self.fallback.get("tree_fill_B", 0.0)),
            two_node_tree_gain=v.get("tree_gain", 1.0), net_latency_s=tuple(x * 1e-6 for x in lat),
            p2p_intra_Bps=math.exp(v["p2p_intra"]) * 1e9 if "p2p_intra" in v else self.base.p2p_intra_Bps,
            p2p_nic_Bps=math.exp(v["p2p_nic"]) * 1e9 if "p2p_nic" in v else self.base.p2p_nic_Bps,
            p2p_latency_s=v["p2p_latency"] * 1e-6 if "p2p_latency" in v else self.base.p2p_latency_s)

    def residuals(self, net: nccl.NcclNetwork, thread_launch_s: float) -> np.ndarray:
        out = []
        for g, prepared in zip(self.groups, self.prepared, strict=True):
            t, _ = batch.choose_many(g.op, g.sizes, g.ranks, g.nodes, net, prepared)
            out.append(np.log((t + (g.gpt - 1) * thread_launch_s) / g.times))
        r = np.concatenate(out)
        return np.where(np.isfinite(r), r, 10.0)

    def cost(self, values: dict, channels) -> float:
        """The soft-L1 loss least_squares minimises (0.5 · f² · Σ 2(√(1 + (r/f)²) - 1), f = F_SCALE) at `values`."""
        r = self.residuals(self.network(values, channels), values.get("thread_launch", 0.0) * 1e-6)
        return float(F_SCALE**2 * np.sum(np.sqrt(1 + (r / F_SCALE) ** 2) - 1))

    def solve(self, active: list[str], x0: dict, channels, max_nfev: int = MAX_NFEV) -> tuple[float, dict]:
        """(soft-L1 cost, fitted values) with `active` free, starting from x0."""
        from scipy.optimize import least_squares  # only calibration needs scipy

        lo = [self.bounds[a][0] for a in active]
        hi = [self.bounds[a][1] for a in active]
        start = np.clip([x0[a] for a in active], lo, hi)

        def res(x):
            v = dict(zip(active, x, strict=True))
            return self.residuals(self.network(v, channels), v.get("thread_launch", 0.0) * 1e-6)

        r = least_squares(res, start, loss="soft_l1", f_scale=F_SCALE, bounds=(lo, hi), max_nfev=max_nfev)
        return float(r.cost), dict(zip(active, (float(x) for x in r.x), strict=True))


def _fit_nics(model: _Model, active: list[str], x0: dict, n: int) -> tuple[_Model, str | None]:
    """NICs per node where no one states them and multi-node logs of several GPUs per node can tell (rails: a
    layout of G GPUs per node uses min(G, K) NICs): each count K up to the most GPUs per node of those logs, kept
    when it is identified against no rails. (model, what was fitted) or (model, None)."""
    gpus = sorted({-(-g.ranks // g.nodes) for g in model.groups if g.nodes > 1})
    if len(gpus) < 2:
        return model, None
    counts = sorted({k for k in (1, 2, 4, 8, 16, 32) if k <= gpus[-1]} | set(gpus))
    without, _ = model.solve(active, x0, 8)
    tried = {}
    for k in counts:
        m = _Model(replace(model.base, nics_per_node=k), model.groups, model.fallback, model.inter_from_p2p)
        tried[k] = (m.solve(active, x0, 8)[0], m)
    best = min(tried, key=lambda k: tried[k][0])
    if not _identified(without, tried[best][0], n):
        return model, None
    return tried[best][1], (f"NICs per node {best} (logs at {', '.join(map(str, gpus))} GPUs per node on several "
                            "nodes)")


def _identified(cost_without: float, cost_with: float, n: int) -> bool:
    """A parameter is identified when fitting it cuts the loss by more than IDENTIFY_GAIN of it and by more than
    NOISE_RMS noise would (the soft-L1 cost of n points at NOISE_RMS is about n · NOISE_RMS² / 2)."""
    gain = cost_without - cost_with
    return gain > IDENTIFY_GAIN * cost_without and gain > n * NOISE_RMS**2 / 2


def fit(traces: Sequence[NetworkTrace], *, version: str | None = None, gpu_arch: str | None = None,
        cpu_vendor: str | None = None, intra_transport: str | None = None, channels: int | None = None,
        nics_per_node: int | None = None, nic_Bps: float | None = None, gpu_nic_path: str | None = None,
        nvls: bool | None = None, collnet: bool | None = None, statistic: str = "min",
        source: str = "", unidentified: dict | None = None, fabric: FabricSpec | None = None) -> NcclCalibration:
    """Fit an NcclNetwork to the measurements of `traces` (nccl-tests logs of any layouts and collectives; 1-rank
    runs and collectives NCCL has no model for are left out). Hardware arguments None: as the logs state, else
    assumed (simfog.nccl.facts). Raises Infeasible when nothing can be fitted (no measurement with 2+ ranks, one
    message size, times that do not grow), ConfigError for bad options, times, or logs of different releases.
    `unidentified`: the values of the tree fill ("tree_fill_B", bytes) and the 2-node tree gain
    ("two_node_tree_gain") where the logs cannot identify them (default UNIDENTIFIED). `fabric`: the switches
    between the nodes (simfog.nccl.scale_out; the bandwidths fitted are then a non-blocking fabric's)."""
    if statistic not in STATISTICS:
        raise ConfigError("statistic", statistic, f"one of {', '.join(STATISTICS)}")
    facts = resolve(traces, dict(version=version, gpu_arch=gpu_arch, cpu_vendor=cpu_vendor,
                                            intra_transport=intra_transport, channels=channels,
                                            nics_per_node=nics_per_node, nic_Bps=nic_Bps, gpu_nic_path=gpu_nic_path,
                                            nvls=nvls, collnet=collnet))
    pts = _series(traces, statistic)
    _check_fittable(pts)
    base = nccl.NcclNetwork(1e9, 1e9, **facts.hardware, fabric=fabric)
    groups = _groups(pts)
    coll = [g for g in groups if g.op in nccl.model.COLLECTIVES]
    p2p = [g for g in groups if g.op in nccl.p2p.OPS]
    single, multi = any(g.nodes == 1 for g in coll), any(g.nodes > 1 for g in coll)
    p2p_multi = not multi and any(g.nodes > 1 for g in p2p)  # NICs measured by alltoall / sendrecv only
    fallback, assumed = _hardware_fallback(base, single, multi or p2p_multi, coll)
    defaults = {**UNIDENTIFIED, **(unidentified or {})}
    if defaults["tree_fill_B"] > 0:  # held fixed unless the logs identify another value
        fallback["tree_fill"] = math.log(defaults["tree_fill_B"])
        fallback["tree_fill_B"] = float(defaults["tree_fill_B"])
    if defaults["two_node_tree_gain"] != 1.0:
        fallback["tree_gain"] = float(defaults["two_node_tree_gain"])
    if not any(g.nodes == 1 for g in groups):
        # a constant per operation cannot be told from the inter-node latency without one-node logs; NCCL's own
        # model has none, so the logs' constant goes to the network's latency
        assumed.append("launch 0 (no one-node logs: a constant cannot be told from the inter-node latency)")
    if p2p_multi:
        assumed.append("bus bandwidth between nodes = the p2p NIC rate x the NICs per node (no multi-node "
                       "collective logs)")
    model = _Model(base, groups, fallback, p2p_multi)
    new_latency = nccl.parse_release(base.version) >= (2, 12, 0)
    active = ([k for k, on in (("intra", single), ("inter", multi), ("latency_inter", multi and new_latency))
               if on] + (["launch"] if any(g.nodes == 1 for g in groups) else [])
              + (["thread_launch"] if any(g.gpt > 1 for g in groups) else [])
              + [k for k, on in (("p2p_intra", any(g.nodes == 1 for g in p2p)),
                                 ("p2p_nic", any(g.nodes > 1 for g in p2p)), ("p2p_latency", bool(p2p))) if on])
    x0 = {k: v for k, (_, v) in _PARAMS.items() if v is not None} | _bandwidth_guesses(groups, fallback)
    if not coll and "intra" not in fallback and "inter" not in fallback and not p2p_multi:  # one-node p2p logs only
        fallback["inter"] = x0["p2p_intra"]
        assumed.append("bus bandwidths = the point-to-point rate (no collective logs, no hardware facts)")
    nics_note = None
    if base.nics_per_node is None:
        model, nics_note = _fit_nics(model, active, x0, len(pts))
        base = model.base
    fixed_channels = facts.channels
    hardware_channels = base.nics_per_node is not None and base.nic_Bps is not None
    ch0 = fixed_channels if fixed_channels is not None else (None if hardware_channels else 8)
    if fixed_channels is None and not hardware_channels and base.nics_per_node is not None and (multi or p2p_multi):
        # NICs known, their rate not: NCCL's search derives the channels from the NICs and their rate; take the
        # rate the logs measure (the p2p NIC rate, else the inter-node bus bandwidth per NIC) for it
        net0 = model.network(model.solve(active, x0, 8)[1], 8)
        rate = net0.p2p_nic_Bps if "p2p_nic" in active else net0.inter_bus_Bps / base.nics_per_node
        ch0 = nccl.derived_channels(replace(base, nic_Bps=rate), base.nics_per_node, 2)
        hardware_channels = True
        assumed.append(f"channels {ch0} (derived from the {base.nics_per_node} NICs as NCCL's search, at the "
                       f"{rate / 1e9:.3g} GB/s per NIC the logs measure: their rate is not stated)")
    cost, values = model.solve(active, x0, ch0)
    ch, channel_note = ch0, None
    if fixed_channels is None:  # every count briefly from the first fit's values, the best one to the end
        tried = {c: model.solve(active, {**x0, **values}, c, SCAN_NFEV) for c in CHANNELS}
        best = min(tried, key=lambda c: tried[c][0])
        tried[best] = min(tried[best], model.solve(active, {**x0, **tried[best][1]}, best), key=lambda cv: cv[0])
        if not hardware_channels or _identified(cost, tried[best][0], len(pts)):
            close = [c for c in tried if c != best and not _identified(tried[c][0], tried[best][0], len(pts))]
            ch, (cost, values) = best, tried[best]
            channel_note = f"channels {best}" + (f" (the logs fit {', '.join(map(str, close[:4]))} about as well)"
                                                  if close else "")
    additions = [a for a, on in (("latency_inter", multi and not new_latency),
                                 ("tree_gain", any(g.nodes == 2 and g.op == "allreduce" for g in coll)),
                                 ("tree_fill", multi), ("net_ll", multi), ("net_ll128", multi),
                                 ("net_simple", multi)) if on]
    kept = []
    for a in additions if not cost <= len(pts) * NOISE_RMS**2 / 2 else ():  # at the noise floor: nothing to gain
        c2, v2 = model.solve(active + [a], {**x0, **values}, ch)
        if _identified(cost, c2, len(pts)):
            active, cost, values = active + [a], c2, v2
            kept.append(_ADDITIONS[a])
    net = model.network(values, ch)
    fitted = _fitted_names(active, values, channel_note, not new_latency) + ([nics_note] if nics_note else [])
    if fixed_channels is not None:
        given = [f"channels {fixed_channels} ({facts.sources['channels']})"]
    else:
        given = []
        if ch is None:
            assumed.append("channels (derived from the NICs, as NCCL's search: "
                           f"{net.graph_channels(base.nics_per_node, 2)} with every NIC in use)")
    assumed += [f"{_ADDITIONS[a]} ({_unidentified_value(a, fallback)}: not identified)" for a in additions
                if _ADDITIONS[a] not in kept]
    assumed += [f"{what} (no {where}alltoall / sendrecv logs: {how})" for key, what, where, how in (
        ("p2p_intra", "p2p GPU rate", "one-node ", "one node's bus bandwidth"),
        ("p2p_nic", "p2p NIC rate", "multi-node ", "the inter-node bus bandwidth / NICs"),
        ("p2p_latency", "p2p latency per peer", "", "the release's Ring/Simple step latency")) if key not in active]
    given += [f"{k} = {_show(k, v)} ({s})" for k, v in facts.hardware.items() for s in [facts.sources[k]]
              if s != "assumed"] + ([f"fabric {fabric}"] if fabric else [])
    assumed += [f"{k} = {_show(k, v)}" for k, v in facts.hardware.items() if facts.sources[k] == "assumed"
                and v is not None]
    thread = values.get("thread_launch", 0.0) * 1e-6
    covered = Calibrated(facts.hardware["version"] if facts.sources["version"] != "assumed" else "",
                         tuple(sorted({(g.nodes, -(-g.ranks // g.nodes)) for g in groups})),
                         int(min(p[3] for p in pts)), int(max(p[3] for p in pts)),
                         tuple(sorted({g.op for g in groups})))
    return NcclCalibration(net, residual_points(pts, net, thread), tuple(fitted), source, tuple(assumed), tuple(given),
                           facts.warnings, covered)


def _check_fittable(pts) -> None:
    if not pts:
        raise Infeasible("nothing to calibrate: no measurement of a collective NCCL models on 2 or more ranks (a "
                         "1-rank log only measures the launch)")
    if len({p[3] for p in pts}) < 2:
        raise Infeasible(f"nothing to calibrate: every measurement has the same size ({pts[0][3]} B); latency "
                         "and bandwidth need at least two sizes")
    times = [p[4] for p in pts]
    if max(times) - min(times) <= 1e-9 * max(times):
        raise Infeasible(f"nothing to calibrate: the times do not grow with message size (every measurement takes "
                         f"{times[0]:g} s), so no bandwidth can be fitted")


def _unidentified_value(addition: str, fallback: dict) -> str:
    if addition not in fallback:
        return "off"
    if addition == "tree_fill":
        return f"{units.format_bytes(fallback['tree_fill_B'])}, {UNIDENTIFIED_SOURCE}"
    return f"{fallback[addition]:.3g}, {UNIDENTIFIED_SOURCE}"


def _hardware_fallback(base, single: bool, multi: bool, coll) -> tuple[dict, list[str]]:
    """Values (log GB/s) of the bus bandwidths the logs cannot fit, from the hardware where it is known."""
    out, assumed = {}, []
    for key, on, nodes in (("intra", single, 1), ("inter", multi, 2)):
        if on:
            continue
        bw = nccl.derived_bus_Bps(base, nodes=nodes)
        if bw is not None:
            out[key] = math.log(bw / 1e9)
            assumed.append(f"bus bandwidth {'on one node' if nodes == 1 else 'between nodes'} {bw / 1e9:.4g} GB/s "
                           "(derived from the hardware)")
        elif single or multi:
            assumed.append(f"bus bandwidth {'on one node' if nodes == 1 else 'between nodes'} = the "
                           f"{'several-node' if nodes == 1 else 'one-node'} one (no logs, no hardware facts)")
    return out, assumed


def _bandwidth_guesses(groups: list[_Group], fallback: dict) -> dict:
    """Starting bus bandwidths (log GB/s): the largest message's busbw of each kind of log."""
    def guess(gs):
        g = max(gs, key=lambda g: g.sizes.max(), default=None)
        if g is None:
            return None
        k = int(np.argmax(g.sizes))
        return math.log(max(0.1, 2 * g.sizes[k] / g.times[k] / 1e9))

    out = {}
    for key, pick in (("intra", lambda g: g.nodes == 1 and g.op in nccl.model.COLLECTIVES),
                      ("inter", lambda g: g.nodes > 1 and g.op in nccl.model.COLLECTIVES),
                      ("p2p_intra", lambda g: g.nodes == 1 and g.op in nccl.p2p.OPS),
                      ("p2p_nic", lambda g: g.nodes > 1 and g.op in nccl.p2p.OPS)):
        v = guess([g for g in groups if pick(g)])
        out[key] = v if v is not None else fallback.get(key, 0.0)
    return out


def _fitted_names(active, values, channel_note, addition_latency: bool) -> list[str]:
    names = {**_ADDITIONS, "intra": "bus bandwidth on one node", "inter": "bus bandwidth between nodes",
             "launch": "launch", "p2p_intra": "p2p GPU rate", "p2p_nic": "p2p NIC rate",
             "p2p_latency": "p2p latency per peer"}
    if not addition_latency:
        names["latency_inter"] = "latencyInter"
    out = [names[a] for a in active if a != "thread_launch"]
    if "thread_launch" in active:
        out.append(f"launch per extra GPU of one thread ({values['thread_launch']:.3g} us; for the fit only)")
    return out + ([channel_note] if channel_note else [])


def _show(key: str, v) -> str:
    return f"{v * 8 / 1e9:g}Gbit/s" if key == "nic_Bps" else str(v)


def predict(net: nccl.NcclNetwork, traces: Sequence[NetworkTrace], *, statistic: str = "min") -> tuple[Point, ...]:
    """Every measurement of `traces` against `net` (no fitting): for held-out checks."""
    return residual_points(_series(traces, statistic), net)
