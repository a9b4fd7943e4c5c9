"""The training algorithm protocol (simfog.engine.protocol): one written list of hooks, defaults for all of them, and
engines that call hooks and read nothing else of an algorithm."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from simfog import algorithms
from simfog.engine import protocol
from simfog.engine.protocol import TrainingAlgorithm
from simfog.simulation import Simulation, why_events
from tests.conftest import make_experiment, make_trace

REPO = Path(__file__).resolve().parents[1]
ENGINES = [REPO / "simfog" / "simulation.py", *sorted((REPO / "simfog" / "engine").glob("*.py"))]
HOOKS = {name for name, _ in inspect.getmembers(TrainingAlgorithm) if not name.startswith("_")} - {"redefined"}


def test_the_protocol_docstring_lists_every_hook():
    doc = protocol.__doc__
    assert HOOKS == {"symmetric", "symmetric_draws", "whole_iterations", "backward_s", "for_experiment", "memory",
                     "describe_buckets",
                     "mixing", "backward_started", "run_iteration", "events_blocker", "closed_form_blocker",
                     "closed_form"}
    for hook in HOOKS:
        assert f"`{hook}" in doc, hook


def test_every_registered_algorithm_implements_the_protocol():
    for name in algorithms.REGISTRY.names():
        assert issubclass(algorithms.REGISTRY.get(name), TrainingAlgorithm), name


def _algorithm_reads(path: Path) -> set[str]:
    """Attributes the module reads off an algorithm: `alg.x`, `algorithm.x`, `self.algorithm.x`,
    `self.algorithm_class.x`."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if isinstance(v, ast.Name) and v.id in ("alg", "algorithm"):
            out.add(node.attr)
        if isinstance(v, ast.Attribute) and v.attr in ("algorithm", "algorithm_class") and \
                isinstance(v.value, ast.Name) and v.value.id == "self":
            out.add(node.attr)
    return out


@pytest.mark.parametrize("path", ENGINES, ids=lambda p: p.name)
def test_the_engines_call_hooks_and_probe_nothing(path):
    tree = ast.parse(path.read_text())
    probes = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and n.func.id in ("getattr", "hasattr")]
    assert not probes, f"{path.name} probes attributes with {probes}"
    assert "__func__" not in path.read_text()
    assert _algorithm_reads(path) <= HOOKS, _algorithm_reads(path) - HOOKS


class Silent(TrainingAlgorithm):
    """An algorithm that communicates nothing: every hook but describe_buckets left to its default."""

    def describe_buckets(self) -> list[dict]:
        return []


def test_the_defaults_make_an_algorithm_that_communicates_nothing():
    trace = make_trace([1e-3, 2e-3], [2e-3, 4e-3], [10, 20], optimizer=1e-3)
    exp = make_experiment(trace, nodes=2, gpus_per_node=2, iterations=3)
    sim = Simulation(exp, Silent)
    assert not sim.symmetric  # the default: ranks not provably alike
    assert why_events(sim) == "algorithm 'allreduce' decides while running"
    s = sim.run().summary()
    assert s["path"] == "events" and s["comm_s"] == 0.0
    assert s["iteration_time_s"] == pytest.approx(1e-3 + 2e-3 + 2e-3 + 4e-3 + 1e-3, rel=1e-12)
    assert s["memory_peak_B"] > 0  # simfog.memory.estimate of the experiment
    with pytest.raises(ValueError, match="analytic path was requested, but algorithm 'allreduce' decides"):
        Simulation(exp, Silent, path="analytic").run()


def test_a_patched_hook_takes_the_event_engine(monkeypatch):
    """The closed form replays the program its family wrote; a hook patched on the algorithm is another program."""
    from simfog.simulation import new_simulation

    trace = make_trace([1e-3, 2e-3], [2e-3, 4e-3], [10, 20])
    sim = new_simulation(make_experiment(trace, merge="ddp"))
    assert why_events(sim) is None
    monkeypatch.setattr(sim.algorithm, "_comm_stream", lambda *a: None)
    assert why_events(sim) == "algorithm 'allreduce' overrides _comm_stream"
