"""What a collective costs the host inside a training step beyond the same collective bare, measured on the rig
before the rows, for every algorithm family, and fitted per collective and per byte.

The calibration microbenchmarks (validate.calibration) time each collective bare: a barrier, then the call on every
rank, nothing else running. Inside training the same collective also pays host work they do not see: the rank
program's hooks and Python around each launch (DDP's reducer and comm hook, the bucketed hooks, FSDP2's hooks and
issuing thread, the neighbour exchange's waiter thread), the gloo threads' wake-ups among the other ranks' work,
and collectives queued behind each other, all on shared cores. On a slower host that work grows where the bare
microbenchmark does not: re-run on another machine of the same kind, collectives inside training took a median
1.24 times their calibrated cost, and simfog came out optimistic on almost every row.

The probe (one launch per group, right after the network calibration, on the group's own emulated cluster and
layout; never looking at the rows) runs each family's real rank program, the very code path of the rows
(validate.ranks.worker: BucketedAllreduce or DDP, FSDP2, ZeRO-2, the neighbour exchange, WAGMA's group allreduce),
on a small synthetic replay model whose collectives have known sizes (PROBE_SIZES, 1 kB to 1 MB: the bench's
buckets, units and messages lie in that range; PROBE_ITERATIONS measured after the rows' warm-up), its compute
long enough that collectives overlap it but not each other, and times each collective inside the step:

    span = mean over ranks of (completion - start), start = max(the last launch among the ranks it waits for,
           the rank's previous collective's completion)

i.e. what the collective adds to a rank's one-at-a-time chain of collectives once every rank has issued it (the
time it queued behind the one before is not its own). Bare is the same collective as the prediction costs it: the
calibrated cost model of the group's microbenchmarks (`Family.host_points`). The excess span - bare is fitted, over
the per-size medians (a stalled collective moves a median little), as

    excess(M) = overhead + per_byte * M,  overhead >= 0, per_byte >= 0   (non-negative least squares)

Host work adds time; a collective faster in training than its calibrated cost is the fit's error, not a negative
host cost. Each family applies the fit through the model's inputs (`Family.with_host_costs`): the allreduce family
as collective_overhead_s and, per byte, a slower bucket copy; the sharded and WAGMA families as collective_overhead_s;
neighbour averaging in its links' latency. Every row records the fit, how it was measured and how it was applied
(`host_excess_s`, `host_excess_s_per_B`, `overheads_source`).

FSDP measures the whole step instead of its collectives' spans (`step_excess`): what a sharded step pays beyond
its bare collectives is not all inside them. FSDP2's issuing thread wakes up before a collective starts (its
request to the launch stamped as the span's start is not in the span), the rank's thread wakes up after it ends,
and the per-layer hooks, copy-in and copy-out, resharding and the prefetch order sit around them; on a slower host
the span fit left every fsdp row 6-7.5 % fast (issue 39). So each variant the rows run (reshard_after_forward,
prefetch) is probed on its own, one probe per size at which its rows pay the fit (each row's mean collective;
FSDP_PROBE_LAYERS layers of that size, a unit each), and the point of a size is the per-collective overhead x at
which simfog's prediction of that probe's steady-state iteration (collective_overhead_s = x, everything else as the
rows are predicted) equals the measured one (the median over its iterations), solved by bisection: the same
a + b·M fit then holds what the step pays per collective and per byte, whatever the mechanism.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from simfog.experiment import Experiment, Heterogeneity, Workload
from simfog.trace import Layer, ModelTrace, Provenance, Tensor

PROBE_SIZES = (1_000, 30_000, 300_000, 1_000_000)  # bytes per collective, float32: decimal (see CALIBRATION_SIZES)
PROBE_FORWARD_S = 1e-3
PROBE_BACKWARD_S = 3e-3  # replayed, per layer (at least): collectives overlap compute, as in training
# A layer's backward covers the collective of the layer before it by this much: collectives overlap compute but not
# each other (gloo runs two at once, where the prediction queues them; their sharing is not the host's cost)
COVER = 1.25
PROBE_ITERATIONS = 6
FSDP_PROBE_LAYERS = 4  # layers (units) of one size per fsdp probe
FSDP_PROBE_ITERATIONS = 10  # its steps' median is the point: more steps than the span probes, one point per probe
STEP = "per-collective overhead at which simfog's probe step equals the measured one (median over its iterations)"


@dataclass(frozen=True)
class HostFit:
    """The in-step excess of one rank program on this rig: `overhead_s` per collective plus `per_byte_s` per byte
    of it, from `points` collectives; `how`: what ran and what came out, for the rows."""

    overhead_s: float
    per_byte_s: float
    points: int
    how: str

    def excess_s(self, nbytes: float) -> float:
        return self.overhead_s + self.per_byte_s * nbytes


def probe_trace(sizes: Sequence[int] = PROBE_SIZES, name: str = "probe", cover=None) -> ModelTrace:
    """A synthetic replay model: one layer of one float32 weight per entry of `sizes` (bytes), PROBE_FORWARD_S
    forward and PROBE_BACKWARD_S backward each; `cover` (bytes -> seconds, the calibrated time of a gradient's
    collective), when given, lengthens each layer's backward to COVER times the collective of the layer after it
    (ready just before: backward runs from the last layer), so that one collective ends before the next starts."""
    backward = [PROBE_BACKWARD_S] * len(sizes)
    if cover is not None:
        for i in range(len(sizes) - 1):
            backward[i] = max(PROBE_BACKWARD_S, COVER * cover(sizes[i + 1]) + 1e-3)
    layers = tuple(Layer(f"{name}{i}", (PROBE_FORWARD_S,), (backward[i],), (Tensor(f"{name}{i}.weight", m // 4),))
                   for i, m in enumerate(sizes))
    order = tuple(t.name for layer in reversed(layers) for t in layer.params)
    return ModelTrace("mlp", 1, "float32", {"kind": "synthetic"}, {},
                      Provenance("validate.host_calibration.probe_trace", str(datetime.date.today()),
                                 platform.node(), "estimated", True,
                                 notes=f"{len(sizes)} layers of {'/'.join(f'{s:g}' for s in sizes)} B, "
                                       f"{PROBE_FORWARD_S * 1e3:g} ms forward and "
                                       f"{'/'.join(f'{b * 1e3:.3g}' for b in backward)} ms backward"),
                      layers, order, optimizer_s=(0.0,))


def probe_experiment(like: Experiment, trace: ModelTrace, **comm) -> Experiment:
    """`like` on its cluster with the synthetic `trace`, `comm` changed, no heterogeneity and no overheads given
    (what the probe measures)."""
    comm = replace(like.comm, bucket_copy_Bps=None, collective_overhead_s=None, overlap_slowdown=None, **comm)
    return replace(like, iterations=PROBE_ITERATIONS, comm=comm, heterogeneity=Heterogeneity(),
                   workload=Workload(trace, f"<{trace.provenance.source}>", like.workload.compute))


def with_overheads(exp: Experiment, record: dict) -> Experiment:
    """`exp` whose trace carries `record` as its measured overheads (simfog.overheads.TRACE_KEY), in place of its
    own; the experiment file's values still win."""
    from simfog.overheads import TRACE_KEY

    trace = exp.workload.trace
    return replace(exp, workload=replace(exp.workload, trace=replace(trace, extra={**trace.extra, TRACE_KEY: record})))


