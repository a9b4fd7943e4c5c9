"""The interval of a simulated run's iteration time and throughput (simfog.bands), propagated through the
simulation.

Parts, each a half-width (ln) at the level:

- compute: for a measured trace, the spread of its own samples: the conformal half-width of |ln(step_i / mean)|
  over its recorded iterations (and ranks), step_i = forward + backward + optimizer + host of sample i; for an
  estimated trace (retargeted by simfog.gpu's per-layer model), the error of such estimates on public training
  iterations of GPUs and machines the model never saw (simfog/data/compute_estimates.toml, bench/compute_estimates.py:
  3 models on 7 machines, so less independent than their count says); for an estimate pinned to a measured step
  (simfog.retarget.pin_step), the error such pinned estimates make of a distributed run's iteration (the table's
  pinned_scores; the measured step itself is taken as exact: a single rank's run has no compute part, and no
  run's interval reaches below that step). A trace of one sample, or too few for the level, is unmeasured;
- network: simfog.nccl.bands.network_part for a run on a network file (its NCCL collectives, the run's bucket
  sizes, extrapolated when simfog.nccl.calibrated says so); for links calibrated from microbenchmarks (a
  network_trace, or validate's calibration), the conformal half-width of those microbenchmarks' residuals against
  the installed links (Experiment.link_scores: in sample, so the coverage of validate's rows is what checks it);
  a run on links nothing measured is unmeasured; a run of one rank has none;
- run-to-run: what the experiment itself draws at random (stragglers, a recorded sample per simulated iteration,
  random peers) makes the mean of a run of its length vary from one run to the next. The run is simulated again
  with other seeds, as many as the level needs (9 at 90 %, 19 at 95 %), and the part is the conformal half-width of
  |ln(t_seed / t)|. One other seed first: a run that does not move with its seed has none. Past 95 % the seeds one
  can afford cannot bound it, and the part is unmeasured (at least as wide as the seeds show).

Propagation: the run is simulated again with each part's inputs at its two bounds (compute: every layer's forward
and backward, the optimizer and host times x exp(∓half-width); network: every bandwidth ÷ and latency x the factor,
of the cluster's links, the NCCL network file's fitted parameters, comm.alpha / beta and the per-collective
overhead), and the part's effect is the ln ratio of those runs' iteration times to the prediction (a part the run
does not wait on, e.g. fully overlapped communication, has none). The effects combine as simfog.bands.combine
says. NCCL's own per-protocol latency constants are not scaled, so for latency-bound NCCL runs the network effect
is a lower estimate. Throughput takes the bounds of the iteration time; the scaling efficiency its own effects (its
single-rank baseline moves with the compute too).

A run costs 1 + 2 x (compute and network parts with a width) simulations, + 1 (+ the seeds where the run moves
with its seed). Where a bound's run fails (e.g. the slower bound runs past the
longest run simfog simulates), the part's whole factor is taken for both sides (no part moves the time by more
than its inputs' factor) and its source says so.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np

from simfog.bands import (
    DEFAULT_LEVEL,
    Interval,
    Part,
    check_level,
    combine,
    conformal_quantile,
    conformal_rank,
    effect,
    log_scores,
    size_regime,
)
from simfog.errors import ConfigError, SimfogError
from simfog.experiment import MAX_SEED, Experiment
from simfog.simulation import simulate

COMPUTE_ESTIMATES = Path(__file__).parent / "data" / "compute_estimates.toml"


@cache
def estimate_scores(path: Path = COMPUTE_ESTIMATES, key: str = "scores") -> tuple[float, ...]:
    """The retarget estimate's scores against held-out GPU steps (module docstring; `key` "pinned_scores": those of
    estimates pinned to a measured step). Raises ConfigError naming the file."""
    try:
        scores = tomllib.loads(path.read_text())["estimates"][key]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        raise ConfigError(f"estimates.{key}", "(unreadable)", "the table bench/compute_estimates.py --write writes",
                          source=str(path)) from None
    return tuple(float(s) for s in scores)


def step_samples(trace) -> np.ndarray:
    """Per recorded sample (iteration, and rank where the trace has several): forward + backward + optimizer +
    host seconds."""
    fwd = np.array([layer.forward_s for layer in trace.layers]).sum(0)
    bwd = np.array([layer.backward_s for layer in trace.layers]).sum(0)
    out = fwd + bwd
    for extra in (trace.optimizer_s, trace.host_s):
        x = np.asarray(extra, dtype=float)
        out = out + (x if x.size == out.size else (x.mean() if x.size else 0.0))
    return out


def compute_part(trace, level: float) -> Part:
    """The compute part of a run on `trace` (module docstring)."""
    if pinned_step_s(trace) is not None:
        scores = estimate_scores(key="pinned_scores")
        w = conformal_quantile(scores, level)
        what = (f"estimate pinned to a measured step ({trace.extra.get('pinned_to', 'a measurement')}, taken as "
                f"exact): such estimates' error on {len(scores)} real H200 runs x clusters")
        if w is None:
            return Part.unmeasured("compute", f"{what}: too few for level {level:g}", at_least=max(scores))
        return Part.symmetric("compute", w, what)
    if trace.provenance.estimated:
        scores = estimate_scores()
        w = conformal_quantile(scores, level)
        what = (f"estimated trace: the retarget model's error on {len(scores)} public training steps of GPUs it "
                "never saw")
        if w is None:
            return Part.unmeasured("compute", f"{what}: too few for level {level:g}", at_least=max(scores))
        return Part.symmetric("compute", w, what)
    steps = step_samples(trace)
    if steps.size < 2:
        return Part.unmeasured("compute", "the trace has one sample: its spread is unknown")
    w = conformal_quantile(log_scores(np.full(steps.size, steps.mean()), steps), level)
    what = f"the spread of the trace's {steps.size} samples"
    return Part.unmeasured("compute", f"{what}: too few for level {level:g}") if w is None else \
        Part.symmetric("compute", w, what)


def network_part(exp: Experiment, buckets: list, level: float, extrapolated: list[str] | None) -> Part:
    """The network part of a run of `exp` whose collectives are `buckets` (Result.buckets; module docstring)."""
    from simfog.nccl.bands import network_part as nccl_part

    if exp.ranks == 1:
        return Part("network", 0.0, 0.0, "one rank: no communication")
    sizes = [b["bytes"] for b in buckets if isinstance(b, dict) and b.get("bytes")] or [exp.workload.trace.nbytes]
    if exp.network is None and exp.link_scores:
        return link_part(exp.link_scores, sizes, level)
    if exp.network is None or exp.comm.collective != "nccl":  # links nobody measured: the prior's band
        from simfog.nccl.prior import network_part as prior_part

        named = exp.network.cluster if exp.network is not None else None
        return prior_part(getattr(exp, "transport", None) or (named.transport if named is not None else None),
                          sizes, level, what="calibrate them (simfog calibrate, comm.collective = \"nccl\") or use "
                          "network_trace; until then: ")
    covered = exp.network.calibrated
    return nccl_part(covered, sizes, level, extrapolated=bool(extrapolated),
                     distance=covered.distance(exp.cluster.nodes) if covered is not None else None,
                     within=covered is not None and covered.within(exp.cluster.nodes))


def link_part(scores: Sequence[tuple[int, float]], sizes: Sequence[float], level: float) -> Part:
    """The network part of a run on links calibrated from microbenchmarks (Experiment.link_scores) whose
    collectives move messages of `sizes`: per message-size regime (simfog.bands.SIZE_REGIMES) the conformal
    half-width of the microbenchmarks' scores in that regime, the widest over the run's regimes. A regime with too
    few scores for the level is unmeasured, never narrower than its scores."""
    by_regime: dict[str, list[float]] = {}
    for nbytes, score in scores:
        by_regime.setdefault(size_regime(nbytes), []).append(score)
    widths = []
    for regime in sorted({size_regime(s) for s in sizes}):
        seen = by_regime.get(regime, [])
        w = conformal_quantile(seen, level) if seen else None
        if w is None:
            return Part.unmeasured("network", f"the link calibration has {len(seen)} microbenchmark points of "
                                   f"{regime} messages: too few for level {level:g}", at_least=max(seen, default=0.0))
        widths.append(w)
    return Part.symmetric("network", max(widths), f"the link calibration's residuals on its {len(scores)} "
                          "microbenchmark points, in the run's message-size regimes (in sample)")


MOST_SEEDS = 19  # run-to-run: the most seeds simulated (a 95 % bound; conformal_rank(19, 0.95) = 19)
INDEPENDENT_SEEDS = 1_000_003  # a ratio's second run draws with seeds this far from the first's


def seeds_needed(level: float) -> int:
    """The fewest scores that bound a new one at `level` (simfog.bands.conformal_rank(n, level) <= n)."""
    n = 1
    while conformal_rank(n, level) > n:
        n += 1
    return n


def seed_parts(measure, values: Sequence[float], level: float, what: str) -> list[Part]:
    """The run-to-run part (module docstring) of each of `values`, quantities of a run with its own seed:
    `measure(k)` gives them (in the same order) for runs with seed + k. One probe seed first: none where nothing
    moves."""
    first = tuple(measure(1))
    if first == tuple(values):
        return [Part("run-to-run", 0.0, 0.0, "the run does not move with its seed (nothing it draws at random)")
                for _ in values]
    n = seeds_needed(level)
    runs = [first] + [tuple(measure(k)) for k in range(2, min(n, MOST_SEEDS) + 1)]
    out = []
    for i, v in enumerate(values):
        scores = log_scores(np.full(len(runs), v), [r[i] for r in runs])
        how = f"{what}, simulated with {len(runs)} other seeds"
        if n > MOST_SEEDS:
            out.append(Part.unmeasured("run-to-run", f"{how}: level {level:g} needs {n} seeds",
                                       at_least=float(scores.max())))
        else:
            out.append(Part.symmetric("run-to-run", conformal_quantile(scores, level), how))
    return out


def reseeded(exp: Experiment, k: int) -> Experiment:
    """`exp` with its seed + k (modulo the seeds allowed)."""
    return replace(exp, seed=(exp.seed + k) % (MAX_SEED + 1))


def run_to_run_parts(exp: Experiment, summary: dict, level: float) -> tuple[Part, Part]:
    """The run-to-run part (module docstring) of a run of `exp` whose summary is `summary`, on its mean iteration
    time and on its scaling efficiency."""
    keys = ("iteration_time_s", "scaling_efficiency")

    def measure(k: int) -> tuple[float, ...]:
        s = simulate(reseeded(exp, k)).summary()
        return tuple(s[key] for key in keys)

    on_time, on_eff = seed_parts(measure, [summary[key] for key in keys], level,
                                 f"the mean over {exp.iterations} iterations")
    return on_time, on_eff


def scale_compute(exp: Experiment, factor: float) -> Experiment:
    """`exp` with every compute time of its trace x factor."""
    t = exp.workload.trace

    def times(x):
        return tuple(v * factor for v in x)

    layers = tuple(replace(layer, forward_s=times(layer.forward_s), backward_s=times(layer.backward_s))
                   for layer in t.layers)
    trace = replace(t, layers=layers, optimizer_s=times(t.optimizer_s), host_s=times(t.host_s))
    return replace(exp, workload=replace(exp.workload, trace=trace))


def scale_network(exp: Experiment, factor: float) -> Experiment:
    """`exp` with every network latency x factor and bandwidth ÷ factor (module docstring)."""

    def link(x):
        cap = x.flow_bandwidth_Bps
        return replace(x, latency_s=x.latency_s * factor, bandwidth_Bps=x.bandwidth_Bps / factor,
                       flow_bandwidth_Bps=cap / factor if cap is not None else None)

    c = exp.cluster
    cluster = replace(c, intra=link(c.intra), nic=link(c.nic),
                      degraded_nics=tuple((n, bw / factor) for n, bw in c.degraded_nics))
    comm = exp.comm
    comm = replace(comm, **{k: getattr(comm, k) * factor for k in ("alpha_s", "beta_s_per_B", "collective_overhead_s")
                            if getattr(comm, k) is not None})
    network = exp.network
    if network is not None:
        n = network.nccl
        slow = {k: getattr(n, k) / factor for k in ("intra_bus_Bps", "inter_bus_Bps", "nic_Bps", "p2p_nic_Bps",
                                                     "p2p_intra_Bps") if getattr(n, k) is not None}
        late = {k: getattr(n, k) * factor for k in ("latency_inter_s", "launch_s", "p2p_latency_s")
                if getattr(n, k) is not None}
        network = replace(network, nccl=replace(n, **slow, **late,
                                                net_latency_s=tuple(x * factor for x in n.net_latency_s)))
    return replace(exp, cluster=cluster, comm=comm, network=network)


SCALERS = {"compute": scale_compute, "network": scale_network}


def extrapolated(exp, buckets: list) -> list[str] | None:
    """How the run's NCCL collectives leave what its network file was calibrated on (simfog.nccl.calibrated): the
    cluster's layout, the release, and the smallest and largest message the run sends (from its buckets); None when
    the run has no calibrated network file or does not use NCCL's model."""
    network = getattr(exp, "network", None)
    if network is None or network.calibrated is None or exp.comm.collective != "nccl":
        return None
    covered, net = network.calibrated, network.nccl
    notes = covered.notes(net, None, exp.cluster.nodes, exp.cluster.ranks_per_node)
    sizes = [b["bytes"] for b in buckets if isinstance(b, dict) and b.get("bytes")]
    for size in (min(sizes), max(sizes)) if sizes else ():
        notes += [n for n in covered.notes(net, None, 1, 1, size) if n not in notes]
    return notes


