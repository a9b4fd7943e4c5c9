"""`simfog calibrate NETTRACE.json[.gz]`: fit link latency and bandwidth from a NetworkTrace, print the residuals.

    simfog calibrate traces/net-gloo-loopback.json.gz            # table of fits and residuals
    simfog calibrate traces/net-gloo-loopback.json.gz --rows     # ... and every measurement
    simfog calibrate traces/net-gloo-loopback.json.gz --json     # one JSON object (SI units)
"""

from __future__ import annotations

import argparse
import json

from simfog.calibrate import ALGORITHMS, STATISTICS, fit
from simfog.errors import ConfigError
from simfog.trace import load_network_trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `simfog calibrate` to `parser`."""
    parser.add_argument("trace", help="a NetworkTrace (.json or .json.gz)")
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="ring",
                        help="collective algorithm whose α-β coefficients are fitted (default ring)")
    parser.add_argument("--statistic", choices=tuple(STATISTICS), default="median",
                        help="what of each measurement's samples is fitted (default median; min on a busy machine)")
    parser.add_argument("--rows", action="store_true", help="also print every measurement's residual")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: argparse.Namespace) -> int:
    """Print the calibration of `args.trace`. Returns the exit status (0). Raises ConfigError (naming the file)
    and Infeasible as simfog.calibrate.fit does."""
    trace = load_network_trace(args.trace)
    try:
        cal = fit(trace, algorithm=args.algorithm, statistic=getattr(args, "statistic", "median"))
    except ConfigError as e:
        raise e.in_file(str(args.trace)) from None
    if args.json:
        print(json.dumps(cal.to_dict(), indent=1))
    else:
        print(cal.report(rows=args.rows))
    return 0
