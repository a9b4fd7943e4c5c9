"""Memory per rank (simfog.memory): hand-worked parts per algorithm and merge policy, the gpu_memory refusal, the
activation and output bytes of a trace (measured by the collector: an MLP worked out by hand) and their round
trip."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from simfog import cli
from simfog.cluster import Cluster, Link
from simfog.errors import ConfigError, Infeasible
from simfog.memory import HOROVOD_FUSION_BYTES, buffer_bytes
from simfog.simulation import simulate
from simfog.trace import Layer, load_model_trace

from .conftest import make_experiment, make_trace

MB = 10**6


def _trace(acts=(3 * MB, 5 * MB, 0.0), outs=(1 * MB, 2 * MB, 1 * MB)):
    """Three layers of 1, 2 and 0 million float32 elements (4 + 8 MB of parameters), activations and output bytes
    as given. Activation gradients in backward, (output, input) per layer: (1, 0), (2, 1), (1, 2) MB; the most
    alive at once 3 MB."""
    t = make_trace([1e-3] * 3, [2e-3] * 3, [MB, 2 * MB, 0])
    return replace(t, layers=tuple(replace(layer, activation_bytes=a, output_bytes=o)
                                   for layer, a, o in zip(t.layers, acts, outs)))


def _peak(merge="ddp", **kw):
    return simulate(make_experiment(_trace(), merge=merge, **kw)).summary()


def test_parts_by_hand_for_ddp_and_adam():
    s = _peak("ddp")
    assert s["memory_parameters_B"] == s["memory_gradients_B"] == 12 * MB
    assert s["memory_optimizer_B"] == 12 * MB      # SGD with momentum (the default): one buffer per parameter
    assert s["memory_buffers_B"] == 12 * MB        # DDP copies every gradient into its bucket buffers
    assert s["memory_activations_B"] == 8 * MB
    assert s["memory_activation_grads_B"] == 3 * MB  # l2's output gradient (1) and input gradient (l1's output, 2)
    assert s["memory_peak_B"] == 59 * MB and s["memory_complete"] is True
    adam = make_experiment(_trace(), merge="ddp")
    adam = replace(adam, workload=replace(adam.workload, optimizer="adam"))
    assert simulate(adam).summary()["memory_optimizer_B"] == 24 * MB


def test_buffers_by_merge_policy():
    assert _peak("wfbp")["memory_buffers_B"] == 0             # every tensor reduced in place
    assert _peak("single")["memory_buffers_B"] == 12 * MB     # one flat buffer of both tensors
    assert _peak("horovod")["memory_buffers_B"] == 12 * MB    # the fusion buffer, at most the model
    assert buffer_bytes("horovod", [], 10**9)[0] == HOROVOD_FUSION_BYTES
    # threshold 5 MB: buckets [8 MB] then [4 MB] in ready order, each alone: no flat buffer
    assert _peak("threshold", threshold_bytes=5 * MB)["memory_buffers_B"] == 0
    assert buffer_bytes("bagua", [(8 * MB, 1), (4 * MB, 2), (1 * MB, 3)], 13 * MB)[0] == 5 * MB


def test_decentralized_holds_one_received_model():
    s = simulate(make_experiment(_trace(), algorithm="neighbor", topology="ring", collective="ring")).summary()
    assert s["memory_buffers_B"] == 12 * MB


def test_unknown_activations_are_said_unknown():
    exp = make_experiment(_trace(acts=(None, 5 * MB, 0.0)), merge="ddp")
    s = simulate(exp).summary()
    assert s["memory_activations_B"] is None and s["memory_complete"] is False
    assert s["memory_peak_B"] == 51 * MB  # the known parts only
    s = simulate(make_experiment(_trace(outs=(1 * MB, None, 1 * MB)), merge="ddp")).summary()
    assert s["memory_activation_grads_B"] is None and s["memory_complete"] is False
    assert s["memory_peak_B"] == 56 * MB


def test_gpu_memory_refuses_what_does_not_fit():
    exp = make_experiment(_trace(), merge="ddp")
    tight = replace(exp, cluster=replace(exp.cluster, gpu_memory_B=50 * MB))
    with pytest.raises(Infeasible, match=r"needs 56\.27 MiB per rank .* activation gradients 2\.861 MiB\), over "
                                         r"cluster.gpu_memory = 47\.68 MiB"):
        simulate(tight)
    roomy = replace(exp, cluster=replace(exp.cluster, gpu_memory_B=60 * MB))
    assert simulate(roomy).summary()["memory_peak_B"] == 59 * MB
    with pytest.raises(ConfigError, match="cluster.gpu_memory"):
        Cluster(1, 1, Link(0, 1e9), Link(0, 1e9), gpu_memory_B=0.0)


def test_experiment_file_keys_and_cli(tmp_path, capsys):
    t = _trace()
    t.save(tmp_path / "t.json")
    f = tmp_path / "e.toml"
    f.write_text('[workload]\ntrace = "t.json"\noptimizer = "adamw"\n[cluster]\nnodes = 2\n'
                 'nic_bandwidth = "10Gbit/s"\ngpu_memory = "1GB"\n')
    assert cli.main(["simulate", str(f), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["memory_optimizer_B"] == 24 * MB and s["memory_peak_B"] == (12 + 12 + 24 + 12 + 8 + 3) * MB
    f.write_text(f.read_text().replace('"1GB"', '"10MB"'))
    assert cli.main(["simulate", str(f)]) == 2
    assert "over cluster.gpu_memory" in capsys.readouterr().err
    f.write_text(f.read_text().replace('"adamw"', '"lion"'))
    assert cli.main(["simulate", str(f)]) == 2
    assert "workload.optimizer = 'lion': one of sgd, momentum, adam, adamw" in capsys.readouterr().err


def test_activation_bytes_round_trip(tmp_path):
    _trace().save(tmp_path / "t.json")
    layers = load_model_trace(tmp_path / "t.json").layers
    assert [layer.activation_bytes for layer in layers] == [3 * MB, 5 * MB, 0]
    assert [layer.output_bytes for layer in layers] == [1 * MB, 2 * MB, 1 * MB]
    for key in ("activation_bytes", "output_bytes"):
        bad = json.loads((tmp_path / "t.json").read_text())
        bad["layers"][0][key] = -1
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=rf"layers\[0\]\.{key}"):
            load_model_trace(tmp_path / "bad.json")
    assert Layer("x", (1.0,), (1.0,)).activation_bytes is None and Layer("x", (1.0,), (1.0,)).output_bytes is None


def test_mlp_activations_by_hand():
    """MLP 784-256-128-10 at batch 16, float32: Linear 0 keeps its input (16x784x4 = 50,176 B; its weight is a
    parameter), ReLU 1 its output (16x256x4 = 16,384), Linear 2 the same tensor (counted once: 0), ReLU 3 its output
    (8,192), Linear 4 again the same; the loss (charged to the last layer) log_softmax's output (16x10x4 = 640), the
    int64 targets (128) and nll_loss's total weight (a float32 scalar, 4): 772. Output bytes: 16x256x4 = 16,384
    (Linear 0 and ReLU 1), 16x128x4 = 8,192 (Linear 2 and ReLU 3), 16x10x4 = 640 (the logits)."""
    pytest.importorskip("torch")
    from validate.collect.collect_model import measure_activations

    got = measure_activations("mlp", 16)
    assert got["layers"] == {"layers.0": 50_176, "layers.1": 16_384, "layers.2": 0, "layers.3": 8_192,
                             "layers.4": 772}
    assert got["outputs"] == {"layers.0": 16_384, "layers.1": 16_384, "layers.2": 8_192, "layers.3": 8_192,
                              "layers.4": 640}


def test_shipped_traces_carry_activations():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "traces"
    t = load_model_trace(root / "resnet50-cpu-b32.json.gz")
    assert all(layer.activation_bytes is not None and layer.output_bytes is not None for layer in t.layers)
    assert 2e9 < sum(layer.activation_bytes for layer in t.layers) < 4e9  # ~85 MB per 224x224 image in float32
    assert "saved_tensors_hooks" in t.extra["activation_bytes_how"]


def test_plan_reports_memory_and_never_recommends_what_does_not_fit(tmp_path):
    """Two options alike but for device memory: the 40 MB one cannot hold the 59 MB this workload needs per GPU,
    so every one of its candidates is refused with the reason, and the plan recommends the 80 MB one."""
    from simfog.plan import load_catalogue, plan

    cat = tmp_path / "c.toml"
    option = ('gpus_per_node = 2\nmax_nodes = 8\nintra_bandwidth = "100GB/s"\nnic_bandwidth = "100Gbit/s"\n'
              'price_per_gpu_hour = {price}\nmerges = ["ddp"]\ngpu_memory = "{mem}"\n')
    cat.write_text('currency = "USD"\n[[option]]\nname = "small"\n' + option.format(price=1.0, mem="40MB")
                   + '[[option]]\nname = "big"\n' + option.format(price=2.0, mem="80MB"))
    exp = make_experiment(_trace(), merge="ddp")
    result = plan(exp, load_catalogue(cat), target_samples_per_s=1000.0)
    df = result.candidates
    small, big = df[df.option == "small"], df[df.option == "big"]
    assert len(small) and all("over cluster.gpu_memory" in e for e in small.error)
    assert len(big) and not any("over cluster.gpu_memory" in e for e in big.error)
    assert not small.meets_target.any()
    assert result.best["option"] == "big" and result.best["memory_peak_B"] == 59 * MB
    assert result.best["memory_complete"] is True or result.best["memory_complete"] == True  # noqa: E712
    from simfog.commands.plan import _memory

    assert _memory(56e6, True) == "53.41 MiB" and _memory(48e6, False) == "45.78 MiB+?"
