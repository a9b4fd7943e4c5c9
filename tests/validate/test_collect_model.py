"""collect_model on the tiny zoo models: structure of the measured trace, never its speed."""

from __future__ import annotations

import argparse
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="collecting a model trace needs torch (pip install -e .[validate])")

from simfog.commands import collect_model as collect_model_cli  # noqa: E402
from simfog.errors import ConfigError  # noqa: E402
from simfog.trace import load_model_trace, model_trace_from_dict  # noqa: E402
from validate.collect import models  # noqa: E402
from validate.collect.collect_model import _charge, collect_model  # noqa: E402
from validate.ranks.timing import HostClock  # noqa: E402

ITERATIONS = 3


def _timed(name: str, batch_size: int, **kw):
    start = time.perf_counter()
    trace = collect_model(name, batch_size, iterations=ITERATIONS, warmup=1, threads=1, device="cpu", **kw)
    return trace, time.perf_counter() - start


@pytest.fixture(scope="module")
def mlp():
    return _timed("mlp", 4)


@pytest.fixture(scope="module")
def resnet20():
    return _timed("resnet20", 2)


@pytest.fixture(params=["mlp", "resnet20"])
def measured(request, mlp, resnet20):
    return {"mlp": mlp, "resnet20": resnet20}[request.param]


def test_trace_round_trips_through_the_format(measured, tmp_path):
    trace, _ = measured
    assert model_trace_from_dict(trace.to_dict()) == trace
    trace.save(tmp_path / "t.json.gz")
    assert load_model_trace(tmp_path / "t.json.gz") == trace


def test_layers_and_parameters_are_the_model_s(measured):
    trace, _ = measured
    model = models.build(trace.model)
    assert trace.parameters == models.ZOO[trace.model].parameters
    assert {n: p.numel() for n, p in model.named_parameters()} == {n: t.elements for n, t in trace.tensors.items()}
    leaves = [n for n, m in model.named_modules() if n and not list(m.children())]
    assert sorted(layer.name for layer in trace.layers) == sorted(leaves)


def test_grad_ready_order_names_every_parameter_once(measured):
    trace, _ = measured
    names = [n for n, _ in models.build(trace.model).named_parameters()]
    assert sorted(trace.grad_ready_order) == sorted(names)
    assert len(set(trace.grad_ready_order)) == len(names)


def test_mlp_gradients_become_ready_in_reverse_layer_order(mlp):
    trace, _ = mlp
    owner = trace.layer_index()
    layers = [trace.layers[owner[n]].name for n in trace.grad_ready_order]
    assert list(dict.fromkeys(layers)) == ["layers.4", "layers.2", "layers.0"]
    assert [layer.name for layer in trace.layers] == ["layers.0", "layers.1", "layers.2", "layers.3", "layers.4"]


def test_every_layer_has_one_sample_per_measured_iteration(measured):
    trace, _ = measured
    assert trace.samples == ITERATIONS
    assert all(len(layer.forward_s) == len(layer.backward_s) == ITERATIONS for layer in trace.layers)
    assert len(trace.optimizer_s) == len(trace.extra["forward_wall_s"]) == len(trace.extra["backward_wall_s"]) \
        == ITERATIONS


def test_per_layer_times_add_up_to_each_iteration_s_wall_time(measured):
    trace, elapsed_s = measured
    for k in range(ITERATIONS):
        forward = sum(layer.forward_s[k] for layer in trace.layers)
        backward = sum(layer.backward_s[k] for layer in trace.layers)
        assert forward == pytest.approx(trace.extra["forward_wall_s"][k], rel=1e-9, abs=1e-12)
        assert backward == pytest.approx(trace.extra["backward_wall_s"][k], rel=1e-9, abs=1e-12)
        assert forward > 0 and backward > 0
    # The measured steps happened inside the call: together they cannot exceed its duration.
    steps = sum(trace.extra["forward_wall_s"]) + sum(trace.extra["backward_wall_s"]) + sum(trace.optimizer_s)
    assert steps <= elapsed_s


