"""Scale bench (issue 14): one iteration with every rank explicit, per configuration and rank count.

Each run is a fresh process (start-up included): `python bench/scale.py --child '<json>'` builds the shipped
default experiment with the configuration's trace, compute mode, training algorithm (allreduce with a merge
policy, or a sharded one: fsdp, hsdp, zero1-3 with their defaults) and collective at the rank count, simulates it
with symmetric=False (no rank stands for another) and prints one JSON line. The parent measures the
child's wall seconds and peak RSS (its own ru_maxrss, from os.wait4) and prints a table; its last line is

    seconds_8192=<worst> seconds_131072=<worst> rss_131072_MiB=<worst>

and the line before it times the 1000-configuration sweep of the default experiment (8-1024 ranks x 5 merges x 5
collectives x 5 thresholds, `simfog sweep --jobs 2`): `sweep_1000_seconds=<s>` (skip it with --no-sweep).

Usage: python bench/scale.py [--quick] [--ranks 8,8192,131072] [--iterations 1] [--no-sweep]
                             [--algorithms allreduce,fsdp,hsdp,zero1,zero2,zero3] [--events]

Rows whose collective says `@fat3` run on a three-tier fat tree at 2:1 per tier with the job scattered (FAT_TREE);
their worst times print as `fabric: seconds_8192=<worst> seconds_131072=<worst> rss_131072_MiB=<worst>` (targets
< 5 s and < 60 s).

--events adds the configurations that only the event engine runs (EVENT_PATH: what they decide while running is
said there), ResNet-50 with samples and GPT-2 with mean, each child stopped after --timeout seconds. Rows that took
the event engine print their own line, `events: seconds_8192=<worst> seconds_131072=<worst> rss_131072_MiB=<worst>`,
before the last one, which is the worst of the rows the analytic paths ran (the path column says which).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The default experiment's cluster when these rows were first measured (it now names a shipped cluster): 8-GPU nodes
# on 25 Gbit/s links, as tests/test_event_scale.py pins them.
CLUSTER = {"nodes": 4, "gpus_per_node": 8, "intra_bandwidth": "150GB/s", "intra_latency": "2us",
           "nic_bandwidth": "25Gbit/s", "nic_latency": "10us", "gpu_memory": "80GB"}
TRACES = {"resnet50": "resnet50-cpu-b32.json.gz", "gpt2": "gpt2-cpu-b8.json.gz"}
MERGES = ["wfbp", "ddp", "mgwfbp", "optimal", "threshold", "single", "bagua"]
COLLECTIVES = ["ring", "nccl", "hierarchical", "tree", "rhd", "gloo_ring", "ps", "ompi"]  # linear needs alpha, beta
SHARDED = ["fsdp", "hsdp", "zero1", "zero2", "zero3"]
# the compressed allreduces, the decentralized algorithms and win_put's one-sided puts (the dataflow family's closed
# form), with their defaults
OTHERS = ["bytegrad", "fp16", "powersgd", "qadam", "neighbor", "hierarchical_neighbor", "decentralized",
          "low_precision_decentralized", "win_put"]
RANKS = [8, 1024, 8192, 131072]
# Configurations the event engine runs, and why no fixed schedule (max-plus) can stand for them:
EVENT_PATH = [
    # Horovod's coordinator fuses, every cycle, the tensors that happen to be ready then: the buckets follow the
    # run's own timing
    dict(algorithm="allreduce", merge="horovod", collective="ring"),
    # wait-avoiding group collectives start when their FIRST member arrives: who waits is decided by the run
    dict(algorithm="wagma", merge="-", collective="ring"),
    # asynchronous: no rank waits for another, a background loop runs on its own clock and averages whatever the
    # ranks have reached then
    dict(algorithm="async", merge="-", collective="ring"),
]


# Several communication streams sharing each link (a collective's rate depends on which others run beside it): every
# collective is global, so the allreduce family's closed form on streams loops over the collectives (it was an
# EVENT_PATH row).
STREAMS = [dict(algorithm="allreduce", merge="ddp", collective="ring", streams=2)]

# A three-tier fat tree (issue 28): 16 nodes per leaf, 16 leaves per pod, 2:1 at the leaves and at the spines, as many
# pods as the ranks need, the job scattered over twice its nodes (simfog.fabric: each collective's step pattern
# routed and its slowest flow taken per step shape, in closed form).
FAT_TREE = {"kind": "fat_tree", "tiers": 3, "nodes_per_leaf": 16, "leaves_per_pod": 16, "leaf_oversubscription": 2.0,
            "spine_oversubscription": 2.0, "placement": "scattered"}
FABRIC = [dict(algorithm="allreduce", merge="ddp", collective=c, fabric="fat_tree3") for c in ("ring", "tree")] + \
    [dict(algorithm="fsdp", merge="-", collective="ring", fabric="fat_tree3")]


def configs(quick: bool) -> list[dict]:
    """Every trace × compute mode × (allreduce: each merge over ring, ddp over each collective, and STREAMS; each
    sharded algorithm and each of OTHERS over ring); --quick: resnet50 with samples and gpt2 with mean, merges over
    ring, ddp over nccl and hierarchical, STREAMS, fsdp, zero2, zero3 and neighbor."""
    out = []
    for trace, compute in itertools.product(TRACES, ["mean", "samples"]):
        if quick and (trace, compute) not in (("resnet50", "samples"), ("gpt2", "mean")):
            continue
        pairs = [(m, "ring") for m in MERGES] + [("ddp", c) for c in COLLECTIVES if c != "ring"]
        sharded = SHARDED + OTHERS
        if quick:
            pairs = [(m, "ring") for m in ("wfbp", "ddp", "mgwfbp", "optimal")] + [("ddp", "nccl"),
                                                                                     ("mgwfbp", "hierarchical")]
            sharded = ["fsdp", "zero2", "zero3", "neighbor"]
        out += [dict(trace=trace, compute=compute, algorithm="allreduce", merge=m, collective=c) for m, c in pairs]
        out += [dict(trace=trace, compute=compute, **c) for c in STREAMS + FABRIC]
        out += [dict(trace=trace, compute=compute, algorithm=a, merge="-", collective="ring") for a in sharded]
    return out


def child(spec: dict) -> None:
    from dataclasses import replace

    from simfog import experiment
    from simfog.cli import DEFAULT_EXPERIMENT
    from simfog.simulation import simulate
    from simfog.trace import load_model_trace

    doc = tomllib.loads(DEFAULT_EXPERIMENT.read_text())  # its workload, on the cluster these rows were first run on
    exp = experiment.from_dict({**doc, "cluster": CLUSTER}, base_dir=DEFAULT_EXPERIMENT.parent)
    path = REPO / "traces" / TRACES[spec["trace"]]
    exp = replace(exp, iterations=spec["iterations"],
                  workload=replace(exp.workload, trace=load_model_trace(path), trace_path=str(path),
                                   compute=spec["compute"]))
    algorithm = spec.get("algorithm", "allreduce")
    merge = {"merge": spec["merge"], "threshold_bytes": 25 * 2**20} if algorithm == "allreduce" else {}
    if algorithm == "allreduce" and "streams" in spec:
        merge["streams"] = spec["streams"]
    exp = exp.with_ranks(spec["ranks"]).with_comm(algorithm=algorithm, collective=spec["collective"], **merge)
    if spec.get("fabric") == "fat_tree3":
        from simfog.fabric import attach

        nodes = exp.cluster.nodes
        pods = -(-2 * nodes // 256)  # room for twice the job's nodes: a scattered placement has somewhere to go
        exp = replace(exp, cluster=attach(exp.cluster, {**FAT_TREE, "pods": pods}))
    s = simulate(exp, symmetric=False).summary()
    print(json.dumps({k: s[k] for k in ("path", "iteration_time_s", "buckets", "ranks", "symmetric_fast_path")}))


def run_one(spec: dict, timeout_s: float | None = None) -> dict:
    """Run one child; its wall seconds and its own peak RSS (os.wait4 gives the child's rusage). A child still
    running after `timeout_s` is killed: rc "timeout"."""
    import signal
    import tempfile
    import threading

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], stdout=out, stderr=err,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        timer = threading.Timer(timeout_s, lambda: os.kill(proc.pid, signal.SIGKILL)) if timeout_s else None
        if timer:
            timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if timer:
            timer.cancel()
            if wall >= timeout_s:
                return {"wall_s": wall, "rss_MiB": usage.ru_maxrss / 1024, "rc": "timeout",
                        "error": f"stopped after {timeout_s:.0f} s"}
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    result = {"wall_s": wall, "rss_MiB": usage.ru_maxrss / 1024, "rc": rc}  # ru_maxrss: KiB on Linux
    if rc == 0:
        result.update(json.loads(stdout.strip().splitlines()[-1]))
    else:
        result["error"] = (stderr.strip().splitlines() or ["?"])[-1]
    return result


SWEEP_RANKS = "8,16,32,64,128,256,512,1024"
SWEEP_MERGES = "wfbp,ddp,mgwfbp,threshold,optimal"
SWEEP_COLLECTIVES = "ring,tree,rhd,hierarchical,nccl"
SWEEP_THRESHOLDS = "1MiB,4MiB,16MiB,25MiB,64MiB"


def sweep_1000(jobs: int = 2) -> tuple[float, int, int]:
    """The 1000-configuration sweep of the shipped default experiment (8 rank counts x 5 merges x 5 collectives x 5
    thresholds) through `simfog sweep --jobs 2`, a fresh process: (wall seconds, rows, rows with an error)."""
    import csv
    import tempfile

    with tempfile.TemporaryDirectory(prefix="simfog-scale-sweep-") as tmp:
        out = Path(tmp) / "sweep.csv"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "simfog", "sweep", "--ranks", SWEEP_RANKS, "--merge", SWEEP_MERGES,
                        "--collective", SWEEP_COLLECTIVES, "--threshold", SWEEP_THRESHOLDS, "--jobs", str(jobs),
                        "-o", str(out), "--no-progress"], check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
        wall = time.perf_counter() - start
        with open(out, newline="") as f:
            rows = list(csv.DictReader(f))
    return wall, len(rows), sum(1 for r in rows if r["error"])


def _worst(table: dict, ranks: int, r: dict) -> None:
    if ranks == 8192:
        table["seconds_8192"] = max(table["seconds_8192"], r["wall_s"])
    if ranks == 131072:
        table["seconds_131072"] = max(table["seconds_131072"], r["wall_s"])
        table["rss_131072_MiB"] = max(table["rss_131072_MiB"], r["rss_MiB"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="fewer configurations")
    p.add_argument("--ranks", default=",".join(map(str, RANKS)), help="rank counts, comma-separated")
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--no-sweep", action="store_true", help="skip the 1000-configuration sweep")
    p.add_argument("--algorithms", default=",".join(["allreduce"] + SHARDED + OTHERS),
                   help="training algorithms to run, comma-separated (allreduce: the merge and collective rows)")
    p.add_argument("--events", action="store_true", help="also the event-engine configurations (EVENT_PATH)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before an --events child is stopped")
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    ranks = [int(r) for r in args.ranks.split(",")]
    worst = {"seconds_8192": 0.0, "seconds_131072": 0.0, "rss_131072_MiB": 0.0}
    algorithms = set(args.algorithms.split(","))
    print(f"{'trace':9} {'compute':7} {'algorithm':9} {'merge':9} {'collective':12} {'ranks':>7} {'wall_s':>7} "
          f"{'rss_MiB':>8} {'path':8} iteration_s", flush=True)
    failed = 0
    specs = [(c, None) for c in configs(args.quick) if c["algorithm"] in algorithms]
    if args.events:
        specs += [({**c, "trace": t, "compute": m}, args.timeout)
                  for t, m in (("resnet50", "samples"), ("gpt2", "mean")) for c in EVENT_PATH]
    events, fabric = dict.fromkeys(worst, 0.0), dict.fromkeys(worst, 0.0)
    for spec, timeout_s in specs:
        for n in ranks:
            r = run_one({**spec, "ranks": n, "iterations": args.iterations}, timeout_s)
            what = r.get("path", "FAILED") if r["rc"] == 0 else ("TIMEOUT" if r["rc"] == "timeout" else "FAILED")
            tail = f"{r['iteration_time_s']:.6f}" if r["rc"] == 0 else r["error"]
            label = spec["algorithm"] if "streams" not in spec else f"streams={spec['streams']}"
            collective = spec["collective"] + ("@fat3" if "fabric" in spec else "")
            print(f"{spec['trace']:9} {spec['compute']:7} {label[:9]:9} {spec['merge']:9} "
                  f"{collective:12} {n:>7} "
                  f"{r['wall_s']:7.2f} {r['rss_MiB']:8.0f} {what:8} {tail}", flush=True)
            failed += r["rc"] not in (0, "timeout")
            into = events if r.get("path") == "events" or (r["rc"] != 0 and timeout_s) else worst
            for table in (into, fabric) if "fabric" in spec else (into,):
                _worst(table, n, r)
    if failed:
        print(f"{failed} run(s) failed")
    if any("fabric" in spec for spec, _ in specs):
        print("fabric: " + " ".join(f"{k}={v:.2f}" if "seconds" in k else f"{k}={v:.0f}" for k, v in fabric.items()))
    if args.events:
        print("events: " + " ".join(f"{k}={v:.2f}" if "seconds" in k else f"{k}={v:.0f}" for k, v in events.items()))
    if not args.no_sweep:
        wall, rows, errors = sweep_1000()
        print(f"sweep of the default experiment, {rows} configurations ({errors} with an error row), 2 workers: "
              f"sweep_1000_seconds={wall:.2f}")
    print(" ".join(f"{k}={v:.2f}" if "seconds" in k else f"{k}={v:.0f}" for k, v in worst.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
