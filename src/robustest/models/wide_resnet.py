"""Wide residual networks WRN-d-k (Zagoruyko & Komodakis 2016) for CIFAR-sized images: ``wrn``.

A 3x3 stem with 16 channels, three groups of (d - 4) / 6 pre-activation wide basic blocks with 16k, 32k
and 64k channels (strides 1, 2, 2), then BN-ReLU, global average pooling and the classifier. A block is
BN-ReLU-conv3x3-BN-ReLU-[dropout]-conv3x3; where the width or stride changes, a 1x1 convolution of the
pre-activated input is the shortcut. The module and parameter names are those of the TRADES /
RobustBench ``WideResNet`` (``conv1``, ``block1.layer.0.bn1``, ..., ``convShortcut``, ``bn1``, ``fc``), so
their WRN-28-10 / WRN-34-10 / WRN-70-16 weights files load with ``load_state_dict``.

``create("wrn-28-10")``, ``create("wrn-40-2", dropout=0.3)`` or ``create("wrn", depth=16, width=4)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.errors import ConfigError
from robustest.models.registry import register

__all__ = ["WideResNet", "wrn"]


class _WideBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.dropout = dropout
        # the reference names this attribute convShortcut; keep it so published weights load
        self.convShortcut = (nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
                             if c_in != c_out or stride != 1 else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        short = x if self.convShortcut is None else self.convShortcut(pre)
        out = F.relu(self.bn2(self.conv1(pre)))
        if self.dropout > 0:
            out = F.dropout(out, p=self.dropout, training=self.training)
        return self.conv2(out) + short


class _Group(nn.Module):
    def __init__(self, n: int, c_in: int, c_out: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.Sequential(*[_WideBlock(c_in if i == 0 else c_out, c_out, stride if i == 0 else 1, dropout)
                                     for i in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class WideResNet(nn.Module):
    """WRN-``depth``-``width``: N x ``in_channels`` x H x W -> N x ``num_classes`` (any H, W >= 4)."""

    def __init__(self, depth: int = 28, width: int = 10, num_classes: int = 10, in_channels: int = 3,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
            raise ConfigError(f"WRN depth must be 6n+4 with n >= 1 (10, 16, 22, 28, 34, 40, ...), got {depth!r}")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConfigError(f"WRN width must be a positive integer, got {width!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1), got {dropout!r}")
        n = (depth - 4) // 6
        chans = (16, 16 * width, 32 * width, 64 * width)
        self.conv1 = nn.Conv2d(in_channels, chans[0], 3, padding=1, bias=False)
        self.block1 = _Group(n, chans[0], chans[1], 1, dropout)
        self.block2 = _Group(n, chans[1], chans[2], 2, dropout)
        self.block3 = _Group(n, chans[2], chans[3], 2, dropout)
        self.bn1 = nn.BatchNorm2d(chans[3])
        self.fc = nn.Linear(chans[3], num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block3(self.block2(self.block1(self.conv1(x))))
        out = F.relu(self.bn1(out))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


@register("wrn", "Wide ResNet WRN-D-K (Zagoruyko & Komodakis): pre-activation wide basic blocks 16k/32k/64k, "
          "dropout option; wrn alone is wrn-28-10", native=(3, 32, 10), any_size=True,
          pattern=r"wrn-(?P<depth>\d+)-(?P<width>\d+)", form="wrn-D-K", variants=("wrn-16-4", "wrn-28-10", "wrn-40-2"))
def wrn(num_classes: int = 10, in_channels: int = 3, input_size: int = 32, depth: int = 28, width: int = 10,
        dropout: float = 0.0) -> nn.Module:
    return WideResNet(depth, width, num_classes, in_channels, dropout)
