"""`simfog validate --bench`: a fixed matrix of replayed runs on emulated clusters, ending with the error statistics.

Matrix (replay mode, 2 x 5 x 3 x 2 x 2 = 120 allreduce configurations, 2 x 2 x 2 x 2 x 2 = 32 decentralized and
2 x 3 x 2 x 2 = 24 fsdp):

- models: CIFAR ResNet-20 at batch 32 (61 layers, 59 gradient tensors, 1.08 MB; compute ~0.3 s per iteration on
  one core here) and the MLP 784-256-128-10 at batch 1024 (5 layers, 6 tensors, 0.94 MB; ~13 ms), traces measured
  on this machine by `simfog collect model` (taken from traces/ when shipped there, else collected once into the
  output directory, and the rows name the file). ResNet-20 overlaps a long backward with communication; the MLP
  barely overlaps, so it checks the collective model directly. (At batch 64 the MLP computes ~2 ms per
  iteration and host costs no input carries, ~0.3-0.5 ms of gradient copies and Python per iteration, dominate
  its error on one node: -11 to -37 %.)
- merge policies: wfbp, single, ddp (torch DDP itself), mgwfbp, optimal (simfog's exact contiguous plan);
- ranks: 2, 4, 8; NIC bandwidth: 200 Mbit/s and 1 Gbit/s per node and direction (tbf); layouts: 1 and 2 ranks per
  node (2 ranks on 2 per node is a single node: no NIC, unshaped loopback; both bandwidth rows of it are then the
  same configuration measured twice, which shows the run-to-run noise).
- decentralized algorithms (validate.ranks.decentralized), on 4 and 8 ranks of the same clusters, both models: one-peer
  exp2 neighbour averaging (BlueFog awc: isend/irecv of the whole model to i + 2^(k mod D), ½/½) and WAGMA with
  groups of 2 and a global average every 5 iterations (twice among the 10 measured ones). Their links are
  calibrated from a gloo sendrecv microbenchmark (point-to-point), measured in the same launch as the allreduce
  one. WAGMA is run as a BLOCKING group allreduce (gloo has no wait-avoiding collective): it waits for the
  group's members, where simfog's wagma (and real WAGMA) does not; under this homogeneous replay the members arrive
  together and the two coincide (see validate.ranks.decentralized). The validator costs what gloo runs: each group's
  allreduce as a ring among its members (comm.group_collective: for groups of 2, two steps of M/2, one latency more
  than WAGMA's recursive doubling) and the global step as gloo's ring over all ranks (comm.global_collective).
- fsdp (validate.ranks.fsdp: FSDP2 fully_shard per unit, prefetch 1), both models on 2, 4 and 8 ranks of one rank per
  node at 200 Mbit/s: units of one layer and of 300 kB (layers added until a unit holds 300 kB), each with and
  without reshard_after_forward. Collectives are costed on the allreduce fit; gloo's reduce-scatter is an
  allreduce of the whole buffer (simfog.collectives gloo_ring). Rows also compare the measured memory peak with
  simfog's (measured_memory_B, predicted_memory_B).

- long rows (validate.comparison.distributions): one MLP configuration per family (wfbp, neighbour averaging,
  WAGMA, fsdp 300 kB units with reshard) on 4 ranks of one per node at 200 Mbit/s, 120 measured iterations each
  ("...-long"): the rows on which the per-iteration distributions are judged (KS distance against the floor of
  two samples of one distribution, rows differing at 5 %, p99).

- fabric (validate.jobs): two MLP wfbp jobs of 2 nodes each, 200 Mbit/s, on 2 leaves of 2 nodes whose uplinks are
  2:1 oversubscribed (one NIC's rate), each job alone and both together: placed contiguous (each job on a leaf
  of its own: nothing crosses an uplink) and scattered (seeded: each job on both leaves, so both rings share both
  uplinks), 8 rows ("fabric-..."; `--quick`: the scattered 4), with the measured and predicted slowdowns; python
  bench/fabric.py summarises them.

At 200 Mbit/s a 1 MB allreduce takes ~45 ms on 2 ranks and ~80 ms on 8, comparable to ResNet-20's backward; at
1 Gbit/s it is ~5x shorter. One group (ranks, layout, bandwidth) is one emulated cluster, one calibration (NIC and
intra measurements are reused across groups with the same process count and rate), one launch of the host probes
of its families (validate.host_calibration: what a collective costs the host inside a training step beyond the
same collective bare, per collective and per byte, measured there before the rows) and one launch running all its
configurations, 3 warm-up and 10 (ResNet-20) or 30 (MLP) measured iterations each; errors compare steady-state
iteration times (after the first measured iteration, see validate.comparison.compare.steady_iteration_s).

Targets for the absolute relative error of the iteration time: median <= 5 % and worst <= 15 %, then 3 % and 8 %.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from simfog import units
from simfog.cluster import Cluster, Link
from simfog.experiment import Comm, Experiment, Workload
from simfog.trace import load_model_trace
from validate.cluster.fingerprint import fingerprint
from validate.comparison import compare, distributions
from validate.comparison.compare import algorithm_of
from validate.run import Options, run_group

MODELS = (("resnet20", 32), ("mlp", 1024))
POLICIES = ("wfbp", "single", "ddp", "mgwfbp", "optimal")
RANKS = (2, 4, 8)
NIC_BANDWIDTHS = ("200Mbit/s", "1Gbit/s")
RANKS_PER_NODE = (1, 2)
# Decentralized rows: (label, comm) on these rank counts (WAGMA needs a power of two).
DECENTRALIZED = (("neighbor", Comm(algorithm="neighbor", topology="one_peer_exp2", combine="awc")),
                 ("wagma", Comm(algorithm="wagma", group_size=2, global_every=5)))
DECENTRALIZED_RANKS = (4, 8)
# fsdp rows: (label, comm), on every rank count, one rank per node, the first bandwidth.
FSDP = tuple((f"fsdp-{unit_label}-{'reshard' if reshard else 'keep'}",
              Comm(algorithm="fsdp", fsdp_unit=unit, reshard_after_forward=reshard, prefetch=1))
             for unit, unit_label in (("layer", "layer"), (300e3, "300kB")) for reshard in (True, False))
# Measured iterations per model: at least ~0.5 s of steady state per row, so that one stall of the shared host
# (a few ms) moves the mean by little; the MLP's iterations last 15-130 ms (ResNet-20's 150-600 ms)
ITERATIONS = {"resnet20": 10, "mlp": 30}
# Long rows: one MLP configuration per family with LONG_ITERATIONS measured iterations, so that a KS test of their
# per-iteration times means something (validate.comparison.distributions), on the cluster every family runs on
LONG = (("wfbp", Comm(merge="wfbp")), *DECENTRALIZED, FSDP[2])  # FSDP[2]: 300 kB units, reshard
LONG_ITERATIONS, LONG_SHAPE = 120, (4, 1, NIC_BANDWIDTHS[0])
WARMUP, SEED = 3, 1
# fabric rows: placement label -> the [[job]] placement keys of jobs a and b (2 nodes each of 4 on 2 leaves)
FABRIC_PLACEMENTS = {"contiguous": ({"placement": "contiguous"}, {"placement": "contiguous"}),
                     "scattered": ({"placement": "scattered", "placement_seed": 1},  # nodes 1 2, then 0 3
                                   {"placement": "scattered", "placement_seed": 0})}
FABRIC = {"kind": "fat_tree", "nodes_per_leaf": 2, "leaves": 2, "leaf_oversubscription": 2}
TARGETS = ((0.05, 0.15), (0.03, 0.08))  # (median, worst) |relative error|, first and second goal
REPO = Path(__file__).resolve().parents[1]
UNUSED_INTRA = Link(0.0, 1e9)  # replaced by the calibration wherever two ranks share a node


def trace_path(model: str, batch: int, out_dir: Path, log: Callable[[str], None] = print) -> Path:
    """traces/<model>-cpu-b<batch>.json(.gz) when shipped, else out_dir/traces/..., collected here if missing
    (`simfog collect model <model> --batch-size <batch> --threads 1`)."""
    name = f"{model}-cpu-b{batch}"
    for d in (REPO / "traces", out_dir / "traces"):
        for ext in (".json.gz", ".json"):
            if (d / f"{name}{ext}").is_file():
                return d / f"{name}{ext}"
    from validate.collect.collect_model import collect_model

    path = out_dir / "traces" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"collecting {path} (no shipped trace {name})")
    collect_model(model, batch, iterations=10, warmup=3, threads=1,
                  command=f"simfog collect model {model} --batch-size {batch} --iterations 10 --warmup 3 "
                          f"--threads 1 -o {path}").save(path)
    return path


def groups(traces: dict[str, Path], *, quick: bool = False) -> list[tuple[tuple, list[tuple[str, Experiment]]]]:
    """The matrix as groups sharing one cluster shape: [((ranks, ranks_per_node, nic_Bps), [(id, Experiment)])].
    `quick`: 2 and 4 ranks, 200 Mbit/s, wfbp and ddp only (a smoke test of the whole path; with the
    decentralized rows of 4 ranks)."""
    loaded = {m: load_model_trace(p) for m, p in traces.items()}
    ranks = RANKS[:2] if quick else RANKS
    bws = NIC_BANDWIDTHS[:1] if quick else NIC_BANDWIDTHS
    policies = ("wfbp", "ddp") if quick else POLICIES
    out = []
    for n in ranks:
        for rpn in RANKS_PER_NODE:
            for bw_text in bws:
                bw = units.bandwidth(bw_text)
                cluster = Cluster(n // rpn, rpn, UNUSED_INTRA, Link(0.0, bw))
                exps = []
                for model, trace in loaded.items():
                    for policy in policies:
                        exp = Experiment(SEED, ITERATIONS[model], Workload(trace, str(traces[model]), "samples"),
                                         cluster, Comm(merge=policy))
                        exps.append((f"{model}-{policy}-{n}r-{n // rpn}x{rpn}-{bw_text.replace('/s', '')}", exp))
                    if rpn == 1 and bw_text == NIC_BANDWIDTHS[0] and not quick:
                        for label, comm in FSDP:
                            exp = Experiment(SEED, ITERATIONS[model], Workload(trace, str(traces[model]), "samples"),
                                             cluster, comm)
                            exps.append((f"{model}-{label}-{n}r-{n}x1-{bw_text.replace('/s', '')}", exp))
                    if n not in DECENTRALIZED_RANKS:
                        continue
                    for label, comm in DECENTRALIZED:
                        exp = Experiment(SEED, ITERATIONS[model], Workload(trace, str(traces[model]), "samples"),
                                         cluster, comm)
                        exps.append((f"{model}-{label}-{n}r-{n // rpn}x{rpn}-{bw_text.replace('/s', '')}", exp))
                if (n, rpn, bw_text) == LONG_SHAPE and not quick:
                    exps += long_rows(loaded["mlp"], str(traces["mlp"]), cluster)
                out.append(((n, rpn, bw), exps))
    return out


def long_rows(trace, trace_path: str, cluster: Cluster) -> list[tuple[str, Experiment]]:
    """The long rows (LONG) of the MLP on `cluster`: [(id, Experiment)], ids ending in "-long"."""
    tag = f"{cluster.ranks}r-{cluster.nodes}x{cluster.ranks_per_node}-{LONG_SHAPE[2].replace('/s', '')}"
    return [(f"mlp-{label}-{tag}-long", Experiment(SEED, LONG_ITERATIONS, Workload(trace, trace_path, "samples"),
                                                   cluster, comm)) for label, comm in LONG]


def fabric_jobs(trace: Path, *, quick: bool = False) -> list[tuple[str, list]]:
    """The fabric rows' jobs (module docstring): [(placement label, simfog.jobs.Job list)]."""
    from simfog import jobs

    out = []
    for label, placements in FABRIC_PLACEMENTS.items():
        if quick and label != "scattered":
            continue
        table = {"seed": SEED, "iterations": ITERATIONS["mlp"], "fabric": FABRIC,
                 "cluster": {"nodes": 4, "gpus_per_node": 1, "nic_bandwidth": NIC_BANDWIDTHS[0]},
                 "job": [{"name": f"fabric-{label}-{name}", "workload": {"trace": str(trace), "compute": "samples"},
                          "ranks": 2, "merge": "wfbp", **where} for name, where in zip("ab", placements)]}
        out.append((label, jobs.from_table(table)))
    return out


