"""`simfog collect activations TRACE -o OUT`: add each layer's activation bytes (what autograd keeps for backward)
and output bytes (the gradient backward hands it) to a trace of a zoo model, measured by one CPU forward pass at the
trace's batch size; its times stay as they were. For traces collected before `simfog collect model` recorded
them."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", metavar="TRACE", help="a ModelTrace of a zoo model (simfog collect model)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.json[.gz]", help="trace file to write")


def run(args: argparse.Namespace) -> int:
    from simfog.trace import load_model_trace
    from simfog.units import format_bytes
    from validate.collect.collect_model import add_activations

    trace = add_activations(load_model_trace(args.trace))
    trace.save(args.output)
    total = sum(layer.activation_bytes or 0 for layer in trace.layers)
    print(f"wrote {args.output}: {trace.model} batch {trace.batch_size}, activations {format_bytes(total)} "
          f"over {len(trace.layers)} layers")
    return 0
