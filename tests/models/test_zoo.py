"""The full-scale zoo: WRN, PreAct ResNet-18, DenseNet-BC, ImageNet ResNet-18/50, ViT-Tiny; parameterised
names and their specs; torchvision key layout; profile (parameters, multiply-adds); `robustest info`.

Big networks are built on the meta device (shapes only, no weights, no compute) wherever only their structure
matters; real forward/backward passes run on small inputs or small variants here and at the native size in the
slow tests.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cli_runner import run_cli
from robustest import models
from robustest.core.errors import ConfigError
from robustest.models.checkpoints import load_checkpoint, save_checkpoint
from robustest.train import fit
from robustest.train.recipes import Recipe

NEW = ("wrn", "preact_resnet18", "densenet_bc", "resnet18", "resnet50", "vit_tiny")


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def on_meta(name: str, **kwargs) -> nn.Module:
    with torch.device("meta"):
        return models.create(name, **kwargs)


def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------------- registry and specs
def test_new_models_are_registered_with_descriptions():
    names = models.names()
    for name in NEW:
        assert name in names and models.describe(name)
    assert models.variants() == ["mnist_small-x2", "wrn-16-4", "wrn-28-10", "wrn-40-2"]
    assert models.options("mnist_small-x3") == {"width": 3} and models.options("mnist_small") == {"width": 1}
    assert models.describe("wrn-40-2") == models.describe("wrn")
    assert models.native("resnet50") == (3, 224, 1000) and models.native("wrn-16-4") == (3, 32, 10)
    assert models.native("digits_cnn") == (1, 8, 10)


def test_resolve_name_parses_parameterised_names():
    assert models.resolve_name("wrn-28-10") == ("wrn", {"depth": 28, "width": 10})
    assert models.resolve_name("wrn") == ("wrn", {})
    assert models.resolve_name("resnet20") == ("resnet20", {})
    for bad in ("vgg", "wrn-28", "wrn-28-10-2", "wrn-a-b", "WRN-28-10"):
        with pytest.raises(ConfigError, match="unknown model.*lenet5.*wrn \\(wrn-D-K\\)") as exc:
            models.resolve_name(bad)
        assert "\n" not in str(exc.value)


@pytest.mark.parametrize("name, depth, width, params", [
    # Zagoruyko & Komodakis, table 1/4: WRN-16-4 2.7M, WRN-28-10 36.5M, WRN-40-2 2.2M (exact counts of the
    # TRADES / RobustBench layout with a 10-class head)
    ("wrn-16-4", 16, 4, 2_748_890), ("wrn-28-10", 28, 10, 36_479_194), ("wrn-40-2", 40, 2, 2_243_546),
])
def test_wrn_names_build_the_right_network(name, depth, width, params):
    model = on_meta(name)
    assert n_params(model) == params
    spec = models.spec_of(model)
    assert spec["name"] == name and spec["options"] == {"depth": depth, "width": width, "dropout": 0.0}
    assert spec["input_size"] == 32 and spec["in_channels"] == 3 and spec["num_classes"] == 10
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) == 6 * (depth - 4) // 6 + 1  # n = (d - 4) / 6 blocks of two 3x3 convs per group, + stem
    assert sum(isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) for m in model.modules()) == 3
    assert model.fc.in_features == 64 * width
    same = on_meta("wrn", depth=depth, width=width)
    assert shapes(same) == shapes(model)


def test_wrn_keys_follow_the_robustbench_layout():
    sd = shapes(on_meta("wrn-28-10"))
    assert len(sd) == 155  # 12 blocks x (2 BN x 5 + 2 conv) + 3 shortcuts + stem conv + final BN (5) + fc (2)
    assert sd["conv1.weight"] == (16, 3, 3, 3)
    assert sd["block1.layer.0.convShortcut.weight"] == (160, 16, 1, 1)
    assert sd["block2.layer.0.convShortcut.weight"] == (320, 160, 1, 1)
    assert sd["block3.layer.0.conv1.weight"] == (640, 320, 3, 3)
    assert sd["block3.layer.3.bn2.running_var"] == (640,)
    assert "block1.layer.1.convShortcut.weight" not in sd
    assert sd["bn1.weight"] == (640,) and sd["fc.weight"] == (10, 640) and sd["fc.bias"] == (10,)


def test_options_are_validated_and_recorded():
    with pytest.raises(ConfigError, match="has depth=28 but depth=40"):
        models.create("wrn-28-10", depth=40)
    with pytest.raises(ConfigError, match="no option 'dropot'.*depth, dropout, width"):
        models.create("wrn", dropot=0.3)
    with pytest.raises(ConfigError, match="no option 'dropout'.*none"):
        models.create("resnet20", dropout=0.3)
    with pytest.raises(ConfigError, match="6n\\+4"):
        models.create("wrn-30-2")
    with pytest.raises(ConfigError, match="dropout must be in"):
        models.create("wrn-10-1", dropout=1.5)
    with pytest.raises(ConfigError, match="must be a number"):
        models.create("wrn-10-1", dropout=[0.1])
    with pytest.raises(ConfigError, match="6n\\+4"):
        models.create("densenet_bc", depth=50)
    assert models.spec_of(on_meta("wrn-28-10", dropout=0.3))["options"]["dropout"] == 0.3
    assert models.spec_of(on_meta("densenet_bc"))["options"] == {"depth": 100, "growth": 12}
    assert models.spec_of(models.create("lenet5"))["options"] == {}


def test_sizes_must_be_integers():
    spec = models.spec_of(models.create("lenet5", num_classes=np.int64(4), input_size=torch.tensor(28)))
    assert spec["num_classes"] == 4 and type(spec["num_classes"]) is int and type(spec["input_size"]) is int
    for bad in ({"num_classes": 2.5}, {"input_size": "28"}, {"in_channels": True}):
        with pytest.raises(ConfigError, match="must be an integer"):
            models.create("lenet5", **bad)


def test_native_sizes_are_the_defaults():
    spec = models.spec_of(models.create("resnet20"))
    assert (spec["in_channels"], spec["input_size"], spec["num_classes"]) == (3, 32, 10)
    spec = models.spec_of(models.create("digits_cnn"))
    assert (spec["in_channels"], spec["input_size"]) == (1, 8)
    spec = models.spec_of(on_meta("resnet50"))
    assert (spec["in_channels"], spec["input_size"], spec["num_classes"]) == (3, 224, 1000)


def test_from_spec_rebuilds_parameterised_models():
    torch.manual_seed(0)
    model = models.create("wrn-10-2", dropout=0.25, num_classes=4, in_channels=1, input_size=16,
                          mean=0.5, std=0.25)
    spec = models.spec_of(model)
    assert spec["options"] == {"depth": 10, "width": 2, "dropout": 0.25}
    again = models.from_spec(spec)
    assert models.spec_of(again) == spec
    assert all(b.dropout == 0.25 for b in again.modules() if hasattr(b, "convShortcut"))
    again.load_state_dict(model.state_dict())
    x = torch.rand(3, 1, 16, 16)
    torch.testing.assert_close(again.eval()(x), model.eval()(x))
    # a spec from before options existed rebuilds with the defaults
    old = {"name": "lenet5", "num_classes": 10, "in_channels": 1, "input_size": 28, "mean": None, "std": None}
    assert models.spec_of(models.from_spec(old))["options"] == {}
    for bad in ({}, {"name": 3}, {"name": "wrn-10-1", "options": [1]}):
        with pytest.raises(ConfigError):
            models.from_spec(bad)


def test_checkpoint_round_trip_keeps_options(tmp_path):
    torch.manual_seed(0)
    for name, kw in (("wrn-10-1", {"dropout": 0.3, "input_size": 16}), ("vit_tiny", {"input_size": 8, "patch": 2}),
                     ("densenet_bc", {"depth": 10, "growth": 4, "input_size": 8}),
                     ("mnist_small", {"width": 2, "input_size": 28})):
        model = models.create(name, in_channels=3, mean=[0.5] * 3, std=[0.2] * 3, **kw).eval()
        path = save_checkpoint(tmp_path / f"{name}.pt", model)
        loaded = load_checkpoint(path)
        assert models.spec_of(loaded) == models.spec_of(model)
        x = torch.rand(2, 3, kw["input_size"], kw["input_size"])
        torch.testing.assert_close(loaded(x), model(x))


# ----------------------------------------------------------------------------------------- input sizes
def test_imagenet_model_on_tiny_images_is_one_line_with_suggestions():
    with pytest.raises(ConfigError) as exc:
        models.create("resnet50", in_channels=1, input_size=8)
    msg = str(exc.value)
    assert "\n" not in msg and "resnet50" in msg and "1x8x8" in msg and "32x32" in msg
    assert "digits_cnn, resnet20, preact_resnet18" in msg
    with pytest.raises(ConfigError, match="resnet18.*1x28x28.*lenet5, convnet, resnet20"):
        models.create("resnet18", in_channels=1, input_size=28)
    assert models.create("resnet18", num_classes=10, input_size=32)(torch.rand(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("name, min_size", [("lenet1", 16), ("lenet5", 12), ("convnet", 16)])
def test_declared_minimum_sizes_are_exact(name, min_size):
    assert models.create(name, input_size=min_size).eval()(torch.rand(2, 1, min_size, min_size)).shape == (2, 10)
    with pytest.raises(ConfigError, match=f"at least {min_size}x{min_size}"):
        models.create(name, input_size=min_size - 1)


def test_vit_patch_follows_the_input_size():
    assert models.spec_of(on_meta("vit_tiny", input_size=32))["options"] == {"patch": 4}
    assert models.spec_of(on_meta("vit_tiny"))["options"] == {"patch": 16}
    assert models.spec_of(on_meta("vit_tiny", input_size=28))["options"] == {"patch": 4}
    assert models.spec_of(on_meta("vit_tiny", input_size=32, patch=8))["options"] == {"patch": 8}
    with pytest.raises(ConfigError, match="patch 4 cannot take 30x30.*patch= one of 2, 3, 5, 6, 10, 15") as exc:
        models.create("vit_tiny", input_size=30)
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="patch size must be a positive integer"):
        models.create("vit_tiny", input_size=32, patch=0)


def test_accepts_size_and_suggest():
    wrn = models.spec_of(on_meta("wrn-16-4"))
    assert models.accepts_size(wrn, 32, 32) and models.accepts_size(wrn, 64, 48) and models.accepts_size(wrn, 8, 8)
    r50 = models.spec_of(on_meta("resnet50"))
    assert models.accepts_size(r50, 64, 64) and not models.accepts_size(r50, 16, 16)
    vit = models.spec_of(on_meta("vit_tiny", input_size=32))
    assert models.accepts_size(vit, 32, 32) and not models.accepts_size(vit, 64, 64)
    lenet = models.spec_of(models.create("lenet5"))
    assert models.accepts_size(lenet, 28, 28) and not models.accepts_size(lenet, 32, 32)
    assert models.suggest(8) == ["digits_cnn", "resnet20", "preact_resnet18"]
    assert models.suggest(12) == ["digits_cnn", "resnet20", "preact_resnet18"]
    assert models.suggest(28) == ["lenet5", "convnet", "resnet20"]
    assert models.suggest(32) == ["resnet20", "preact_resnet18", "wrn-28-10"]
    assert models.suggest(224) == ["resnet18", "resnet50"]


# ------------------------------------------------------------------------- architectures: keys, shapes
def torchvision_resnet_shapes(layers: tuple[int, ...], bottleneck: bool, num_classes: int = 1000
                              ) -> dict[str, tuple[int, ...]]:
    """state_dict keys and shapes of torchvision.models.resnet18/resnet50, in order, written out from
    torchvision/models/resnet.py: ResNet.__init__ (conv1 7x7/64, bn1, layer1..4 with planes 64/128/256/512,
    fc), _make_layer (downsample = conv1x1 + norm when stride != 1 or inplanes != planes * expansion, on the
    first block), BasicBlock (conv1 3x3, bn1, conv2 3x3, bn2) and Bottleneck (conv1 1x1, bn1, conv2 3x3,
    bn2, conv3 1x1 to planes * 4, bn3)."""
    def bn(p: str, c: int) -> dict[str, tuple[int, ...]]:
        return {f"{p}.weight": (c,), f"{p}.bias": (c,), f"{p}.running_mean": (c,), f"{p}.running_var": (c,),
                f"{p}.num_batches_tracked": ()}

    exp = 4 if bottleneck else 1
    out = {"conv1.weight": (64, 3, 7, 7), **bn("bn1", 64)}
    inplanes = 64
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers)):
        for j in range(n):
            p = f"layer{i + 1}.{j}"
            stride = 2 if i > 0 and j == 0 else 1
            if bottleneck:
                out.update({f"{p}.conv1.weight": (planes, inplanes, 1, 1), **bn(f"{p}.bn1", planes),
                            f"{p}.conv2.weight": (planes, planes, 3, 3), **bn(f"{p}.bn2", planes),
                            f"{p}.conv3.weight": (planes * 4, planes, 1, 1), **bn(f"{p}.bn3", planes * 4)})
            else:
                out.update({f"{p}.conv1.weight": (planes, inplanes, 3, 3), **bn(f"{p}.bn1", planes),
                            f"{p}.conv2.weight": (planes, planes, 3, 3), **bn(f"{p}.bn2", planes)})
            if stride != 1 or inplanes != planes * exp:
                out.update({f"{p}.downsample.0.weight": (planes * exp, inplanes, 1, 1),
                            **bn(f"{p}.downsample.1", planes * exp)})
            inplanes = planes * exp
    out.update({"fc.weight": (num_classes, 512 * exp), "fc.bias": (num_classes,)})
    return out


@pytest.mark.parametrize("name, layers, bottleneck, n_keys, params, samples", [
    ("resnet18", (2, 2, 2, 2), False, 122, 11_689_512, {
        "conv1.weight": (64, 3, 7, 7), "layer1.0.conv1.weight": (64, 64, 3, 3),
        "layer2.0.conv1.weight": (128, 64, 3, 3), "layer2.0.downsample.0.weight": (128, 64, 1, 1),
        "layer2.0.downsample.1.running_mean": (128,), "layer4.1.bn2.weight": (512,), "fc.weight": (1000, 512)}),
    ("resnet50", (3, 4, 6, 3), True, 320, 25_557_032, {
        "layer1.0.conv1.weight": (64, 64, 1, 1), "layer1.0.conv3.weight": (256, 64, 1, 1),
        "layer1.0.downsample.0.weight": (256, 64, 1, 1), "layer2.0.conv2.weight": (128, 128, 3, 3),
        "layer3.5.bn3.weight": (1024,), "layer4.0.downsample.0.weight": (2048, 1024, 1, 1),
        "layer4.2.conv3.weight": (2048, 512, 1, 1), "fc.weight": (1000, 2048)}),
])
def test_imagenet_resnets_have_torchvision_keys(name, layers, bottleneck, n_keys, params, samples):
    model = on_meta(name)
    got = shapes(model)
    expected = torchvision_resnet_shapes(layers, bottleneck)
    assert len(got) == len(expected) == n_keys
    assert list(got.items()) == list(expected.items())
    assert {k: got[k] for k in samples} == samples
    assert n_params(model) == params
    assert "layer1.0.downsample.0.weight" not in got or bottleneck


@pytest.fixture(scope="module")
def resnet18_bare() -> nn.Module:
    torch.manual_seed(0)
    return models.create("resnet18")


def test_a_torchvision_state_dict_loads_into_the_bare_and_the_wrapped_network(resnet18_bare):
    torch.manual_seed(1)
    tv = {k: (torch.tensor(7) if not s else torch.rand(s) + 0.5 if k.endswith("running_var") else torch.randn(s))
          for k, s in torchvision_resnet_shapes((2, 2, 2, 2), False).items()}
    assert isinstance(resnet18_bare, models.ResNet) and models.unwrap(resnet18_bare) is resnet18_bare
    resnet18_bare.load_state_dict(tv)  # strict: every key present, none extra, shapes equal
    assert torch.equal(resnet18_bare.layer3[0].downsample[0].weight, tv["layer3.0.downsample.0.weight"])
    wrapped = models.create("resnet18", mean=models.IMAGENET_MEAN, std=models.IMAGENET_STD)
    assert set(wrapped.state_dict()) == {f"net.{k}" for k in tv} | {"normalize.mean", "normalize.std"}
    models.unwrap(wrapped).load_state_dict(tv)
    x = torch.rand(2, 3, 64, 64)
    mean = torch.tensor(models.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(models.IMAGENET_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(wrapped.eval()(x), resnet18_bare.eval()((x - mean) / std))
    # an older torchvision file without num_batches_tracked loads too (BatchNorm fills them in)
    old = {k: v for k, v in tv.items() if not k.endswith("num_batches_tracked")}
    assert len(old) == 102
    models.create("resnet18", input_size=32).load_state_dict(old)


def test_preact_resnet18_structure():
    model = on_meta("preact_resnet18")
    sd = shapes(model)
    # Kuang Liu's / RobustBench's PreActResNet-18 has 11,171,146 parameters; the final BN adds 2 x 512
    assert n_params(model) == 11_172_170
    assert sd["conv1.weight"] == (64, 3, 3, 3)
    assert sd["layer1.0.bn1.weight"] == (64,) and "layer1.0.shortcut.0.weight" not in sd
    assert sd["layer2.0.bn1.weight"] == (64,) and sd["layer2.0.shortcut.0.weight"] == (128, 64, 1, 1)
    assert sd["layer4.1.conv2.weight"] == (512, 512, 3, 3)
    assert sd["bn.weight"] == (512,) and sd["linear.weight"] == (10, 512)
    assert not any(".shortcut.1" in k for k in sd)  # projection without BN


def test_densenet_bc_structure():
    model = on_meta("densenet_bc")
    sd = shapes(model)
    assert n_params(model) == 769_162  # Huang et al.: DenseNet-BC (L = 100, k = 12) 0.8M
    assert sd["features.conv0.weight"] == (24, 3, 3, 3)
    assert sd["features.denseblock1.denselayer1.conv1.weight"] == (48, 24, 1, 1)
    assert sd["features.denseblock1.denselayer16.conv2.weight"] == (12, 48, 3, 3)
    assert sd["features.transition1.conv.weight"] == (108, 216, 1, 1)  # 24 + 16 x 12 = 216, halved
    assert sd["features.transition2.conv.weight"] == (150, 300, 1, 1)
    assert sd["features.norm5.weight"] == (342,) and sd["classifier.weight"] == (10, 342)
    assert "features.denseblock3.denselayer17.conv1.weight" not in sd
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) + 1 == 100


def test_vit_tiny_structure():
    model = on_meta("vit_tiny")
    sd = shapes(model)
    assert n_params(model) == 5_717_416  # DeiT-Tiny: 5.7M (timm deit_tiny_patch16_224: 5,717,416)
    assert sd["patch_embed.proj.weight"] == (192, 3, 16, 16) and sd["pos_embed"] == (1, 197, 192)
    assert sd["cls_token"] == (1, 1, 192) and sd["blocks.11.attn.qkv.weight"] == (576, 192)
    assert sd["blocks.0.attn.proj.weight"] == (192, 192) and sd["blocks.0.mlp.fc1.weight"] == (768, 192)
    assert sd["blocks.0.mlp.fc2.weight"] == (192, 768) and sd["norm.weight"] == (192,)
    assert sd["head.weight"] == (1000, 192) and "blocks.12.norm1.weight" not in sd
    small = shapes(on_meta("vit_tiny", input_size=32, num_classes=10, in_channels=1))
    assert small["patch_embed.proj.weight"] == (192, 1, 4, 4) and small["pos_embed"] == (1, 65, 192)


def test_vit_attention_is_softmax_attention():
    from robustest.models.vit import _Attention

    torch.manual_seed(0)
    att = _Attention(12, 3)
    x = torch.randn(2, 5, 12)
    q, k, v = att.qkv(x).split(12, dim=-1)
    heads = [torch.softmax(q[..., h * 4:(h + 1) * 4] @ k[..., h * 4:(h + 1) * 4].transpose(1, 2) / 2.0, -1)
             @ v[..., h * 4:(h + 1) * 4] for h in range(3)]
    torch.testing.assert_close(att(x), att.proj(torch.cat(heads, -1)), rtol=1e-5, atol=1e-6)


def test_wrn_block_is_pre_activation():
    from robustest.models.wide_resnet import _WideBlock

    torch.manual_seed(0)
    blk = _WideBlock(4, 8, 2, 0.0).eval()
    x = torch.randn(2, 4, 6, 6)
    pre = F.relu(blk.bn1(x))
    expect = blk.conv2(F.relu(blk.bn2(blk.conv1(pre)))) + blk.convShortcut(pre)
    torch.testing.assert_close(blk(x), expect)
    same = _WideBlock(8, 8, 1, 0.0).eval()
    y = torch.randn(2, 8, 6, 6)
    assert same.convShortcut is None
    torch.testing.assert_close(same(y), same.conv2(F.relu(same.bn2(same.conv1(F.relu(same.bn1(y)))))) + y)


# --------------------------------------------------------------------------------- build, run, train
@pytest.mark.parametrize("name", [*models.names(), *models.variants()])
@pytest.mark.parametrize("channels", [1, 3])
def test_every_model_builds_at_its_native_size(name, channels):
    _, s, k = models.native(name)
    model = on_meta(name, in_channels=channels)
    with torch.no_grad():
        out = model.eval()(torch.zeros(2, channels, s, s, device="meta"))
    assert out.shape == (2, k)


SMALL = [  # (name, options, channels, size): real forward/backward and a training step on CPU, batch 2
    ("wrn-10-2", {"dropout": 0.3}, 3, 16), ("wrn-10-1", {}, 1, 16),
    ("preact_resnet18", {}, 3, 8), ("preact_resnet18", {}, 1, 8),
    ("densenet_bc", {"depth": 16, "growth": 6}, 3, 8), ("densenet_bc", {"depth": 16, "growth": 6}, 1, 8),
    ("resnet18", {}, 3, 32), ("resnet50", {}, 1, 32),
    ("vit_tiny", {}, 3, 8), ("vit_tiny", {"patch": 2}, 1, 8),
]


def forward_backward_and_step(model: nn.Module, channels: int, size: int, k: int) -> None:
    torch.manual_seed(0)
    x = torch.rand(2, channels, size, size, requires_grad=True)
    y = torch.tensor([0, k - 1])
    model.eval()
    out = model(x)
    assert out.shape == (2, k) and torch.isfinite(out).all()
    torch.testing.assert_close(model(x[:1]), out[:1], rtol=1e-4, atol=1e-5)  # batch independence in eval
    F.cross_entropy(out, y).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    hist = fit(model, (x.detach(), y), epochs=1, batch_size=2, recipe=Recipe(lr=1e-3), progress=False)
    assert math.isfinite(hist.to_dict()["epochs"][0]["loss"])
    changed = sum(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert changed >= len(before) // 2


@pytest.mark.parametrize("name, options, channels, size", SMALL)
def test_small_configurations_run_and_train(name, options, channels, size):
    torch.manual_seed(0)
    model = models.create(name, num_classes=5, in_channels=channels, input_size=size, **options)
    forward_backward_and_step(model, channels, size, 5)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NEW if n != "wrn"] + models.variants())
@pytest.mark.parametrize("channels", [1, 3])
def test_native_size_runs_and_trains(name, channels):
    _, s, k = models.native(name)
    torch.manual_seed(0)
    model = models.create(name, in_channels=channels)
    forward_backward_and_step(model, channels, s, k)


# -------------------------------------------------------------------------------------------- profile
@pytest.mark.parametrize("name, params, macs, rel", [
    ("resnet18", 11_689_512, 1.82e9, 0.01),  # torchvision: 1.81 GFLOPs (multiply-adds)
    ("resnet50", 25_557_032, 4.1e9, 0.01),  # torchvision: 4.09
    ("resnet20", 269_722, 41e6, 0.02),  # He et al. 0.27M; commonly 41 MMACs
    ("wrn-28-10", 36_479_194, 5.25e9, 0.01),
    ("vit_tiny", 5_717_416, 1.26e9, 0.01),  # DeiT-Tiny: 1.3 GFLOPs (timm: 1.26 GMACs)
])
def test_profile_matches_published_figures(name, params, macs, rel):
    prof = models.profile(name)
    assert prof["params"] == params
    assert prof["macs"] == pytest.approx(macs, rel=rel)


def test_profile_counts_exactly():
    # LeNet-5 on 28x28, by hand: conv1 28*28*6*25 + conv2 10*10*16*150 + fc 400*120 + 120*84 + 84*10
    assert models.profile("lenet5") == {"params": 61_706, "macs": 117_600 + 240_000 + 48_000 + 10_080 + 840}
    # the adversarial-training CNNs on 28x28: Wong & Kolter's small net (166,406 parameters) and Madry et al.'s
    # MNIST challenge net (3,274,634), the MACs by hand (output pixels x channels x kernel taps, then FC)
    assert models.profile("mnist_small") == {"params": 166_406,
                                             "macs": 14 * 14 * 16 * 16 + 7 * 7 * 32 * 256 + 1568 * 100 + 1000}
    # width 2 doubles every layer: conv 32 (544), conv 64 (32,832), FC 3136 -> 200 (627,400), FC 200 -> 10 (2,010)
    assert models.profile("mnist_small", width=2) == {"params": 662_786, "macs": 14 * 14 * 32 * 16 + 7 * 7 * 64 * 512
                                                      + 3136 * 200 + 2000}
    with pytest.raises(ConfigError, match="width must be an integer >= 1, got 0"):
        models.create("mnist_small", width=0)
    assert models.profile("madry_cnn") == {"params": 3_274_634,
                                           "macs": 28 * 28 * 32 * 25 + 14 * 14 * 64 * 800 + 3136 * 1024 + 10240}
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 5))
    assert models.profile(net, input_size=2, in_channels=3) == {"params": 65, "macs": 60}
    with pytest.raises(ConfigError, match="give input_size and in_channels"):
        models.profile(net)
    with pytest.raises(ConfigError, match="zoo model name or an nn.Module"):
        models.profile(3)
    with pytest.raises(ConfigError, match="unknown model"):
        models.profile("vgg")


def test_profile_of_a_built_model_counts_attention_on_the_cpu():
    torch.manual_seed(0)
    model = models.create("vit_tiny", num_classes=10, input_size=16, mean=0.5, std=0.5).train()
    by_name = models.profile("vit_tiny", input_size=16, num_classes=10)
    got = models.profile(model)  # real CPU forward: the CPU attention kernel must be counted
    assert got == by_name and model.training  # mode restored
    tokens, d = 17, 192
    attention = 12 * 2 * tokens * tokens * d  # q k^T and the weighted sum of v, 12 blocks
    no_attention = models.profile("vit_tiny", input_size=16, num_classes=10)["macs"] - attention
    assert no_attention == 12 * tokens * (d * 3 * d + d * d + 2 * d * 768) + 16 * 192 * 48 + 192 * 10
    assert models.profile("wrn-16-4", input_size=64)["macs"] == pytest.approx(
        4 * models.profile("wrn-16-4")["macs"], rel=1e-3)


# ------------------------------------------------------------------------------------------------ CLI
def test_info_lists_models_with_parameters_and_macs(capsys):
    code, out, err = run_cli(capsys, "info", "--models")
    assert code == 0 and err == ""
    assert "data sets:" not in out and "models (input and classes: the native size" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ") and line.split()}
    for name in models.names() + models.variants():
        assert name in rows
    assert rows["resnet50"][1:5] == ["3x224x224", "1000", "25.6M", "4.09G"]
    assert rows["wrn-28-10"][1:5] == ["3x32x32", "10", "36.5M", "5.24G"]
    assert rows["resnet20"][1:5] == ["3x32x32", "10", "269.7k", "40.6M"]
    assert rows["digits_cnn"][1] == "1x8x8"
    code, out, _ = run_cli(capsys, "info")
    assert code == 0 and "data sets:" in out and "robustest info --models" in out and "25.6M" not in out


def test_train_verb_takes_a_parameterised_model_and_the_checkpoint_rebuilds_it(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "tiny.npz", x_train=rng.integers(0, 256, (8, 16, 16, 3), dtype=np.uint8),
             y_train=np.arange(8) % 3, x_test=rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8),
             y_test=np.arange(4) % 3)
    code, _, err = run_cli(capsys, "train", "--dataset", "npz", "--data-dir", tmp_path / "tiny.npz", "--model",
                           "wrn-10-1", "--epochs", "1", "--batch-size", "4", "--out", tmp_path / "o", "--no-progress")
    assert code == 0, err
    rep = json.loads((tmp_path / "o" / "results.json").read_text())
    assert rep["model"]["name"] == "wrn-10-1"
    assert rep["model"]["options"] == {"depth": 10, "width": 1, "dropout": 0.0}
    model = load_checkpoint(tmp_path / "o" / "model.pt")
    assert model.net.fc.in_features == 64 and model.net.conv1.in_channels == 3
    from torch.utils.data import TensorDataset

    from robustest.cli import loading as cli_loading

    cli_loading.check_fits(model, TensorDataset(torch.rand(2, 3, 24, 24), torch.tensor([0, 1])))  # pools globally
    code, _, err = run_cli(capsys, "train", "--dataset", "npz", "--data-dir", tmp_path / "tiny.npz", "--model",
                           "resnet50", "--epochs", "1", "--out", tmp_path / "r", "--no-progress")
    assert code == 2 and "resnet50" in err and "3x16x16" in err and "digits_cnn" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
    code, _, err = run_cli(capsys, "train", "--dataset", "npz", "--data-dir", tmp_path / "tiny.npz", "--model",
                           "wrn-9-1", "--epochs", "1", "--out", tmp_path / "w", "--no-progress")
    assert code == 2 and "6n+4" in err and len(err.strip().splitlines()) == 1


def test_robot_config_accepts_parameterised_train_models():
    from robustest.robot import RobotConfig

    RobotConfig.from_dict({"train_model": "wrn-16-4"}).validate()
    with pytest.raises(ConfigError, match="train_model: unknown model 'vgg'"):
        RobotConfig.from_dict({"train_model": "vgg"}).validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_zoo_models_run_on_cuda():
    dev = torch.device("cuda")
    for name, options, channels, size in SMALL:
        torch.manual_seed(0)
        model = models.create(name, num_classes=5, in_channels=channels, input_size=size, **options).to(dev)
        x = torch.rand(2, channels, size, size, device=dev, requires_grad=True)
        F.cross_entropy(model(x), torch.tensor([0, 4], device=dev)).backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
    vit = models.create("vit_tiny", num_classes=10, input_size=32).to(dev)
    assert models.profile(vit) == models.profile("vit_tiny", input_size=32, num_classes=10)  # CUDA attention counted


# ------------------------------------------------------------------------------------ catalogue and checks
def test_si_gives_three_significant_figures():
    from robustest.models.profiling import si

    assert [si(n) for n in (0, 950, 999, 1000, 1234, 9999, 10_000, 999_999, 1_000_000, 25_557_032, 999_999_999,
                            1_000_000_000, 4_100_000_000, 12_345_678_901)] == [
        "0", "950", "999", "1.00k", "1.23k", "10.00k", "10.0k", "1000.0k", "1.00M", "25.6M", "1000.0M", "1.00G",
        "4.10G", "12.3G"]


def test_the_catalogue_has_a_row_per_model_and_variant_with_its_profile():
    rows = {r["name"]: r for r in models.catalogue()}
    assert list(rows) == models.names() + models.variants()
    lenet = rows["lenet5"]
    prof = models.profile("lenet5")
    c, s, k = models.native("lenet5")
    assert lenet == {"name": "lenet5", "input": f"{c}x{s}x{s}", "classes": str(k),
                     "params": models.profiling.si(prof["params"]), "MACs": models.profiling.si(prof["macs"]),
                     "description": models.describe("lenet5")}
    variant = models.variants()[0]
    family, opts = models.resolve_name(variant)
    assert rows[variant]["description"] == f"{family} with " + ", ".join(f"{o} {v}" for o, v in opts.items())


def test_check_options_names_the_unknown_option_and_the_known_ones():
    assert models.check_options("convnet", {}) == {}
    assert models.check_options("wrn", {"dropout": 0.3, "depth": 16}) == {"dropout": 0.3, "depth": 16}
    with pytest.raises(ConfigError, match="^model 'wrn' has no option 'colour' \\(its options: depth, dropout, "
                                          "width\\)$"):
        models.check_options("wrn", {"depth": 16, "colour": 1})
    with pytest.raises(ConfigError, match="^model 'convnet' has no option 'width' \\(its options: none\\)$"):
        models.check_options("convnet", {"width": 2})


def test_check_spec_input_refuses_other_channels_or_a_size_the_model_cannot_take():
    spec = models.spec_of(models.create("lenet5"))
    c, s, _ = models.native("lenet5")
    models.check_spec_input(spec, c, s, s)  # its own input: accepted
    models.check_spec_input({}, 3, 5, 7)  # no spec details: nothing to check
    with pytest.raises(ConfigError, match=f"^the model takes {c}-channel images but the data has {c + 2} channels$"):
        models.check_spec_input(spec, c + 2, s, s)
    with pytest.raises(ConfigError, match=f"^the model takes {s}x{s} images but the data is 8x8: models for 8x8 "
                                          "images: "):
        models.check_spec_input(spec, c, 8, 8)
