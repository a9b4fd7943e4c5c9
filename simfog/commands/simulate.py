"""`simfog simulate FILE.toml`: iteration time, throughput and scaling efficiency of one experiment."""

from __future__ import annotations

import math
from pathlib import Path

from simfog import units
from simfog.bands import DEFAULT_LEVEL, check_level
from simfog.errors import Caveat
from simfog.nccl.clusters import CLUSTERS_DIR
from simfog.nccl.prior import prior


def add_arguments(parser) -> None:
    parser.add_argument("file", nargs="?", help="experiment TOML (default: the embedded ResNet-50 example)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--level", type=float, default=DEFAULT_LEVEL,
                        help="level of the prediction intervals (default 0.9: 90 %%; simfog.run_bands)")
    parser.add_argument("--explain", action="store_true", help="list each part of the interval's width: its share, "
                        "its effect on the iteration time and where it comes from")
    add_overrides(parser)
    parser.add_argument("--intervals", metavar="CSV", help="write every per-rank interval to this CSV")
    parser.add_argument("--timeline", metavar="OUT.json",
                        help="write the run as a Chrome trace for ui.perfetto.dev (at most 64 ranks: the first "
                             "and last 32)")
    parser.add_argument("--timeline-ranks", metavar="LIST", help='ranks in the timeline, e.g. "0-7,120-127"')
    parser.add_argument("--force", action="store_true", help="overwrite an existing --intervals or --timeline file")


def add_overrides(parser) -> None:
    """Options that override the experiment file (shared with tune)."""
    parser.add_argument("--ranks", type=int, help="override the rank count (whole nodes of gpus_per_node)")
    parser.add_argument("--nodes", type=int, help="override [cluster] nodes (not with --ranks)")
    add_cluster_overrides(parser)
    parser.add_argument("--merge", help="override comm.merge")
    parser.add_argument("--collective", help="override comm.collective")
    parser.add_argument("--threshold", help='override comm.threshold, e.g. "25MiB"')
    parser.add_argument("--iterations", type=int, help="override the iteration count")
    parser.add_argument("--seed", type=int, help="override the seed")


def add_cluster_overrides(parser, *, each: str = "") -> None:
    """--gpus-per-node, --nic-bandwidth, --network: the cluster as the file's [cluster] keys would set it (shared
    with sweep, curve, tune and plan, whose `each` says they set every catalogue option's)."""
    parser.add_argument("--gpus-per-node", type=int, help=f"override {each or '[cluster] '}gpus_per_node")
    parser.add_argument("--nic-bandwidth", help=f'override {each or "[cluster] "}nic_bandwidth, e.g. "100Gbit/s" '
                        "(a network file, when there is one, sets the links instead: a warning says so)")
    parser.add_argument("--network", metavar="FILE", help=f"override {each or '[cluster] '}network: a network file "
                        "(simfog calibrate LOGS -o FILE), relative to here; its links replace those written")


def cluster_overrides(args) -> dict:
    """The cluster overrides given, as simfog.overrides.load_with_overrides takes them."""
    from simfog.overrides import CLUSTER_KEYS

    return {k: getattr(args, k, None) for k in CLUSTER_KEYS}


def load_with_overrides(args, **given):
    """The experiment named by args.file (or the embedded default) with the command line's overrides applied
    (simfog.overrides, which the Python API shares); `given` in place of args' (sweep's --nodes is a list)."""
    from simfog.overrides import load_with_overrides as load

    options = {"ranks": args.ranks, "merge": args.merge, "collective": args.collective, "threshold": args.threshold,
               "iterations": args.iterations, "seed": args.seed, **cluster_overrides(args)}
    return load(args.file, **{**options, **given})


def _what(s: dict) -> str:
    """What communicates: the collective and merge policy for allreduce-style algorithms, else the topology."""
    if s.get("topology"):
        return f"{s['algorithm']} over {s['topology']}"
    return f"{s['algorithm']} / {s['collective']} / merge {s['merge']} ({s['buckets']} buckets)"


