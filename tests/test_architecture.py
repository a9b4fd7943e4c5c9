"""The house rules that code review alone lets slip: simfog's and validate's modules stand in layers and every import
goes down or stays on its layer (`LAYERS`: the engine at the bottom knows nothing of the algorithm families, the
API nothing of the command line), with no import circles; every training algorithm family is a folder of the same
module names; every CLI command lives in simfog/commands/; a module over 400 lines says at its top why it is that
long.

Imports are read with `ast` from the source: every `import` and `from ... import`, at any depth, those under
`if TYPE_CHECKING:` included (a type-only import is still a dependency of the reader's mind, and a circle of them
is still a circle). `from a.b import c` is an edge to module a.b.c when that is a module of the project, else to
a.b. Importing a submodule also runs its package's __init__, but that implicit edge is not counted: a package's
__init__ gathering its submodules is how a package shows its face.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("simfog", "validate")
LONG_LINES = 400
LONG_REASON = "Over 400 lines"  # the phrase a long module's docstring uses to say why


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(tree: ast.AST, *, type_only: bool = True):
    """Import nodes of `tree`; `type_only` False leaves out the bodies of `if TYPE_CHECKING:` (never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if (not type_only and isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _runtime_imports(tree: ast.AST):
    """Import nodes of `tree`, leaving out the bodies of `if TYPE_CHECKING:`."""
    return _imports(tree, type_only=False)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (type-only imports included)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules and "." in t:  # `import a.b.c` of an attribute: its module
                    t = t.rsplit(".", 1)[0]
                if t in modules and t != name:
                    graph[name].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (module -> module): " + "; ".join(" <-> ".join(c) for c in found)


# The layers, from the bottom up: a module may import modules of its own layer and of the layers below it, never one
# above. A module belongs to the first layer with a prefix it starts with (a prefix is a module or a package).
LAYERS = [
    ("foundations: errors, units, files, registries", ["simfog.errors", "simfog.units", "simfog.registry",
                                                       "simfog.files", "simfog.processes", "simfog.progress",
                                                       "simfog.interrupts",
                                                       "simfog.dask_backend", "simfog.data"]),
    ("models: traces, clusters, pure cost functions, results", [
        "simfog.trace", "simfog.cluster", "simfog.topology", "simfog.merge", "simfog.overheads", "simfog.memory",
        "simfog.p2p", "simfog.collectives", "simfog.nccl", "simfog.nccl.facts", "simfog.nccl.report",
        "simfog.nccl.fit", "simfog.calibrate", "simfog.network_file", "simfog.retarget", "simfog.importers",
        "simfog.span_log", "simfog.results", "simfog.fabric", "simfog.bands",
        "simfog.nccl.bands", "simfog.variation", "simfog.gpu"]),
    ("the event engine", ["simfog.engine"]),
    ("the training algorithms, by family", ["simfog.algorithms"]),
    ("the experiment", ["simfog.experiment"]),
    ("the simulation: composes a run, chooses its path", ["simfog.simulation"]),
    ("tools over many simulations, outputs", ["simfog.sweeps", "simfog.tune", "simfog.tune_sharded",
                                             "simfog.tune_framework", "simfog.titles", "simfog.pricing", "simfog.plan",
                                             "simfog.timeline", "simfog.plot", "simfog.jobs", "simfog.exporters",
                                             "simfog.run_bands", "simfog.caveats"]),
    ("the Python API", ["simfog.api", "simfog.overrides", "simfog"]),
    ("the validator", ["validate"]),
    ("the command line", ["simfog.commands", "simfog.cli", "simfog.__main__"]),
]


def layer_of(module: str) -> int:
    """The index in LAYERS of `module`'s layer (KeyError when none names it)."""
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "simfog"):
            return i
    for i, (_, prefixes) in enumerate(LAYERS):
        if module in prefixes:
            return i
    raise KeyError(module)


def test_every_module_has_a_layer():
    missing = [m for m in _modules() if not _has_layer(m)]
    assert not missing, f"modules in no layer of LAYERS: {missing}"


def _has_layer(module: str) -> bool:
    try:
        layer_of(module)
    except KeyError:
        return False
    return True


def test_every_import_goes_down_or_stays_on_its_layer():
    """No module imports one of a layer above its own (type-only imports included)."""
    up = sorted(f"{m} ({LAYERS[layer_of(m)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})"
                for m, deps in import_graph().items() for d in deps if layer_of(d) > layer_of(m))
    assert not up, "imports that go up a layer:\n" + "\n".join(up)


def test_the_layer_test_sees_an_upward_import(monkeypatch):
    """The test above fails when a module imports one above it (the engine importing the algorithm registry)."""
    graph = import_graph()
    graph["simfog.engine.ranks"].add("simfog.algorithms.registry")
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: graph)
    with pytest.raises(AssertionError, match="simfog.engine.ranks .*-> simfog.algorithms.registry"):
        test_every_import_goes_down_or_stays_on_its_layer()