def run_bench(out_dir: str | os.PathLike, *, quick: bool = False, options: Options | None = None,
              log: Callable[[str], None] = print, csv_path: str | os.PathLike | None = None,
              runs: list | None = None) -> list[dict]:
    """Run the matrix; write the CSV (default out_dir/bench-validation.csv) after every group, so an interrupted
    bench keeps what it measured. Returns the rows; `runs`, when given, receives every group's GroupRun (for
    validate.comparison.report)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = Path(csv_path) if csv_path else out / "bench-validation.csv"
    options = options or Options(mode="replay", warmup=WARMUP)
    traces = {m: trace_path(m, b, out, log) for m, b in MODELS}
    cache: dict = {}
    rows: list[dict] = []
    started = time.monotonic()
    log(f"host: {fingerprint().describe()}")  # two runs on two machines can be told apart
    plan = groups(traces, quick=quick)
    for k, ((n, rpn, bw), exps) in enumerate(plan):
        log(f"[{k + 1}/{len(plan)}] {n} ranks, {rpn} per node, {units.format_bandwidth(bw)} "
            f"({time.monotonic() - started:.0f} s so far)")
        ids, experiments = zip(*exps, strict=True)
        run = run_group(list(experiments), options, ids=list(ids), cache=cache, log=log)
        rows += run.rows
        if runs is not None:
            runs.append(run)
        compare.write_csv(rows, csv_path)
    from validate.cluster.netemu import available
    from validate.jobs import format_slowdowns, validate_jobs

    tiers = (False, "--loopback") if options.emulate is False else available()
    for label, jobs_ in fabric_jobs(traces["mlp"], quick=quick) if tiers[0] else ():
        log(f"[fabric] two jobs placed {label} on 2 leaves at 2:1 ({time.monotonic() - started:.0f} s so far)")
        done = validate_jobs(jobs_, options, cache=cache, log=log)
        rows += done.rows
        if runs is not None:
            runs += done.alone
        log(format_slowdowns(done.rows))
        compare.write_csv(rows, csv_path)
    if not tiers[0]:
        log(f"[fabric] no fabric rows: switch tiers need the emulated network ({tiers[1]})")
    log(compare.format_table(rows))
    log(verdict(rows))
    log(f"bench: {len(rows)} configurations in {time.monotonic() - started:.0f} s on {fingerprint().describe()}; "
        f"CSV {csv_path}")
    return rows


def verdict(rows: list[dict]) -> str:
    """The error statistics of the rows the rig can emulate (not host-limited: validate.cluster.hostload) against both
    targets, one line each, then the host-limited rows' own statistics."""
    limited = [r for r in rows if compare.host_limited(r)]
    s = compare.error_stats([r for r in rows if not compare.host_limited(r)])
    if not s["configurations"]:
        return "no configuration ran" + (f" except {len(limited)} host-limited ones" if limited else "")
    med, worst = s["median_abs_rel_error"], s["worst_abs_rel_error"]
    lines = []
    for m, w in TARGETS:
        ok = med <= m and worst <= w
        lines.append(f"target median <= {m:.0%}, worst <= {w:.0%}: {'MET' if ok else 'NOT MET'} "
                     f"(median {med:.1%}, worst {worst:.1%} over {s['configurations']} rows the rig can emulate)")
    lines.append(f"mean signed error {s['mean_rel_error']:+.1%} over the rows the rig can emulate")
    u = compare.error_stats([r for r in rows if not compare.host_limited(r)], key="rel_error_without_probe")
    if u["configurations"]:  # the same measurements predicted without the in-step host fit (validate.host_calibration)
        lines.append(f"without the host probe, on the same measurements: median {u['median_abs_rel_error']:.1%}, "
                     f"worst {u['worst_abs_rel_error']:.1%}, mean signed {u['mean_rel_error']:+.1%} over "
                     f"{u['configurations']} of those rows")
    if limited:
        h = compare.error_stats(limited)
        lines.append(f"host-limited, reported apart: {len(limited)} rows, median {h['median_abs_rel_error']:.1%}, "
                     f"worst {h['worst_abs_rel_error']:.1%} ({h['worst_id']})")
    for kind in sorted({algorithm_of(r).split(":")[0] for r in rows if not compare.host_limited(r)}):
        k = compare.error_stats([r for r in rows if not compare.host_limited(r)
                                 and algorithm_of(r).split(":")[0] == kind])
        if k["configurations"]:
            lines.append(f"{kind}: median {k['median_abs_rel_error']:.1%}, worst {k['worst_abs_rel_error']:.1%}, mean "
                         f"signed {k['mean_rel_error']:+.1%} over {k['configurations']} rows the rig can emulate")
    lines += distributions.lines([r for r in rows if not compare.host_limited(r)])
    return "\n".join(lines)


