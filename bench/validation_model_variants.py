"""Re-predict the allreduce rows of a `simfog validate --bench` CSV under other network-model variants.

The measured times stay as they were; only the simulated side changes (same calibrated links, same traces and
draws), so model changes can be judged without rerunning the real matrix. Prints median and worst |error| per
variant, then the rows where any variant is off by more than 10 %.
Run: python bench/validation_model_variants.py OUT/bench-validation.csv
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path

import numpy as np

from simfog.cluster import Link
from simfog.simulation import new_simulation
from validate import bench
from validate.comparison.compare import steady_iteration_s

VARIANTS = {"ring": ("ring", 1), "gloo_ring": ("gloo_ring", 1), "gloo_ring+2streams": ("gloo_ring", 2),
            "ring+2streams": ("ring", 2)}
ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    args = parser.parse_args()
    rows = {r["id"]: r for r in csv.DictReader(open(args.csv))}
    traces = {"resnet20": ROOT / "traces/resnet20-cpu-b32.json.gz", "mlp": ROOT / "traces/mlp-cpu-b1024.json.gz"}
    errors = {k: [] for k in VARIANTS}
    detail = []
    for _, exps in bench.groups(traces):
        for vid, exp in exps:
            r = rows.get(vid)
            if r is None or r["error"] or exp.comm.algorithm != "allreduce":
                continue
            c = exp.cluster
            nic = Link(float(r["nic_latency_s"]), float(r["nic_fit_bandwidth_Bps"])) if r["nic_latency_s"] else c.nic
            intra = (Link(float(r["intra_latency_s"]), float(r["intra_fit_bandwidth_Bps"])) if r["intra_latency_s"]
                     else c.intra)
            base = replace(exp, cluster=replace(c, nic=nic, intra=intra))
            measured = float(r["measured_iteration_s"])
            line = [vid]
            for name, (collective, streams) in VARIANTS.items():
                run = new_simulation(base.with_comm(collective=collective, streams=streams)).run()
                predicted = steady_iteration_s(run)
                errors[name].append((predicted - measured) / measured)
                line.append(f"{100 * errors[name][-1]:+.1f}%")
            detail.append(line)
    for name, values in errors.items():
        a = np.abs(values)
        print(f"{name:<20} median |error| {100 * np.median(a):.1f}%  worst {100 * a.max():.1f}%  ({len(a)} rows)")
    print("rows off by more than 10 % under some variant:", *VARIANTS)
    for line in detail:
        if any(abs(float(x[:-1])) > 10 for x in line[1:]):
            print(" ", *line)


if __name__ == "__main__":
    main()
