"""Gradient-merging policies: which gradient tensors are allreduced together, and in which order. Over 400 lines
because every policy (wfbp, SyncEASGD, DDP, Horovod, BAGUA, MG-WFBP, threshold, optimal) sits in one registry with
the framework source of each rule quoted where it is implemented; each policy alone is short.

A policy turns the gradient tensors of a model, in the order their gradients become ready in backward, into
buckets in launch order; every tensor lands in exactly one bucket. Each policy follows the framework or paper it is
named after; the source of every rule is cited where it is implemented. Sizes are bytes, times seconds.

The iteration-time recurrences of MG-WFBP (docs/ALGORITHMS.md §2) are exposed too (`predicted_comm_end_s`), for tests
and quick estimates; the engine does the real simulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean

from simfog.errors import ConfigError
from simfog.registry import Registry
from simfog.trace import DTYPE_BYTES, ModelTrace

MiB = 1 << 20
# torch 2.13 torch/nn/parallel/distributed.py: _DEFAULT_BUCKET_CAP_MB = 25, _MB_TO_BYTES = 1024 * 1024, and
# torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 1048576 (first bucket, only when bucket_cap_mb is left unset).
DDP_BUCKET_CAP_BYTES = 25 * MiB
DDP_FIRST_BUCKET_BYTES = 1 * MiB
# Horovod >= 0.21 defaults (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME).
HOROVOD_FUSION_BYTES = 128 * MiB
HOROVOD_CYCLE_S = 1e-3
# BAGUA bagua/service/autotune_service.py: default_bucket_size = 10 * 1024 ** 2.
BAGUA_BUCKET_BYTES = 10 * MiB
# What the MG-WFBP authors' later code uses for small_tensor_elements (off by default here).
MGWFBP_SMALL_TENSOR_ELEMENTS = 8192

AllreduceTime = Callable[[float], float]


@dataclass(frozen=True)
class GradTensor:
    """One gradient: `nbytes` bytes, ready `ready_s` seconds after backward starts (mean times)."""

    name: str
    nbytes: int
    ready_s: float
    dtype: str = "float32"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("tensor.name", self.name, "a non-empty string")
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes < 0:
            raise ConfigError(f"tensor {self.name}.nbytes", self.nbytes, "an integer >= 0")
        if not isinstance(self.ready_s, (int, float)) or not math.isfinite(self.ready_s) or self.ready_s < 0:
            raise ConfigError(f"tensor {self.name}.ready_s", self.ready_s, "a finite time in seconds >= 0")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"tensor {self.name}.dtype", self.dtype, f"one of {', '.join(DTYPE_BYTES)}")

    @property
    def elements(self) -> int:
        return self.nbytes // DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Bucket:
    """Tensors allreduced together: their names in ready order and their total size in bytes."""

    tensors: tuple[str, ...]
    nbytes: int

    @classmethod
    def of(cls, tensors: Sequence[GradTensor]) -> Bucket:
        return cls(tuple(t.name for t in tensors), sum(t.nbytes for t in tensors))


@dataclass(frozen=True)
class MergeSettings:
    """Knobs of the policies; None means the policy's own default."""

    threshold_bytes: float | None = None  # threshold policy (required); overrides ddp/horovod/bagua sizes
    cycle_time_s: float | None = None     # horovod (default 1 ms)
    small_tensor_elements: int = 0        # mgwfbp: also merge every group under this many elements (0 = off)

    def __post_init__(self):
        t = self.threshold_bytes
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
                              or t < 0):
            raise ConfigError("comm.threshold", t, "a size in bytes >= 0")
        c = self.cycle_time_s
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c)
                              or c <= 0):
            raise ConfigError("comm.cycle_time", c, "a time in seconds > 0")
        s = self.small_tensor_elements
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError("comm.small_tensor_elements", s, "an integer >= 0 (0 = off)")


Policy = Callable[[tuple[GradTensor, ...], MergeSettings, AllreduceTime | None], list[list[GradTensor]]]
POLICIES: Registry[Policy] = Registry("merge policy")
DYNAMIC = {"horovod"}  # fusion decided at run time, cycle by cycle (the engine calls horovod_fuse)


