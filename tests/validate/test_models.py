"""The model zoo matches the published parameter counts; the big models are built on CPU, never run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the model zoo needs torch (pip install -e .[validate])")

from simfog.errors import ConfigError  # noqa: E402
from validate.collect import models  # noqa: E402

# Published counts (see validate/collect/models.py for sources), written out by hand.
PUBLISHED = {
    "resnet50": 25_557_032,      # torchvision resnet50
    "vgg16": 138_357_544,        # torchvision vgg16
    "densenet121": 7_978_856,    # torchvision densenet121
    "bert-base": 109_482_240,    # HF BertModel bert-base-uncased (the "110M" of Devlin et al.)
    "gpt2": 124_439_808,         # HF GPT2LMHeadModel "gpt2", tied LM head
    "resnet20": 269_722,         # He et al. 2016 CIFAR ResNet-20, option A ("0.27M")
    "mlp": (784 * 256 + 256) + (256 * 128 + 128) + (128 * 10 + 10),
}


@pytest.fixture(scope="module")
def built():
    return {name: models.build(name) for name in PUBLISHED}


def test_the_zoo_is_exactly_the_published_list():
    assert models.names() == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_equals_the_published_one(built, name):
    assert models.count_parameters(built[name]) == PUBLISHED[name]
    assert models.ZOO[name].parameters == PUBLISHED[name]


def test_resnet50_has_161_parameter_tensors_named_as_torchvision(built):
    named = dict(built["resnet50"].named_parameters())
    assert len(named) == 161  # 53 convs + 53 batch norms x 2 + fc weight and bias
    assert named["conv1.weight"].numel() == 64 * 3 * 7 * 7
    assert named["layer4.2.bn3.bias"].numel() == 2048
    assert named["layer1.0.downsample.0.weight"].numel() == 256 * 64
    assert named["fc.weight"].shape == (1000, 2048)


def test_bert_base_breaks_down_into_embeddings_layers_and_pooler(built):
    named = dict(built["bert-base"].named_parameters())
    embeddings = sum(p.numel() for n, p in named.items() if n.startswith("embeddings."))
    layer0 = sum(p.numel() for n, p in named.items() if n.startswith("encoder.layer.0."))
    pooler = sum(p.numel() for n, p in named.items() if n.startswith("pooler."))
    assert embeddings == (30522 + 512 + 2) * 768 + 2 * 768
    assert layer0 == 4 * (768 * 768 + 768) + 2 * 768 + (768 * 3072 + 3072) + (3072 * 768 + 768) + 2 * 768
    assert pooler == 768 * 768 + 768
    assert embeddings + 12 * layer0 + pooler == 109_482_240


def test_gpt2_lm_head_is_tied_to_the_token_embedding(built):
    gpt2 = built["gpt2"]
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight
    untied = sum(p.numel() for p in gpt2.parameters()) + 50257 * 768
    assert untied == 163_037_184  # what an untied head would count


def test_every_layer_is_a_single_use_non_inplace_module(built):
    for name, model in built.items():
        for module_name, module in model.named_modules():
            assert not getattr(module, "inplace", False), f"{name}: {module_name} is inplace"


@pytest.mark.parametrize("name, input_shape, target_shape", [
    ("resnet50", (2, 3, 224, 224), (2,)), ("vgg16", (2, 3, 224, 224), (2,)),
    ("densenet121", (2, 3, 224, 224), (2,)), ("bert-base", (2, 128), (2, 768)), ("gpt2", (2, 128), (2, 128)),
    ("resnet20", (2, 3, 32, 32), (2,)), ("mlp", (2, 784), (2,)),
])
def test_input_makers_give_one_batch(name, input_shape, target_shape):
    inputs, targets = models.ZOO[name].make_inputs(2, torch.Generator().manual_seed(0))
    assert [tuple(x.shape) for x in inputs] == [input_shape]
    assert tuple(targets.shape) == target_shape


@pytest.mark.parametrize("name", ["mlp", "resnet20"])
def test_tiny_models_train_and_every_parameter_gets_a_gradient(name):
    entry = models.ZOO[name]
    model = entry.build()
    inputs, targets = entry.make_inputs(2)
    entry.loss(model(*inputs), targets).backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


def test_unknown_model_names_the_model_and_the_allowed_ones():
    with pytest.raises(ConfigError) as e:
        models.build("resnet51")
    assert e.value.field == "model"
    message = str(e.value)
    assert "resnet51" in message and "\n" not in message
    assert all(name in message for name in PUBLISHED)