def format_summary(s: dict) -> str:
    est = "  (ESTIMATED inputs: see the trace's provenance)" if s["estimated"] else ""
    lines = [
        f"{s['model']} x {s['ranks']} ranks ({s['nodes']} nodes x {s['gpus_per_node']}), batch {s['batch_size']}/rank, "
        f"{_what(s)}{est}",
        f"  iteration time     {_with_interval(s, 'iteration_time', '_s', units.format_time)}"
        f"  (worst {units.format_time(s['iteration_time_max_s'])})",
        f"  throughput         {_with_interval(s, 'samples_per_s', '', lambda x: f'{x:.1f} samples/s')}",
        f"  scaling efficiency {_with_interval(s, 'scaling_efficiency', '', lambda x: f'{100 * x:.1f} %')}",
        f"  compute            {units.format_time(s['compute_s'])} per rank, from {s['compute_source']}",
        f"  communication      {units.format_time(s['comm_s'])}, exposed {units.format_time(s['comm_exposed_s'])}"
        f" (overlap {100 * s['overlap_fraction']:.1f} %), idle {units.format_time(s['idle_s'])}",
    ]
    if s.get("warnings"):  # what the numbers rest on (simfog.caveats), as every row of sweep, curve, plan says it
        lines.append(f"  WARNINGS           {Caveat.line(Caveat(**w) for w in s['warnings'])}")
    shipped = s.get("network_file") and Path(s["network_file"]).parent == CLUSTERS_DIR
    links = (f"shipped cluster {Path(s['network_file']).stem} ({s['network_file']})" if shipped else
             f"network file {s['network_file']}" if s.get("network_file") else
             f"links calibrated from {s['network_trace']}" if s.get("network_trace") else
             f"links from the experiment: {prior(s['transport']).describe()}" if s.get("transport") else
             "links from the experiment")
    if "nic_spread" in s:  # per-call variation (simfog.variation)
        links += (f"; per-call spread {100 * s['nic_spread']:g} % between nodes, {100 * s['intra_spread']:g} % within "
                  f"({'drawn per call' if s['variation'] == 'draw' else 'each call its expected slowest rank'})")
    lines.append(f"  inputs             trace {s['trace']}; {links}")
    if "bucket_copy_Bps" in s:
        copy = (units.format_bandwidth(s["bucket_copy_Bps"]).replace("bit/s", "bit/s copies")
                if s["bucket_copy_Bps"] > 0 else "free copies")
        lines.append(f"  beyond the wire    {copy} ({s['bucket_copy_Bps_source']}); "
                     f"{units.format_time(s['collective_overhead_s'])} per collective "
                     f"({s['collective_overhead_s_source']}); overlap slowdown {s['overlap_slowdown']:g} "
                     f"({s['overlap_slowdown_source']})")
    if "memory_peak_B" in s:
        acts, grads = (units.format_bytes(s[k]) if s[k] is not None else "UNKNOWN (the trace records none)"
                       for k in ("memory_activations_B", "memory_activation_grads_B"))
        lines.append(f"  memory per rank    {units.format_bytes(s['memory_peak_B'])}"
                     f"{'' if s['memory_complete'] else ' + activations'}: parameters "
                     f"{units.format_bytes(s['memory_parameters_B'])}, gradients "
                     f"{units.format_bytes(s['memory_gradients_B'])}, optimizer "
                     f"{units.format_bytes(s['memory_optimizer_B'])}, buffers "
                     f"{units.format_bytes(s['memory_buffers_B'])}"
                     f", activations {acts}, activation gradients {grads}")
    if s.get("topology"):
        reach = s.get("iterations_to_consensus")
        reach = f"{reach} iterations" if reach is not None else "not within 10,000 iterations"
        lines.append(f"  mixing             {s['topology']}: spectral gap {s['spectral_gap']:.4g}, consensus error "
                     f"{s['consensus_eps']:g} after {reach}")
    return "\n".join(lines)