def overheads_record(exp: Experiment) -> dict:
    """The measured overheads `exp`'s trace carries (simfog.overheads.TRACE_KEY), a copy; {} when none."""
    from simfog.overheads import TRACE_KEY

    return dict(exp.workload.trace.extra.get(TRACE_KEY) or {})


def spans(per_rank: Sequence[Mapping]) -> list[list[float]]:
    """Per measured iteration, per collective (the records' index): the mean over ranks of the completion minus
    the start (the latest launch among the ranks it waits for, "peers" when recorded, else all; or the rank's
    previous collective's completion, in its launch order, when later)."""
    out = []
    for it in range(min(len(r["iterations"]) for r in per_rank)):
        rows = [r["iterations"][it] for r in per_rank]
        n = min(len(d["launch"]) for d in rows)
        took = [[] for _ in range(n)]
        for d in rows:
            previous = float("-inf")
            for c in d["launch_order"]:
                if c >= n:
                    continue
                peers = d["peers"][c] if "peers" in d else range(len(rows))
                start = max(max(rows[q]["launch"][c] for q in peers), previous)
                took[c].append(d["done"][c] - start)
                previous = d["done"][c]
        out.append([statistics.fmean(t) if t else float("nan") for t in took])
    return out


def excess_points(per_rank: Sequence[Mapping], bare: Sequence[Sequence[tuple[float, float]]]) -> list[tuple]:
    """(bytes, span - bare) of every collective of every measured iteration; `bare[it][c]` = (bytes, seconds)."""
    return [(b[c][0], s[c] - b[c][1]) for s, b in zip(spans(per_rank), bare, strict=False)
            for c in range(min(len(s), len(b))) if s[c] == s[c]]


