"""`simfog import KIND FILE... -o OUT.json[.gz]`: turn third-party measurement files into a simfog trace.

    simfog import nccl-tests nccl_8.log -o net-a100-8.json
    simfog import nccl-tests nccl_8.log nccl_16.log nccl_32.log -o net-a100.json.gz     # one NetworkTrace
    simfog import nccl-tests ag.log --collective allgather -o net-ag.json               # log does not name it
    simfog import osu allreduce2.log allreduce4.log allreduce8.log -o net-osu.json.gz
    simfog import osu IMB-MPI1-allreduce.log -o net-imb.json                            # Intel MPI Benchmarks
    simfog import kineto nccl_data.json.gz -o resnet50.json.gz -s batch_size=32 -s model=resnet50
    simfog import kineto-comm nccl_data.json.gz -o net-resnet50.json.gz                 # its NCCL collectives
    simfog import kineto traces/ -o ddp.json.gz           # a folder, one trace per rank: each rank's compute
    simfog import kineto-comm traces/ -o net-ddp.json.gz  # transfer times across the ranks, waits left out
    simfog import mgwfbp tmp8comm.log -o googlenet.json -s forward_per_backward=0.5
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from simfog.errors import ConfigError
from simfog.files import check_output, refuse_existing
from simfog.importers import IMPORTERS, ImporterWarning, import_files, options_of
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
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="the file(s) to import (.gz read transparently), or for kineto and kineto-comm a "
                        "folder with one trace per rank; several files (network importers: "
                        "nccl-tests, osu, imb) are merged into one NetworkTrace")
    parser.add_argument("-o", "--output", required=True, help="trace to write: OUT.json or OUT.json.gz (atomic)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")
    parser.add_argument("--collective", metavar="NAME", default=None,
                        help="the collective of logs that do not name it; in logs that do, only its runs are "
                        "imported (same as -s collective=NAME)")
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
    """Import args.files with importer args.kind (several are merged into one NetworkTrace), write args.output
    atomically, print every ImporterWarning as `simfog: warning: ...` on stderr and one summary line.
    Returns 0. Raises ConfigError (naming the file) for a bad file, option or output name."""
    out = Path(args.output)
    if not (out.name.endswith(".json") or out.name.endswith(".json.gz")):
        raise ConfigError("--output", str(out), "a file name ending in .json or .json.gz")
    check_output(out, field="--output")
    files = list(getattr(args, "files", None) or [args.file])
    options = _options(args.kind, args.set)
    collective = getattr(args, "collective", None)
    if collective is not None:
        if "collective" not in options_of(args.kind):
            raise ConfigError("--collective", collective, f"only for importers with a collective option: "
                              f"{', '.join(k for k in IMPORTERS.names() if 'collective' in options_of(k))}")
        if options.get("collective", collective) != collective:
            raise ConfigError("--collective", collective, f"the same as -s collective={options['collective']}")
        options["collective"] = collective
    refuse_existing([out], force=getattr(args, "force", False))  # the options are checked first, then the output
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ImporterWarning)
        trace = import_files(args.kind, files, **options)
    for w in caught:
        if issubclass(w.category, ImporterWarning):
            print(f"simfog: warning: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    trace.save(out)
    if isinstance(trace, ModelTrace):
        what = (f"ModelTrace {trace.model!r}: {len(trace.layers)} layers, {len(trace.tensors)} tensors "
                f"({trace.parameters} elements), " + (
                    f"{trace.samples // len(set(trace.sample_ranks))} iteration(s) x {len(set(trace.sample_ranks))} "
                    "ranks" if trace.sample_ranks else f"{trace.samples} iteration(s)"))
    else:
        ranks = sorted({m.ranks for m in trace.measurements})
        collectives = sorted({m.collective for m in trace.measurements})
        what = (f"NetworkTrace {trace.backend}/{trace.transport}: {len(trace.measurements)} measurements, "
                f"ranks {', '.join(map(str, ranks))}, {', '.join(collectives)}")
    print(f"{' '.join(files) if len(files) <= 3 else f'{len(files)} files'} -> {out}: {what}")
    return 0
