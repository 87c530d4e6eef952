"""Model zoo behind a small registry.

``create(name, num_classes=10, in_channels=1, input_size=28, mean=None, std=None)`` returns an
``nn.Module`` that takes images in [0, 1] (N x C x H x W) and returns logits (N x K). When ``mean`` and
``std`` are given, a :class:`Normalize` layer inside the model standardises the input, so attacks,
fuzzers and corruptions all work in pixel space. Each model carries its spec in ``model.robustest_spec``
(registry name and keyword arguments), which checkpoints store so that the model can be rebuilt.

Adding a model is adding one function decorated with :func:`register`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robustest.errors import ConfigError
from robustest.runtime import logits_of

__all__ = ["Logits", "Normalize", "create", "describe", "logits_of", "names", "register", "spec_of"]

_REGISTRY: dict[str, tuple[Callable[..., nn.Module], str]] = {}


def register(name: str, description: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator adding a builder ``fn(num_classes, in_channels, input_size) -> nn.Module`` to the zoo."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        _REGISTRY[name] = (fn, description)
        return fn

    return deco


def names() -> list[str]:
    """Registered model names."""
    return sorted(_REGISTRY)


def describe(name: str) -> str:
    """One-line description of a registered model."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(names())}")
    return _REGISTRY[name][1]