def grad_tensors(trace: ModelTrace) -> tuple[GradTensor, ...]:
    """The trace's gradients in `trace.grad_ready_order`, each ready when its layer's backward ends.

    Backward runs over `trace.layers` in reverse order from time 0, each layer taking its mean backward time, so a
    tensor's `ready_s` is the sum of the mean backward times of its layer and of every later layer (seconds).
    """
    ready, end = {}, 0.0
    for layer in reversed(trace.layers):
        end += fmean(layer.backward_s)
        for t in layer.params:
            ready[t.name] = end
    by_name = trace.tensors
    return tuple(GradTensor(n, by_name[n].nbytes, ready[n], by_name[n].dtype) for n in trace.grad_ready_order)


def plan(policy: str, tensors: Sequence[GradTensor], settings: MergeSettings = MergeSettings(),
         allreduce_time: AllreduceTime | None = None) -> tuple[Bucket, ...]:
    """Buckets in launch order for `tensors` (given in gradient-ready order); every tensor exactly once.

    `allreduce_time(nbytes) -> seconds` is the cost model in use: mgwfbp needs it, horovod uses it for how long a
    cycle's allreduces keep its background thread busy (0 when absent). For horovod the result is the static plan
    the cycles produce on identical ranks. Raises ConfigError for an unknown policy (field comm.merge), a missing
    threshold for "threshold" (comm.threshold), mgwfbp without a cost model, or repeated tensor names.
    """
    fn = POLICIES.get(policy, field="comm.merge")
    tensors = tuple(tensors)
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise ConfigError("tensors", next(n for n in names if names.count(n) > 1), "unique tensor names")
    if not tensors:
        return ()
    return tuple(Bucket.of(g) for g in fn(tensors, settings, allreduce_time) if g)


def _close_at(tensors: Sequence[GradTensor], limits: Sequence[float]) -> list[list[GradTensor]]:
    """Greedy in order: add a tensor, then close the bucket once its size >= the current limit (so buckets
    overshoot the limit); limits[k] applies to the k-th bucket, the last one to all later buckets."""
    out, cur, size = [], [], 0
    for t in tensors:
        cur.append(t)
        size += t.nbytes
        if size >= limits[min(len(out), len(limits) - 1)]:
            out.append(cur)
            cur, size = [], 0
    return out + [cur] if cur else out


@POLICIES.register("wfbp")
def _wfbp(tensors, settings, allreduce_time):
    """Wait-free backpropagation: one allreduce per tensor, as soon as it is ready."""
    return [[t] for t in tensors]


@POLICIES.register("single")
def _single(tensors, settings, allreduce_time):
    """SyncEASGD: one allreduce of every gradient after backward."""
    return [list(tensors)]


@POLICIES.register("threshold")
def _threshold(tensors, settings, allreduce_time):
    """Greedy in ready order: add a tensor, close the bucket once it holds >= threshold bytes."""
    # The rule of DDP's reducer, BAGUA and the MG-WFBP authors' _generate_groups_with_threshold: buckets overshoot
    # the threshold by at most their last tensor. Dtypes are not separated.
    if settings.threshold_bytes is None:
        raise ConfigError("comm.threshold", "(missing)", 'a size such as "25MiB" when merge = "threshold"')
    return _close_at(tensors, [settings.threshold_bytes])


@POLICIES.register("ddp")
def _ddp(tensors, settings, allreduce_time):
    """PyTorch DDP (torch 2.13) rebuilt buckets: per dtype, first 1 MiB then 25 MiB, overshooting, in ready order."""
    # torch/csrc/distributed/c10d/reducer.cpp: Reducer::rebuild_buckets (iteration 2 on; iteration 1's
    # whole-model bucket is warm-up) calls compute_bucket_assignment_by_size with the gradient-ready order and the
    # limits [first_bucket_bytes_cap, bucket_bytes_cap]. Per (dtype, device) key a tensor is added, then the bucket
    # closes once size >= limit and that key's limit iterator advances; buckets are kept in the order they close
    # (no sort, as tensor_indices is given), then the still-open ones follow (in unordered_map order in torch;
    # here in order of first appearance). distributed.py _BucketCapacityConfig: an explicit bucket_cap_mb makes
    # the first cap equal to it.
    if settings.threshold_bytes is None:
        limits = (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_BYTES)
    else:
        limits = (settings.threshold_bytes,)
    out, open_, size, level = [], {}, {}, {}
    for t in tensors:
        open_.setdefault(t.dtype, []).append(t)
        size[t.dtype] = size.get(t.dtype, 0) + t.nbytes
        k = level.get(t.dtype, 0)
        if size[t.dtype] >= limits[k]:
            out.append(open_[t.dtype])
            open_[t.dtype], size[t.dtype] = [], 0
            level[t.dtype] = min(k + 1, len(limits) - 1)
    return out + [b for b in open_.values() if b]


