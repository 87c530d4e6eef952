"""The small zoo models: LeNet-1, LeNet-5, RobOT's Fashion ConvNet, the two CNNs of the adversarial-training
literature at MNIST scale (``mnist_small``, ``madry_cnn``), a CNN for 8x8 digits, an MLP.

Each flattens its last feature map into fully-connected layers, so a model takes only the input size it was
built for (the first FC layer is sized from it).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from robustest.core.validation import check_int
from robustest.models.registry import register


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


@register("lenet1", "LeNet-1: conv 4@5x5, pool, conv 12@5x5, pool, FC K", min_size=16)
def lenet1(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> nn.Module:
    feats = OrderedDict([
        ("conv1", nn.Conv2d(in_channels, 4, 5)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(4, 12, 5)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
    ])
    head = OrderedDict([("fc", nn.Linear(1, num_classes))])
    return _with_head(feats, head, in_channels, input_size, "fc")


@register("lenet5", "LeNet-5: conv 6@5x5 same, pool, conv 16@5x5, pool, FC 120, 84, K", min_size=12)
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


@register("convnet", "RobOT's Fashion ConvNet: conv 32-32-pool-64-64-pool (3x3), FC 512, dropout 0.5, K",
          min_size=16)
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


@register("mnist_small", "small CNN of the adversarial-training literature: conv 16@4x4 s2, conv 32@4x4 s2, FC 100, K "
          "(each times the width W of mnist_small-xW)", min_size=8, pattern=r"mnist_small-x(?P<width>\d+)",
          form="mnist_small-xW", variants=("mnist_small-x2",))
def mnist_small(num_classes: int = 10, in_channels: int = 1, input_size: int = 28, width: int = 1) -> nn.Module:
    """The MNIST network of Wong & Kolter (2018) and Wong et al. (2020): two stride-2 convolutions (4x4, padding 1)
    and one hidden FC layer of 100; 166k parameters at 28x28. ``width`` multiplies the channels and the hidden
    units (``mnist_small-x2``: 32, 64 and 200; 663k parameters)."""
    w = check_int("width", width, lo=1)
    feats = OrderedDict([
        ("conv1", nn.Conv2d(in_channels, 16 * w, 4, stride=2, padding=1)), ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(16 * w, 32 * w, 4, stride=2, padding=1)), ("relu2", nn.ReLU()),
    ])
    head = OrderedDict([("fc1", nn.Linear(1, 100 * w)), ("relu3", nn.ReLU()),
                        ("fc2", nn.Linear(100 * w, num_classes))])
    return _with_head(feats, head, in_channels, input_size, "fc1")


@register("madry_cnn", "Madry et al.'s MNIST CNN: conv 32@5x5 same, pool, conv 64@5x5 same, pool, FC 1024, K",
          min_size=8)
def madry_cnn(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> nn.Module:
    """The MNIST challenge network of Madry et al. (2018): 3.27M parameters at 28x28."""
    feats = OrderedDict([
        ("conv1", nn.Conv2d(in_channels, 32, 5, padding=2)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(32, 64, 5, padding=2)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
    ])
    head = OrderedDict([("fc1", nn.Linear(1, 1024)), ("relu3", nn.ReLU()), ("fc2", nn.Linear(1024, num_classes))])
    return _with_head(feats, head, in_channels, input_size, "fc1")


@register("digits_cnn", "small CNN for 8x8 digits: conv 32, conv 64, pool, FC 128, K", native=(1, 8, 10))
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
