"""Model zoo behind a small registry.

``create(name, num_classes=None, in_channels=None, input_size=None, mean=None, std=None, **options)``
returns an ``nn.Module`` that takes images in [0, 1] (N x C x H x W) and returns logits (N x K). Sizes not
given default to the model's native ones (``native(name)``: e.g. 1 x 28 x 28 and 10 classes for LeNet-5,
3 x 32 x 32 and 10 for the CIFAR networks, 3 x 224 x 224 and 1000 for the ImageNet ResNets). When ``mean``
and ``std`` are given, a :class:`Normalize` layer inside the model standardises the input, so attacks,
fuzzers and corruptions all work in pixel space; the network itself is then ``model.net`` (see
:func:`unwrap`), whose state_dict keys are those of the bare architecture.

Every model carries its spec in ``model.robustest_spec``, which checkpoints store so the model can be
rebuilt with :func:`from_spec`::

    {"name": "wrn-28-10", "num_classes": 10, "in_channels": 3, "input_size": 32,
     "mean": [...] or None, "std": [...] or None,
     "options": {"depth": 28, "width": 10, "dropout": 0.0}}

``options`` holds every architecture option with its resolved value (defaults included), so a rebuild
gives the same network even if a default changes later. Parameterised families are registered once
(``wrn``) and also reached through names that carry their parameters (``wrn-D-K``); the options parsed
from the name and the keyword options must agree.

Adding a model is adding one function decorated with :func:`register`; its keyword parameters beyond
``num_classes``, ``in_channels`` and ``input_size`` are its options.

:mod:`robustest.models.checkpoints` reads and writes models as files (safe checkpoints, TorchScript,
``torch.export`` programs, a user's ``pkg.module:factory``), so evaluating, gating or testing a model never
imports the training package.
"""

from __future__ import annotations

# Architectures: each module registers its models on import; the builders and classes are re-exported.
from robustest.models.densenet import DenseNetBC, densenet_bc
from robustest.models.preact_resnet import PreActResNet, preact_resnet18
from robustest.models.profiling import catalogue, profile
from robustest.models.registry import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Logits,
    Normalize,
    accepts_size,
    check_input,
    check_options,
    check_spec_input,
    create,
    describe,
    from_spec,
    names,
    native,
    options,
    register,
    resolve_name,
    spec_of,
    suggest,
    unregister,
    unwrap,
    variants,
)
from robustest.models.resnet_cifar import ResNetCifar, resnet20
from robustest.models.resnet_imagenet import ResNet, resnet18, resnet50
from robustest.models.small import convnet, digits_cnn, lenet1, lenet5, madry_cnn, mlp, mnist_small
from robustest.models.vit import VisionTransformer, vit_tiny
from robustest.models.wide_resnet import WideResNet, wrn

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DenseNetBC",
    "Logits",
    "Normalize",
    "PreActResNet",
    "ResNet",
    "ResNetCifar",
    "VisionTransformer",
    "WideResNet",
    "accepts_size",
    "catalogue",
    "check_input",
    "check_options",
    "check_spec_input",
    "convnet",
    "create",
    "densenet_bc",
    "describe",
    "digits_cnn",
    "from_spec",
    "lenet1",
    "lenet5",
    "madry_cnn",
    "mlp",
    "mnist_small",
    "names",
    "native",
    "options",
    "preact_resnet18",
    "profile",
    "register",
    "resnet18",
    "resnet20",
    "resnet50",
    "resolve_name",
    "spec_of",
    "suggest",
    "unregister",
    "unwrap",
    "variants",
    "vit_tiny",
    "wrn",
]
