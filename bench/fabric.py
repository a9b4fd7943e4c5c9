"""Fabric bench (issue 28): the hand-worked cases, the speed of per-step bottlenecks at scale, and the fabric rows of
the last validate bench.

1. Every hand-worked case of tests/test_fabric_cases.py, each row's expected and computed value; a case is exact
   when every row is equal (==).
2. A three-tier fat tree (4 nodes of 8 NICs at 400 Gbit/s per leaf, 16 uplinks per leaf at 2:1, pods of 16 leaves
   and 16 spines, 16 uplinks per spine at 1:1) sized to 8,192 and 131,072 ranks (8 per node): one job on all of
   it (contiguous), and two jobs of half the nodes each (scattered by seeds 1 and 2, the second on the rest) whose
   concurrent steps share the links. Timed per row: placing the job(s), building the step's flows, routing them
   and their bottleneck (the closed form alone, the max-min filling for two jobs), wall seconds in this process
   (building the fabric included; its link table is cached across rows of one fabric).
3. Two training jobs on that fat tree at 8,192 ranks (simfog.jobs' timeline model, its band over start phases
   included; the jobs file is written to a temporary folder):
   BERT-base with DDP over NCCL's tree and GPT-2 with FSDP (traces measured on an H200), half the nodes each,
   scattered (seeds 1 and 2), one NIC of 3.2 Tbit/s per node (the 8 NICs' sum: the jobs file's cluster has no
   network file). Timed: loading the jobs, each alone and the fixed point together, wall seconds in this process.
4. The fabric rows (id starting "fabric-") of the validate bench CSV (`simfog validate --bench` writes
   bench-validation/bench-validation.csv by default; --csv picks another): their count and the median and worst
   |relative error| of the iteration time (validate.jobs: two jobs on 2 leaves at 2:1, placed contiguous and
   scattered, each alone and together), and each together row's measured and predicted slowdown, with the
   predicted range over start phases and whether the measured slowdown falls in it where the CSV has them;
   rows=0 and nan without any.

Last line: cases=<n> exact=<n> rows=<n> median=<pct> worst=<pct> seconds_8192=<worst 8,192-rank row of 2 and 3, s>

Usage: python bench/fabric.py [--csv PATH] [--ranks 8192,131072]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simfog.fabric import Placement, from_table, pattern, shared_step_costs, step_cost  # noqa: E402
from tests.test_fabric_cases import CASES  # noqa: E402

GPUS, NICS, NIC_BPS = 8, 8, 5e10  # per node; 400 Gbit/s NICs
FAT_TREE = {"kind": "fat_tree", "tiers": 3, "nodes_per_leaf": 4, "leaves_per_pod": 16, "leaf_uplinks": 16,
            "leaf_oversubscription": 2.0, "spine_uplinks": 16, "spine_uplink_bandwidth": "400Gbit/s"}
BUFFER_B = 1e9  # per rank
DEFAULT_CSV = Path("bench-validation") / "bench-validation.csv"


def run_cases() -> tuple[int, int]:
    exact = 0
    for case in CASES:
        rows = case()
        ok = all(computed == expected for _, expected, computed in rows)
        exact += ok
        print(f"{case.__name__.removeprefix('case_')}: {'exact' if ok else 'NOT EXACT'}")
        for what, expected, computed in rows:
            print(f"    {what:44s} expected {float(expected)!r:>24}  computed {float(computed)!r:>24}"
                  f"{'' if computed == expected else '  <-- differs'}")
    return len(CASES), exact


def timed_rows(ranks: int) -> list[dict]:
    nodes = ranks // GPUS
    rows = []
    for ecmp in ("split", "hash"):
        table = {**FAT_TREE, "ecmp": ecmp}
        for algorithm in ("ring", "tree", "hierarchical"):
            t0 = time.perf_counter()
            fabric = from_table(table, nodes=nodes, nic_Bps=NIC_BPS, nics_per_node=NICS)
            job = Placement.contiguous(nodes, fabric.nodes)
            cost = step_cost(fabric, pattern(algorithm, job.nodes, BUFFER_B, ranks_per_node=GPUS, nics=NICS))
            rows.append(dict(ranks=ranks, jobs=1, algorithm=algorithm, ecmp=ecmp, seconds=time.perf_counter() - t0,
                             costs=[cost]))
        for pair in (("ring", "ring"), ("ring", "tree")):
            t0 = time.perf_counter()
            fabric = from_table(table, nodes=nodes, nic_Bps=NIC_BPS, nics_per_node=NICS)
            a = Placement.scattered(nodes // 2, fabric.nodes, seed=1)
            b = Placement.scattered(nodes - nodes // 2, fabric.nodes, seed=2, taken=a.nodes)
            steps = [pattern(alg, p.nodes, BUFFER_B, ranks_per_node=GPUS, nics=NICS) for alg, p in zip(pair, (a, b))]
            costs = shared_step_costs(fabric, steps)
            rows.append(dict(ranks=ranks, jobs=2, algorithm="+".join(pair), ecmp=ecmp,
                             seconds=time.perf_counter() - t0, costs=costs))
    return rows


JOBS = """
seed = 1
iterations = 2
[cluster]
nodes = {nodes}
gpus_per_node = 8
intra_bandwidth = "450GB/s"
nic_bandwidth = "3200Gbit/s"
nic_latency = "5us"
[fabric]
{fabric}
[[job]]
name = "bert-ddp"
workload = {{ trace = "{traces}/bert-base-h200-b8.json.gz", compute = "mean" }}
ranks = {half}
placement = "scattered"
placement_seed = 1
collective = "tree"
merge = "ddp"
[[job]]
name = "gpt2-fsdp"
workload = {{ trace = "{traces}/gpt2-h200-b8.json.gz", compute = "mean" }}
ranks = {half}
placement = "scattered"
placement_seed = 2
algorithm = "fsdp"
collective = "ring"
"""


def two_jobs(ranks: int):
    """(seconds, simfog.jobs.JobsResult) of two jobs of ranks/2 each on FAT_TREE (module docstring, part 3)."""
    import tempfile

    from simfog import jobs

    fabric = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in FAT_TREE.items())
    with tempfile.TemporaryDirectory(prefix="simfog-bench-fabric-") as tmp:
        path = Path(tmp) / "jobs.toml"
        path.write_text(JOBS.format(nodes=ranks // GPUS, half=ranks // 2, fabric=fabric, traces=REPO / "traces"))
        t0 = time.perf_counter()
        result = jobs.run(jobs.load(path), model="timeline")
        return time.perf_counter() - t0, result


def fabric_rows(path: Path) -> tuple[int, float, float]:
    """(rows, median, worst |relative error|) of the fabric rows of a validate bench CSV; (0, nan, nan) without.
    Prints each together row's slowdowns."""
    if not path.is_file():
        return 0, math.nan, math.nan
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("id", "").startswith("fabric-") and not r.get("error")]
    inside = banded = 0
    for r in rows:
        if r.get("slowdown_rel_error"):
            band = ""
            if r.get("predicted_slowdown_lo"):  # the timeline model's range over start phases (simfog.jobs)
                lo, hi, m = float(r["predicted_slowdown_lo"]), float(r["predicted_slowdown_hi"]), \
                    float(r["measured_slowdown"])
                banded, inside = banded + 1, inside + (lo <= m <= hi)
                band = f" over phases {lo:.3f}-{hi:.3f}{'' if lo <= m <= hi else ' (outside)'}, start offset " \
                       f"{float(r['start_offset_s']) * 1e3:.2f} ms"
            print(f"    {r['id']:28} slowdown measured {float(r['measured_slowdown']):.3f} predicted "
                  f"{float(r['predicted_slowdown']):.3f} ({float(r['slowdown_rel_error']):+.1%}); iteration "
                  f"{float(r['rel_error']):+.1%}{band}")
    if banded:
        print(f"    measured slowdowns inside the predicted band over start phases: {inside} of {banded}")
    errors = [abs(float(r["rel_error"])) for r in rows if r.get("rel_error")]
    errors = [e for e in errors if math.isfinite(e)]
    if not errors:
        return 0, math.nan, math.nan
    return len(errors), statistics.median(errors), max(errors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV, help=f"validate bench CSV (default {DEFAULT_CSV})")
    ap.add_argument("--ranks", default="8192,131072", help="rank counts to time (multiples of 8)")
    args = ap.parse_args(argv)
    cases, exact = run_cases()
    print(f"\n{'ranks':>7} {'jobs':>4} {'algorithm':>13} {'ecmp':>5} {'slowest Gbit/s':>16} {'step us':>18} "
          f"{'seconds':>8}")
    worst_8192 = math.nan
    for ranks in (int(r) for r in args.ranks.split(",")):
        for row in timed_rows(ranks):
            rates = "/".join(f"{c.slowest_Bps * 8 / 1e9:.1f}" for c in row["costs"])
            steps = "/".join(f"{c.step_s * 1e6:.3g}" for c in row["costs"])
            print(f"{row['ranks']:>7} {row['jobs']:>4} {row['algorithm']:>13} {row['ecmp']:>5} {rates:>16} "
                  f"{steps:>18} {row['seconds']:8.3f}")
            if ranks == 8192:
                worst_8192 = row["seconds"] if math.isnan(worst_8192) else max(worst_8192, row["seconds"])
    if 8192 in {int(r) for r in args.ranks.split(",")}:
        seconds, result = two_jobs(8192)
        print(f"\ntwo jobs on 8,192 ranks ({result.rounds} rounds, "
              f"{'converged' if result.converged else 'NOT converged'}): {seconds:.3f} s")
        for j in result.jobs:
            print(f"    {j.name:13} {j.ranks:>5} ranks  alone {j.alone_s * 1e3:9.3f} ms  together "
                  f"{j.together_s * 1e3:9.3f} ms  slowdown {j.slowdown:.4f} (over start phases "
                  f"{j.slowdown_lo:.4f}-{j.slowdown_hi:.4f})  duty {j.duty_alone:.3f} -> {j.duty_together:.3f}")
        worst_8192 = seconds if math.isnan(worst_8192) else max(worst_8192, seconds)
    rows, median, worst = fabric_rows(args.csv)
    pct = lambda x: "nan" if math.isnan(x) else f"{x:.1%}"
    print(f"\nvalidate bench fabric rows from {args.csv}: {rows}")
    print(f"cases={cases} exact={exact} rows={rows} median={pct(median)} worst={pct(worst)} "
          f"seconds_8192={worst_8192:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
