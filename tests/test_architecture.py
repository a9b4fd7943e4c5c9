"""The house rules that code review alone lets slip: no import circles among simfog's and validate's modules, the
engine knows nothing of the algorithm registry, every CLI command lives in simfog/commands/, and a module over 400
lines says at its top why it is that long.

Imports are read with `ast` from the source (every `import` and `from ... import`, at any depth, except those under
`if TYPE_CHECKING:`, which never run). `from a.b import c` is an edge to module a.b.c when that is a module of the
project, else to a.b. Importing a submodule also runs its package's __init__, but that implicit edge is not counted:
a package's __init__ gathering its submodules is how a package shows its face.
"""

from __future__ import annotations

import ast
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


def _runtime_imports(tree: ast.AST):
    """Import nodes of `tree`, leaving out the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
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


def test_the_engine_knows_nothing_of_the_algorithm_registry():
    graph = import_graph()
    assert not {m for m in graph["simfog.engine"] if m.startswith("simfog.algorithms")}
    assert "simfog.algorithms" in graph["simfog.simulation"]  # the one place where the three meet


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
    """The validator's top level holds only the orchestration, the bench and the fits run.py makes from its own
    microbenchmarks (the calibrated cluster, NCCL's model, the in-training host costs); every other module sits in the
    subpackage that names its part (the algorithm families' adapters in families)."""
    top = {p.stem for p in (REPO / "validate").glob("*.py")} - {"__init__"}
    assert top <= {"run", "bench", "calibration", "nccl_calibration", "host_calibration"}, top
    parts = {p.name for p in (REPO / "validate").iterdir() if (p / "__init__.py").is_file()}
    assert parts == {"cluster", "launch", "ranks", "collect", "comparison", "families"}