def test_the_engine_knows_nothing_of_the_algorithm_registry():
    graph = import_graph()
    engine = {m for m in graph if m.startswith("simfog.engine")}
    assert engine and not {d for m in engine for d in graph[m] if d.startswith("simfog.algorithms")}
    assert "simfog.algorithms" in graph["simfog.simulation"]  # the one place where the three meet


def test_the_api_knows_nothing_of_the_command_line():
    graph = import_graph()
    assert not {d for d in graph["simfog.api"] if d.startswith(("simfog.commands", "simfog.cli"))}


FAMILY_MODULES = {"__init__", "plan", "program", "closed_form"}


def test_every_algorithm_family_is_a_folder_of_the_same_module_names():
    """simfog/algorithms/<family>/ holds plan.py, program.py and closed_form.py (and may hold more), and every
    registered algorithm is a class of one of them."""
    from simfog import algorithms
    from simfog.engine.protocol import TrainingAlgorithm

    root = REPO / "simfog" / "algorithms"
    families = sorted(p for p in root.iterdir() if (p / "__init__.py").is_file())
    registered = import_graph()["simfog.algorithms"]
    assert len(families) >= 4
    for family in families:
        assert FAMILY_MODULES <= {p.stem for p in family.glob("*.py")}, family.name
        assert f"simfog.algorithms.{family.name}" in registered, f"{family.name}: not imported by simfog.algorithms"
    for name in algorithms.REGISTRY.names():
        cls = algorithms.REGISTRY.get(name)
        assert issubclass(cls, TrainingAlgorithm), name
        assert cls.__module__.split(".")[2] in {p.name for p in families}, (name, cls.__module__)


def test_every_cli_command_lives_in_simfog_commands():
    from simfog import cli

    for name, (module, *_rest) in cli.COMMANDS.items():
        assert module.startswith("simfog.commands."), (name, module)


@pytest.mark.parametrize("name", sorted(_modules()))
def test_a_long_module_says_why(name):
    path = _modules()[name]
    lines = path.read_text().count("\n")
    if lines <= LONG_LINES:
        return
    doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split())
    assert LONG_REASON in doc, f"{path.relative_to(REPO)} has {lines} lines: split it, or say at its top why not " \
                               f"(a docstring sentence starting {LONG_REASON!r})"


def test_the_simulator_never_imports_the_validator_or_torch():
    """simfog (but its commands, which run real things on request) stays pure Python: no validate, no torch."""
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("simfog") and not name.startswith("simfog.commands"):
            assert not {d for d in deps if d.startswith("validate")}, name
    for path in (REPO / "simfog").rglob("*.py"):
        if "commands" in path.parts:
            continue
        for node in _runtime_imports(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path


def test_validate_is_split_into_its_parts():
    """The validator's top level holds only the orchestration (run; jobs: several at once), the bench and the fits
    run.py makes from its own microbenchmarks (the calibrated cluster, NCCL's model, the in-training host costs);
    every other module sits in the subpackage that names its part (the algorithm families' adapters in families)."""
    top = {p.stem for p in (REPO / "validate").glob("*.py")} - {"__init__"}
    assert top <= {"run", "jobs", "bench", "calibration", "nccl_calibration", "host_calibration"}, top
    parts = {p.name for p in (REPO / "validate").iterdir() if (p / "__init__.py").is_file()}
    assert parts == {"cluster", "launch", "ranks", "collect", "comparison", "families"}