def repeat_summary(runs: list[list[dict]]) -> str:
    """For the matrix run several times (`--repeat`): per configuration its error in each run and the spread of its
    measured iteration time ((max - min) / mean over the runs), then each run's verdict. A configuration that
    failed in a run shows "-" there."""
    ids = list(dict.fromkeys(r["id"] for rows in runs for r in rows))
    by_run = [{r["id"]: r for r in rows} for rows in runs]
    head = f"{'configuration':44s} " + " ".join(f"{'run ' + str(k + 1):>8s}" for k in range(len(runs))) + \
        f" {'spread':>8s}  host-limited in"
    lines = [head, "-" * len(head)]
    for vid in ids:
        cells, measured, limited = [], [], []
        for k, rows in enumerate(by_run):
            r = rows.get(vid)
            ok = r is not None and not r.get("error") and compare._finite(r.get("rel_error"))
            cells.append(f"{r['rel_error']:+8.1%}" if ok else f"{'-':>8s}")
            if ok:
                measured.append(r["measured_iteration_s"])
                if compare.host_limited(r):
                    limited.append(str(k + 1))
        spread = (max(measured) - min(measured)) / (sum(measured) / len(measured)) if len(measured) > 1 else 0.0
        lines.append(f"{vid:44s} {' '.join(cells)} {spread:8.1%}  {','.join(limited)}")
    for k, rows in enumerate(runs):
        lines.append(f"run {k + 1}: " + verdict(rows).replace("\n", f"\nrun {k + 1}: "))
    return "\n".join(lines)