@POLICIES.register("bagua")
def _bagua(tensors, settings, allreduce_time):
    """BAGUA: greedy 10 MiB buckets in ready order, closed once >= the size, launched in order."""
    # BaguaSys/bagua bagua/service/autotune_task_manager.py (and autotune_service.py) split_bucket_by_bucket_size:
    # dtypes are visited in sorted order of their names ("f16" < "f32" < "u8"), each dtype's tensors in the given
    # order; a tensor is added, then the bucket closes once its size >= bucket_size. The open bucket is NOT reset
    # between dtypes, so a bucket may span two dtypes, as in BAGUA. BAGUA knows no other dtype (it would drop
    # such tensors); simfog appends them afterwards, in order of first appearance, under the same rule.
    size_limit = BAGUA_BUCKET_BYTES if settings.threshold_bytes is None else settings.threshold_bytes
    known = ["float16", "float32", "uint8"]
    dtypes = known + [d for d in dict.fromkeys(t.dtype for t in tensors) if d not in known]
    ordered = [t for d in dtypes for t in tensors if t.dtype == d]
    position = {t.name: i for i, t in enumerate(tensors)}  # names within a bucket listed in ready order
    return [sorted(g, key=lambda t: position[t.name]) for g in _close_at(ordered, [size_limit])]


def _fuse(ready: Sequence[GradTensor], threshold_bytes: float) -> list[list[GradTensor]]:
    # horovod/common/controller.cc Controller::FuseResponses: take the first response; a following one of the
    # same dtype joins while the fused size stays <= threshold; one that cannot join is skipped (look-ahead, for
    # mixed dtypes) as long as fused size + all skipped sizes <= threshold, otherwise the look-ahead stops.
    # Skipped ones go back to the front of the queue. (Horovod's 16-byte GPU padding is not modelled.)
    queue, out = list(ready), []
    while queue:
        first = queue.pop(0)
        group, size, skipped, skipped_size = [first], first.nbytes, [], 0
        while queue:
            t = queue[0]
            if t.dtype == first.dtype and size + t.nbytes <= threshold_bytes:
                group.append(queue.pop(0))
                size += t.nbytes
            else:
                skipped_size += t.nbytes
                if size + skipped_size > threshold_bytes:
                    break
                skipped.append(queue.pop(0))
        queue = skipped + queue
        out.append(group)
    return out


def horovod_fuse(ready: Sequence[GradTensor], threshold_bytes: float) -> list[Bucket]:
    """One Horovod negotiation cycle: the given ready tensors fused, in order, into buckets of at most
    `threshold_bytes` of one dtype (a larger tensor goes alone), by Horovod's FuseResponses rule."""
    return [Bucket.of(g) for g in _fuse(ready, threshold_bytes)]


@POLICIES.register("horovod")
def _horovod(tensors, settings, allreduce_time):
    """Horovod: every cycle (1 ms) fuse what is ready on all ranks, up to the 128 MiB fusion threshold."""
    # horovod/common/operations.cc RunLoopOnce: a cycle starts cycle_time after the previous one started, or when
    # its operations have finished if that is later; it negotiates what is ready everywhere and fuses it.
    threshold = HOROVOD_FUSION_BYTES if settings.threshold_bytes is None else settings.threshold_bytes
    cycle = HOROVOD_CYCLE_S if settings.cycle_time_s is None else settings.cycle_time_s
    pending, tick, out = list(tensors), 0.0, []
    while pending:
        ready = [t for t in pending if t.ready_s <= tick]
        if not ready:
            tick = _next_tick(tick, cycle, min(t.ready_s for t in pending))
            continue
        groups = _fuse(ready, threshold)
        out.extend(groups)
        sent = {t.name for t in ready}
        pending = [t for t in pending if t.name not in sent]
        busy = sum(allreduce_time(sum(t.nbytes for t in g)) for g in groups) if allreduce_time else 0.0
        tick += max(cycle, busy)
    return out


def _next_tick(tick: float, cycle: float, when: float) -> float:
    """The first tick + k·cycle (k >= 1) at or after `when`, without stepping through idle cycles."""
    k = max(1, math.ceil((when - tick) / cycle))
    while tick + k * cycle < when:  # guard against rounding in the division
        k += 1
    while k > 1 and tick + (k - 1) * cycle >= when:
        k -= 1
    return tick + k * cycle


