"""The compute part of a retargeted trace's interval (simfog.run_bands): how far simfog's per-layer model of compute
(simfog.gpu, `simfog retarget`) is from whole training steps on GPUs it never saw, and how far such an estimate
pinned to a measured step is from a distributed run's iteration. `--write FILE` writes the table simfog ships
(simfog/data/compute_estimates.toml).

- `scores`: |ln(measured / estimated)| of every public training iteration bench/retarget.py holds out (part 3:
  pytorch-gpu-benchmark's ResNet-50, VGG-16 and DenseNet-121 at batch 12, FP32/TF32 and FP16, on six GPUs), each
  estimated by the model learned without its GPU and with the host figures learned without its machine. They are
  iterations of three models on few machines: less independent than their count says.
- `pinned_scores`: each zoo model's estimate on an H200 pinned to each measured H200 run's mean step
  (simfog.retarget.pin_step: the estimate's split over layers, the total measured) and the measured trace itself, run
  on the default experiment's cluster (4 nodes x 8 GPUs, DDP over a ring) at 25 and 100 Gbit/s:
  |ln(t(pinned) / t(measured))|. The H200 runs are the measurement given to the pin, never learned from.

Run: python bench/compute_estimates.py [--cache DIR] [--write simfog/data/compute_estimates.toml] (the cache of
bench/retarget.py: its fits are reused)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import retarget as bench  # noqa: E402

from simfog.bands import LEVELS, conformal_quantile  # noqa: E402
from simfog.retarget import pin_step, retarget  # noqa: E402
from simfog.trace import load_model_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PINNED_NICS = ("25Gbit/s", "100Gbit/s")


def pinned_scores() -> list[tuple[str, str, float]]:
    """(measured run, NIC rate, |ln(t(pinned) / t(measured))|) per H200 run and PINNED_NICS (module docstring)."""
    from dataclasses import replace

    import simfog
    from simfog import units
    from simfog.run_bands import step_samples

    base = simfog.load()
    out = []
    for cpu, runs in bench.data.h200_runs():
        est = retarget(load_model_trace(cpu), "h200")
        for run in runs:
            real = load_model_trace(run)
            pinned = pin_step(est, float(step_samples(real).mean()), f"the mean step of {run.name}")
            for nic in PINNED_NICS:
                cluster = replace(base.cluster, nic=replace(base.cluster.nic, bandwidth_Bps=units.bandwidth(nic)))
                t = [simfog.simulate(replace(base, cluster=cluster, workload=replace(base.workload, trace=tr,
                                                                                    compute="mean")),
                                     level=None).summary()["iteration_time_s"] for tr in (pinned, real)]
                out.append((run.relative_to(ROOT).as_posix(), nic, abs(math.log(t[0] / t[1]))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=None, help="bench/retarget.py's cache of fits")
    parser.add_argument("--write", metavar="FILE", help="write the scores (simfog/data/compute_estimates.toml)")
    args = parser.parse_args()
    everything, fits, _, scales = bench.held_out(args.cache)
    public = bench.public_step_scores(fits, everything, scales, args.cache)
    scores = [abs(math.log(m / p)) for _, p, m in public]
    q = {lv: conformal_quantile(scores, lv) for lv in LEVELS}
    print(f"{len(scores)} public training iterations held out: median {100 * math.expm1(np.median(scores)):.1f}%, "
          f"worst {100 * math.expm1(max(scores)):.1f}%; conformal half-widths: "
          + ", ".join(f"{lv:g}: {'too few points' if w is None else f'x/ {math.exp(w):.3f}'}" for lv, w in q.items()))
    pinned = pinned_scores()
    ps = [x for *_, x in pinned]
    qp = conformal_quantile(ps, 0.9)
    print(f"pinned to the measured step, {len(ps)} runs x clusters: median {100 * math.expm1(np.median(ps)):.1f}%, "
          f"worst {100 * math.expm1(max(ps)):.1f}%, 90 % half-width "
          f"{'too few points' if qp is None else f'{100 * math.expm1(qp):.1f}%'}")
    if args.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
        lines = ["# |ln(measured / estimated)| of simfog's per-layer compute model (simfog retarget) against public",
                 "# training iterations on GPUs it never saw (bench/retarget.py, part 3), and of estimates pinned to a",
                 "# measured H200 step. Generated; do not edit. Regenerate: python bench/compute_estimates.py --write "
                 "simfog/data/compute_estimates.toml", "[estimates]",
                 f"scores = [{', '.join(repr(round(s, 6)) for s in scores)}]",
                 f"pairs = {json.dumps([w for w, _, _ in public])}",
                 f"pinned_scores = [{', '.join(repr(round(x, 6)) for x in ps)}]",
                 f"pinned_runs = {json.dumps([f'{run} @ {nic}' for run, nic, _ in pinned])}",
                 "", "[provenance]", f"generated = {json.dumps(datetime.now(UTC).strftime('%Y-%m-%d'))}",
                 f"commit = {json.dumps(commit)}",
                 "estimate = " + json.dumps("simfog retarget TRACE --device GPU (simfog.gpu's per-layer model, "
                                            "default precision): each iteration with the model learned without its "
                                            "GPU and the host figures without its machine"),
                 "measured = " + json.dumps("bench/data/kernels/pytorch-gpu-benchmark/steps.csv (train, batch 12); "
                                            "pinned: traces/h200/*-run1, -run2 (traces/README.md)"),
                 "step = " + json.dumps("one training iteration as measured (pytorch-gpu-benchmark: zero_grad, the "
                                        "batch's copy, forward, loss, backward)")]
        Path(args.write).write_text("\n".join(lines) + "\n")
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
