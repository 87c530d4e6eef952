"""ImageNet ResNets (He et al. 2016) laid out exactly as torchvision's: ``resnet18``, ``resnet50``.

A 7x7 stride-2 stem with 64 channels, 3x3 stride-2 max pooling, four stages (64/128/256/512 planes,
strides 1, 2, 2, 2) of basic blocks (ResNet-18: 2-2-2-2) or bottlenecks with expansion 4 and the stride on
the 3x3 convolution (ResNet-50 "v1.5": 3-4-6-3), a 1x1 convolution + BN projection (``downsample``) where a
block changes shape, global average pooling and ``fc``. Parameter and buffer names and shapes are those of
``torchvision.models.resnet18/resnet50`` (``conv1``, ``bn1``, ``layer1.0.conv1``, ...,
``layer2.0.downsample.0/1``, ``fc``), so a torchvision weights file loads into the bare network
(``create("resnet50")`` without mean/std, or ``unwrap(model)``) with ``load_state_dict``, torchvision not
needed. Its weights expect ImageNet normalisation: ``mean=IMAGENET_MEAN, std=IMAGENET_STD``.

The network downsamples by 32, so it takes inputs from 32x32 (then its last stage sees 1x1 maps); smaller
images are refused with a pointer to the CIFAR/digits models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from robustest.models.registry import register

__all__ = ["ResNet", "resnet18", "resnet50"]


class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """torchvision-compatible ResNet: N x ``in_channels`` x H x W -> N x ``num_classes`` (H, W >= 32).

    ``bottleneck`` selects bottleneck blocks (ResNet-50/101/152) over basic blocks (ResNet-18/34);
    ``blocks`` is the number per stage.
    """

    def __init__(self, blocks: tuple[int, int, int, int], bottleneck: bool, num_classes: int = 1000,
                 in_channels: int = 3) -> None:
        super().__init__()
        block: type[_BasicBlock] | type[_Bottleneck] = _Bottleneck if bottleneck else _BasicBlock
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        c_in = 64
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), blocks)):
            stride = 1 if i == 0 else 2
            layer = []
            for j in range(n):
                s = stride if j == 0 else 1
                down = None
                if s != 1 or c_in != planes * block.expansion:
                    down = nn.Sequential(nn.Conv2d(c_in, planes * block.expansion, 1, stride=s, bias=False),
                                         nn.BatchNorm2d(planes * block.expansion))
                layer.append(block(c_in, planes, s, down))
                c_in = planes * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


@register("resnet18", "ResNet-18, ImageNet style (7x7 stem, max pool, basic blocks 2-2-2-2); torchvision's "
          "state_dict keys", native=(3, 224, 1000), min_size=32, any_size=True)
def resnet18(num_classes: int = 1000, in_channels: int = 3, input_size: int = 224) -> nn.Module:
    return ResNet((2, 2, 2, 2), False, num_classes, in_channels)


@register("resnet50", "ResNet-50 v1.5, ImageNet style (7x7 stem, max pool, bottlenecks 3-4-6-3); torchvision's "
          "state_dict keys", native=(3, 224, 1000), min_size=32, any_size=True)
def resnet50(num_classes: int = 1000, in_channels: int = 3, input_size: int = 224) -> nn.Module:
    return ResNet((3, 4, 6, 3), True, num_classes, in_channels)
