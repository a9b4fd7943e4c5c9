"""`simfog calibrate NETTRACE.json[.gz]...`: fit the network model from measurements, print the residuals, and
write the network file that experiments use.

    simfog calibrate net-a100.json.gz -o network.toml          # NCCL model (nccl-tests logs): fit, report, file
    simfog calibrate a.json.gz b.json.gz --nics-per-node 4 --nic-bandwidth 200Gbit/s   # any mix of layouts
    simfog calibrate h100.json.gz --nccl-version 2.29.2 --gpu-nic-path pxb --intra-transport nvswitch --nvls
    simfog calibrate traces/net-gloo-loopback.json.gz          # α-β link fit (gloo, MPI) and residual tables
    simfog calibrate traces/net-gloo-loopback.json.gz --json   # one JSON object (SI units)

The model is NCCL's (simfog.nccl.fit) when every trace was measured on NCCL, else α-β per link class
(simfog.calibrate); --model forces one. For NCCL, what the logs state (release, GPU, NCCL_DEBUG=INFO lines) is
used; a flag overrides it with a warning naming both; hardware neither states is assumed and reported.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

import numpy as np

from simfog import nccl, network_file, units
from simfog.bands import LEVELS
from simfog.calibrate import ALGORITHMS, STATISTICS, fit
from simfog.errors import ConfigError, Infeasible
from simfog.files import refuse_existing
from simfog.nccl import bands as nccl_bands
from simfog.nccl import fit as nccl_fit
from simfog.nccl.facts import model_of_name
from simfog.trace import load_network_trace

MODELS = ("auto", "nccl", "alpha-beta")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `simfog calibrate` to `parser`."""
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("trace", nargs="+", help="NetworkTrace files (.json or .json.gz), e.g. from `simfog import "
                        "nccl-tests`")
    parser.add_argument("-o", "--output", help="write the calibrated network file (TOML) for [cluster] network")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")
    parser.add_argument("--model", choices=MODELS, default="auto",
                        help="nccl: NCCL's cost model; alpha-beta: one latency and bandwidth per link class; "
                        "auto: nccl when every trace is NCCL's")
    parser.add_argument("--nccl-version", default=None,
                        help="NCCL release X.Y or X.Y.Z the logs were measured with (default: as the logs state, "
                        "else 2.30)")
    parser.add_argument("--gpu-arch", choices=nccl.ARCHS, default=None,
                        help="GPU generation (default: read from the GPU names in the traces, else ampere)")
    parser.add_argument("--cpu-vendor", choices=nccl.CPU_VENDORS, default=None,
                        help="the hosts' CPU vendor (default: as NCCL_DEBUG lines state, else intel)")
    parser.add_argument("--intra-transport", choices=nccl.TRANSPORTS, default=None,
                        help="how GPUs of one node connect (nvidia-smi topo -m: NV# = nvlink, NVSwitch systems "
                        "nvswitch; default nvlink)")
    parser.add_argument("--nics-per-node", type=int, default=None,
                        help="NICs per node (ibstat; rails: GPU i sends through NIC i mod NICs; default: as "
                        "NCCL_DEBUG's NET/ lines state, else unknown)")
    parser.add_argument("--nic-bandwidth", default=None, help="one NIC's rate, e.g. 400Gbit/s (ibstat 'Rate')")
    parser.add_argument("--gpu-nic-path", choices=nccl.PATHS, default=None,
                        help="how a GPU reaches its NIC (nvidia-smi topo -m: PIX/PXB through PCIe switches, PHB or "
                        "NODE through the CPU, SYS across sockets; default: as the logs state, else pxb)")
    parser.add_argument("--nvls", action=argparse.BooleanOptionalAction, default=None,
                        help="NVLink SHARP on the node's NVSwitches (Hopper+; NCCL_DEBUG: 'NVLS multicast support')")
    parser.add_argument("--collnet", action=argparse.BooleanOptionalAction, default=None,
                        help="SHARP in-network reduction on the fabric (CollNet plugin)")
    parser.add_argument("--channels", type=int, default=None,
                        help="NCCL's graph channels (default: as NCCL_DEBUG lines state, else derived from the "
                        "hardware, fitted where the logs identify them)")
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="ring",
                        help="alpha-beta model: collective algorithm whose α-β coefficients are fitted")
    parser.add_argument("--statistic", choices=tuple(STATISTICS), default=None,
                        help="what of each measurement's samples is fitted (default: min for NCCL, whose "
                        "samples are out-of-place and in-place; median for alpha-beta)")
    parser.add_argument("--rows", action="store_true", help="alpha-beta: also print every measurement's residual")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: argparse.Namespace) -> int:
    """Calibrate, print the report, write the network file if asked. Returns 0. Raises ConfigError and Infeasible
    (nothing to fit), both naming the trace file(s)."""
    refuse_existing([args.output], force=args.force)
    try:
        return _run(args)
    except Infeasible as e:
        raise Infeasible(f"{', '.join(args.trace)}: {e}") from None
    except ConfigError as e:
        raise e.in_file(", ".join(args.trace)) from None


