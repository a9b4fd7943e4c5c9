"""The model zoo: the networks simfog traces and validates, in plain torch.nn (no torchvision, no transformers).
Over 400 lines because it holds seven whole networks (ResNet-50, VGG-16, DenseNet-121, BERT-base, GPT-2, ResNet-20,
an MLP), each checked against its reference parameter count.

Parameter names and counts follow the reference implementations, so a trace's tensor names and sizes are the ones
a real DDP/Horovod run of that model communicates:

| name          | parameters  | reference                                                          |
|---------------|-------------|--------------------------------------------------------------------|
| resnet50      | 25,557,032  | torchvision.models.resnet50 (161 parameter tensors)                |
| vgg16         | 138,357,544 | torchvision.models.vgg16 (no batch norm)                           |
| densenet121   | 7,978,856   | torchvision.models.densenet121                                     |
| bert-base     | 109,482,240 | HF transformers BertModel, bert-base-uncased: embeddings, 12       |
|               |             | encoder layers and pooler; the "110M" of Devlin et al. 2019, Tab. 1 |
| gpt2          | 124,439,808 | HF transformers GPT2LMHeadModel "gpt2" (LM head tied to wte)       |
| resnet20      | 269,722     | He et al. 2016, Sec. 4.2 (CIFAR, option A shortcuts: "0.27M")      |
| mlp           | 235,146     | 784-256-128-10, for fast tests                                     |

Every activation is a separate, non-inplace module: a layer must be a leaf module called once per forward so the
collector can time it with module hooks, and inplace ops break full backward hooks (torch.nn.Module docs).
This module is torch-only and imports torch at module level; `simfog` never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from simfog.errors import ConfigError

SEQ_LEN = 128  # tokens per sample for bert-base and gpt2


# ---- ResNet-50 (torchvision.models.resnet, Bottleneck v1.5: stride on the 3x3 conv) ----

class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        width, out = planes, planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))
        self.relu3 = nn.ReLU()

    def forward(self, x):
        y = self.bn3(self.conv3(self.relu2(self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x))))))))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu3(y + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes, stages = 64, []
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layers = [Bottleneck(inplanes, planes, stride)]
            inplanes = planes * Bottleneck.expansion
            layers += [Bottleneck(inplanes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---- VGG-16 (torchvision.models.vgg, configuration "D") ----

class VGG16(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers, channels = [], 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU()]
                channels = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(0.5), nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# ---- DenseNet-121 (torchvision.models.densenet: growth 32, blocks 6-12-24-16, bn_size 4) ----

class DenseLayer(nn.Module):
    def __init__(self, in_features: int, growth: int = 32, bn_size: int = 4):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(in_features)
        self.relu1 = nn.ReLU()
        self.conv1 = nn.Conv2d(in_features, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, in_features: int):
        super().__init__({f"denselayer{i + 1}": DenseLayer(in_features + i * 32) for i in range(layers)})

    def forward(self, x):
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(in_features)
        self.relu = nn.ReLU()
        self.conv = nn.Conv2d(in_features, out_features, 1, bias=False)
        self.pool = nn.AvgPool2d(2, 2)


class DenseNet121(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        f = nn.Sequential()
        f.add_module("conv0", nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False))
        f.add_module("norm0", nn.BatchNorm2d(64))
        f.add_module("relu0", nn.ReLU())
        f.add_module("pool0", nn.MaxPool2d(3, stride=2, padding=1))
        n = 64
        for i, layers in enumerate((6, 12, 24, 16)):
            f.add_module(f"denseblock{i + 1}", DenseBlock(layers, n))
            n += layers * 32
            if i != 3:
                f.add_module(f"transition{i + 1}", Transition(n, n // 2))
                n //= 2
        f.add_module("norm5", nn.BatchNorm2d(n))
        self.features = f
        self.relu = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(n, num_classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.relu(self.features(x))), 1))


# ---- CIFAR ResNet-20 (He et al. 2016, Sec. 4.2; option A: parameter-free zero-padded shortcuts) ----

class PadShortcut(nn.Module):
    """Option A shortcut: subsample by 2 and zero-pad the new channels (no parameters)."""

    def __init__(self, extra_channels: int):
        super().__init__()
        self.extra = extra_channels

    def forward(self, x):
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = PadShortcut(planes - inplanes) if stride != 1 or inplanes != planes else None
        self.relu2 = nn.ReLU()

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet20(nn.Module):
    def __init__(self, num_classes: int = 10, blocks: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        inplanes, stages = 16, []
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            stages.append(nn.Sequential(BasicBlock(inplanes, planes, stride),
                                        *[BasicBlock(planes, planes) for _ in range(blocks - 1)]))
            inplanes = planes
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x))))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (784, 256, 128, 10)):
        super().__init__()
        layers = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)


# ---- BERT-base (HF transformers BertModel names) and GPT-2 small (HF GPT2LMHeadModel names) ----

def _init_transformer(model: nn.Module) -> None:
    # HF transformers' _init_weights: N(0, 0.02) weights, zero biases; default init makes GPT-2's tied logits huge.
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


class SelfAttention(nn.Module):
    """Multi-head attention core: the projections are the caller's leaf Linear modules; SDPA runs between them."""

    def __init__(self, heads: int, dropout: float, causal: bool):
        super().__init__()
        self.heads, self.dropout, self.causal = heads, dropout, causal

    def split(self, x):  # (B, T, C) -> (B, heads, T, C / heads)
        b, t, c = x.shape
        return x.view(b, t, self.heads, c // self.heads).transpose(1, 2)

    def attend(self, q, k, v):
        y = F.scaled_dot_product_attention(self.split(q), self.split(k), self.split(v), is_causal=self.causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        return y.transpose(1, 2).reshape(q.shape)


class BertSelf(SelfAttention):
    def __init__(self, hidden: int = 768, heads: int = 12):
        super().__init__(heads, 0.1, causal=False)
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x):
        return self.attend(self.query(x), self.key(x), self.value(x))


class BertOutput(nn.Module):
    """dense -> dropout -> LayerNorm(x + residual): BertSelfOutput and BertOutput."""

    def __init__(self, inner: int, hidden: int = 768):
        super().__init__()
        self.dense = nn.Linear(inner, hidden)
        self.dropout = nn.Dropout(0.1)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertLayer(nn.Module):
    def __init__(self, hidden: int = 768, inner: int = 3072):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = BertSelf(hidden)
        self.attention.output = BertOutput(hidden, hidden)
        self.intermediate = nn.Sequential()
        self.intermediate.add_module("dense", nn.Linear(hidden, inner))
        self.intermediate.add_module("intermediate_act_fn", nn.GELU())
        self.output = BertOutput(inner, hidden)

    def forward(self, x):
        x = self.attention.output(self.attention.self(x), x)
        return self.output(self.intermediate(x), x)


class BertBase(nn.Module):
    VOCAB, HIDDEN = 30522, 768

    def __init__(self, layers: int = 12, max_positions: int = 512):
        super().__init__()
        e = self.embeddings = nn.Module()
        e.word_embeddings = nn.Embedding(self.VOCAB, self.HIDDEN, padding_idx=0)
        e.position_embeddings = nn.Embedding(max_positions, self.HIDDEN)
        e.token_type_embeddings = nn.Embedding(2, self.HIDDEN)
        e.LayerNorm = nn.LayerNorm(self.HIDDEN, eps=1e-12)
        e.dropout = nn.Dropout(0.1)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(BertLayer() for _ in range(layers))
        self.pooler = nn.Sequential()
        self.pooler.add_module("dense", nn.Linear(self.HIDDEN, self.HIDDEN))
        self.pooler.add_module("activation", nn.Tanh())
        _init_transformer(self)

    def forward(self, input_ids):
        e, t = self.embeddings, input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device).unsqueeze(0)
        x = e.word_embeddings(input_ids) + e.position_embeddings(positions)
        x = e.dropout(e.LayerNorm(x + e.token_type_embeddings(torch.zeros_like(input_ids))))
        for layer in self.encoder.layer:
            x = layer(x)
        return self.pooler(x[:, 0])  # pooled output of the first ([CLS]) token


