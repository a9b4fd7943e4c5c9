"""`simfog retarget TRACE --device a100 -o OUT.json.gz`: an estimated trace for another device (roofline)."""

from __future__ import annotations


def add_arguments(parser) -> None:
    from simfog.retarget import DEFAULT_EFFICIENCY, DEFAULT_LAUNCH_S, DEVICES, PRECISIONS, TORCH_DEFAULT

    parser.add_argument("trace", help="a measured ModelTrace with per-layer flops and bytes_accessed")
    parser.add_argument("--device", required=True, help=f"one of {', '.join(DEVICES.names())}")
    parser.add_argument("--precision", default=TORCH_DEFAULT, choices=(TORCH_DEFAULT,) + PRECISIONS,
                        help="torch (default): what PyTorch (2.13, as since 1.12) runs an fp32 model in on the device "
                        "unless told otherwise: convolutions in TF32 where the device has it (A100, H100: "
                        "torch.backends.cudnn.allow_tf32 defaults to True), matrix multiplies in FP32 "
                        "(torch.backends.cuda.matmul.allow_tf32 defaults to False); or one precision for every "
                        "layer")
    parser.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY,
                        help="fraction of peak FLOP/s and bandwidth reached (an assumption; default %(default)s)")
    parser.add_argument("--launch", default=f"{DEFAULT_LAUNCH_S * 1e6:g}us",
                        help="time added per layer and pass for launches and the framework's dispatch (default "
                        "%(default)s: learned across 7 models measured on an H200, bench/compute_estimates.py)")
    parser.add_argument("--samples-per-s", type=float, default=None,
                        help="one GPU's measured throughput at the trace's batch size: the estimate is pinned to it "
                        "(every layer scaled so that a step takes batch / throughput; the split over layers stays "
                        "estimated, and its interval takes the error of such pinned estimates)")
    parser.add_argument("-o", "--output", required=True, help="output trace (.json or .json.gz)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")


def run(args) -> int:
    from simfog import units
    from simfog.errors import ConfigError
    from simfog.files import refuse_existing
    from simfog.retarget import pin_step, precision_note, retarget
    from simfog.trace import MAX_SECONDS, MIN_COMPUTE_SECONDS, load_model_trace

    refuse_existing([args.output], force=args.force)
    launch_s = units.seconds(args.launch, field="--launch")
    rate = args.samples_per_s
    if rate is not None and not (rate > 0 and rate < float("inf")):
        raise ConfigError("--samples-per-s", rate, "a measured throughput > 0 (samples per second on one GPU)")
    trace = load_model_trace(args.trace)
    if rate is not None and not MIN_COMPUTE_SECONDS <= trace.batch_size / rate <= MAX_SECONDS:
        raise ConfigError("--samples-per-s", rate, f"a throughput from {trace.batch_size / MAX_SECONDS:g} to "
                          f"{trace.batch_size / MIN_COMPUTE_SECONDS:g} samples/s: a step of batch {trace.batch_size} "
                          f"that lasts from {MIN_COMPUTE_SECONDS:g} s to {MAX_SECONDS:g} s, as a trace's may")
    out = retarget(trace, args.device, precision=args.precision, efficiency=args.efficiency, launch_s=launch_s)
    if rate is not None:
        out = pin_step(out, out.batch_size / rate, f"simfog retarget --samples-per-s {rate:g}: {rate:g} samples/s "
                       f"at batch {out.batch_size} measured on one {args.device}")
    out.save(args.output)
    fwd = sum(layer.forward_s[0] for layer in out.layers)
    bwd = sum(layer.backward_s[0] for layer in out.layers)
    # Say which precision each kind of layer was given: the default is a choice a reader must be able to see.
    note = precision_note(out, args.device, args.precision)
    print(f"ESTIMATED {out.model} batch {out.batch_size} on {args.device} ({note}): forward "
          f"{fwd * 1e3:.2f} ms, backward {bwd * 1e3:.2f} ms, optimizer {out.optimizer_s[0] * 1e3:.2f} ms "
          f"-> {args.output}")
    return 0