# ---- MG-WFBP (Shi, Chu, Li, INFOCOM'19; HKBU-HPML/MG-WFBP distributed_optimizer.py _generate_groups_mgwfbp) ----

#: How many sizes MG-WFBP's line a + b·M is fitted on (log-spaced over the sizes it merges).
LINEAR_FIT_POINTS = 64


def linear_cost(allreduce_time: AllreduceTime, lo_bytes: float, hi_bytes: float,
                points: int = LINEAR_FIT_POINTS) -> tuple[float, float]:
    """(a, b) of T(M) ≈ a + b·M (s, s/B) for MG-WFBP, fitted to `allreduce_time` over the sizes it merges.

    The fit: `points` sizes log-spaced from `lo_bytes` (the smallest gradient) to `hi_bytes` (the whole model),
    least squares on the relative error (a + b·M − T(M)) / T(M), with a, b >= 0. Exact for an affine cost.

    Source. The authors fit a + b·p by least squares to measured allreduce times and use that one line for every
    t_c and as the start-up time a that a merge saves (HKBU-HPML/MG-WFBP distributed_optimizer.py,
    `_benchmark_communication`: sklearn LinearRegression, i.e. ordinary least squares with an intercept, on the
    times that profiling.py `CommunicationProfiler.benchmark` measures at 8192·i float32 elements, i = 1..63:
    32 KiB to 2016 KiB, linearly spaced). Their INFOCOM'19 B-Caffe code instead hard-coded
    T = 2n·α + 2(n−1)/n·M·β with α = 20 µs·n, β = 0.8 ns/B (hclhkbu/B-Caffe src/caffe/distributed.cpp).
    simfog keeps the least-squares line and fits it to the cost model rather than to measurements, with two
    choices of its own: the range is the one the pass merges in (the authors' fixed 32 KiB–2 MiB is inside
    GoogLeNet's 256 B–53 MB but is not every model's), and the sizes are log-spaced with relative errors (as
    simfog.calibrate), so that a, which the merge test weighs waits against, is set by the small messages and
    not swamped by the largest sizes (linear spacing with absolute errors tends to the large-message secant).
    Sizes where T is 0 (or subnormal) are left out ((0, 0) when all are). A single size (lo >= hi) fixes no line:
    the secant from the empty message, a = T(0), b = (T(lo) − T(0)) / lo (>= 0), exact for an affine cost (all of
    T(lo) as start-up made MG-WFBP merge a gradient into an empty one for nothing, found by hypothesis)."""
    import numpy as np

    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise ConfigError("points", points, "an integer >= 2")
    if not (math.isfinite(lo_bytes) and math.isfinite(hi_bytes) and 0 < lo_bytes):
        raise ConfigError("lo_bytes", (lo_bytes, hi_bytes), "finite sizes in bytes, lo > 0")
    if hi_bytes <= lo_bytes:
        a = float(allreduce_time(0))
        return a, max(0.0, (float(allreduce_time(lo_bytes)) - a) / lo_bytes)
    sizes = np.geomspace(lo_bytes, hi_bytes, points)
    sizes[0], sizes[-1] = lo_bytes, hi_bytes
    t = np.array([float(allreduce_time(float(m))) for m in sizes])
    keep = t >= np.finfo(float).tiny  # a subnormal time is 0 here: its 1/T overflows and breaks the fit
    if not keep.any():
        return 0.0, 0.0
    sizes, t = sizes[keep], t[keep]
    # In units of the largest time and size, so that 1/T and M/T stay finite for times near the smallest normal
    # float (found by hypothesis: beta = 2.2e-313 s/B overflowed M/T and broke the SVD); scaled back at the end.
    t_unit, m_unit = float(t.max()), float(sizes.max())
    t, sizes = t / t_unit, sizes / m_unit
    x = np.column_stack([1.0 / t, sizes / t])  # (a·1 + b·M) / T ≈ 1
    y = np.ones(len(t))
    scale = np.linalg.norm(x, axis=0)
    sol = np.linalg.lstsq(x / scale, y, rcond=None)[0] / scale
    candidates = [sol] if (sol >= 0).all() else []
    for j in (0, 1):  # the best line on the boundary a = 0 or b = 0
        c, col = np.zeros(2), x[:, j]
        c[j] = (col @ y) / (col @ col)
        candidates.append(c)
    best = min(candidates, key=lambda c: float(np.sum((x @ c - y) ** 2)))
    return float(best[0]) * t_unit, float(best[1]) * t_unit / m_unit