class GPT2Attention(SelfAttention):
    def __init__(self, hidden: int = 768, heads: int = 12):
        super().__init__(heads, 0.1, causal=True)
        self.c_attn = nn.Linear(hidden, 3 * hidden)  # HF uses Conv1D: same elements, transposed weight
        self.c_proj = nn.Linear(hidden, hidden)
        self.resid_dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.resid_dropout(self.c_proj(self.attend(*self.c_attn(x).split(x.shape[-1], dim=2))))


class GPT2Block(nn.Module):
    def __init__(self, hidden: int = 768):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = GPT2Attention(hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential()
        for name, m in (("c_fc", nn.Linear(hidden, 4 * hidden)), ("act", nn.GELU(approximate="tanh")),
                        ("c_proj", nn.Linear(4 * hidden, hidden)), ("dropout", nn.Dropout(0.1))):
            self.mlp.add_module(name, m)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Small(nn.Module):
    VOCAB, HIDDEN = 50257, 768

    def __init__(self, layers: int = 12, max_positions: int = 1024):
        super().__init__()
        t = self.transformer = nn.Module()
        t.wte = nn.Embedding(self.VOCAB, self.HIDDEN)
        t.wpe = nn.Embedding(max_positions, self.HIDDEN)
        t.drop = nn.Dropout(0.1)
        t.h = nn.ModuleList(GPT2Block(self.HIDDEN) for _ in range(layers))
        t.ln_f = nn.LayerNorm(self.HIDDEN)
        self.lm_head = nn.Linear(self.HIDDEN, self.VOCAB, bias=False)
        self.lm_head.weight = t.wte.weight  # tied: one tensor, one gradient, counted once
        _init_transformer(self)

    def forward(self, input_ids):
        t = self.transformer
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = t.drop(t.wte(input_ids) + t.wpe(positions))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


# ---- the registry ----

@dataclass(frozen=True)
class ZooModel:
    """A model of the zoo: how to build it, feed it and score it."""

    build: Callable[[], nn.Module]
    make_inputs: Callable[..., tuple[tuple[torch.Tensor, ...], torch.Tensor]]  # (batch_size, generator=None)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    parameters: int        # the published parameter count the build matches
    description: str


def _images(size: int, classes: int):
    def make(batch_size: int, generator: torch.Generator | None = None):
        x = torch.randn(batch_size, 3, size, size, generator=generator)
        return (x,), torch.randint(0, classes, (batch_size,), generator=generator)
    return make


def _mlp_inputs(batch_size: int, generator: torch.Generator | None = None):
    return (torch.randn(batch_size, 784, generator=generator),), torch.randint(0, 10, (batch_size,),
                                                                              generator=generator)


def _bert_inputs(batch_size: int, generator: torch.Generator | None = None):
    ids = torch.randint(0, BertBase.VOCAB, (batch_size, SEQ_LEN), generator=generator)
    return (ids,), torch.randn(batch_size, BertBase.HIDDEN, generator=generator)


def _gpt2_inputs(batch_size: int, generator: torch.Generator | None = None):
    ids = torch.randint(0, GPT2Small.VOCAB, (batch_size, SEQ_LEN + 1), generator=generator)
    return (ids[:, :-1],), ids[:, 1:]  # next-token targets


def _classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, targets)


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _pooled_loss(pooled: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # No task head, so the parameter count stays BertModel's; MSE on the pooled output reaches every parameter.
    return F.mse_loss(pooled, targets)


ZOO: dict[str, ZooModel] = {
    "resnet50": ZooModel(ResNet50, _images(224, 1000), _classification_loss, 25_557_032,
                         "ResNet-50 v1.5, ImageNet 224x224, as torchvision"),
    "vgg16": ZooModel(VGG16, _images(224, 1000), _classification_loss, 138_357_544,
                      "VGG-16 (no batch norm), ImageNet 224x224, as torchvision"),
    "densenet121": ZooModel(DenseNet121, _images(224, 1000), _classification_loss, 7_978_856,
                            "DenseNet-121, ImageNet 224x224, as torchvision"),
    "bert-base": ZooModel(BertBase, _bert_inputs, _pooled_loss, 109_482_240,
                          f"BERT-base encoder with embeddings and pooler, sequence length {SEQ_LEN}"),
    "gpt2": ZooModel(GPT2Small, _gpt2_inputs, _lm_loss, 124_439_808,
                     f"GPT-2 small with tied LM head, sequence length {SEQ_LEN}"),
    "resnet20": ZooModel(ResNet20, _images(32, 10), _classification_loss, 269_722,
                         "CIFAR ResNet-20 (option A shortcuts), 32x32"),
    "mlp": ZooModel(MLP, _mlp_inputs, _classification_loss, 235_146, "MLP 784-256-128-10, for fast tests"),
}


def names() -> list[str]:
    """The zoo's model names, sorted."""
    return sorted(ZOO)


def get(name: object) -> ZooModel:
    """The zoo entry called `name`. Raises ConfigError(field "model") listing the allowed names otherwise."""
    if not isinstance(name, str) or name not in ZOO:
        raise ConfigError("model", name, f"one of {', '.join(names())}")
    return ZOO[name]


def build(name: object) -> nn.Module:
    """A fresh model `name` (train mode, float32, on CPU). Raises ConfigError for an unknown name."""
    return get(name).build()


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements; a tied (shared) tensor counts once, as `model.parameters()` yields it once."""
    return sum(p.numel() for p in model.parameters())