def attach(result, level: float = DEFAULT_LEVEL):
    """`result` with its interval at `level` in its summary (Result.interval); returns it."""
    iv, eff = intervals(result, check_level(level, "level"),
                        extrapolated=extrapolated(result.experiment, result.buckets))
    result.interval = None
    result.interval = summary_fields(result, iv, eff)
    return result


def intervals(result, level: float, *, extrapolated: list[str] | None = None) -> tuple[Interval, Interval]:
    """The intervals of `result`'s mean iteration time and of its scaling efficiency at `level` (module docstring;
    the efficiency's single-rank baseline moves with each part's bounds as the run does)."""
    exp = result.experiment
    s = result.summary()
    t, eff = s["iteration_time_s"], s["scaling_efficiency"]
    step = pinned_step_s(exp.workload.trace)
    compute = compute_part(exp.workload.trace, level)
    if step is not None and exp.ranks == 1:
        compute = Part("compute", 0.0, 0.0, "one rank of a trace pinned to its measured step: that step, taken as "
                       "exact (its split over layers matters only beside communication)")
    parts = [compute, network_part(exp, result.buckets, level, extrapolated)]
    on_time, on_eff = [], []
    for p in parts:
        if p.below == 0 and p.above == 0:
            on_time.append(p)
            on_eff.append(p)
            continue
        try:
            runs = [simulate(SCALERS[p.name](exp, math.exp(w))).summary() for w in (-p.below, p.above)]
        except SimfogError as e:  # e.g. the slower bound runs past the longest run simfog simulates
            note = f" (a bound's run failed: {str(e)[:100]}; the part's whole factor taken)"
            on_time.append(replace(p, source=p.source + note))
            on_eff.append(replace(p, source=p.source + note))
            continue
        on_time.append(effect(p.name, t, *(r["iteration_time_s"] for r in runs), p.source, p.measured))
        on_eff.append(effect(p.name, eff, *(r["scaling_efficiency"] for r in runs), p.source, p.measured))
    seed_time, seed_eff = run_to_run_parts(exp, s, level)
    on_iteration = combine(t, level, on_time + [seed_time])
    if step is not None and on_iteration.lo < step:  # no run's iteration is shorter than the measured step
        on_iteration = replace(on_iteration, lo=min(step, t))
    return on_iteration, combine(eff, level, on_eff + [seed_eff])