def _with_interval(s: dict, key: str, unit: str, fmt) -> str:
    """'142 ms (90 %: 131–158 ms)' from the summary's value and bounds; the value alone without an interval."""
    if "interval_level" not in s:
        return fmt(s[key + unit])
    lo, hi = fmt(s[f"{key}_lo{unit}"]), fmt(s[f"{key}_hi{unit}"])
    lo_num, _, lo_unit = lo.partition(" ")
    bounds = f"{lo_num}–{hi}" if lo_unit and lo_unit == hi.partition(" ")[2] else f"{lo}–{hi}"
    unmeasured = f", widened for {', '.join(s['interval_unmeasured'])}: UNMEASURED" if s["interval_unmeasured"] else ""
    return f"{fmt(s[key + unit])} ({100 * s['interval_level']:g} %: {bounds}{unmeasured})"


def format_explain(s: dict) -> str:
    """Each part of the interval: its share of the width, its effect on the iteration time, its source."""
    lines = [f"  interval parts ({100 * s['interval_level']:g} %; independent, root-sum-square in log space):"]
    for name, p in s["interval_parts"].items():
        lines.append(f"    {name:10s} {100 * p['share']:5.1f} % of the width: "
                     f"-{100 * -math.expm1(-p['below']):.1f} % / +{100 * math.expm1(p['above']):.1f} % on the "
                     f"iteration time; {p['source']}")
    return "\n".join(lines)


def run_jobs(args) -> int:
    """A jobs file ([[job]] tables, simfog.jobs): each job's iteration time alone and together, and its slowdown."""
    from dataclasses import asdict

    from simfog import jobs
    from simfog.cli import print_json
    from simfog.errors import ConfigError

    for option in ("ranks", "merge", "collective", "threshold", "iterations", "seed", "intervals", "timeline", "nodes",
                   "gpus_per_node", "nic_bandwidth", "network"):
        if getattr(args, option, None) is not None:
            raise ConfigError("--" + option.replace("_", "-"), getattr(args, option), f"left out for a jobs file "
                              f"({args.file}): set it per job in the file")
    result = jobs.run(jobs.load(args.file), model="timeline")  # the jobs in time, and the band over phases
    if args.json:
        print_json({"jobs": [{**asdict(r), "slowdown": r.slowdown} for r in result.jobs], "rounds": result.rounds,
                    "converged": result.converged, "model": result.model})
    else:
        print(jobs.format_result(result))
    return 0


def run(args) -> int:
    from simfog import caveats
    from simfog.cli import print_json
    from simfog.files import atomic_open, refuse_existing
    from simfog.jobs import is_jobs_file
    from simfog.run_bands import attach, extrapolated
    from simfog.simulation import simulate

    if args.file and is_jobs_file(args.file):
        return run_jobs(args)

    level = check_level(args.level, "--level")  # before simulating: a bad level fails at once
    # before simulating: a bad name (simfog.files.check_output) or an existing file fails at once
    refuse_existing([args.intervals], force=args.force, option="--intervals")
    refuse_existing([args.timeline], force=args.force, option="--timeline")
    result = caveats.attach(simulate(load_with_overrides(args), progress=True))
    attach(result, level)
    summary = result.summary()
    notes = extrapolated(result.experiment, result.buckets)
    if notes is not None:
        summary["extrapolated"] = notes
    if args.intervals is not None:
        with atomic_open(args.intervals) as f:
            result.intervals().to_csv(f, index=False)
    if args.timeline is not None:
        import sys

        from simfog.timeline import parse_rank_list, write_chrome_trace

        ranks = parse_rank_list(args.timeline_ranks, field="--timeline-ranks") if args.timeline_ranks else None
        shown = write_chrome_trace(result, args.timeline, ranks)
        # stderr, so that --json output stays one JSON object
        print(f"wrote {args.timeline}" + (f": {shown['note']}" if "note" in shown else ""), file=sys.stderr)
    if args.json:
        print_json(summary)
    else:
        print(format_summary(summary))
        if args.explain:
            print(format_explain(summary))
    return 0
