"""`simfog collect model NAME ...`: measure a zoo model's per-layer compute and write a ModelTrace file.

torch is imported only when the command runs, so building the CLI's parser never imports it.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from simfog.errors import ConfigError

# validate.collect.models.names(), written out so that building the parser does not import torch (a test keeps
# them equal).
MODEL_NAMES = ("bert-base", "densenet121", "gpt2", "mlp", "resnet20", "resnet50", "vgg16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `collect model` arguments to `parser`."""
    parser.add_argument("name", metavar="NAME", help=f"zoo model: {', '.join(MODEL_NAMES)}")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step (default 32)")
    parser.add_argument("--iterations", type=int, default=10, help="measured steps, all kept (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="steps run first and dropped (default 3)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per process (default: torch's, or cores / concurrent)")
    parser.add_argument("--concurrent", type=int, default=1,
                        help="processes training at once, in lock step; the trace comes from rank 0 (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and inputs (default 0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--overlap", action="store_true",
                        help="also measure how much slower backward runs beside a collective (overlap_slowdown): "
                             "on CPU beside gloo allreduces with a second process on loopback; on a GPU beside "
                             "one-GPU stand-ins for NCCL's kernels and copies (validate.collect.gpu_overlap)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.json[.gz]", help="trace file to write")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")


def run(args: argparse.Namespace) -> int:
    """Collect the trace, write it atomically to `args.output`, print one summary line; 0 on success.

    Raises ConfigError (the CLI prints it as one line) for an unknown model, a bad number or a bad output name."""
    out = Path(args.output)
    if not (out.name.endswith(".json") or out.name.endswith(".json.gz")):
        raise ConfigError("--output", args.output, "a file name ending in .json or .json.gz")
    from simfog.files import refuse_existing

    refuse_existing([out], force=args.force)  # before minutes of measuring, not after
    from simfog.units import format_time
    from validate.collect.collect_model import collect_model

    command = ["simfog", "collect", "model", args.name, "--batch-size", args.batch_size, "--iterations",
               args.iterations, "--warmup", args.warmup, "--concurrent", args.concurrent, "--seed", args.seed]
    command += ["--threads", args.threads] if args.threads is not None else []
    command += ["--device", args.device] if args.device else []
    command += ["--overlap"] if args.overlap else []
    trace = collect_model(args.name, args.batch_size, iterations=args.iterations, warmup=args.warmup,
                          threads=args.threads, seed=args.seed, concurrent=args.concurrent, device=args.device,
                          command=shlex.join(str(c) for c in command + ["-o", args.output]), overlap=args.overlap)
    trace.save(out)
    k = trace.samples
    fwd, bwd = sum(trace.extra["forward_wall_s"]) / k, sum(trace.extra["backward_wall_s"]) / k
    opt = sum(trace.optimizer_s) / k
    print(f"wrote {out}: {trace.model} batch {trace.batch_size}, {len(trace.layers)} layers, "
          f"{trace.parameters:,} parameters, {k} steps; mean step {format_time(fwd + bwd + opt)} "
          f"(forward {format_time(fwd)}, backward {format_time(bwd)}, optimizer {format_time(opt)}) "
          f"on {trace.device['threads']} thread(s)"
          + (f"; overlap slowdown {rec['overlap_slowdown']:.3f} (raw {rec['overlap_slowdown_raw']:.3f})"
             if args.overlap and (rec := trace.extra.get("comm_overheads", {})).get("overlap_slowdown") else ""))
    return 0
