"""`simfog import KIND FILE -o OUT.json[.gz]`: turn a third-party measurement file into a simfog trace.

    simfog import nccl-tests nccl_8.log -o net-a100-8.json
    simfog import osu allreduce4.log -o net-osu-4.json -s ranks=4
    simfog import kineto nccl_data.json.gz -o resnet50.json.gz -s batch_size=32 -s model=resnet50
    simfog import mgwfbp tmp8comm.log -o googlenet.json -s forward_per_backward=0.5
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simfog.errors import ConfigError
from simfog.importers import IMPORTERS, import_file, options_of
from simfog.trace import ModelTrace


def _epilog() -> str:
    lines = ["importers and their options (-s KEY=VALUE):"]
    for name, doc in IMPORTERS.describe():
        opts = ", ".join(f"{k}={p.default!r}" for k, p in options_of(name).items())
        lines += [f"  {name}: {doc}", f"      options: {opts or 'none'}"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `simfog import` to `parser`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _epilog()
    parser.add_argument("kind", choices=IMPORTERS.names(), help="what FILE is")
    parser.add_argument("file", help="the file to import (.gz read transparently where the format is JSON)")
    parser.add_argument("-o", "--output", required=True, help="trace to write: OUT.json or OUT.json.gz (atomic)")
    parser.add_argument("-s", "--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an importer option, repeatable (see below)")


def _options(kind: str, pairs: list[str]) -> dict[str, object]:
    """KEY=VALUE strings -> keyword options, converted to int/float where the importer's option takes one."""
    allowed = options_of(kind)
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError("--set", pair, "KEY=VALUE, e.g. ranks=4")
        if key not in allowed:
            raise ConfigError("--set", key, f"an option of importer {kind}: {', '.join(allowed) or 'none'}")
        annotation = str(allowed[key].annotation)
        value: object = text
        for kind_name, convert in (("int", int), ("float", float)):
            if kind_name in annotation:
                try:
                    value = convert(text)
                    break
                except ValueError:
                    continue
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    """Import args.file with importer args.kind, write args.output atomically, print one summary line.
    Returns 0. Raises ConfigError (naming the file) for a bad file, option or output name."""
    out = Path(args.output)
    if not (out.name.endswith(".json") or out.name.endswith(".json.gz")):
        raise ConfigError("--output", str(out), "a file name ending in .json or .json.gz")
    trace = import_file(args.kind, args.file, **_options(args.kind, args.set))
    trace.save(out)
    if isinstance(trace, ModelTrace):
        what = (f"ModelTrace {trace.model!r}: {len(trace.layers)} layers, {len(trace.tensors)} tensors "
                f"({trace.parameters} elements), {trace.samples} iteration(s)")
    else:
        ranks = sorted({m.ranks for m in trace.measurements})
        what = (f"NetworkTrace {trace.backend}/{trace.transport}: {len(trace.measurements)} measurements, "
                f"ranks {', '.join(map(str, ranks))}")
    print(f"{args.file} -> {out}: {what}")
    return 0