def pinned_step_s(trace) -> float | None:
    """The measured step an estimated trace was pinned to (simfog.retarget.pin_step), else None."""
    extra = trace.extra if isinstance(trace.extra, dict) else {}
    step = extra.get("pinned_step_s")
    return float(step) if trace.provenance.estimated and isinstance(step, int | float) else None


def ratio_interval(slower: Experiment, faster: Experiment, level: float = DEFAULT_LEVEL) -> Interval:
    """The interval of t(slower) / t(faster), the mean iteration times of two runs of one workload on one cluster
    (two settings a tuner compares). The model's error is shared: each part's inputs go to their bounds in both
    runs at once (the same faster compute, the same slower network), and the part's effect is how far that moves the
    ratio, combined as simfog.bands.combine says. A part that slows both runs alike leaves the ratio where it
    is; one that changes which run waits on what moves it. Parts as `intervals` (module docstring), the network's
    from the collectives of both runs, and the run-to-run part of the ratio, each run with its own seeds (two real
    runs draw independently); 1 + 4 x (parts with a width) simulations more than the two runs, + 2 per seed where
    the runs move with their seeds."""
    level = check_level(level, "level")
    runs = [simulate(e) for e in (slower, faster)]
    times = [r.summary()["iteration_time_s"] for r in runs]
    ratio = times[0] / times[1]
    buckets = [b for r in runs for b in r.buckets]
    parts = [compute_part(slower.workload.trace, level),
             network_part(slower, buckets, level, extrapolated(slower, buckets))]
    on_ratio = []
    for p in parts:
        if p.below == 0 and p.above == 0:
            on_ratio.append(p)
            continue
        try:
            bounds = []
            for w in (-p.below, p.above):
                a, b = (simulate(SCALERS[p.name](e, math.exp(w))).summary()["iteration_time_s"]
                        for e in (slower, faster))
                bounds.append(a / b)
        except SimfogError as e:
            on_ratio.append(replace(p, source=p.source + f" (a bound's run failed: {str(e)[:100]}; the part's whole "
                                                          "factor taken)"))
            continue
        on_ratio.append(effect(p.name, ratio, *bounds, p.source, p.measured))

    def measure(k: int) -> tuple[float]:  # independent draws, as two real runs have: far-apart seeds
        a, b = (simulate(reseeded(e, k + j * INDEPENDENT_SEEDS)).summary()["iteration_time_s"]
                for j, e in enumerate((slower, faster)))
        return (a / b,)

    on_ratio += seed_parts(measure, [ratio], level, "the ratio of the two runs' means, each with its own seed")
    return combine(ratio, level, on_ratio)


