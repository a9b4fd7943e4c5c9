"""How far simfog's roofline compute estimate (`simfog retarget CPU-TRACE --device h200`, its defaults) is from the
same models measured on a real H200 (traces/h200/*-run1/-run2, traces/README.md): per model and run, the step
(medians of forward + backward + optimizer) estimated and measured, and |ln(measured / estimated)|, the score an
estimated trace's compute interval is conformal on (simfog.prediction_interval). `--write FILE` writes the scores
(simfog/data/compute_estimates.toml, the table simfog ships) with their provenance.

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

from simfog.retarget import retarget
from simfog.trace import load_model_trace
from simfog.uncertainty import LEVELS, conformal_quantile

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "h200"


def step_s(trace) -> float:
    """Medians of the forward, backward and optimizer totals over the trace's samples, summed."""
    fwd = np.array([layer.forward_s for layer in trace.layers]).sum(0)
    bwd = np.array([layer.backward_s for layer in trace.layers]).sum(0)
    opt = np.asarray(trace.optimizer_s, dtype=float)
    return float(np.median(fwd) + np.median(bwd) + (np.median(opt) if opt.size else 0.0))


def pairs() -> list[tuple[str, str, float, float]]:
    """(CPU trace, measured H200 trace, estimated step, measured step) for every CPU trace with H200 runs."""
    out = []
    for cpu in sorted((ROOT / "traces").glob("*-cpu-*.json.gz")):
        model, batch = cpu.name.removesuffix(".json.gz").split("-cpu-")
        estimated = step_s(retarget(load_model_trace(cpu), DEVICE))
        for run in sorted((ROOT / "traces" / DEVICE).glob(f"{model}-{DEVICE}-{batch}-run*.json.gz")):
            out.append((cpu.relative_to(ROOT).as_posix(), run.relative_to(ROOT).as_posix(), estimated,
                        step_s(load_model_trace(run))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", metavar="FILE", help="write the scores (simfog/data/compute_estimates.toml)")
    args = parser.parse_args()
    rows = pairs()
    print(f"{'measured trace':44s} {'estimated':>10s} {'measured':>10s} {'ln(m/e)':>8s}")
    for _, run, est, meas in rows:
        print(f"{run:44s} {est * 1e3:8.2f}ms {meas * 1e3:8.2f}ms {math.log(meas / est):+8.3f}")
    scores = [abs(math.log(meas / est)) for *_, est, meas in rows]
    q = {lv: conformal_quantile(scores, lv) for lv in LEVELS}
    print("conformal half-widths: " + ", ".join(f"{lv:g}: {'too few points' if w is None else f'{w:.3f}'}"
                                                for lv, w in q.items()))
    print(f"points={len(scores)} median={100 * math.expm1(float(np.median(scores))):.1f}% "
          f"worst={100 * math.expm1(max(scores)):.1f}%")
    if args.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
        lines = ["# |ln(measured / estimated)| of the roofline compute estimate against real H200 steps.",
                 "# Generated; do not edit. Regenerate: python bench/compute_estimates.py --write "
                 "simfog/data/compute_estimates.toml", "[estimates]",
                 f"scores = [{', '.join(repr(round(s, 6)) for s in scores)}]",
                 f"pairs = {json.dumps([f'{cpu} -> {run}' for cpu, run, *_ in rows])}",
                 "", "[provenance]", f"generated = {json.dumps(datetime.now(UTC).strftime('%Y-%m-%d'))}",
                 f"commit = {json.dumps(commit)}",
                 "estimate = " + json.dumps(f"simfog retarget CPU-TRACE --device {DEVICE} (default precision, "
                                            "efficiency and per-layer overhead)"),
                 "measured = " + json.dumps("traces/h200/*-run1, -run2: one NVIDIA H200, 2026-11-27 "
                                            "(traces/README.md)"),
                 "step = " + json.dumps("medians of forward + backward + optimizer totals over the samples")]
        Path(args.write).write_text("\n".join(lines) + "\n")
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
