"""He et al.'s (2016) CIFAR ResNets (6n+2 layers, 16/32/64 channels, option-A shortcuts): ``resnet20``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.errors import ConfigError
from robustest.models.registry import register

__all__ = ["ResNetCifar", "resnet20"]


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


@register("resnet20", "He et al.'s CIFAR ResNet-20 (3x3 basic blocks 16/32/64, option-A shortcuts)",
          native=(3, 32, 10), any_size=True)
def resnet20(num_classes: int = 10, in_channels: int = 3, input_size: int = 32) -> nn.Module:
    return ResNetCifar(20, num_classes, in_channels)
