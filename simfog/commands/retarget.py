"""`simfog retarget TRACE --device h200 -o OUT.json.gz`: an estimated trace for another GPU (simfog list devices),
by the per-layer model learned from public measurements (a trace without operators: a roofline); `--explain` names
each layer's bound and the figures used."""

from __future__ import annotations


def add_arguments(parser) -> None:
    from simfog.gpu.specs import DEVICES
    from simfog.retarget import DEFAULT_EFFICIENCY, DEFAULT_LAUNCH_S, PRECISIONS, TORCH_DEFAULT

    parser.add_argument("trace", help="a measured ModelTrace whose layers carry their operators (simfog collect ops "
                        "adds them) or, for the roofline, flops and bytes_accessed")
    parser.add_argument("--device", required=True, help=f"a GPU of `simfog list devices` ({len(DEVICES.names())}: "
                        f"{', '.join(DEVICES.names())}) or an alias such as \"NVIDIA A100-SXM4-40GB\"")
    parser.add_argument("--precision", default=TORCH_DEFAULT, choices=(TORCH_DEFAULT,) + PRECISIONS,
                        help="torch (default): what PyTorch (2.13, as since 1.12) runs an fp32 model in on the device "
                        "unless told otherwise: convolutions in TF32 where the device has it (A100, H100: "
                        "torch.backends.cudnn.allow_tf32 defaults to True), matrix multiplies in FP32 "
                        "(torch.backends.cuda.matmul.allow_tf32 defaults to False); fp32/tf32 every product in that; "
                        "fp16/bf16 a model in 16 bits")
    parser.add_argument("--host-op", default=None, metavar="TIME",
                        help="the host's dispatch time per operator (forward and backward), e.g. 25us: your "
                        "machine's, instead of the one learned from public machines (the GPU waits for it in "
                        "small layers)")
    parser.add_argument("--explain", action="store_true",
                        help="print each layer's bound (compute, memory, launch, host) and the figures used")
    parser.add_argument("--efficiency", type=float, default=None,
                        help="roofline only (a trace without operators): fraction of peak reached (an assumption; "
                        f"default {DEFAULT_EFFICIENCY:g}); refused for a trace with operators, which the learned "
                        "model estimates kernel by kernel")
    parser.add_argument("--launch", default=None,
                        help=f"roofline only: time added per layer and pass (default {DEFAULT_LAUNCH_S * 1e6:g}us)")
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
    from simfog.gpu.specs import DEVICES
    from simfog.retarget import DEFAULT_EFFICIENCY, DEFAULT_LAUNCH_S, has_ops, pin_step, precision_note, retarget
    from simfog.trace import MAX_SECONDS, MIN_COMPUTE_SECONDS, load_model_trace

    refuse_existing([args.output], force=args.force)
    launch_s = DEFAULT_LAUNCH_S if args.launch is None else units.seconds(args.launch, field="--launch")
    efficiency = DEFAULT_EFFICIENCY if args.efficiency is None else args.efficiency
    host = None
    if args.host_op is not None:
        op = units.seconds(args.host_op, field="--host-op")
        host = {"host.forward_op_s": op, "host.backward_op_s": op}
    rate = args.samples_per_s
    if rate is not None and not (rate > 0 and rate < float("inf")):
        raise ConfigError("--samples-per-s", rate, "a measured throughput > 0 (samples per second on one GPU)")
    device = DEVICES.get(args.device, field="--device").name
    explain: list = []
    trace = load_model_trace(args.trace)
    if rate is not None and not MIN_COMPUTE_SECONDS <= trace.batch_size / rate <= MAX_SECONDS:
        raise ConfigError("--samples-per-s", rate, f"a throughput from {trace.batch_size / MAX_SECONDS:g} to "
                          f"{trace.batch_size / MIN_COMPUTE_SECONDS:g} samples/s: a step of batch {trace.batch_size} "
                          f"that lasts from {MIN_COMPUTE_SECONDS:g} s to {MAX_SECONDS:g} s, as a trace's may")
    for flag, given in (("--efficiency", args.efficiency), ("--launch", args.launch)):
        if given is not None and has_ops(trace):  # the learned model has no such knob: never ignore a flag silently
            raise ConfigError(flag, given, f"left out for {args.trace}: its layers carry their operators, so the "
                              "per-layer model learned from public measurements estimates it, kernel by kernel "
                              "(the roofline's knobs apply to a trace without operators)")
    out = retarget(trace, device, precision=args.precision, efficiency=efficiency, launch_s=launch_s,
                   host=host, explain=explain)
    if rate is not None:
        out = pin_step(out, out.batch_size / rate, f"simfog retarget --samples-per-s {rate:g}: {rate:g} samples/s "
                       f"at batch {out.batch_size} measured on one {device}")
    out.save(args.output)
    if args.explain:
        print_explanation(out, explain)
    fwd = sum(layer.forward_s[0] for layer in out.layers)
    bwd = sum(layer.backward_s[0] for layer in out.layers)
    method = out.extra.get("retarget_method", "roofline")
    # Say which precision each kind of layer was given: the default is a choice a reader must be able to see.
    print(f"ESTIMATED ({method}) {out.model} batch {out.batch_size} on {device} "
          f"({precision_note(trace, device, args.precision)}): forward {fwd * 1e3:.2f} ms, backward {bwd * 1e3:.2f} "
          f"ms, optimizer {out.optimizer_s[0] * 1e3:.2f} ms -> {args.output}")
    return 0


