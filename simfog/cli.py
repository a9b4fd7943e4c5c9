"""The `simfog` command. Only here do exceptions become exit codes: a user error prints one line and exits 2."""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys
import warnings

from simfog import interrupts
from simfog.data import DEFAULT_EXPERIMENT  # noqa: F401  (the commands' default, named here too)
from simfog.errors import SimfogError, SimfogWarning

# name -> (module with add_arguments(parser) and run(args) -> int, help). Modules are imported only when used,
# so `simfog list` never imports torch.
COMMANDS = {
    "simulate": ("simfog.commands.simulate", "simulate an experiment file; print the summary"),
    "sweep": ("simfog.commands.sweep", "simulate a grid of ranks x merge policies x collectives; table and CSV"),
    "list": ("simfog.commands.listing", "list every registered collective, merge policy, algorithm, ..."),
    "import": ("simfog.commands.importing", "convert a profiler trace or benchmark log into a simfog trace"),
    "export": ("simfog.commands.exporting", "write an experiment's workload for another simulator (Chakra traces "
               "and ASTRA-sim inputs)"),
    "retarget": ("simfog.commands.retarget", "estimate a trace for another GPU (per-layer model learned from public "
                 "measurements)"),
    "calibrate": ("simfog.commands.calibrate", "fit cluster latency and bandwidth from a network trace"),
    "collective": ("simfog.commands.collective", "predict nccl-tests output for a layout from a network file; "
                   "compare with a log"),
    "validate": ("simfog.commands.validate", "run an experiment for real on an emulated cluster; compare with the "
                 "simulation"),
    "tune": ("simfog.commands.tune", "search the merge threshold with the least iteration time; plot and CSV"),
    "plan": ("simfog.commands.plan", "cheapest GPU count, network, collective and merge policy for a target"),
    "curve": ("simfog.commands.curve", "throughput and scaling efficiency against ranks; PNG, SVG and CSV"),
    "init": ("simfog.commands.init", "write a starter experiment file, every key annotated (and --catalogue: a "
             "one-option catalogue for plan)"),
}
COLLECT = {
    "model": ("simfog.commands.collect_model", "measure a zoo model's per-layer compute (torch)"),
    "network": ("simfog.commands.collect_network", "measure collectives over gloo or MPI"),
    "activations": ("simfog.commands.collect_activations", "add layers' activation and output bytes to a zoo trace"),
    "ops": ("simfog.commands.collect_ops", "add layers' operators and shapes to a zoo trace (for retarget)"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the usage block is what --help is for), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """argparse's, with the nearest option of the command named beside an unrecognized one."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}"
                       f"{_nearest_option(extras, getattr(parsed, '_parser', self))}")
        return parsed


# Options that ask for the same thing under another name: `--nodes` where only `--ranks` counts, and back.
SAME_IDEA = {"--nodes": ("--ranks", "--gpus"), "--gpus": ("--ranks", "--nodes"), "--ranks": ("--gpus", "--nodes"),
             "--world-size": ("--ranks", "--gpus"), "--nproc-per-node": ("--gpus-per-node",)}


def _nearest_option(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """" (did you mean --ranks?)" for the first unrecognized option near one of `parser`'s (by spelling, or
    SAME_IDEA), else ""."""
    from simfog.errors import did_you_mean

    known = [o for o in parser._option_string_actions if o.startswith("--")]
    for extra in extras:
        flag = extra.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        hint = did_you_mean(flag, known, quote=False)
        if hint:
            return hint
        idea = difflib.get_close_matches(flag, SAME_IDEA, n=1)  # --rank: --ranks's idea
        same = next((o for o in SAME_IDEA.get(idea[0], ()) if o in known), None) if idea else None
        if same:
            return f" (did you mean {same}?)"
    return ""


def _one_line(text: str) -> str:
    """Messages name user-supplied keys, paths and values: escape their line breaks so an error is one line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless the help already says it or there is none to show
    (None, False): ArgumentDefaultsHelpFormatter would print "(default: None)" after "(default: the file's)".
    Descriptions and epilogs keep their line breaks (the importers' epilog is a table)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or action.default in (None, False, argparse.SUPPRESS)
                or not (action.option_strings or action.nargs in ("?", "*"))):
            return text
        return text + " (default: %(default)s)"


def version() -> str:
    """The installed distribution's version (pyproject.toml's), or a note when run from an uninstalled copy."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("simfog")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _add(sub, name: str, module: str, help_text: str) -> None:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.set_defaults(_module=module, _parser=parser)
    try:
        importlib.import_module(module).add_arguments(parser)
    except ModuleNotFoundError as e:  # an optional part (torch, a later feature) is not installed
        parser.set_defaults(_missing=str(e))
    parser.formatter_class = HelpFormatter  # after add_arguments, which may have set its own


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="simfog", description="Trace-driven simulator of data-parallel training.",
                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        _add(sub, name, module, help_text)
    collect = sub.add_parser("collect", help="collect traces from real runs",
                             formatter_class=HelpFormatter).add_subparsers(dest="what", required=True)
    for name, (module, help_text) in COLLECT.items():
        _add(collect, name, module, help_text)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """simfog's own warnings as one line on stderr; any other as Python shows it."""
    if issubclass(category, SimfogWarning):
        print(f"simfog: warning: {_one_line(str(message))}", file=sys.stderr)
    else:
        _default(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings(), interrupts.handled():  # both restored when main returns (tests call it)
        warnings.showwarning = _show_warning
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        # Inside the try: building the parser imports every command, so Ctrl-C often lands there.
        args = build_parser().parse_args(argv)
        if getattr(args, "_missing", None):
            print(f"simfog: error: this command needs a missing module ({args._missing}); "
                  "install the extras: pip install -e '.[validate]'", file=sys.stderr)
            return 2
        return importlib.import_module(args._module).run(args) or 0
    except SimfogError as e:
        print(f"simfog: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simfog: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `simfog ... | head`: the reader left; not an error worth a traceback
        sys.stderr.close()
        return 0


def print_json(data: object) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    sys.exit(main())