def step_excess(exp: Experiment, measured_s: float, tolerance_s: float = 1e-6) -> float:
    """The per-collective overhead x >= 0 at which simfog's steady-state iteration of `exp` (comm's
    collective_overhead_s = x) equals `measured_s`, by bisection (the iteration does not shrink as x grows; the
    draws of a run are seeded, so the same at every x): 0 when x = 0 already predicts at least `measured_s`; at
    most 1 s."""
    from simfog.simulation import simulate
    from validate.comparison.compare import steady_iteration_s

    def predicted(x: float) -> float:
        return steady_iteration_s(simulate(replace(exp, comm=replace(exp.comm, collective_overhead_s=x))))

    if predicted(0.0) >= measured_s:
        return 0.0
    lo, hi = 0.0, 1e-3
    while predicted(hi) < measured_s and hi < 1.0:
        lo, hi = hi, 2 * hi
    while hi - lo > tolerance_s:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted(mid) < measured_s else (lo, mid)
    return (lo + hi) / 2


def medians_by_size(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """(size, median of its values) of `points` ((size, value)), by increasing size."""
    by_size: dict[float, list[float]] = {}
    for m, e in points:
        by_size.setdefault(float(m), []).append(e)
    return [(m, statistics.median(by_size[m])) for m in sorted(by_size)]


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) >= 0 minimising the squared error of a + b·M over the median excess of each size M (non-negative
    least squares in two unknowns: the unconstrained line, else the best with b = 0 or with a = 0, else 0)."""
    medians = medians_by_size(points)
    if not medians:
        return 0.0, 0.0
    xs, ys = [m for m, _ in medians], [e for _, e in medians]
    candidates = [(max(0.0, statistics.fmean(ys)), 0.0)]
    sxx = sum(x * x for x in xs)
    if sxx > 0:
        candidates.append((0.0, max(0.0, sum(x * y for x, y in medians) / sxx)))
    if len(xs) > 1:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        b = sum((x - mx) * (y - my) for x, y in medians) / sum((x - mx) ** 2 for x in xs)
        if b >= 0 and my - b * mx >= 0:
            candidates.append((my - b * mx, b))
    return min(candidates, key=lambda ab: sum((ab[0] + ab[1] * x - y) ** 2 for x, y in medians))


EXCESS = "in-step span minus the calibrated cost"  # what the points of most families are


def fit(points: Sequence[tuple[float, float]], what: str, measured: str = EXCESS) -> HostFit:
    """The HostFit of `points` ((bytes, seconds): `measured`) of the probes `what`, with its description."""
    a, b = fit_line(points)
    medians = ", ".join(f"{m / 1e3:g} kB {e * 1e3:+.2f} ms" for m, e in medians_by_size(points))
    how = (f"host probe: {what} on this cluster before the rows, {len(points)} measurements; {measured}, median by "
           f"size {medians}; fitted {a * 1e3:.3f} ms + {b * 1e9:.3f} ns/B")
    return HostFit(a, b, len(points), how)


def measure(rig, probes: Mapping[str, tuple], fits: Mapping) -> dict[str, HostFit | str]:
    """Run the families' probes on `rig` (validate.run.Rig) in one launch and fit them. `probes`: probe id ->
    (family, fit key, experiment); `fits`: the group's network fits by microbenchmark. Returns fit key -> HostFit,
    or the reason it is missing (the launch failed). Fits are cached in the rig's cache per fit key and rig."""
    cache = rig.cache if rig.cache is not None else {}
    todo = {pid: v for pid, v in probes.items() if ("host-fit", v[1], *rig.key) not in cache}
    out: dict[str, HostFit | str] = {v[1]: cache[("host-fit", v[1], *rig.key)] for v in probes.values()
                                     if ("host-fit", v[1], *rig.key) in cache}
    if not todo:
        return out
    folder = rig.work / "host-probe"
    folder.mkdir(parents=True, exist_ok=True)
    prepared = {pid: rig.prepare(pid, exp, fits[fam.calibration_collective], folder)
                for pid, (fam, _, exp) in todo.items()}
    rig.log(f"measuring the host's work per collective in training: {', '.join(todo)}")
    started = time.monotonic()
    ranks, error = rig.run(list(prepared.values()), folder)
    took = time.monotonic() - started
    if ranks is None:
        why = f"host probe failed ({error.splitlines()[0] if error else 'no records'})"
        return {**out, **{v[1]: why for v in todo.values()}}
    points: dict[str, list] = {}
    for k, (pid, (fam, key, _)) in enumerate(todo.items()):
        per_rank = [r["configs"][k] for r in ranks]
        points.setdefault(key, (fam, []))[1].extend(fam.host_points(prepared[pid], per_rank))
    for key, (fam, pts) in points.items():
        what = ", ".join(pid for pid, v in todo.items() if v[1] == key)
        cache[("host-fit", key, *rig.key)] = out[key] = fit(pts, what, fam.host_measured)
        rig.log(f"{key}: {out[key].overhead_s * 1e3:.3f} ms + {out[key].per_byte_s * 1e9:.3f} ns/B per collective "
                f"(probe launch {took:.1f} s)")
    return out
