"""`simfog calibrate NETTRACE.json[.gz]...`: fit the network model from measurements, print the residuals, and
write the network file that experiments use.

    simfog calibrate net-a100.json.gz -o network.toml          # NCCL model (nccl-tests logs): fit, report, file
    simfog calibrate a.json.gz b.json.gz --nccl-version 2.8    # several traces, any mix of layouts
    simfog calibrate traces/net-gloo-loopback.json.gz          # α-β link fit (gloo, MPI) and residual tables
    simfog calibrate traces/net-gloo-loopback.json.gz --json   # one JSON object (SI units)

The model is NCCL's (simfog.nccl_fit) when every trace was measured on NCCL, else α-β per link class
(simfog.calibrate); --model forces one.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from simfog import nccl, nccl_fit, network_file
from simfog.calibrate import ALGORITHMS, STATISTICS, fit
from simfog.errors import ConfigError, Infeasible
from simfog.files import check_output, refuse_existing
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
    parser.add_argument("--nccl-version", default="2.30",
                        help="NCCL release whose constant tables apply (the one the logs were measured with)")
    parser.add_argument("--gpu-arch", choices=nccl.ARCHS, default=None,
                        help="GPU generation (default: read from the GPU names in the traces, else ampere)")
    parser.add_argument("--cpu-vendor", choices=nccl.CPU_VENDORS, default="intel", help="the hosts' CPU vendor")
    parser.add_argument("--intra-transport", choices=nccl.TRANSPORTS, default="nvlink",
                        help="how GPUs of one node connect")
    parser.add_argument("--channels", type=int, default=None, help="NCCL channels (default: fitted)")
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
    if args.output:
        check_output(args.output)
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
        if args.output:
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
    if args.channels is not None and not 1 <= args.channels <= 64:
        raise ConfigError("--channels", args.channels, "an integer in 1..64")
    cal = nccl_fit.fit(traces, version=args.nccl_version, gpu_arch=args.gpu_arch, cpu_vendor=args.cpu_vendor,
                       intra_transport=args.intra_transport, channels=args.channels,
                       statistic=args.statistic or "min", source=", ".join(args.trace))
    if args.json:
        print(json.dumps(_as_dict(cal), indent=1))
    else:
        print(cal.report())
    if args.output:
        e = cal.errors()
        network_file.save(args.output, cal.network, {
            "fitted_from": ", ".join(args.trace), "fitted": ", ".join(cal.fitted),
            "statistic": args.statistic or "min",
            "residuals": f"{len(e)} points, median |error| {float(np.median(e)):.3f}, worst {float(e.max()):.3f}",
            "command": "simfog calibrate " + " ".join(args.trace)})
        if not args.json:
            print(f"wrote {args.output}")
    return 0


def _as_dict(cal: nccl_fit.NcclCalibration) -> dict:
    n = cal.network
    return {"model": "nccl", "network": {k: getattr(n, k) for k in n.__dataclass_fields__},
            "fitted": list(cal.fitted),
            "points": [{"op": p.op, "ranks": p.ranks, "nodes": p.nodes, "bytes": p.bytes, "measured_s": p.measured_s,
                        "predicted_s": p.predicted_s, "rel_error": p.rel_error, "algorithm": p.algorithm,
                        "protocol": p.protocol, "flag": p.flag} for p in cal.points]}
