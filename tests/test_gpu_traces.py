"""The GPU traces of traces/h200/ (every zoo model on one H200, twice, with the one-GPU overlap stand-in): they load,
say how they were measured and that the overlap slowdown is a stand-in estimate, and a simulation with one of them
slows backward by exactly that factor, naming where it came from."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from simfog import overheads
from simfog.trace import load_model_trace

REPO = Path(__file__).resolve().parents[1]
H200 = sorted((REPO / "traces" / "h200").glob("*.json.gz"))
ZOO = ("bert-base", "densenet121", "gpt2", "mlp", "resnet20", "resnet50", "vgg16")


def test_every_zoo_model_was_collected_twice():
    names = [p.name.split("-h200-")[0] for p in H200]
    assert sorted(set(names)) == sorted(ZOO)
    assert all(names.count(n) == 2 for n in ZOO)


@pytest.mark.parametrize("path", H200, ids=lambda p: p.name)
def test_trace_says_where_and_how_and_that_the_overlap_is_a_stand_in(path):
    trace = load_model_trace(path)
    raw = json.loads(gzip.decompress(path.read_bytes()))
    assert "H200" in raw["device"]["name"] and raw["provenance"]["source"] == "measured"
    command = raw["provenance"]["command"]
    assert "--device cuda" in command and "--overlap" in command and f"collect model {trace.model}" in command
    rec = raw["comm_overheads"]
    kernel = rec["overlap_standins"]["kernel"]
    assert rec["overlap_slowdown_estimated"] is True and "stand-in" in rec["overlap_slowdown_how"]
    assert rec["overlap_slowdown"] == max(1.0, kernel["with_s"] / rec["overlap_backward_s"]["alone"])
    assert "Triton" in kernel["how"]  # the limited-block kernel ran, not the every-SM fallback
    assert trace.samples == 30


def test_simulation_slows_backward_by_the_stand_in_and_names_it():
    from dataclasses import replace

    import simfog

    path = REPO / "traces" / "h200" / "resnet50-h200-b32-run1.json.gz"
    trace = load_model_trace(path)
    exp = simfog.load(None, ranks=16)
    exp = replace(exp, workload=replace(exp.workload, trace=trace, compute="mean"))
    factor = json.loads(gzip.decompress(path.read_bytes()))["comm_overheads"]["overlap_slowdown"]
    resolved = overheads.resolve(exp.comm, trace)
    assert resolved.overlap_slowdown == factor > 1
    assert "stand-in" in resolved.sources["overlap_slowdown"]
    summary = simfog.simulate(exp).summary()
    assert summary["overlap_slowdown"] == factor
    slower_off = simfog.simulate(exp.with_comm(overlap_slowdown=1.0)).summary()
    assert summary["compute_s"] > slower_off["compute_s"]
