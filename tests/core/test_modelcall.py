"""Models whose forward returns a tuple, a dict, an object with ``.logits`` or half-precision logits go
through attacks, metrics, training and analysis via the one adapter (``modelcall.forward``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from robustest import attacks, metrics, models, weakrobust
from robustest import evaluate as ev
from robustest.core import modelcall
from robustest.core.errors import ConfigError
from robustest.train import fit
from robustest.train.recipes import Recipe


class _Wrapped(nn.Module):
    """A digits model whose forward returns its logits in another shape of output."""

    def __init__(self, net: nn.Module, kind: str) -> None:
        super().__init__()
        self.net, self.kind = net, kind

    def forward(self, x):
        z = self.net(x)
        if self.kind == "tuple":
            return z, z.detach() * 0
        if self.kind == "dict":
            return {"features": x.flatten(1), "logits": z}
        if self.kind == "hf":
            return SimpleNamespace(logits=z, hidden_states=None)
        return z


@pytest.mark.parametrize("kind", ["tuple", "dict", "hf"])
def test_structured_outputs_equal_plain_logits(trained_digits_model, digits_test, kind) -> None:
    x, y = digits_test.tensors[0][:40], digits_test.tensors[1][:40]
    wrapped = _Wrapped(trained_digits_model, kind).eval()
    ref = attacks.pgd(trained_digits_model, x, y, eps=0.1, steps=3, seed=1)
    got = attacks.pgd(wrapped, x, y, eps=0.1, steps=3, seed=1)
    assert torch.equal(ref, got)
    torch.testing.assert_close(metrics.fol(wrapped, got, y, x0=x, eps=0.1),
                               metrics.fol(trained_digits_model, got, y, x0=x, eps=0.1))
    assert ev.accuracy(wrapped, (x, y)) == ev.accuracy(trained_digits_model, (x, y))


def test_fit_trains_a_tuple_output_model(digits_train) -> None:
    torch.manual_seed(0)
    net = _Wrapped(models.create("digits_cnn", input_size=8), "tuple")
    x, y = digits_train.tensors[0][:300], digits_train.tensors[1][:300]
    hist = fit(net, (x, y), epochs=8, recipe=Recipe(lr=3e-3), seed=0, progress=False)
    assert hist.last.accuracy > 0.8 and ev.accuracy(net, (x, y)) > 0.8


def test_logits_wrapper_selects_an_explicit_part(trained_digits_model, digits_test) -> None:
    class TwoHeads(nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            z = self.net(x)
            return torch.zeros_like(z), z  # the logits are the SECOND element

    x = digits_test.tensors[0][:8]
    m = models.Logits(TwoHeads(trained_digits_model), output=1).eval()
    assert torch.equal(modelcall.forward(m, x), trained_digits_model(x))
    with pytest.raises(ConfigError, match="no part 5"):
        modelcall.forward(models.Logits(TwoHeads(trained_digits_model), output=5), x)


def test_an_output_without_logits_is_one_clear_error(digits_test) -> None:
    class Bad(nn.Module):
        def forward(self, x):
            return "not logits"

    with pytest.raises(ConfigError, match="without a tensor of logits"):
        modelcall.forward(Bad(), digits_test.tensors[0][:2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_model_in_attacks_metrics_and_analysis(trained_digits_model, digits_test, dtype) -> None:
    x, y = digits_test.tensors[0][:32], digits_test.tensors[1][:32]
    half = trained_digits_model.to(dtype)
    adv = attacks.pgd(half, x, y, eps=0.1, steps=3, seed=0)
    assert adv.dtype == torch.float32 and float((adv - x).abs().max()) <= 0.1 + 1e-6
    assert modelcall.forward(half, x).dtype == torch.float32
    fol = metrics.fol(half, adv, y, x0=x, eps=0.1)
    assert fol.dtype == torch.float32 and torch.isfinite(fol).all() and (fol >= 0).all()
    ana = weakrobust.analyze(half, (x, y), n_neighbors=4, eps=0.1, seed=0)
    assert len(ana) == 32 and torch.isfinite(ana.score).all()
    # the half model agrees with the float one on most clean predictions
    ref = trained_digits_model.float()(x).argmax(1)
    assert float((modelcall.forward(half.to(dtype), x).argmax(1) == ref).float().mean()) >= 0.9


def test_predict_gives_the_logits_in_batches_in_eval_mode_and_restores_the_mode() -> None:
    from robustest.core.modelcall import predict

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(4, 3))
    x = torch.rand(5, 1, 2, 2)
    model.train()
    got = predict(model, x, batch_size=2)  # three batches: 2, 2, 1
    model.eval()
    torch.testing.assert_close(got, model(x))  # dropout off: eval mode while predicting
    assert got.shape == (5, 3) and not got.requires_grad
    model.train()
    predict(model, (x, torch.zeros(5, dtype=torch.long)))
    assert model.training  # the mode is restored
    assert predict(model, x[:0]).shape == (0,)
