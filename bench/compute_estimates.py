"""How far simfog's roofline compute estimate (`simfog retarget CPU-TRACE --device h200`, its defaults) is from the
same models measured on a real H200 (traces/h200/*-run1/-run2, traces/README.md): per model and run, the step
(medians of forward + backward + optimizer) estimated and measured, and |ln(measured / estimated)|, the score an
estimated trace's compute interval is conformal on (simfog.run_bands). `--write FILE` writes the scores
(simfog/data/compute_estimates.toml, the table simfog ships) with their provenance.

The estimate's one free constant, the per-layer-and-pass floor (`simfog.retarget.DEFAULT_LAUNCH_S`: launches and
the framework's dispatch around each layer, which decide small models' steps on a GPU), is learned across models
and scored leave-one-model-out: each model is estimated with the floor of LAUNCH_GRID that gives the least median
score over the OTHER models' runs, and its runs' scores with that floor are the table's (what an estimate of a model
nobody measured is off by). The floor learned from every model is what simfog ships; the bench says whether it
still is. Not blind: the 10 us floor's scores were known, and two variants were scored leave-one-model-out on
these same 14 steps before one was shipped (the floor with the efficiency learned too: median 44 %, 90 % x2.5; the
floor alone, efficiency kept at its stated 0.5: median 32 %, 90 % x3.1). The floor alone was kept, so that the
efficiency stays a stated assumption; the figures are held out per model, not from data no choice saw.

A trace pinned to a measured step (simfog.retarget.pin_step: the estimate's split over layers, the total a user
measured, e.g. one GPU's throughput) has the right step on one GPU; what it can get wrong is how much of the
communication its layers hide. Its scores (`pinned_scores`): each model's estimate (its floor learned from the other
models) pinned to each measured run's mean step, and the measured trace itself, both run on the default experiment's
cluster (4 nodes x 8 GPUs, DDP over a ring) at 25 and 100 Gbit/s: |ln(t(pinned) / t(measured))|.

Run: python bench/compute_estimates.py [--write simfog/data/compute_estimates.toml]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from simfog.bands import LEVELS, conformal_quantile
from simfog.retarget import DEFAULT_LAUNCH_S, pin_step, retarget
from simfog.trace import load_model_trace

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "h200"
LAUNCH_GRID = (10e-6, 20e-6, 30e-6, 40e-6, 60e-6, 80e-6)  # per layer and pass (s)
PINNED_NICS = ("25Gbit/s", "100Gbit/s")  # the pinned traces' clusters: the default experiment's, at these NIC rates


def step_s(trace) -> float:
    """Medians of the forward, backward and optimizer totals over the trace's samples, summed."""
    fwd = np.array([layer.forward_s for layer in trace.layers]).sum(0)
    bwd = np.array([layer.backward_s for layer in trace.layers]).sum(0)
    opt = np.asarray(trace.optimizer_s, dtype=float)
    return float(np.median(fwd) + np.median(bwd) + (np.median(opt) if opt.size else 0.0))


def pairs() -> list[tuple[str, str, dict, float]]:
    """(CPU trace, measured H200 trace, estimated step per floor of LAUNCH_GRID, measured step) for every CPU trace
    with H200 runs."""
    out = []
    for cpu in sorted((ROOT / "traces").glob("*-cpu-*.json.gz")):
        model, batch = cpu.name.removesuffix(".json.gz").split("-cpu-")
        runs = sorted((ROOT / "traces" / DEVICE).glob(f"{model}-{DEVICE}-{batch}-run*.json.gz"))
        if not runs:
            continue
        trace = load_model_trace(cpu)
        estimated = {f: step_s(retarget(trace, DEVICE, launch_s=f)) for f in LAUNCH_GRID}
        for run in runs:
            out.append((cpu.relative_to(ROOT).as_posix(), run.relative_to(ROOT).as_posix(), estimated,
                        step_s(load_model_trace(run))))
    return out


def learned_floor(rows: list, models: set[str]) -> float:
    """The floor of LAUNCH_GRID with the least median |ln(measured / estimated)| over the runs of `models` (CPU trace
    names); ties go to the smaller floor."""
    def median(f: float) -> float:
        return float(np.median([abs(math.log(meas / est[f])) for cpu, _, est, meas in rows if cpu in models]))

    return min(LAUNCH_GRID, key=lambda f: (median(f), f))