class Normalize(nn.Module):
    """Per-channel standardisation ``(x - mean) / std`` inside the model. x: N x C x H x W."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        mean_t = torch.as_tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1)
        std_t = torch.as_tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1)
        if bool((std_t <= 0).any()):
            raise ConfigError(f"std must be positive, got {list(std)}")
        self.register_buffer("mean", mean_t)
        self.register_buffer("std", std_t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"


class Logits(nn.Module):
    """Wrap a model whose forward returns more than logits, selecting them with ``output``.

    ``output`` is a dict key or attribute name (str), a tuple/list position (int), or a callable mapping the
    raw output to the N x K logits; None uses :func:`robustest.runtime.logits_of`'s rules (a tensor, the
    ``logits`` attribute/key, the first tensor of a tuple or dict). The wrapped model is ``self.model``, so
    its parameters and state_dict keys (prefixed ``model.``) stay reachable.
    """

    def __init__(self, model: nn.Module, output: str | int | Callable[[Any], torch.Tensor] | None = None) -> None:
        super().__init__()
        if output is not None and not isinstance(output, (str, int)) and not callable(output):
            raise ConfigError(f"output must be a key, an index or a callable, got {type(output).__name__}")
        self.model = model
        self.output = output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        sel = self.output
        if sel is None:
            return logits_of(out)
        if callable(sel):
            return sel(out)
        try:
            if isinstance(sel, int):
                return out[sel]
            return out[sel] if isinstance(out, dict) else getattr(out, sel)
        except (KeyError, IndexError, AttributeError, TypeError) as exc:
            raise ConfigError(f"the model's output ({type(out).__name__}) has no part {sel!r}: "
                              "check the output= key or index") from exc


def create(name: str, num_classes: int = 10, in_channels: int = 1, input_size: int = 28,
           mean: Sequence[float] | float | None = None, std: Sequence[float] | float | None = None) -> nn.Module:
    """Build model ``name`` for ``in_channels`` x ``input_size`` x ``input_size`` inputs in [0, 1].

    Returns an ``nn.Module`` mapping N x C x H x W to logits N x ``num_classes``.
    """
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(names())}")
    if num_classes < 2:
        raise ConfigError(f"num_classes must be >= 2, got {num_classes}")
    if in_channels < 1:
        raise ConfigError(f"in_channels must be >= 1, got {in_channels}")
    if input_size < 4:
        raise ConfigError(f"input_size must be >= 4, got {input_size}")
    if (mean is None) != (std is None):
        raise ConfigError("give both mean and std (or neither)")

    def per_channel(v: Sequence[float] | float) -> list[float]:
        vals = [float(v)] * in_channels if isinstance(v, (int, float)) else [float(t) for t in v]
        if len(vals) != in_channels:
            raise ConfigError(f"mean/std need {in_channels} values (one per channel), got {len(vals)}")
        return vals

    mean_l = per_channel(mean) if mean is not None else None
    std_l = per_channel(std) if std is not None else None
    try:
        net = _REGISTRY[name][0](num_classes=num_classes, in_channels=in_channels, input_size=input_size)
    except RuntimeError as exc:  # e.g. an input too small for the architecture's pooling
        raise ConfigError(f"model {name!r} cannot take {in_channels}x{input_size}x{input_size} inputs: {exc}") from exc
    model: nn.Module = net
    if mean_l is not None and std_l is not None:
        model = _WithNormalize(Normalize(mean_l, std_l), net)
    model.robustest_spec = {  # type: ignore[assignment]
        "name": name, "num_classes": num_classes, "in_channels": in_channels, "input_size": input_size,
        "mean": mean_l, "std": std_l,
    }
    return model


def spec_of(model: nn.Module) -> dict[str, Any]:
    """The spec (registry name and kwargs) a zoo model was built from."""
    spec = getattr(model, "robustest_spec", None)
    if spec is None:
        raise ConfigError("model was not built by robustest.models.create; pass its spec explicitly")
    return dict(spec)


class _WithNormalize(nn.Sequential):
    def __init__(self, norm: Normalize, net: nn.Module) -> None:
        super().__init__(OrderedDict([("normalize", norm), ("net", net)]))


def _flat_size(features: nn.Module, in_channels: int, input_size: int) -> int:
    with torch.no_grad():
        out = features(torch.zeros(1, in_channels, input_size, input_size))
    if out.numel() == 0:
        raise RuntimeError("feature map is empty")
    return int(out.numel())


def _with_head(features: OrderedDict[str, nn.Module], head: OrderedDict[str, nn.Module],
               in_channels: int, input_size: int, first_fc: str) -> nn.Sequential:
    feat = nn.Sequential(features)
    flat = _flat_size(feat, in_channels, input_size)
    layers = OrderedDict(list(features.items()) + [("flatten", nn.Flatten())])
    for key, mod in head.items():
        if key == first_fc:
            assert isinstance(mod, nn.Linear)
            mod = nn.Linear(flat, mod.out_features)
        layers[key] = mod
    return nn.Sequential(layers)


@register("lenet1", "LeNet-1: conv 4@5x5, pool, conv 12@5x5, pool, FC K")
def lenet1(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> nn.Module:
    feats = OrderedDict([
        ("conv1", nn.Conv2d(in_channels, 4, 5)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(4, 12, 5)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
    ])
    head = OrderedDict([("fc", nn.Linear(1, num_classes))])
    return _with_head(feats, head, in_channels, input_size, "fc")


@register("lenet5", "LeNet-5: conv 6@5x5 same, pool, conv 16@5x5, pool, FC 120, 84, K")
def lenet5(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> nn.Module:
    feats = OrderedDict([
        ("conv1", nn.Conv2d(in_channels, 6, 5, padding=2)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(6, 16, 5)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
    ])
    head = OrderedDict([
        ("fc1", nn.Linear(1, 120)), ("relu3", nn.ReLU()),
        ("fc2", nn.Linear(120, 84)), ("relu4", nn.ReLU()),
        ("fc3", nn.Linear(84, num_classes)),
    ])
    return _with_head(feats, head, in_channels, input_size, "fc1")


@register("convnet", "RobOT's Fashion ConvNet: conv 32-32-pool-64-64-pool (3x3), FC 512, dropout 0.5, K")
def convnet(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> nn.Module:
    feats = OrderedDict([
        ("conv1", nn.Conv2d(in_channels, 32, 3)), ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(32, 32, 3)), ("relu2", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv3", nn.Conv2d(32, 64, 3)), ("relu3", nn.ReLU()),
        ("conv4", nn.Conv2d(64, 64, 3)), ("relu4", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
    ])
    head = OrderedDict([
        ("fc1", nn.Linear(1, 512)), ("relu5", nn.ReLU()), ("dropout", nn.Dropout(0.5)),
        ("fc2", nn.Linear(512, num_classes)),
    ])
    return _with_head(feats, head, in_channels, input_size, "fc1")


@register("digits_cnn", "small CNN for 8x8 digits: conv 32, conv 64, pool, FC 128, K")
def digits_cnn(num_classes: int = 10, in_channels: int = 1, input_size: int = 8) -> nn.Module:
    feats = OrderedDict([
        ("conv1", nn.Conv2d(in_channels, 32, 3, padding=1)), ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(32, 64, 3, padding=1)), ("relu2", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
    ])
    head = OrderedDict([
        ("fc1", nn.Linear(1, 128)), ("relu3", nn.ReLU()), ("dropout", nn.Dropout(0.25)),
        ("fc2", nn.Linear(128, num_classes)),
    ])
    return _with_head(feats, head, in_channels, input_size, "fc1")


@register("mlp", "two-layer perceptron: FC 256, FC 256, K (for quick experiments)")
def mlp(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> nn.Module:
    d = in_channels * input_size * input_size
    return nn.Sequential(OrderedDict([
        ("flatten", nn.Flatten()), ("fc1", nn.Linear(d, 256)), ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(256, 256)), ("relu2", nn.ReLU()), ("fc3", nn.Linear(256, num_classes)),
    ]))


# --------------------------------------------------------------------------------------------- ResNet-20
class _BasicBlock(nn.Module):
    """He et al. (2016) CIFAR basic block with option-A (parameter-free, zero-padded) shortcuts."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.stride = stride
        self.pad = c_out - c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        short = x
        if self.stride != 1 or self.pad:
            short = x[:, :, :: self.stride, :: self.stride]
            short = F.pad(short, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + short)


class ResNetCifar(nn.Module):
    """CIFAR ResNet (He et al. 2016, section 4.2): 6n+2 layers, 16/32/64 channels, global average pool."""

    def __init__(self, depth: int = 20, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ConfigError("ResNet depth must be 6n+2 (20, 32, 44, 56, 110)")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers = []
        c_in = 16
        for stage, c_out in enumerate((16, 32, 64)):
            blocks = []
            for i in range(n):
                stride = 2 if (stage > 0 and i == 0) else 1
                blocks.append(_BasicBlock(c_in, c_out, stride))
                c_in = c_out
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = layers
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


@register("resnet20", "He et al.'s CIFAR ResNet-20 (3x3 basic blocks 16/32/64, option-A shortcuts)")
def resnet20(num_classes: int = 10, in_channels: int = 3, input_size: int = 32) -> nn.Module:
    return ResNetCifar(20, num_classes, in_channels)
