"""`simfog export KIND EXPERIMENT.toml -o DIR`: an experiment's workload as another tool's input files.

    simfog export chakra experiment.toml -o astra/          # Chakra traces + ASTRA-sim network/system inputs
    simfog export chakra experiment.toml -o astra/ --ranks 64 --merge mgwfbp
"""

from __future__ import annotations

import argparse

from simfog.commands.simulate import add_overrides, load_with_overrides
from simfog.exporters import EXPORTERS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `simfog export` to `parser`."""
    parser.add_argument("kind", choices=EXPORTERS.names(), help="what to write")
    parser.add_argument("file", nargs="?", help="experiment TOML (default: the embedded ResNet-50 example)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write (new; whole or not "
                        "at all)")
    parser.add_argument("--force", action="store_true", help="replace an existing output folder")
    parser.add_argument("--plain", action="store_true", help="Chakra's fields only, without simfog's exact values: "
                        "smaller traces for large runs (simfog import then reads them per operator)")
    add_overrides(parser)


def run(args: argparse.Namespace) -> int:
    """Export the experiment with args.kind into args.output; print what was written, its notes (what the other
    tool will not see) and the command that runs it. Returns 0; ConfigError for a bad experiment or folder."""
    exp = load_with_overrides(args)
    done = EXPORTERS.get(args.kind, field="kind")(exp, args.output, force=args.force, exact=not args.plain)
    print(f"{exp.source or 'default experiment'} -> {done.folder}/: {done.ranks} Chakra traces workload.<rank>.et "
          f"({done.distinct} distinct, {done.nodes} nodes each, {done.collectives} collectives per iteration), "
          "network.yml, system.json, memory.json, export.json")
    for note in done.notes:
        print(f"  note: {note}")
    print(f"  run ASTRA-sim (analytical, congestion unaware): {done.command}")
    return 0
