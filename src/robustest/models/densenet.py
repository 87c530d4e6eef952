"""DenseNet-BC for CIFAR-sized images (Huang et al. 2017): ``densenet_bc`` (DenseNet-BC-100, k = 12).

A 3x3 stem with 2k channels, three dense blocks of (depth - 4) / 6 bottleneck layers
(BN-ReLU-conv1x1 to 4k-BN-ReLU-conv3x3 to k, output concatenated to the input), transitions with
compression 0.5 (BN-ReLU-conv1x1-avgpool 2x2) between blocks, then BN-ReLU, global average pooling and the
classifier. Module names follow torchvision's DenseNet (``features.conv0``,
``features.denseblock1.denselayer1.norm1``, ``features.transition1.conv``, ``features.norm5``,
``classifier``).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.errors import ConfigError
from robustest.models.registry import register

__all__ = ["DenseNetBC", "densenet_bc"]


class _DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, 4 * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(4 * growth)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.norm1(x)))
        return torch.cat([x, self.conv2(F.relu(self.norm2(out)))], 1)


class _Transition(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(c_in)
        self.conv = nn.Conv2d(c_in, c_out, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(self.conv(F.relu(self.norm(x))), 2)


class DenseNetBC(nn.Module):
    """DenseNet-BC-``depth`` with growth rate ``growth``: N x C x H x W -> N x K (H, W >= 4)."""

    def __init__(self, depth: int = 100, growth: int = 12, num_classes: int = 10, in_channels: int = 3,
                 compression: float = 0.5) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
            raise ConfigError(f"DenseNet-BC depth must be 6n+4 with n >= 1 (40, 100, 190, 250, ...), got {depth!r}")
        if isinstance(growth, bool) or not isinstance(growth, int) or growth < 1:
            raise ConfigError(f"DenseNet growth rate must be a positive integer, got {growth!r}")
        n = (depth - 4) // 6
        c = 2 * growth
        layers: OrderedDict[str, nn.Module] = OrderedDict(conv0=nn.Conv2d(in_channels, c, 3, padding=1, bias=False))
        for b in range(3):
            block = nn.Sequential()
            for i in range(n):
                block.add_module(f"denselayer{i + 1}", _DenseLayer(c, growth))
                c += growth
            layers[f"denseblock{b + 1}"] = block
            if b < 2:
                c_out = int(c * compression)
                layers[f"transition{b + 1}"] = _Transition(c, c_out)
                c = c_out
        layers["norm5"] = nn.BatchNorm2d(c)
        self.features = nn.Sequential(layers)
        self.classifier = nn.Linear(c, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.features(x))
        return self.classifier(F.adaptive_avg_pool2d(out, 1).flatten(1))


@register("densenet_bc", "DenseNet-BC (Huang et al.): depth 100, growth k = 12, compression 0.5, CIFAR stem; "
          "depth/growth options", native=(3, 32, 10), any_size=True)
def densenet_bc(num_classes: int = 10, in_channels: int = 3, input_size: int = 32, depth: int = 100,
                growth: int = 12) -> nn.Module:
    return DenseNetBC(depth, growth, num_classes, in_channels)