def test_layers_are_scaled_to_steps_without_hooks(measured):
    """The hooks' own time is taken out: each phase's layers add up to (instrumented wall) x (plain median /
    instrumented median), never more than instrumented; the raw figures stay in the trace."""
    trace, _ = measured
    info = trace.extra["instrumentation"]
    for phase in ("forward_wall_s", "backward_wall_s", "optimizer_s"):
        raw, plain = info["instrumented"][phase], info["plain"][phase]
        assert len(raw) == len(plain) == ITERATIONS and min(plain) > 0
        factor = min(1.0, sorted(plain)[ITERATIONS // 2] / sorted(raw)[ITERATIONS // 2])
        assert info["scale"][phase] == pytest.approx(factor, rel=1e-12)
        measured = trace.optimizer_s if phase == "optimizer_s" else trace.extra[phase]
        assert measured == pytest.approx([t * factor for t in raw], rel=1e-12)
    assert "instrumentation" in trace.provenance.notes and "without hooks" in trace.provenance.notes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the collector's CUDA path")
def test_collect_on_cuda_times_layers_with_cuda_events():
    trace = collect_model("mlp", 64, iterations=ITERATIONS, warmup=1, device="cuda")
    assert trace.device["kind"] == "cuda" and trace.device["name"] == torch.cuda.get_device_name()
    assert "CUDA events" in trace.provenance.notes
    for k in range(ITERATIONS):
        assert sum(layer.forward_s[k] for layer in trace.layers) == pytest.approx(
            trace.extra["forward_wall_s"][k], rel=1e-9, abs=1e-12)
    assert trace.extra["comm_overheads"]["bucket_copy_Bps"] > 0


def test_mlp_flops_and_bytes_are_the_closed_forms(mlp):
    trace, _ = mlp
    batch = 4
    flops = {layer.name: layer.flops for layer in trace.layers}
    assert flops == {"layers.0": 2 * batch * 784 * 256, "layers.1": 0, "layers.2": 2 * batch * 256 * 128,
                     "layers.3": 0, "layers.4": 2 * batch * 128 * 10}
    first = trace.layers[0]
    assert first.bytes_accessed == 4 * ((784 * 256 + 256) + batch * 784 + batch * 256)


def test_provenance_and_device_say_where_and_how(mlp):
    trace, _ = mlp
    p = trace.provenance
    assert (p.source, p.estimated) == ("measured", False)
    assert p.command.startswith("simfog collect model mlp --batch-size 4")
    assert p.date.endswith("Z") and "before:" in p.notes and "after:" in p.notes
    assert trace.device["kind"] == "cpu" and trace.device["threads"] == 1
    assert trace.device["cores"] == os.cpu_count()
    assert set(trace.software) >= {"python", "torch", "numpy"}
    assert trace.dtype == "float32" and trace.batch_size == 4


def test_collecting_does_not_change_the_caller_s_thread_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        collect_model("mlp", 2, iterations=1, warmup=0, threads=1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow  # spawns two processes that each import torch: 3 s idle, over 10 s on a busy machine
def test_concurrent_processes_each_record_every_step():
    trace = collect_model("mlp", 2, iterations=2, warmup=1, threads=1, concurrent=2)
    assert trace.device["processes"] == 2
    assert trace.extra["concurrent"]["trace_from_rank"] == 0
    assert [len(r) for r in trace.extra["concurrent"]["iteration_s"]] == [2, 2]
    assert trace.samples == 2 and "2 process(es)" in trace.provenance.notes


def test_gaps_between_hooks_go_to_the_layer_that_closes_them():
    totals: dict[str, float] = {}
    # start 0; a ends at 1, b at 3, a (called again) at 3.5; the step ends at 4 (tail to the last layer, a)
    _charge([(1.0, "a"), (3.0, "b"), (3.5, "a")], 0.0, 4.0, HostClock(), totals)
    assert totals == {"a": 1.0 + 0.5 + 0.5, "b": 2.0}


@pytest.mark.parametrize("field, kw", [("iterations", {"iterations": 0}), ("warmup", {"warmup": -1}),
                                       ("threads", {"threads": 0}), ("concurrent", {"concurrent": 0}),
                                       ("batch_size", {"batch_size": 0})])
def test_bad_numbers_are_config_errors_naming_the_field(field, kw):
    args = {"batch_size": 2, **kw}
    with pytest.raises(ConfigError) as e:
        collect_model("mlp", args.pop("batch_size"), **args)
    assert e.value.field == field


def test_unknown_model_is_one_line_naming_it_and_the_allowed_ones():
    with pytest.raises(ConfigError) as e:
        collect_model("resnet51", 2)
    message = str(e.value)
    assert "resnet51" in message and "\n" not in message
    assert all(name in message for name in models.names())


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    collect_model_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_writes_a_loadable_gzipped_trace(tmp_path, capsys):
    out = tmp_path / "mlp-cpu-b2.json.gz"
    args = _cli("mlp", "--batch-size", "2", "--iterations", "2", "--warmup", "0", "--threads", "1", "-o", str(out))
    assert collect_model_cli.run(args) == 0
    trace = load_model_trace(out)
    assert trace.samples == 2 and trace.model == "mlp"
    assert trace.provenance.command.endswith(f"-o {out}")
    assert str(out) in capsys.readouterr().out


def test_cli_rejects_an_unknown_model_and_a_bad_output_name(tmp_path):
    with pytest.raises(ConfigError, match="resnet51"):
        collect_model_cli.run(_cli("resnet51", "-o", str(tmp_path / "x.json")))
    with pytest.raises(ConfigError) as e:
        collect_model_cli.run(_cli("mlp", "-o", str(tmp_path / "x.txt")))
    assert e.value.field == "--output"
    assert not list(tmp_path.iterdir())


def test_cli_help_lists_exactly_the_zoo():
    assert sorted(collect_model_cli.MODEL_NAMES) == models.names()


def test_flat_bucket_copy_bandwidth_is_measured_with_its_provenance(mlp):
    from simfog.overheads import resolve
    from tests.conftest import make_experiment

    trace, _ = mlp
    rec = trace.extra["comm_overheads"]
    assert rec["bytes"] == trace.nbytes  # every gradient, as the buckets hold them
    assert rec["bucket_copy_Bps"] == pytest.approx(rec["bytes"] / ((rec["bucket_copy_s"]["pack"]
                                                                     + rec["bucket_copy_s"]["unpack"]) / 2))
    assert rec["bucket_copy_Bps"] > 1e6  # a memcpy of ~1 MB runs far faster than 1 MB/s anywhere
    assert rec["device"] == trace.device["name"] and "median of" in rec["how"]
    assert rec["collective_overhead_s"] is None and rec["overlap_slowdown"] is None and rec["not_measured"]
    o = resolve(make_experiment(trace).comm, trace)
    assert o.bucket_copy_Bps == rec["bucket_copy_Bps"]
    assert o.sources["bucket_copy_Bps"].startswith(f"measured on {trace.device['name']} by the collector")
    assert o.sources["overlap_slowdown"] == "unmeasured: 1"


def test_overlap_slowdown_is_measured_on_request_and_reaches_the_simulator(tmp_path):
    import json
    import math
    import subprocess
    import sys

    trace = collect_model("mlp", 4, iterations=2, warmup=1, threads=1, overlap=True)
    rec = trace.extra["comm_overheads"]
    raw = rec["overlap_slowdown_raw"]
    assert math.isfinite(raw) and raw > 0
    assert rec["overlap_slowdown"] == max(1.0, raw) >= 1.0
    backward = rec["overlap_backward_s"]
    assert backward["alone"] > 0 and backward["with_comm"] / backward["alone"] == pytest.approx(raw)
    assert rec["overlap_allreduce_bytes"] == trace.nbytes and rec["overlap_allreduces"] >= 0
    assert "gloo allreduces" in rec["overlap_slowdown_how"] and "overlap_slowdown" not in rec["not_measured"]
    assert rec["bucket_copy_Bps"] > 0 and "--overlap" in trace.provenance.command
    trace.save(tmp_path / "t.json.gz")
    assert load_model_trace(tmp_path / "t.json.gz") == trace
    (tmp_path / "exp.toml").write_text('[workload]\ntrace = "t.json.gz"\ncompute = "mean"\n[cluster]\nnodes = 1\n'
                                       'gpus_per_node = 2\nnic_bandwidth = "25Gbit/s"\n[comm]\n')
    out = subprocess.run([sys.executable, "-m", "simfog.cli", "simulate", str(tmp_path / "exp.toml"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["overlap_slowdown"] == rec["overlap_slowdown"]
    assert s["overlap_slowdown_source"].startswith(f"measured on {trace.device['name']} by the collector (backward")
    assert s["bucket_copy_Bps_source"].startswith(f"measured on {trace.device['name']} by the collector (")
    assert "flat buffer" in s["bucket_copy_Bps_source"]


def test_cli_overlap_flag_is_off_by_default():
    assert _cli("mlp", "-o", "x.json").overlap is False and _cli("mlp", "--overlap", "-o", "x.json").overlap