def _run(args: argparse.Namespace) -> int:
    traces = [load_network_trace(p) for p in args.trace]
    model = args.model
    if model == "auto":
        model = "nccl" if all(t.backend == "nccl" for t in traces) else "alpha-beta"
    if model == "alpha-beta":
        if args.output is not None:
            raise ConfigError("--output", args.output, "only with the NCCL model (--model nccl); an α-β fit is "
                              "used through [cluster] network_trace")
        if len(traces) > 1:
            raise ConfigError("trace", args.trace, "one trace for the alpha-beta model")
        try:
            cal = fit(traces[0], algorithm=args.algorithm, statistic=args.statistic or "median")
        except ConfigError as e:
            raise e.in_file(str(args.trace[0])) from None
        print(json.dumps(cal.to_dict(), indent=1) if args.json else cal.report(rows=args.rows))
        return 0
    for name in ("channels", "nics_per_node"):
        v = getattr(args, name)
        if v is not None and not 1 <= v <= 64:
            raise ConfigError(f"--{name.replace('_', '-')}", v, "an integer in 1..64")
    nic = None
    if args.nic_bandwidth is not None:
        nic = units.parse(args.nic_bandwidth, "bandwidth", field="--nic-bandwidth")
        if not nic > 0:
            raise ConfigError("--nic-bandwidth", args.nic_bandwidth, 'a bandwidth > 0 such as "400Gbit/s"')
    hardware = dict(version=args.nccl_version, gpu_arch=args.gpu_arch, cpu_vendor=args.cpu_vendor,
                    intra_transport=args.intra_transport, channels=args.channels, nics_per_node=args.nics_per_node,
                    nic_Bps=nic, gpu_nic_path=args.gpu_nic_path, nvls=args.nvls, collnet=args.collnet,
                    statistic=args.statistic or "min")
    cal = nccl_fit.fit(traces, **hardware, source=", ".join(args.trace))
    held_out = nccl_bands.leave_a_scale_out(traces, **hardware)
    held_in = nccl_bands.leave_a_scale_in(traces, **hardware)
    gpus = {m for m in (model_of_name(repr(t.extra)) for t in traces) if m}
    # kept in the network file: every prediction on it then names a POOR FIT, and a trace of another GPU model
    cal = replace(cal, calibrated=replace(cal.calibrated, intervals=held_out, inside=held_in,
                                          quality=cal.quality(), gpu=gpus.pop() if len(gpus) == 1 else ""))
    for w in cal.warnings:
        print(f"simfog: warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(cal.to_dict(), indent=1))
    else:
        print(cal.report())
        print(interval_line(held_out))
        if held_in is not None:  # predictions within the logs' node counts take these
            print(interval_line(held_in))
        elif cal.calibrated.node_counts() >= 3:  # ... or, per size, the narrower of these and the public ones
            print(interval_line(nccl_bands.inside_table()) + " (within the logs' node counts, where narrower than "
                  "the leave-a-scale-out: one count between the fewest and the most is too few for its own)")
    if args.output is not None:
        e = cal.errors()
        network_file.save(args.output, cal.network, {
            "fitted_from": ", ".join(args.trace), "fitted": ", ".join(cal.fitted),
            "assumed": "; ".join(cal.assumed), "given": "; ".join(cal.given),
            "statistic": args.statistic or "min",
            "residuals": f"{len(e)} points, median |error| {float(np.median(e)):.3f}, worst {float(e.max()):.3f}",
            "command": "simfog calibrate " + " ".join([*args.trace, *_flags(args)])}, calibrated=cal.calibrated)
        if not args.json:
            print(f"wrote {args.output}")
    return 0


def interval_line(held_out) -> str:
    """What the leave-a-scale-out found, for the report: the 90 % half-widths per size regime."""
    if held_out is None:
        return ("Intervals: the logs hold one node count, so no scale can be left out; predictions take the public "
                "held-out bench's intervals (simfog.nccl.bands)")
    widths = ", ".join(f"{r} +-{100 * math.sinh(row[LEVELS.index(0.9)]):.0f} % ({held_out.points[r]} points)"
                       if row[LEVELS.index(0.9)] is not None else f"{r}: too few points ({held_out.points[r]})"
                       for r, row in held_out.by_regime.items())
    return f"Intervals (90 %, conformal), {held_out.source}: {widths}"


def _flags(args: argparse.Namespace) -> list[str]:
    """The NCCL-model flags given, as they were typed (for the network file's provenance)."""
    out = []
    for name in ("nccl_version", "gpu_arch", "cpu_vendor", "intra_transport", "nics_per_node", "nic_bandwidth",
                 "gpu_nic_path", "channels", "statistic"):
        if getattr(args, name) is not None:
            out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    for name in ("nvls", "collnet"):
        if getattr(args, name) is not None:
            out.append(f"--{'' if getattr(args, name) else 'no-'}{name}")
    return out
