"""Held-out fidelity of the NCCL model on the real nccl-tests logs of ../shared/ref/nccl-tests.

For each cluster, calibrate (simfog.nccl_fit, as `simfog calibrate` does) on its single-node logs and its logs with
at most 2 nodes, then predict every log with more nodes at every size, and print one row per point: cluster, GPUs,
nodes, size, measured (min of out-of-place and in-place), predicted, error and NCCL's choice. Points that took
longer than the next larger size of the same log (flag "non-monotone": no collective algorithm can do that, so the
run was disturbed there) are reported and counted, and also summarised without them.

Last line: `median=<pct> worst=<pct>` over every held-out point. Run: python bench/collectives.py [--ref DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from simfog import nccl_fit, units
from simfog.importers import import_file

ROOT = Path(__file__).resolve().parents[1]

# cluster -> (hardware facts for nccl_fit.fit, training logs, held-out logs); paths under nccl-tests/. ABCI ran NCCL
# 2.8.4 (its README); Echo's release is not recorded, so the newest tables are used. CPU vendors are the machines'
# (NCCL's model charges AMD hosts 2 us per intra-node step on several nodes, Intel 1 us): Azure ND A100 v4 has AMD
# EPYC 7V12 (Rome) processors, an ABCI compute node (V) two Intel Xeon Gold 6148. NICs: Echo's README states a
# dedicated 200 Gb/s InfiniBand link per GPU (8 per node); ABCI's 2 x EDR per node (V) is not stated by the source,
# so it is not given.
CLUSTERS = {
    "a100-azure": (dict(version="2.30", cpu_vendor="amd", nics_per_node=8, nic_Bps=25e9),
                   [f"echo-a100-azure/nccl_{n}.log" for n in (1, 2, 4, 8, 16)],
                   [f"echo-a100-azure/nccl_{n}.log" for n in (32, 64, 128)]),
    "v100-abci": (dict(version="2.8.4", cpu_vendor="intel"),
                  ["abci-v100/intra_vnode/job04.sh.7280532.nccl", "abci-v100/inter_vnode/job02.sh.7194532.nccl"],
                  ["abci-v100/inter_vnode/job04.sh.7194533.nccl", "abci-v100/inter_vnode/job08.sh.7194534.nccl",
                   "abci-v100/inter_vnode/job16.sh.7194535.nccl", "abci-v100/inter_vnode/job32.sh.7194536.nccl"]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default=str(ROOT.parent / "shared" / "ref" / "nccl-tests"),
                        help="the nccl-tests folder of shared/ref")
    args = parser.parse_args()
    ref = Path(args.ref)
    all_points, started = [], time.perf_counter()
    print(f"{'cluster':11s} {'GPUs':>5s} {'nodes':>5s} {'size':>10s} {'measured':>10s} {'predicted':>10s} "
          f"{'error':>7s}  {'choice':14s} flag")
    for name, (hardware, train, test) in CLUSTERS.items():
        cal = nccl_fit.fit([import_file("nccl-tests", ref / f) for f in train], source=name, **hardware)
        n = cal.network
        channels = n.channels if n.channels is not None else f"{n.graph_channels(64, 2)} (hardware)"
        print(f"# {name}: fitted on {len(train)} logs (<= 2 nodes): channels {channels}, bus bw one node "
              f"{n.intra_bus_Bps / 1e9:.4g} GB/s, several {n.inter_bus_Bps / 1e9:.4g} GB/s, latencyInter "
              f"{n.latency_inter_s * 1e6:.3g} us, launch {n.launch_s * 1e6:.3g} us")
        points = nccl_fit.predict(n, [import_file("nccl-tests", ref / f) for f in test])
        for p in points:
            print(f"{name:11s} {p.ranks:5d} {p.nodes:5d} {units.format_bytes(p.bytes):>10s} "
                  f"{units.format_time(p.measured_s):>10s} {units.format_time(p.predicted_s):>10s} "
                  f"{p.rel_error:+7.1%}  {p.algorithm + '/' + p.protocol:14s} "
                  f"{'non-monotone' if p.flag == 'non-monotone' else ''}")
        e = np.array([abs(p.rel_error) for p in points])
        print(f"# {name}: {len(e)} held-out points, median {np.median(e):.1%}, worst {e.max():.1%}")
        all_points += points
    e = np.array([abs(p.rel_error) for p in all_points])
    clean = np.array([abs(p.rel_error) for p in all_points if p.flag != "non-monotone"])
    print(f"# all: {len(e)} points; without the {len(e) - len(clean)} non-monotone ones: median "
          f"{np.median(clean):.1%}, worst {clean.max():.1%}; {time.perf_counter() - started:.1f} s")
    print(f"median={100 * np.median(e):.1f} worst={100 * e.max():.1f}")


if __name__ == "__main__":
    main()
