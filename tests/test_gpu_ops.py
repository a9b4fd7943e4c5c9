"""A layer's operators in a trace (simfog.gpu.ops): recorded from the zoo, saved and loaded as they were, and a bad
entry named by its field."""

from dataclasses import replace
from pathlib import Path

import pytest

from simfog.errors import ConfigError
from simfog.trace import load_model_trace, model_trace_from_dict

REPO = Path(__file__).resolve().parents[1]


def test_ops_round_trip_and_bad_entries_name_their_field(tmp_path):
    r50 = load_model_trace(REPO / "traces" / "resnet50-cpu-b32.json.gz")
    conv1 = r50.layers[0].ops[0]
    # ResNet-50's first convolution: 32 images of 3 x 224 x 224, 64 filters of 7 x 7, stride 2, output 112 x 112,
    # and no input gradient (the images need none)
    assert {k: conv1[k] for k in ("n", "c", "h", "w", "k", "r", "s", "p", "q", "stride", "groups", "grad")} == \
        {"n": 32, "c": 3, "h": 224, "w": 224, "k": 64, "r": 7, "s": 7, "p": 112, "q": 112, "stride": [2, 2],
         "groups": 1, "grad": False}
    r50.save(tmp_path / "t.json.gz")
    assert load_model_trace(tmp_path / "t.json.gz").layers == r50.layers
    d = r50.to_dict()
    del d["layers"][0]["ops"][0]["k"]
    with pytest.raises(ConfigError, match=r"layers\[0\]\.ops\[0\]\.k"):
        model_trace_from_dict(d)
    d = r50.to_dict()
    d["layers"][1]["ops"][0]["kind"] = "fft"
    with pytest.raises(ConfigError, match=r"layers\[1\]\.ops\[0\]\.kind"):
        model_trace_from_dict(d)
    d = r50.to_dict()
    d["layers"][0]["ops"][0]["stride"] = [2]
    with pytest.raises(ConfigError, match=r"layers\[0\]\.ops\[0\]\.stride"):
        model_trace_from_dict(d)


def test_collect_ops_restores_what_the_shipped_trace_holds(tmp_path, capsys):
    pytest.importorskip("torch")
    from simfog import cli

    mlp = load_model_trace(REPO / "traces" / "mlp-cpu-b1024.json.gz")
    bare = replace(mlp, layers=tuple(replace(layer, ops=()) for layer in mlp.layers))
    bare.save(tmp_path / "bare.json.gz")
    assert cli.main(["collect", "ops", str(tmp_path / "bare.json.gz"), "-o", str(tmp_path / "ops.json.gz")]) == 0
    assert "6 operators over 5 layers" in capsys.readouterr().out
    back = load_model_trace(tmp_path / "ops.json.gz")
    assert [layer.ops for layer in back.layers] == [layer.ops for layer in mlp.layers]
    assert [layer.forward_s for layer in back.layers] == [layer.forward_s for layer in mlp.layers]
    # a trace of another model is refused, naming the layer
    other = replace(bare, model="resnet20")
    other.save(tmp_path / "other.json.gz")
    assert cli.main(["collect", "ops", str(tmp_path / "other.json.gz"), "-o", str(tmp_path / "x.json.gz")]) == 2
    assert "layers" in capsys.readouterr().err and not (tmp_path / "x.json.gz").exists()