def _mgwfbp_core(ready: Sequence[float], nbytes: Sequence[float], a: float, b: float,
                 elements: Sequence[int], small: int) -> list[list[int]]:
    """The authors' merge pass over layers in forward order (ready[l] = τ_b[l] + t_b[l])."""
    L = len(ready)
    p, el = list(nbytes), list(elements)
    tc = [a + b * x for x in p]
    groups, group = [], []
    start = ready[L - 1]  # τ_c[l] for the current l; τ_c[L-1] = τ_b[L-1] + t_b[L-1]
    for i in range(L - 1, 0, -1):
        group.append(i)
        e = ready[i - 1]  # when layer l-1's gradient is ready
        merge = e < start + tc[i] and (start > e or e - start < a)
        if not merge and small and el[i] < small:  # authors' later code: `if not merged and p[l] < 8192`
            merge = True
        if merge:  # p[l] joins l-1; τ_c is recomputed (only τ_c[l-1] and below can change)
            p[i - 1] += p[i]
            el[i - 1] += el[i]
            p[i], el[i], tc[i] = 0, 0, 0.0
            tc[i - 1] = a + b * p[i - 1]
        else:
            groups.append(group)
            group = []
        start = max(start + tc[i], ready[i - 1])  # τ_c[l-1] = max(τ_c[l] + t_c[l], τ_b[l-1] + t_b[l-1])
    groups.append(group + [0])
    return groups


