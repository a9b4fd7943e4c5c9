import json
from datetime import datetime
from pathlib import Path

import pytest

from simfog import files
from simfog.errors import ConfigError
from simfog.trace import load_model_trace, load_network_trace, model_trace_from_dict

from .conftest import make_trace


def _valid() -> dict:
    return make_trace([0.1, 0.2], [0.3, 0.4], [10, 20], samples=[([0.1, 0.2], [0.3, 0.4]), ([0.11, 0.21], [0.31, 0.41])]
                      ).to_dict()


def test_round_trip_json_and_gzip(tmp_path):
    trace = model_trace_from_dict(_valid())
    for name in ("t.json", "t.json.gz"):
        trace.save(tmp_path / name)
        again = load_model_trace(tmp_path / name)
        assert again == trace
    assert trace.samples == 2 and trace.parameters == 30 and trace.nbytes == 120
    assert [t.name for t in trace.ready_tensors()] == ["l1.weight", "l0.weight"]


def test_gzip_output_is_reproducible(tmp_path):
    trace = model_trace_from_dict(_valid())
    trace.save(tmp_path / "a.json.gz")
    trace.save(tmp_path / "b.json.gz")
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()


@pytest.mark.parametrize("mutate, field, value", [
    (lambda d: d.update(format="simfog.model-trace/9"), "format", "simfog.model-trace/9"),
    (lambda d: d["layers"][1].update(backward_s=[0.1]), "layers[1].backward_s", "1 samples"),
    (lambda d: d["layers"][0].update(forward_s=[0.1, -1]), "layers[0].forward_s[1]", "-1"),
    (lambda d: d["layers"][0]["params"][0].update(elements=0), "layers[0].params[0].elements", "0"),
    (lambda d: d["layers"][0]["params"][0].update(dtype="float7"), "layers[0].params[0].dtype", "float7"),
    (lambda d: d.update(grad_ready_order=["l1.weight"]), "grad_ready_order", "l0.weight"),
    (lambda d: d.update(grad_ready_order=["l1.weight", "l0.weight", "x"]), "grad_ready_order", "x"),
    (lambda d: d["provenance"].update(source="guessed"), "provenance.source", "guessed"),
    (lambda d: d.pop("batch_size"), "batch_size", "(missing)"),
])
def test_bad_field_names_file_field_value(tmp_path, mutate, field, value):
    d = _valid()
    mutate(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as err:
        load_model_trace(path)
    msg = str(err.value)
    assert str(path) in msg and field in msg and value in msg


def test_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(_valid())[:50])
    with pytest.raises(ConfigError, match="cut.json.*valid JSON"):
        load_model_trace(path)


def test_network_trace_validation(tmp_path):
    d = {"format": "simfog.network-trace/1", "backend": "gloo", "transport": "tcp",
         "provenance": {"command": "x", "date": "d", "host": "h", "source": "measured", "estimated": False},
         "measurements": [{"collective": "reduce-scatter", "ranks": 4, "nodes": 2, "bytes": 1024, "time_s": [1e-3]}]}
    files.write_json(tmp_path / "n.json", d)
    assert load_network_trace(tmp_path / "n.json").measurements[0].collective == "reduce_scatter"
    d["measurements"][0]["nodes"] = 5
    files.write_json(tmp_path / "n.json", d)
    with pytest.raises(ConfigError, match=r"measurements\[0\]\.nodes = 5"):
        load_network_trace(tmp_path / "n.json")


def test_atomic_write_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with files.atomic_open(target) as f:
            f.write("partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_host_time_is_optional_validated_and_round_trips(tmp_path):
    d = make_trace([1e-3, 2e-3], [2e-3, 4e-3], [10, 20]).to_dict()
    assert "host_s" not in d                                    # traces without host time are written as before
    assert model_trace_from_dict(d).host_s == ()
    mt = model_trace_from_dict({**d, "host_s": [0.25]})
    assert mt.host_s == (0.25,) and "host_s" not in mt.extra
    mt.save(tmp_path / "t.json.gz")
    assert load_model_trace(tmp_path / "t.json.gz").to_dict() == mt.to_dict()
    with pytest.raises(ConfigError, match="host_s.*1 samples"):
        model_trace_from_dict({**d, "host_s": [0.1, 0.2]})
    with pytest.raises(ConfigError, match=r"host_s\[0\]"):
        model_trace_from_dict({**d, "host_s": [-1.0]})


def test_sample_ranks_are_optional_validated_and_round_trip(tmp_path):
    samples = [([1e-3], [2e-3]), ([1e-3], [2e-3]), ([3e-3], [4e-3]), ([3e-3], [4e-3])]
    d = make_trace([0], [0], [10], samples=samples).to_dict()
    assert "sample_ranks" not in d and model_trace_from_dict(d).sample_ranks == ()
    mt = model_trace_from_dict({**d, "sample_ranks": [0, 0, 1, 1]})
    assert mt.sample_ranks == (0, 0, 1, 1) and "sample_ranks" not in mt.extra
    mt.save(tmp_path / "t.json.gz")
    assert load_model_trace(tmp_path / "t.json.gz").to_dict() == mt.to_dict()
    for bad, match in (([0, 1], "one per sample"), ([0, 0, 0, 1], r"samples per rank \{0: 3, 1: 1\}"),
                       ([0, 0, 1, -1], "integers >= 0"), ([0, 0, 1, True], "integers >= 0")):
        with pytest.raises(ConfigError, match=match):
            model_trace_from_dict({**d, "sample_ranks": bad})


SHIPPED = sorted(p for p in (Path(__file__).resolve().parents[1] / "traces").glob("*.json.gz")
                 if "kineto" not in p.name)  # the Kineto file is a profiler trace, imported in test_importers
GPU_TRACES = [p for p in SHIPPED if "-h200-" in p.name]


@pytest.mark.parametrize("path", [p for p in SHIPPED if not p.name.startswith("net-")], ids=lambda p: p.name)
def test_every_shipped_model_trace_loads_and_says_where_it_was_measured(path):
    trace = load_model_trace(path)
    p = trace.provenance
    assert p.command.startswith(("simfog collect model", "simfog retarget")) and datetime.fromisoformat(p.date)
    assert p.estimated == ("estimated" in path.name) and trace.device["name"]
    assert path.name in (path.parent / "README.md").read_text()   # every file is described


@pytest.mark.parametrize("path", GPU_TRACES, ids=lambda p: p.name)
def test_gpu_traces_add_up_to_steps_measured_without_hooks(path):
    """The H200 traces: CUDA events, and each phase's layers scaled so that the median step adds up to the median
    step measured with no hook (the factors and both sets of raw figures are in the file)."""
    import statistics

    trace = load_model_trace(path)
    info = trace.extra["instrumentation"]
    assert trace.device["kind"] == "cuda" and "H200" in trace.device["name"] and "CUDA events" in trace.provenance.notes
    steps = range(trace.samples)
    for phase, values in (("forward_wall_s", [sum(x.forward_s[k] for x in trace.layers) for k in steps]),
                          ("backward_wall_s", [sum(x.backward_s[k] for x in trace.layers) for k in steps]),
                          ("optimizer_s", list(trace.optimizer_s))):
        plain, hooked = statistics.median(info["plain"][phase]), statistics.median(info["instrumented"][phase])
        assert 0 < info["scale"][phase] <= 1
        assert statistics.median(values) == pytest.approx(min(plain, hooked), rel=1e-9)
