"""`simfog collect ops TRACE -o OUT`: add each layer's operators with their shapes (what `simfog retarget`'s
per-layer GPU model reads) to a trace of a zoo model, recorded by one forward pass on meta tensors at the trace's
batch size; its times stay as they were. For traces collected before `simfog collect model` recorded them."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", metavar="TRACE", help="a ModelTrace of a zoo model (simfog collect model)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.json[.gz]", help="trace file to write")


def run(args: argparse.Namespace) -> int:
    from simfog.files import check_output
    from simfog.trace import load_model_trace
    from validate.collect.layer_ops import add_ops

    check_output(args.output)
    trace = add_ops(load_model_trace(args.trace))
    trace.save(args.output)
    count = sum(len(layer.ops) for layer in trace.layers)
    print(f"wrote {args.output}: {trace.model} batch {trace.batch_size}, {count} operators over {len(trace.layers)} "
          "layers")
    return 0