def mgwfbp_groups(backward_s: Sequence[float], nbytes: Sequence[float], a: float, b: float, *,
                  elements: Sequence[int] | None = None, small_tensor_elements: int = 0) -> list[list[int]]:
    """MG-WFBP's merged groups, in the paper's notation.

    Layers (tensors) l = 0..L-1 in forward order; backward runs from L-1 down to 0 taking `backward_s[l]` each;
    layer l has `nbytes[l]` gradient bytes; T_ar(M) = a + b·M seconds. Returns the groups in launch order, each a
    list of layer indices in ready order (descending), e.g. [[4, 3], [2], [1, 0]]. With `small_tensor_elements`
    > 0, a group still under that many `elements` (default: nbytes / 4) is merged too, as the authors' later code.
    Raises ConfigError for mismatched lengths or negative times.
    """
    L = len(backward_s)
    if len(nbytes) != L or (elements is not None and len(elements) != L):
        raise ConfigError("mgwfbp.nbytes", len(nbytes), f"one size per layer ({L})")
    if any(not math.isfinite(t) or t < 0 for t in backward_s):
        raise ConfigError("mgwfbp.backward_s", list(backward_s), "finite times >= 0")
    if L == 0:
        return []
    ready, end = [0.0] * L, 0.0
    for i in range(L - 1, -1, -1):
        end += backward_s[i]
        ready[i] = end
    el = list(elements) if elements is not None else [int(x) // 4 for x in nbytes]
    return _mgwfbp_core(ready, nbytes, a, b, el, small_tensor_elements)


@POLICIES.register("mgwfbp")
def _mgwfbp(tensors, settings, allreduce_time):
    """MG-WFBP: merge a gradient into the next one when that finishes communication sooner (a, b from the cost)."""
    # Per tensor, as the authors' code; a, b: the least-squares line of the cost model over the sizes merged,
    # from the smallest gradient to the whole model (linear_cost). tensors[k] in ready order is the paper's
    # layer L-1-k.
    if allreduce_time is None:
        raise ConfigError("comm.merge", "mgwfbp", "a cost model: MG-WFBP needs allreduce_time(nbytes)")
    sizes = [t.nbytes for t in tensors if t.nbytes > 0]
    a, b = linear_cost(allreduce_time, min(sizes), sum(sizes)) if sizes else (float(allreduce_time(0)), 0.0)
    fwd = tensors[::-1]
    groups = _mgwfbp_core([t.ready_s for t in fwd], [t.nbytes for t in fwd], a, b, [t.elements for t in fwd],
                          settings.small_tensor_elements)
    return [[fwd[i] for i in g] for g in groups]


# ---- Optimal contiguous buckets (simfog's own; exact under the cost model) ----

def optimal_groups(ready_s: Sequence[float], nbytes: Sequence[float], allreduce_time: AllreduceTime
                   ) -> list[tuple[int, int]]:
    """The contiguous bucket plan (i, j) ranges, inclusive, in launch order, whose last collective ends earliest
    when buckets run one at a time in order, each starting once its last tensor is ready and the previous bucket
    has ended: E(plan) = end of its last bucket, with bucket [i..j] ending at max(E(prefix), ready_s[j]) +
    allreduce_time(sum nbytes[i..j]), where ready_s[j] stands for the latest ready time of tensors 0..j (the same
    thing: a prefix's last bucket ends after all of its tensors are ready, so max(E_prefix, latest of i..j) =
    max(E_prefix, latest of 0..j); ready order from a trace may hold small inversions, e.g. tied weights).

    Exactness. Let E*(j) be the least end over all plans of tensors 0..j. The last bucket of any plan of 0..j is
    some [i..j], and its end max(E_prefix, ready_s[j]) + T(S_ij) is non-decreasing in the prefix's end E_prefix, so
    it is at least max(E*(i-1), ready_s[j]) + T(S_ij) (E*(-1) = 0), which the best plan of 0..i-1 followed by [i..j]
    attains. Hence E*(j) = min over i of max(E*(i-1), ready_s[j]) + T(S_ij): a prefix's earliest end is the only
    state a later choice needs, for ANY cost T (not only a + b·M), and the recurrence over j = 0..n-1 finds the
    optimum with n(n+1)/2 cost evaluations (sizes that repeat are costed once). Ties keep the larger last bucket.

    Within simfog's engine this is the least iteration time over contiguous plans in ready order on identical
    ranks with mean layer times and one communication stream: backward's end and the optimizer are fixed, and the
    iteration ends at max(backward end, last collective's end) + optimizer. Raises ConfigError for mismatched
    lengths."""
    n = len(ready_s)
    if len(nbytes) != n:
        raise ConfigError("optimal.nbytes", len(nbytes), f"one size per tensor ({n})")
    latest = list(ready_s)
    for j in range(1, n):
        latest[j] = max(latest[j], latest[j - 1])
    prefix = [0.0]
    for x in nbytes:
        prefix.append(prefix[-1] + x)
    cost: dict[float, float] = {}  # T by size: equal sums (e.g. repeated layers) are costed once

    def t(m: float) -> float:
        if m not in cost:
            cost[m] = float(allreduce_time(m))
        return cost[m]

    best_end, start_of = [0.0] * n, [0] * n
    for j in range(n):
        best = math.inf
        for i in range(j, -1, -1):  # from the smallest last bucket to the largest: ties go to the larger
            end = max(best_end[i - 1] if i else 0.0, latest[j]) + t(prefix[j + 1] - prefix[i])
            if end <= best:
                best, start_of[j] = end, i
        best_end[j] = best
    groups, j = [], n - 1
    while j >= 0:
        groups.append((start_of[j], j))
        j = start_of[j] - 1
    return groups[::-1]


@POLICIES.register("optimal")
def _optimal(tensors, settings, allreduce_time):
    """Optimal: the contiguous buckets in ready order whose last allreduce ends earliest under the cost model."""
    if allreduce_time is None:
        raise ConfigError("comm.merge", "optimal", "a cost model: the optimal plan needs allreduce_time(nbytes)")
    groups = optimal_groups([t.ready_s for t in tensors], [t.nbytes for t in tensors], allreduce_time)
    return [list(tensors[i:j + 1]) for i, j in groups]


def predicted_comm_end_s(tensors: Sequence[GradTensor], buckets: Sequence[Bucket],
                         allreduce_time: AllreduceTime) -> float:
    """When the last allreduce ends (seconds after backward starts) if buckets run one at a time in launch order,
    each starting when its last tensor is ready and the previous one has ended: MG-WFBP's τ_c[0] + t_c[0]
    recurrence (docs/ALGORITHMS.md §2) for any plan. Raises ConfigError for a bucket naming an unknown tensor."""
    ready = {t.name: t.ready_s for t in tensors}
    end = 0.0
    for bucket in buckets:
        missing = [n for n in bucket.tensors if n not in ready]
        if missing:
            raise ConfigError("bucket.tensors", missing[0], "names of the given tensors")
        end = max(end, *(ready[n] for n in bucket.tensors)) + allreduce_time(bucket.nbytes)
    return end