def iteration_interval(result, level: float, *, extrapolated: list[str] | None = None) -> Interval:
    """The interval of `result`'s mean iteration time at `level` (module docstring)."""
    return intervals(result, level, extrapolated=extrapolated)[0]


def summary_fields(result, iv: Interval, eff: Interval) -> dict:
    """The keys a summary gains: iteration_time_lo_s/hi_s, samples_per_s_lo/hi, scaling_efficiency_lo/hi,
    interval_level, interval_parts (name -> share, below, above (ln) of the iteration time, source, measured),
    interval_unmeasured."""
    s = result.summary()
    rate = iv.reciprocal(s["samples_per_s"] * iv.value)
    return {**iv.to_dict("iteration_time", "_s"), "samples_per_s_lo": rate.lo, "samples_per_s_hi": rate.hi,
            # parts combined in log space can pass 1, which no run reaches (single-rank time / iteration time)
            "scaling_efficiency_lo": eff.lo, "scaling_efficiency_hi": min(eff.hi, 1.0), "interval_level": iv.level,
            "interval_parts": {p.name: {"share": iv.shares[p.name], "below": p.below, "above": p.above,
                                        "source": p.source, "measured": p.measured} for p in iv.parts},
            "interval_unmeasured": list(iv.unmeasured)}
