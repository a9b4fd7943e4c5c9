"""FSDP2's host work per collective on the validation rig, measured before the validated runs, as the network is.

simfog costs an FSDP2 collective as its network cost (calibrated from bare gloo microbenchmarks) plus
`collective_overhead_s` (simfog.overheads). On this rig each collective of FSDP2 also pays host work the bare
microbenchmark does not: FSDP2's hooks, copy-in and copy-out in the rank's thread, the issuing thread's turn
(validate.ranks.fsdp issues a rank's collectives one at a time, as NCCL runs a communicator's), gloo's threads, all
on shared cores. The probe measures it: FSDP2 itself (validate.ranks.fsdp, replay mode) on a synthetic model of
PROBE_LAYERS small layers, one unit per layer, reshard after forward, prefetch 1, on the group's own emulated cluster
and layout. Per collective and iteration its span is the mean completion over ranks minus the last rank's start
(what simfog's collective lasts once every rank has issued it); the overhead is the median over all of them of that
span minus the calibrated cost model's time for the same collective (never below 0). The validated rows are not
looked at.

Measured (three `simfog validate --bench` runs, idle 2-core machine, 200 Mbit/s emulated NICs, one rank per node):
0.07 / 0 / 0 ms per collective at 2 ranks, 0.30 / 0.25 / 0.31 ms at 4, 1.12 / 0.65 / 0.68 ms at 8; each fsdp row's
CSV carries the value and how it was measured (`collective_overhead_s`, `overheads_source`).
"""

from __future__ import annotations

import datetime
import platform
import statistics
from collections.abc import Sequence
from dataclasses import replace

from simfog.experiment import Experiment, Heterogeneity, Workload
from simfog.trace import Layer, ModelTrace, Provenance, Tensor

PROBE_LAYERS = 12
PROBE_ELEMENTS = (256, 4096, 16384)  # float32 per layer, in turn: 1, 16 and 64 KiB (the bench's per-layer units)
PROBE_COMPUTE_S = 1e-3  # forward and backward of each layer (replayed)
PROBE_ITERATIONS = 10
PROBE_ID = "fsdp-overhead-probe"


def probe_trace() -> ModelTrace:
    layers = tuple(Layer(f"probe{i}", (PROBE_COMPUTE_S,), (PROBE_COMPUTE_S,),
                         (Tensor(f"probe{i}.weight", PROBE_ELEMENTS[i % len(PROBE_ELEMENTS)]),))
                   for i in range(PROBE_LAYERS))
    order = tuple(t.name for layer in reversed(layers) for t in layer.params)
    return ModelTrace("mlp", 1, "float32", {"kind": "synthetic"}, {},
                      Provenance("validate.fsdp_calibration.probe_trace", str(datetime.date.today()),
                                 platform.node(), "estimated", True,
                                 notes=f"{PROBE_LAYERS} layers of {PROBE_COMPUTE_S * 1e3:g} ms forward and backward"),
                      layers, order, optimizer_s=(0.0,))


def probe_experiment(like: Experiment) -> Experiment:
    """The probe on `like`'s cluster: FSDP2, one unit per layer, reshard after forward, prefetch 1, no overhead
    given (what it measures)."""
    comm = replace(like.comm, algorithm="fsdp", fsdp_unit="layer", reshard_after_forward=True, prefetch=1,
                   collective_overhead_s=None, param_dtype=None, reduce_dtype=None)
    return replace(like, iterations=PROBE_ITERATIONS, comm=comm, heterogeneity=Heterogeneity(),
                   workload=Workload(probe_trace(), "<probe>", like.workload.compute))


def overhead(predicted_s: Sequence[float], per_rank: Sequence[dict]) -> tuple[float, str]:
    """(seconds, how) from the probe's per-rank records (validate.ranks.worker: per iteration `launch`, `done`
    in plan order) and the cost model's time of each plan collective `predicted_s`."""
    excess = []
    for it in range(len(per_rank[0]["iterations"])):
        iterations = [r["iterations"][it] for r in per_rank]
        for c, want in enumerate(predicted_s):
            start = max(i["launch"][c] for i in iterations)
            done = statistics.fmean(i["done"][c] for i in iterations)
            excess.append(done - start - want)
    value = max(0.0, statistics.median(excess))
    sizes = "/".join(str(4 * e // 1024) for e in PROBE_ELEMENTS)
    low, _, high = statistics.quantiles(excess, n=4)
    how = (f"FSDP2 probe on the emulated cluster ({PROBE_LAYERS} layers of {sizes} KiB, one unit each, "
           f"{len(excess)} collectives): median of (mean completion over ranks - last start) - the calibrated cost, "
           f"{value * 1e6:.0f} us; quartiles of that excess {low * 1e6:.0f} / {high * 1e6:.0f} us")
    return value, how


def measure(rig, like: Experiment, calibration) -> tuple[float, str]:
    """(seconds, how): FSDP2's host work per collective on `rig`'s cluster and layout (validate.run.Rig), from the
    probe run on it with `calibration` (the allreduce fit), before the validated runs; (0, why) when the probe
    failed. Cached in the rig's cache per layout, NIC rate and emulation."""
    from simfog.simulation import new_simulation

    key = ("fsdp-overhead", *rig.key)
    if rig.cache is not None and key in rig.cache:
        return rig.cache[key]
    folder = rig.work / "fsdp-probe"
    folder.mkdir(parents=True, exist_ok=True)
    prepared = rig.prepare(PROBE_ID, probe_experiment(like), calibration, folder)
    sim = new_simulation(prepared.experiment)
    predicted = [sim.cost.time(c.op, c.nbytes, None) for c in sim.algorithm.plan.colls]
    ranks, error = rig.run([prepared], folder)
    if ranks is None:
        return 0.0, f"unmeasured, 0: the FSDP2 probe failed ({error.splitlines()[0]})"
    result = overhead(predicted, [r["configs"][0] for r in ranks])
    if rig.cache is not None:
        rig.cache[key] = result
    return result
