"""`simfog retarget TRACE --device a100 -o OUT.json.gz`: an estimated trace for another device (roofline)."""

from __future__ import annotations


def add_arguments(parser) -> None:
    from simfog.retarget import DEFAULT_EFFICIENCY, DEVICES, PRECISIONS

    parser.add_argument("trace", help="a measured ModelTrace with per-layer flops and bytes_accessed")
    parser.add_argument("--device", required=True, help=f"one of {', '.join(DEVICES.names())}")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS)
    parser.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY,
                        help="fraction of peak FLOP/s and bandwidth reached (an assumption; default %(default)s)")
    parser.add_argument("-o", "--output", required=True, help="output trace (.json or .json.gz)")


def run(args) -> int:
    from simfog.files import check_output
    from simfog.retarget import retarget
    from simfog.trace import load_model_trace

    check_output(args.output)
    out = retarget(load_model_trace(args.trace), args.device, precision=args.precision, efficiency=args.efficiency)
    out.save(args.output)
    fwd = sum(layer.forward_s[0] for layer in out.layers)
    bwd = sum(layer.backward_s[0] for layer in out.layers)
    print(f"ESTIMATED {out.model} batch {out.batch_size} on {args.device} ({args.precision}): forward "
          f"{fwd * 1e3:.2f} ms, backward {bwd * 1e3:.2f} ms, optimizer {out.optimizer_s[0] * 1e3:.2f} ms "
          f"-> {args.output}")
    return 0