def describe_launch(r: dict) -> str:
    """One launch's figures, for people: what it is, its bound, tile and waves or bytes, and the correction."""
    figures = []
    if r["tm"]:
        figures.append(f"tile {r['tm']:.0f}x{r['tn']:.0f}" + (f" split-K {r['split']:.0f}" if r["split"] > 1 else "")
                       + f", {r['waves']:.0f} wave(s), {r['flops'] / 1e9:.3g} GFLOP at {r['efficiency']:.0%} of peak"
                       + (f" x{r['power']:.2f} clock (power)" if r["power"] < 0.995 else ""))
    elif r["flops"]:
        figures.append(f"{r['flops'] / 1e9:.3g} GFLOP (Winograd or matrix-vector)")
    figures.append(f"{r['bytes'] / 1e6:.3g} MB")
    if abs(r["correction"] - 1) > 0.005:
        figures.append(f"shape correction x{r['correction']:.2f}")
    return f"{r['what']}: {r['bound']}-bound, {', '.join(figures)}"


def print_explanation(out, launches: list) -> None:
    """Per layer: forward and backward ms, and the launch that added most to each, with its bound and figures."""
    if not launches:
        print("(a roofline estimate: the trace's layers carry no operators; `simfog collect ops` adds them)")
        return
    print(f"{'layer':40s} {'fwd ms':>8s} {'bwd ms':>8s}  what decided it (the launch adding most; bound, figures)")
    by_layer: dict[int, list] = {}
    for r in launches:
        by_layer.setdefault(r["layer"], []).append(r)
    for i, layer in enumerate(out.layers):
        rows = by_layer.get(i, [])
        top = max(rows, key=lambda r: r["added_s"], default=None)
        print(f"{layer.name[:40]:40s} {layer.forward_s[0] * 1e3:8.3f} {layer.backward_s[0] * 1e3:8.3f}  "
              + (describe_launch(top) if top else "no kernel"))
    opt = by_layer.get(-1, [])
    if opt:
        print(f"{'optimizer':40s} {sum(r['added_s'] for r in opt) * 1e3:8.3f} {'':8s}  {describe_launch(opt[0])} "
              f"(x{len(opt)} launches)")
    bounds: dict[str, float] = {}
    for r in launches:
        bounds[r["bound"]] = bounds.get(r["bound"], 0.0) + r["added_s"]
    total = sum(bounds.values())
    print("step by bound: " + ", ".join(f"{b} {t / total:.0%}" for b, t in sorted(bounds.items(),
                                                                                key=lambda kv: -kv[1])))
