"""Model zoo: every registered model builds for its typical input and returns logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from robustest import models
from robustest.core.errors import ConfigError

TYPICAL = {  # name -> (in_channels, input_size)
    "lenet1": (1, 28),
    "lenet5": (1, 28),
    "convnet": (1, 28),
    "mnist_small": (1, 28),
    "madry_cnn": (1, 28),
    "digits_cnn": (1, 8),
    "mlp": (1, 28),
    "resnet20": (3, 32),
}


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_names_cover_the_required_zoo():
    names = models.names()
    assert names == sorted(names)
    for required in ("lenet1", "lenet5", "convnet", "resnet20", "digits_cnn"):
        assert required in names
    for name in names:
        assert models.describe(name)


@pytest.mark.parametrize("name", sorted(TYPICAL))
def test_every_model_builds_and_returns_logits(name):
    c, s = TYPICAL[name]
    k = 7
    torch.manual_seed(0)
    model = models.create(name, num_classes=k, in_channels=c, input_size=s).eval()
    x = torch.rand(3, c, s, s)
    out = model(x)
    assert out.shape == (3, k) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    # batch independence in eval mode: one sample alone gives the same logits
    torch.testing.assert_close(model(x[:1]), out[:1], rtol=1e-4, atol=1e-5)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_every_registered_model_is_covered():
    full_scale = {"wrn", "preact_resnet18", "densenet_bc", "resnet18", "resnet50", "vit_tiny"}  # test_zoo.py
    assert set(models.names()) <= set(TYPICAL) | full_scale, "add new models to TYPICAL or tests/models/test_zoo.py"


@pytest.mark.parametrize("name, c, s", [("lenet5", 3, 32), ("convnet", 3, 32), ("digits_cnn", 1, 28),
                                        ("lenet1", 1, 16), ("resnet20", 1, 12), ("mlp", 3, 8)])
def test_other_input_sizes(name, c, s):
    model = models.create(name, num_classes=10, in_channels=c, input_size=s).eval()
    assert model(torch.rand(2, c, s, s)).shape == (2, 10)


def test_architecture_details():
    lenet5 = models.create("lenet5")
    convs = [m for m in lenet5.modules() if isinstance(m, nn.Conv2d)]
    fcs = [m for m in lenet5.modules() if isinstance(m, nn.Linear)]
    assert [(m.out_channels, m.kernel_size, m.padding) for m in convs] == [(6, (5, 5), (2, 2)), (16, (5, 5), (0, 0))]
    assert [m.out_features for m in fcs] == [120, 84, 10] and fcs[0].in_features == 16 * 5 * 5
    convnet = models.create("convnet")
    assert [m.out_channels for m in convnet.modules() if isinstance(m, nn.Conv2d)] == [32, 32, 64, 64]
    assert any(isinstance(m, nn.Dropout) for m in convnet.modules())
    assert [m.out_features for m in convnet.modules() if isinstance(m, nn.Linear)] == [512, 10]


def test_resnet20_depth_and_parameter_count():
    model = models.create("resnet20", in_channels=3, input_size=32)
    assert 0.26e6 < n_params(model) < 0.28e6  # He et al.: 0.27M
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(convs) + len(linears) == 20
    with pytest.raises(ConfigError, match="6n\\+2"):
        models.ResNetCifar(depth=21)
    assert 0.45e6 < n_params(models.ResNetCifar(depth=32)) < 0.48e6  # 0.46M


def test_normalize_inside_the_model():
    torch.manual_seed(0)
    plain = models.create("lenet5").eval()
    torch.manual_seed(0)
    normed = models.create("lenet5", mean=0.5, std=0.25).eval()
    assert isinstance(normed.normalize, models.Normalize)
    normed.net.load_state_dict(plain.state_dict())
    x = torch.rand(3, 1, 28, 28)
    torch.testing.assert_close(normed(x), plain((x - 0.5) / 0.25))
    assert "mean=[0.5]" in repr(normed.normalize)
    rgb = models.create("resnet20", in_channels=3, input_size=32, mean=[0.1, 0.2, 0.3], std=(1, 2, 4)).eval()
    assert rgb.normalize.mean.flatten().tolist() == pytest.approx([0.1, 0.2, 0.3])
    xr = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(rgb.normalize(xr)[:, 2], (xr[:, 2] - 0.3) / 4)
    # mean/std are buffers: saved with the weights and moved with the model
    assert {"normalize.mean", "normalize.std"} <= set(rgb.state_dict())
    assert not any(p is rgb.normalize.mean for p in rgb.parameters())


@pytest.mark.parametrize("kwargs, pattern", [
    ({"mean": 0.5}, "both mean and std"),
    ({"std": 0.5}, "both mean and std"),
    ({"mean": [0.5, 0.5], "std": [1, 1]}, "one per channel"),
    ({"mean": 0.5, "std": 0.0}, "positive"),
    ({"mean": 0.5, "std": -1.0}, "positive"),
    ({"num_classes": 1}, "num_classes"),
    ({"in_channels": 0}, "in_channels"),
    ({"input_size": 2}, "input_size"),
])
def test_create_argument_errors(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern) as exc:
        models.create("lenet5", **kwargs)
    assert "\n" not in str(exc.value)


def test_unknown_model_and_too_small_input():
    with pytest.raises(ConfigError, match="unknown model 'vgg'.*lenet5"):
        models.create("vgg")
    with pytest.raises(ConfigError, match="cannot take 1x8x8"):
        models.create("lenet1", input_size=8)
    with pytest.raises(ConfigError, match="cannot take"):
        models.create("convnet", input_size=8)


def test_spec_of():
    model = models.create("digits_cnn", num_classes=5, in_channels=1, input_size=8, mean=0.3, std=0.2)
    spec = models.spec_of(model)
    assert spec == {"name": "digits_cnn", "num_classes": 5, "in_channels": 1, "input_size": 8,
                    "mean": [0.3], "std": [0.2], "options": {}}
    spec["name"] = "changed"
    assert models.spec_of(model)["name"] == "digits_cnn"  # a copy
    assert models.spec_of(models.create("mlp"))["mean"] is None
    with pytest.raises(ConfigError, match="not built by robustest"):
        models.spec_of(nn.Linear(2, 2))


def test_register_adds_a_model():
    @models.register("_test_tiny", "tiny test model")
    def tiny(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * input_size * input_size, num_classes))

    try:
        assert "_test_tiny" in models.names() and models.describe("_test_tiny") == "tiny test model"
        assert models.create("_test_tiny", num_classes=4, input_size=5)(torch.rand(2, 1, 5, 5)).shape == (2, 4)
    finally:
        assert models.unregister("_test_tiny").description == "tiny test model"
    assert "_test_tiny" not in models.names()


def test_describe_unknown_is_config_error():
    with pytest.raises(ConfigError, match="unknown model"):
        models.describe("vgg")


def test_models_are_deterministic_given_the_torch_seed():
    torch.manual_seed(3)
    a = models.create("lenet5")
    torch.manual_seed(3)
    b = models.create("lenet5")
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