def pinned_scores(rows: list, floors: dict) -> list[tuple[str, str, float]]:
    """(measured run, NIC rate, |ln(t(pinned) / t(measured))|) per run and PINNED_NICS (module docstring)."""
    from dataclasses import replace

    import simfog
    from simfog import units
    from simfog.run_bands import step_samples

    base = simfog.load()
    out = []
    for cpu, run, _, _ in rows:
        real = load_model_trace(ROOT / run)
        est = retarget(load_model_trace(ROOT / cpu), DEVICE, launch_s=floors[cpu])
        pinned = pin_step(est, float(step_samples(real).mean()), f"the mean step of {run}")
        for nic in PINNED_NICS:
            cluster = replace(base.cluster, nic=replace(base.cluster.nic, bandwidth_Bps=units.bandwidth(nic)))
            t = [simfog.simulate(replace(base, cluster=cluster, workload=replace(base.workload, trace=tr,
                                                                                compute="mean")),
                                 level=None).summary()["iteration_time_s"] for tr in (pinned, real)]
            out.append((run, nic, abs(math.log(t[0] / t[1]))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", metavar="FILE", help="write the scores (simfog/data/compute_estimates.toml)")
    args = parser.parse_args()
    rows = pairs()
    models = {cpu for cpu, *_ in rows}
    floors = {cpu: learned_floor(rows, models - {cpu}) for cpu in models}
    print(f"{'measured trace':44s} {'floor':>6s} {'estimated':>10s} {'measured':>10s} {'ln(m/e)':>8s}  "
          "(floor: learned from the other models)")
    scores = []
    for cpu, run, est, meas in rows:
        f = floors[cpu]
        scores.append(abs(math.log(meas / est[f])))
        print(f"{run:44s} {f * 1e6:4.0f}us {est[f] * 1e3:8.2f}ms {meas * 1e3:8.2f}ms {math.log(meas / est[f]):+8.3f}")
    q = {lv: conformal_quantile(scores, lv) for lv in LEVELS}
    print("conformal half-widths: " + ", ".join(f"{lv:g}: {'too few points' if w is None else f'{w:.3f}'}"
                                                for lv, w in q.items()))
    shipped = learned_floor(rows, models)
    print(f"learned from every model: floor {shipped * 1e6:g} us; simfog ships {DEFAULT_LAUNCH_S * 1e6:g} us"
          + ("" if shipped == DEFAULT_LAUNCH_S else " (DIFFERENT: update simfog.retarget.DEFAULT_LAUNCH_S)"))
    print(f"points={len(scores)} median={100 * math.expm1(float(np.median(scores))):.1f}% "
          f"worst={100 * math.expm1(max(scores)):.1f}% "
          f"half_width90={'nan' if q[0.9] is None else f'{100 * math.expm1(q[0.9]):.1f}'}%")
    pinned = pinned_scores(rows, floors)
    ps = [x for *_, x in pinned]
    qp = conformal_quantile(ps, 0.9)
    print(f"pinned to the measured step, {len(ps)} runs x clusters: median "
          f"{100 * math.expm1(float(np.median(ps))):.1f}%, worst {100 * math.expm1(max(ps)):.1f}%, 90 % half-width "
          f"{'too few points' if qp is None else f'{100 * math.expm1(qp):.1f}%'}")
    if args.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
        lines = ["# |ln(measured / estimated)| of the roofline compute estimate against real H200 steps, each model",
                 "# estimated with the per-layer floor learned from the other models (leave one model out).",
                 "# Generated; do not edit. Regenerate: python bench/compute_estimates.py --write "
                 "simfog/data/compute_estimates.toml", "[estimates]",
                 f"scores = [{', '.join(repr(round(s, 6)) for s in scores)}]",
                 f"pairs = {json.dumps([f'{cpu} -> {run}' for cpu, run, *_ in rows])}",
                 f"pinned_scores = [{', '.join(repr(round(x, 6)) for x in ps)}]",
                 f"pinned_runs = {json.dumps([f'{run} @ {nic}' for run, nic, _ in pinned])}",
                 "", "[provenance]", f"generated = {json.dumps(datetime.now(UTC).strftime('%Y-%m-%d'))}",
                 f"commit = {json.dumps(commit)}",
                 "estimate = " + json.dumps(f"simfog retarget CPU-TRACE --device {DEVICE} (default precision and "
                                            "efficiency; the per-layer floor learned from the other models)"),
                 "floors = { " + ", ".join(f"{json.dumps(cpu)} = {floors[cpu]!r}" for cpu in sorted(floors)) + " }",
                 f"floor_learned_from_all = {shipped!r}",
                 "measured = " + json.dumps("traces/h200/*-run1, -run2: one NVIDIA H200, 2026-11-27 "
                                            "(traces/README.md)"),
                 "step = " + json.dumps("medians of forward + backward + optimizer totals over the samples")]
        Path(args.write).write_text("\n".join(lines) + "\n")
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
