"""`simfog collective OP --network FILE --nodes N --gpus-per-node G`: what nccl-tests would print for that layout
under the calibrated NCCL model, to hold against one's own log.

    simfog collective allreduce --network network.toml --nodes 4 --gpus-per-node 8
    simfog collective allreduce --network network.toml --nodes 16 --gpus-per-node 8 --sizes 1MiB,64MiB --json
    simfog collective allreduce --network network.toml --nodes 4 --gpus-per-node 8 --compare nccl_32.log

Sizes: a range `LOW:HIGH` doubling from LOW (nccl-tests' -f 2), or a comma list; default 8B:8GiB, or the log's
sizes with --compare. Columns as nccl-tests (time in µs, algbw and busbw in GB/s = 10⁹ B/s), float elements.
Every row that leaves what the network file was calibrated on (more GPUs or NICs per node than any log, 3+ nodes
from 2-node logs, sizes outside the logs', another release, a collective without logs) ends with `EXTRAPOLATED:`
and each way it does (simfog.nccl.calibrated). alltoall and sendrecv take NCCL's point-to-point path ("p2p").
Every row has its interval at --level (default 90 %), conformal on held-out points (simfog.nccl.bands): from
the network file's leave-a-scale-out where the row stays inside its logs, else the wider of that and the public
held-out bench's; the JSON rows carry time_lo_s, time_hi_s and interval_source.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simfog import nccl, network_file, units
from simfog.bands import DEFAULT_LEVEL, check_level, combine
from simfog.cli import print_json
from simfog.errors import Caveat, ConfigError, Infeasible
from simfog.experiment import MAX_RANK_ITERATIONS
from simfog.importers import import_file
from simfog.importers.nccl_tests import BUS_FACTOR, normalise
from simfog.nccl.bands import network_part
from simfog.nccl.calibrated import note_line
from simfog.trace import load_network_trace

MAX_SIZES = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("op", help=f"the collective: {', '.join(nccl.OPS)} (all_reduce etc. also accepted)")
    parser.add_argument("--network", required=True, help="a network file (simfog calibrate ... -o network.toml)")
    parser.add_argument("--nodes", type=int, required=True, help="nodes")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="GPUs (ranks) per node")
    parser.add_argument("--sizes", default=None, help="LOW:HIGH doubling, or a comma list (default 8B:8GiB)")
    parser.add_argument("--algo", default=None, help="restrict NCCL's algorithms, as NCCL_ALGO (e.g. ring,tree)")
    parser.add_argument("--proto", default=None, help="restrict NCCL's protocols, as NCCL_PROTO (e.g. Simple)")
    parser.add_argument("--compare", default=None, help="an nccl-tests log or NetworkTrace: add measured times and "
                        "the relative error per size")
    parser.add_argument("--level", type=float, default=DEFAULT_LEVEL,
                        help="level of each row's interval (time_lo_s..time_hi_s; simfog.nccl.bands)")
    parser.add_argument("--json", action="store_true", help="print {\"rows\": [...]} instead of the table")


def run(args: argparse.Namespace) -> int:
    try:
        op = normalise(args.op)
    except KeyError:
        op = None
    if op not in nccl.OPS:
        raise ConfigError("OP", args.op, f"one of {', '.join(nccl.OPS)}")
    for name in ("nodes", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}", getattr(args, name), "an integer >= 1")
    if args.nodes * args.gpus_per_node > MAX_RANK_ITERATIONS:  # NCCL's model printed plausible times for 10**20
        raise ConfigError("--nodes", args.nodes, f"at most {MAX_RANK_ITERATIONS // args.gpus_per_node:,} nodes of "
                          f"{args.gpus_per_node} GPUs ({MAX_RANK_ITERATIONS:,} ranks at most, as a simulation)")
    level = check_level(args.level, "--level")
    loaded, _, _ = network_file.use(args.network, Path.cwd(), field="--network", gpus_per_node=args.gpus_per_node)
    net, covered = loaded.nccl, loaded.calibrated
    ranks = args.nodes * args.gpus_per_node
    algos = _restrict(args.algo, nccl.ALGOS, "--algo")
    protos = _restrict(args.proto, nccl.PROTOS, "--proto")
    measured = _measured(args.compare, op, ranks, args.nodes) if args.compare else {}
    if args.sizes is not None:
        sizes = parse_sizes(args.sizes)
    elif measured:
        sizes = sorted(measured)
    else:
        sizes = parse_sizes("8B:8GiB")
    rows = []
    for size in sizes:
        c = nccl.choose(op, size, ranks, args.nodes, net, algorithms=algos, protocols=protos)
        longest, longest_text = units.LIMITS["time"]  # as a simulated run (simfog.engine.MAX_RUN_SECONDS)
        if c.time_s > longest:
            raise Infeasible(f"{args.network}: a {units.format_bytes(size)} {op} would take {c.time_s:.3g} s, more "
                             f"than {longest_text}: its bandwidths (nccl.intra_bus_bandwidth "
                             f"{units.format_bandwidth(net.intra_bus_Bps)}, nccl.inter_bus_bandwidth "
                             f"{units.format_bandwidth(net.inter_bus_Bps)}) are too small")
        algbw = size / c.time_s / 1e9 if c.time_s > 0 else 0.0
        row = {"bytes": size, "count": size // 4, "time_s": c.time_s, "algbw_GBps": algbw,
               "busbw_GBps": algbw * BUS_FACTOR[op](ranks), "algorithm": c.algorithm, "protocol": c.protocol}
        if size in measured:
            row["measured_s"] = measured[size]
            row["rel_error"] = (c.time_s - measured[size]) / measured[size]
        if covered is not None:
            row["extrapolated"] = covered.notes(net, op, args.nodes, args.gpus_per_node, size)
        part = network_part(covered, [size], level, extrapolated=bool(row.get("extrapolated", True)),
                            distance=covered.distance(args.nodes) if covered is not None else None,
                            within=covered is not None and covered.within(args.nodes))
        iv = combine(c.time_s, level, [part])
        row.update(time_lo_s=iv.lo, time_hi_s=iv.hi, interval_source=part.source)
        rows.append(row)
    fit = Caveat.line(network_file.caveats(loaded))  # the calibration's quality: every row rests on it
    if args.json:
        print_json({"op": op, "nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "network": args.network,
                    "interval_level": level, "warnings": fit, "rows": rows})
        return 0
    print(f"# simfog collective {op}: {ranks} ranks on {args.nodes} node(s), NCCL {net.version} model, "
          f"network {args.network} (predicted, not measured)")
    if covered is None:
        print("# the network file records no calibration coverage ([calibrated]): extrapolation is not checked")
    if fit:
        print(f"# WARNINGS (every row): {fit}")
    head = (f"#{'size':>12s} {'count':>12s} {'type':>6s} {'time':>9s} {f'{100 * level:g} %: low':>11s} {'high':>9s} "
            f"{'algbw':>7s} {'busbw':>7s}  {'algo/proto':14s}")
    units_line = (f"#{'(B)':>12s} {'(elements)':>12s} {'':6s} {'(us)':>9s} {'(us)':>11s} {'(us)':>9s} {'(GB/s)':>7s} "
                  f"{'(GB/s)':>7s}")
    if measured:
        head += f" {'measured':>9s} {'error':>7s}"
        units_line += f" {'':14s}  {'(us)':>9s}"
    print(head)
    print(units_line)
    for r in rows:
        line = (f" {r['bytes']:12d} {r['count']:12d} {'float':>6s} {r['time_s'] * 1e6:9.2f} "
                f"{r['time_lo_s'] * 1e6:11.2f} "
                f"{r['time_hi_s'] * 1e6:9.2f} {r['algbw_GBps']:7.2f} {r['busbw_GBps']:7.2f}  "
                f"{r['algorithm'] + '/' + r['protocol']:14s}")
        if "measured_s" in r:
            line += f" {r['measured_s'] * 1e6:9.2f} {r['rel_error']:+7.1%}"
        if r.get("extrapolated"):
            line += "  " + note_line(r["extrapolated"])
        print(line)
    sources = sorted({r["interval_source"] for r in rows})
    print(f"# {100 * level:g} % intervals (conformal, held-out points): {'; '.join(sources)}")
    if measured:
        errs = sorted(abs(r["rel_error"]) for r in rows if "rel_error" in r)
        if errs:
            print(f"# {len(errs)} sizes compared: median |error| {errs[len(errs) // 2]:.1%}, worst {errs[-1]:.1%}")
    return 0


def parse_sizes(text: str) -> list[int]:
    """'8B:8GiB' -> 8, 16, ..., 8 GiB (doubling); '1MiB,4MiB' -> those. Raises ConfigError naming --sizes."""
    text = text.strip()
    try:
        if ":" in text:
            low_text, high_text = text.split(":", 1)
            low = int(units.nbytes(low_text.strip(), field="--sizes"))
            high = int(units.nbytes(high_text.strip(), field="--sizes"))
            if low < 1 or high < low:
                raise ConfigError("--sizes", text, "LOW:HIGH with 1 B <= LOW <= HIGH, e.g. 8B:8GiB")
            sizes, s = [], low
            while s <= high:
                sizes.append(s)
                s *= 2
        else:
            sizes = [int(units.nbytes(t.strip(), field="--sizes")) for t in text.split(",")]
    except ConfigError as e:
        raise ConfigError("--sizes", text, f"LOW:HIGH (doubling) or a comma list of sizes with units, e.g. "
                          f"8B:8GiB or 1MiB,4MiB ({e.allowed})") from None
    if not sizes or len(sizes) > MAX_SIZES:
        raise ConfigError("--sizes", text, f"between 1 and {MAX_SIZES} sizes")
    return sizes


def _restrict(text: str | None, allowed: tuple[str, ...], flag: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    canon = {a.lower(): a for a in allowed}
    names = [t.strip().lower() for t in text.split(",")]
    if not names or any(n not in canon for n in names):
        raise ConfigError(flag, text, f"a comma list of {', '.join(allowed)}")
    return tuple(canon[n] for n in names)


def _measured(path: str, op: str, ranks: int, nodes: int) -> dict[int, float]:
    """{bytes: min over samples} of `op` at this layout in an nccl-tests log or a NetworkTrace file."""
    trace = (load_network_trace(path) if path.endswith((".json", ".json.gz")) else import_file("nccl-tests", path))
    out = {}
    for m in trace.measurements:
        if m.collective == op and m.ranks == ranks and m.nodes == nodes and m.time_s:
            out[m.bytes] = min(min(m.time_s), out.get(m.bytes, float("inf")))
    if not out:
        layouts = sorted({(m.collective, m.ranks, m.nodes) for m in trace.measurements})
        raise ConfigError("--compare", path, f"measurements of {op} on {ranks} ranks over {nodes} nodes; the file "
                          f"has {', '.join(f'{c} {r} ranks/{n} nodes' for c, r, n in layouts[:6])}")
    return out
