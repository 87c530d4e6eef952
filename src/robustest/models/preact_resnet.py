"""Pre-activation ResNet-18 (He et al. 2016, "Identity mappings in deep residual networks") with the CIFAR
stem RobustBench uses: ``preact_resnet18``.

A 3x3 stride-1 stem with 64 channels (no pooling), four stages of two pre-activation basic blocks
(BN-ReLU-conv3x3-BN-ReLU-conv3x3) with 64/128/256/512 channels (strides 1, 2, 2, 2), where a stage changes
width or stride a 1x1 convolution of the pre-activated input is the shortcut, then BN-ReLU, global average
pooling and a linear classifier. The names follow RobustBench's ``PreActResNet`` with its final BN
(``conv1``, ``layer1.0.bn1``, ..., ``layer2.0.shortcut.0``, ``bn``, ``linear``), so such weights files load
with ``load_state_dict``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest.models.registry import register

__all__ = ["PreActResNet", "preact_resnet18"]


class _PreActBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        short = self.shortcut(pre) if hasattr(self, "shortcut") else x
        out = self.conv2(F.relu(self.bn2(self.conv1(pre))))
        return out + short


class PreActResNet(nn.Module):
    """Pre-activation ResNet with basic blocks, ``blocks`` per stage: N x C x H x W -> N x K (H, W >= 4)."""

    def __init__(self, blocks: tuple[int, int, int, int] = (2, 2, 2, 2), num_classes: int = 10,
                 in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, padding=1, bias=False)
        c_in = 64
        for i, (c_out, n) in enumerate(zip((64, 128, 256, 512), blocks)):
            stage = []
            for j in range(n):
                stage.append(_PreActBlock(c_in, c_out, (1 if i == 0 else 2) if j == 0 else 1))
                c_in = c_out
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
        self.bn = nn.BatchNorm2d(512)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.relu(self.bn(out))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))


@register("preact_resnet18", "PreAct ResNet-18 (He et al. identity mappings; RobustBench's CIFAR stem 3x3/64)",
          native=(3, 32, 10), any_size=True)
def preact_resnet18(num_classes: int = 10, in_channels: int = 3, input_size: int = 32) -> nn.Module:
    return PreActResNet((2, 2, 2, 2), num_classes, in_channels)
