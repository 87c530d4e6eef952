"""Training recipes: SGD momentum/Nesterov, warm-up and step milestones, label smoothing, weight decay off
norms and biases, mixed precision, torch.compile, crop-flip augmentation, per-epoch resume, named recipes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from robustest import models
from robustest.core.errors import ConfigError
from robustest.train import fit, recipes, schedules


def small(digits_train, n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    return digits_train.tensors[0][:n], digits_train.tensors[1][:n]


def fresh(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return models.create("digits_cnn", num_classes=10, in_channels=1, input_size=8)


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------- crop-flip
def reference_crop_flip(x: torch.Tensor, padding: int, seed: int) -> torch.Tensor:
    """One image at a time, with the same random draws as recipes.crop_flip."""
    g = torch.Generator().manual_seed(seed)
    n, _, h, w = x.shape
    oy = torch.randint(0, 2 * padding + 1, (n,), generator=g)
    ox = torch.randint(0, 2 * padding + 1, (n,), generator=g)
    flip = torch.rand(n, generator=g) < 0.5
    padded = F.pad(x, (padding,) * 4)
    out = []
    for i in range(n):
        img = padded[i, :, oy[i]:oy[i] + h, ox[i]:ox[i] + w]
        out.append(img.flip(-1) if flip[i] else img)
    return torch.stack(out)


@pytest.mark.parametrize("shape, padding", [((16, 3, 32, 32), 4), ((9, 1, 8, 12), 4), ((5, 2, 6, 6), 0)])
def test_crop_flip_matches_a_per_image_reference(shape, padding):
    x = torch.rand(shape)
    got = recipes.crop_flip(x, padding, torch.Generator().manual_seed(3))
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, reference_crop_flip(x, padding, 3), rtol=0, atol=0)


def test_crop_flip_is_seeded_and_random_enough():
    x = torch.rand(2000, 1, 8, 8)
    a = recipes.crop_flip(x, generator=torch.Generator().manual_seed(0))
    b = recipes.crop_flip(x, generator=torch.Generator().manual_seed(0))
    c = recipes.crop_flip(x, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.min()) >= 0 and float(a.max()) <= 1  # zero padding keeps pixels in [0, 1]
    unchanged = (a == x).flatten(1).all(1).float().mean()  # offset (4, 4) and no flip: 1/81 * 1/2
    assert 0.001 < float(unchanged) < 0.02
    flipped = (a == x.flip(-1)).flatten(1).all(1).float().mean()
    assert 0.001 < float(flipped) < 0.02
    x1 = torch.ones(4000, 1, 8, 8)  # the zero border shows the offsets: every shift from -4 to 4 occurs
    rows_blank = (recipes.crop_flip(x1, generator=torch.Generator().manual_seed(2)).sum(3) == 0).sum(2)
    assert set(rows_blank.flatten().tolist()) == {0, 1, 2, 3, 4}


def test_crop_flip_runs_on_the_images_device_and_refuses_other_shapes():
    x = torch.rand(3, 3, 8, 8, dtype=torch.float64)
    assert recipes.crop_flip(x, generator=torch.Generator().manual_seed(0)).dtype == torch.float64
    assert recipes.crop_flip(torch.rand(0, 3, 8, 8)).shape == (0, 3, 8, 8)
    with pytest.raises(ConfigError, match="N x C x H x W"):
        recipes.crop_flip(torch.rand(3, 8, 8))


# ------------------------------------------------------------------------------------ optimiser, schedule
def test_sgd_momentum_and_nesterov_are_passed_through():
    model = fresh()
    opt = recipes.make_optimizer(model, recipes.Recipe(optimizer="sgd", lr=0.1, momentum=0.5, nesterov=False).check(1))
    assert isinstance(opt, torch.optim.SGD)
    assert opt.param_groups[0]["momentum"] == 0.5 and opt.param_groups[0]["nesterov"] is False
    default = recipes.make_optimizer(model, recipes.Recipe(optimizer="sgd", lr=0.1).check(1))
    assert default.param_groups[0]["momentum"] == 0.9 and default.param_groups[0]["nesterov"] is True


def test_weight_decay_skips_norms_and_biases():
    torch.manual_seed(0)
    model = models.create("resnet20", num_classes=10, in_channels=3, input_size=8, mean=0.5, std=0.25)
    skip = recipes.no_decay_parameters(model)
    names = {n for n, p in model.named_parameters() if id(p) in skip}
    assert names and all((".bn" in n or "bias" in n) for n in names)
    assert all(id(p) not in skip for n, p in model.named_parameters() if p.ndim == 4)
    assert any(n.endswith("bn1.weight") for n in names) and any(n.endswith("fc.bias") for n in names)
    opts = recipes.Recipe(optimizer="sgd", lr=0.1, weight_decay=0.1, decay_norm_bias=False).check(1)
    opt = recipes.make_optimizer(model, opts)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    # a step with zero gradients: decay shrinks the conv weights only
    before = weights(model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = model.state_dict()
    for n, p in model.named_parameters():
        if id(p) in skip:
            assert torch.equal(after[n], before[n]), n
        else:
            assert after[n].abs().sum() < before[n].abs().sum(), n
    both = recipes.make_optimizer(model, recipes.Recipe(optimizer="sgd", lr=0.1, weight_decay=0.1).check(1))
    assert len(both.param_groups) == 1  # the default: decay on every parameter, as before


def lrs(opts: recipes.Recipe, epochs: int, steps: int) -> list[float]:
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = schedules.make_schedule(opt, opts, epochs, steps)
    out = []
    for _ in range(epochs * steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched is not None:
            sched.step()
    return out


def test_schedules_with_warmup_and_milestones():
    def chk(epochs, **kw):
        return recipes.Recipe(**kw).check(epochs)

    assert lrs(chk(4), 4, 5) == [1.0] * 20
    warm = lrs(chk(4, warmup_epochs=1), 4, 5)
    assert warm[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0]) and warm[5:] == [1.0] * 15
    cos = lrs(chk(4, schedule="cosine", warmup_epochs=1), 4, 5)
    assert cos[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert cos[5:] == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 15)) for k in range(15)])
    step = lrs(chk(4, schedule="step", milestones=[1, 3]), 4, 5)
    assert step == pytest.approx([1.0] * 5 + [0.1] * 10 + [0.01] * 5)
    half = lrs(chk(4, schedule="step", milestones=[0.5, 2.5, 3.5]), 4, 2)  # fractional epochs
    assert half == pytest.approx([1.0, 0.1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.001])
    default = lrs(chk(4, schedule="step"), 4, 5)  # 50 % and 75 % of training, as always
    assert default == pytest.approx([1.0] * 10 + [0.1] * 5 + [0.01] * 5)
    ws = lrs(chk(4, schedule="step", milestones=[2], warmup_epochs=1), 4, 5)
    assert ws[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0]) and ws[5:] == pytest.approx([1.0] * 5 + [0.1] * 10)
    # cyclic: 20 steps, peak at 40 % = step 8 (1-based), then down to 0 at the last step
    cyc = lrs(chk(4, schedule="cyclic"), 4, 5)
    assert cyc[:8] == pytest.approx([t / 8 for t in range(1, 9)])
    assert cyc[8:] == pytest.approx([(20 - t) / 12 for t in range(9, 21)])
    assert max(cyc) == pytest.approx(1.0) and cyc[-1] == 0.0


# --------------------------------------------------------------------------------------------- fit
def test_fit_with_sgd_recipe_options_trains(digits_train):
    x, y = small(digits_train, 200)
    runs = {}
    for key, kw in {"plain": {}, "momentum": {"momentum": 0.5, "nesterov": False},
                    "smooth": {"label_smoothing": 0.2}, "nodecay": {"decay_norm_bias": False},
                    "warm": {"warmup_epochs": 1, "schedule": "cosine"},
                    "step": {"schedule": "step", "milestones": [1]}}.items():
        model = fresh()
        h = fit(model, (x, y), epochs=2, batch_size=32,
                recipe=recipes.Recipe(lr=0.05, optimizer="sgd", weight_decay=5e-3, **kw), progress=False)
        assert all(math.isfinite(e.loss) for e in h.epochs)
        runs[key] = (weights(model), [e.loss for e in h.epochs], [e.lr for e in h.epochs])
    for key in runs:
        if key != "plain":
            assert not same(runs[key][0], runs["plain"][0]), key  # every option changes training
    assert runs["step"][2] == pytest.approx([0.005, 0.005])
    assert runs["warm"][2][-1] == pytest.approx(0.0, abs=1e-12)
    # label smoothing: the reported loss is the smoothed cross-entropy, bounded below by its entropy term
    assert runs["smooth"][1][-1] > runs["plain"][1][-1]


def test_label_smoothing_loss_is_torchs(digits_train):
    x, y = small(digits_train, 32)
    model = fresh()
    h = fit(model, (x, y), epochs=1, batch_size=32, recipe=recipes.Recipe(lr=1e-9, label_smoothing=0.3), progress=False)
    with torch.no_grad():
        torch.manual_seed(0)
        ref = fresh()
        expect = F.cross_entropy(ref.train()(x), y, label_smoothing=0.3)
    assert h.last.loss == pytest.approx(float(expect), rel=1e-5)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"lr": float("nan")}, "lr"),
    ({"weight_decay": float("inf")}, "weight_decay"),
    ({"optimizer": "sgd", "momentum": 1.0}, r"momentum must be a number in \[0, 1\)"),
    ({"optimizer": "sgd", "momentum": float("nan")}, "momentum"),
    ({"optimizer": "sgd", "momentum": 0.0}, "nesterov needs a momentum"),
    ({"momentum": 0.9}, "options of optimizer='sgd'"),
    ({"nesterov": False}, "options of optimizer='sgd'"),
    ({"optimizer": "sgd", "nesterov": "no"}, "nesterov must be"),
    ({"warmup_epochs": 2}, "warmup_epochs must be below"),
    ({"schedule": "cyclic", "warmup_epochs": 0.5}, "cyclic schedule has its own warm-up"),
    ({"warmup_epochs": -1}, r"^warmup_epochs must be"),
    ({"warmup_epochs": float("inf")}, "warmup_epochs"),
    ({"milestones": [1]}, "milestones go with schedule='step'"),
    ({"schedule": "step", "milestones": [3]}, r"milestones must be a number in \(0, 2"),
    ({"schedule": "step", "milestones": [1, 1]}, "strictly increasing"),
    ({"schedule": "step", "milestones": []}, "non-empty list"),
    ({"schedule": "step", "milestones": "1,2"}, "non-empty list"),
    ({"schedule": "step", "milestones": [float("nan")]}, "milestones"),
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"label_smoothing": -0.1}, "label_smoothing"),
    ({"decay_norm_bias": 0}, "decay_norm_bias must be"),
    ({"amp": "fp8"}, "amp"),
    ({"amp": "fp16"}, "amp='fp16' needs a CUDA device"),
    ({"compile": "yes"}, "compile must be"),
    ({"augment": "mixup"}, "augment"),
])
def test_recipe_options_are_refused_before_any_work(digits_train, kwargs, pattern):
    x, y = small(digits_train, 32)
    model = fresh()
    before = weights(model)
    with pytest.raises(ConfigError, match=pattern) as exc:
        fit(model, (x, y), epochs=2, batch_size=16, recipe=recipes.Recipe(**kwargs), progress=False)
    assert "\n" not in str(exc.value)
    assert same(weights(model), before)


def test_bf16_autocast_trains_on_the_cpu(digits_train):
    x, y = small(digits_train, 64)
    model = fresh()
    h = fit(model, (x, y), epochs=2, batch_size=32, recipe=recipes.Recipe(lr=3e-3, amp="bf16"), progress=False)
    assert all(math.isfinite(e.loss) for e in h.epochs) and h.last.loss < h.epochs[0].loss + 0.5
    assert next(model.parameters()).dtype == torch.float32  # weights stay fp32; autocast only computes in bf16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cuda(digits_train, amp):
    x, y = small(digits_train, 256)
    model = fresh().cuda()
    h = fit(model, (x, y), epochs=3, batch_size=32, recipe=recipes.Recipe(lr=3e-3, amp=amp), progress=False)
    assert all(math.isfinite(e.loss) for e in h.epochs) and h.last.loss < h.epochs[0].loss
    assert next(model.parameters()).dtype == torch.float32


# ------------------------------------------------------------------------------------------- compile
def test_compile_unavailable_is_one_line(digits_train, monkeypatch):
    x, y = small(digits_train, 32)
    model = fresh()
    before = weights(model)
    monkeypatch.delattr(torch, "compile")
    with pytest.raises(ConfigError, match="compile=True needs torch.compile") as exc:
        fit(model, (x, y), epochs=1, recipe=recipes.Recipe(compile=True), progress=False)
    assert "\n" not in str(exc.value) and same(weights(model), before)


def test_compile_failure_at_the_first_step_is_one_line(digits_train, monkeypatch):
    class BackendCompilerFailed(RuntimeError):
        pass

    BackendCompilerFailed.__module__ = "torch._dynamo.exc"

    class Broken(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            raise BackendCompilerFailed("backend='inductor' raised:\nCppCompileError: C++ compile error")

    monkeypatch.setattr(torch, "compile", lambda m: Broken(m))
    x, y = small(digits_train, 32)
    model = fresh()
    before = weights(model)
    with pytest.raises(ConfigError, match="torch.compile failed on this machine") as exc:
        fit(model, (x, y), epochs=1, recipe=recipes.Recipe(compile=True), progress=False)
    assert "\n" not in str(exc.value) and same(weights(model), before)

    def refuse(m):
        raise RuntimeError("Dynamo is not supported on Python 3.99+")

    monkeypatch.setattr(torch, "compile", refuse)
    with pytest.raises(ConfigError, match="torch.compile is not available here"):
        fit(model, (x, y), epochs=1, recipe=recipes.Recipe(compile=True), progress=False)


def test_errors_that_are_not_compilation_pass_through(digits_train, monkeypatch):
    class Bad(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            raise ValueError("a bug in the model")

    monkeypatch.setattr(torch, "compile", lambda m: Bad(m))
    x, y = small(digits_train, 32)
    with pytest.raises(ValueError, match="a bug in the model"):
        fit(fresh(), (x, y), epochs=1, recipe=recipes.Recipe(compile=True), progress=False)


@pytest.mark.slow
def test_compiled_training_matches_eager(digits_train):
    x, y = small(digits_train, 64)

    def resnet() -> nn.Module:  # no dropout: a compiled graph draws its own dropout masks
        torch.manual_seed(0)
        return models.create("resnet20", num_classes=10, in_channels=1, input_size=8)

    eager, comp = resnet(), resnet()
    # SGD: its update is linear in the gradient (Adam's normalised step turns a float-level difference in a
    # near-zero gradient into a full lr-sized difference)
    kw = {"lr": 0.05, "optimizer": "sgd"}
    he = fit(eager, (x, y), 1, 32, recipes.Recipe(**kw), progress=False)
    hc = fit(comp, (x, y), 1, 32, recipes.Recipe(compile=True, **kw), progress=False)
    assert hc.last.loss == pytest.approx(he.last.loss, rel=1e-4)
    for k, v in eager.state_dict().items():  # fused kernels sum in another order: float-level differences only
        torch.testing.assert_close(comp.state_dict()[k], v, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------- augment
class PlainDataset(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_crop_flip_augmentation_in_fit(digits_train):
    x, y = small(digits_train, 96)
    runs = []
    for aug in (None, "crop-flip", "crop-flip"):
        model = fresh()
        fit(model, (x, y), epochs=1, batch_size=32, recipe=recipes.Recipe(augment=aug), seed=4, progress=False)
        runs.append(weights(model))
    assert not same(runs[0], runs[1]) and same(runs[1], runs[2])  # applied, and seeded
    model = fresh()
    fit(model, TensorDataset(x, y), epochs=1, batch_size=32, recipe=recipes.Recipe(augment="crop-flip"), seed=4,
        progress=False)
    assert same(weights(model), runs[1])  # the same batches from a TensorDataset
    h = fit(fresh(), PlainDataset(x, y), epochs=1, batch_size=32, recipe=recipes.Recipe(augment="crop-flip"),
            progress=False)
    assert math.isfinite(h.last.loss)
    with pytest.raises(ConfigError, match="DataLoader's own transforms apply"):
        fit(fresh(), DataLoader(TensorDataset(x, y), batch_size=32), epochs=1,
            recipe=recipes.Recipe(augment="crop-flip"), progress=False)


# -------------------------------------------------------------------------------------------- resume
class Killed(Exception):
    pass


def test_state_dir_continues_exactly_after_a_kill(digits_train, tmp_path):
    x, y = small(digits_train, 128)
    recipe = recipes.Recipe(lr=0.05, optimizer="sgd", schedule="cosine", warmup_epochs=1, augment="crop-flip")
    kw = {"epochs": 4, "batch_size": 32, "recipe": recipe, "val": (x[:32], y[:32]), "keep": "best",
          "progress": False}
    ref = fresh()
    h_ref = fit(ref, (x, y), **kw)

    def kill(epoch, model, stats):
        if epoch == 2:
            raise Killed

    state = tmp_path / "train_state.pt"
    model = fresh()
    with pytest.raises(Killed):
        fit(model, (x, y), state_dir=tmp_path, on_epoch_end=kill, **kw)
    assert state.is_file()
    with pytest.raises(ConfigError, match="already holds the state of an interrupted fit run: resume it"):
        fit(fresh(), (x, y), state_dir=tmp_path, **kw)
    torch.manual_seed(123)  # the global RNG state is restored from the file
    again = fresh(seed=9)  # weights come from the file too
    h = fit(again, (x, y), state_dir=tmp_path, resume=True, **kw)
    assert [e.epoch for e in h.epochs] == [1, 2, 3, 4]
    assert [e.loss for e in h.epochs] == [e.loss for e in h_ref.epochs]
    assert [e.lr for e in h.epochs] == [e.lr for e in h_ref.epochs]
    assert h.best_epoch == h_ref.best_epoch and same(weights(again), weights(ref))
    done = fresh(seed=5)  # a finished state: nothing left to train, the final weights come back
    h2 = fit(done, (x, y), state_dir=tmp_path, resume=True, **kw)
    assert [e.loss for e in h2.epochs] == [e.loss for e in h_ref.epochs]
    with pytest.raises(ConfigError, match="other settings") as exc:
        fit(fresh(), (x, y), state_dir=tmp_path, resume=True, **{**kw, "recipe": replace(recipe, lr=0.01)})
    assert "\n" not in str(exc.value)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "train_state.pt").write_bytes(b"not a state")
    with pytest.raises(ConfigError, match="not a training state"):
        fit(fresh(), (x, y), state_dir=tmp_path / "junk", resume=True, **kw)
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        fit(fresh(), (x, y), state_dir=state, resume=True, **kw)


# ------------------------------------------------------------------------------------------- recipes
@pytest.mark.parametrize("name", sorted(recipes.RECIPES))
def test_named_recipes_are_valid_fit_arguments(name, digits_train):
    r = recipes.recipe(name)
    assert r["epochs"] >= 90 and r["augment"] == "crop-flip"
    assert r["optimizer"] == "adam" or r["decay_norm_bias"] is False  # SGD recipes keep decay off norms/biases
    short = recipes.recipe(name, epochs=2)
    if r.get("milestones"):
        assert short["milestones"] == pytest.approx([m * 2 / r["epochs"] for m in r["milestones"]])
    x, y = small(digits_train, 32)
    epochs, batch_size, recipe = recipes.layered_recipe(name, 2, {"batch_size": 16})
    assert (epochs, batch_size, recipe.milestones) == (2, 16, tuple(short["milestones"]) if r.get("milestones")
                                                       else None)
    h = fit(fresh(), (x, y), epochs, batch_size, recipe, progress=False)
    assert len(h.epochs) == 2 and math.isfinite(h.last.loss)
    r["epochs"] = 1
    assert recipes.recipe(name)["epochs"] != 1  # a copy
    with pytest.raises(ConfigError, match="unknown recipe 'fast'"):
        recipes.recipe("fast")


# ------------------------------------------------------------------------------------ layered_recipe
def test_layered_recipe_without_a_name_is_fits_defaults_and_needs_epochs():
    assert recipes.FIT_DEFAULTS == {"batch_size": 64, "lr": 1e-3, "optimizer": "adam", "weight_decay": 0.0}
    epochs, batch, r = recipes.layered_recipe(None, 3, {})
    assert (epochs, batch) == (3, 64) and r == recipes.Recipe().check(3)
    with pytest.raises(ConfigError, match=r"give --epochs N \(or a --recipe"):
        recipes.layered_recipe(None, None, {"lr": 0.1})


def test_layered_recipe_takes_the_named_recipe_and_its_epochs():
    epochs, batch, r = recipes.layered_recipe("cifar-sgd", None, {})
    assert (epochs, batch) == (100, 128)
    assert (r.optimizer, r.lr, r.momentum, r.nesterov, r.weight_decay, r.schedule, r.augment) == (
        "sgd", 0.1, 0.9, True, 5e-4, "cosine", "crop-flip") and r.decay_norm_bias is False


def test_layered_recipe_scales_the_schedule_to_the_epochs_given_and_flags_override():
    epochs, batch, r = recipes.layered_recipe("imagenet-sgd", 9, {"lr": 0.05, "batch_size": 32})
    assert (epochs, batch, r.lr, r.schedule) == (9, 32, 0.05, "step")
    assert r.milestones == pytest.approx((3.0, 6.0))  # 30 and 60 of 90 epochs, scaled to 9


def test_layered_recipe_drops_what_does_not_carry_over_unless_given():
    _, _, adam = recipes.layered_recipe("cifar-sgd", 10, {"optimizer": "adam"})
    assert adam.optimizer == "adam" and adam.momentum == recipes.Recipe().momentum  # the recipe's SGD momentum dropped
    with pytest.raises(ConfigError, match="momentum"):  # given explicitly with Adam: refused, not dropped
        recipes.layered_recipe("cifar-sgd", 10, {"optimizer": "adam", "momentum": 0.5})
    _, _, cos = recipes.layered_recipe("imagenet-sgd", 9, {"schedule": "cosine"})
    assert cos.schedule == "cosine" and cos.milestones is None  # step's milestones do not carry over
    _, _, off = recipes.layered_recipe("cifar-sgd", 10, {"schedule": "none", "augment": "none"})
    assert off.schedule is None and off.augment is None


# ------------------------------------------------------------------------------------------- Recipe
def test_recipe_check_resolves_sgds_defaults_and_is_idempotent():
    adam = recipes.Recipe().check(3)
    assert adam == recipes.Recipe() and (adam.momentum, adam.nesterov) == (None, None)
    sgd = recipes.Recipe(optimizer="sgd", lr=0.1, schedule="none", augment="none").check(3)
    assert sgd == recipes.Recipe(optimizer="sgd", lr=0.1, momentum=0.9, nesterov=True)
    assert sgd.check(3) == sgd and adam.check(3) == adam
    ms = recipes.Recipe(schedule="step", milestones=[1, 2]).check(3)
    assert ms.milestones == (1.0, 2.0) and ms.check(3) == ms


def test_recipe_records_and_given():
    assert recipes.Recipe().to_dict() == {
        "optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0, "momentum": 0.9, "nesterov": True, "schedule": None,
        "warmup_epochs": 0.0, "milestones": None, "label_smoothing": 0.0, "decay_norm_bias": True, "amp": None,
        "compile": False, "augment": None}  # the record of every run since the first release: SGD's as SGD runs
    r = recipes.Recipe(optimizer="sgd", momentum=0.5, nesterov=False, schedule="step", milestones=(2,))
    assert {k: r.to_dict()[k] for k in ("momentum", "nesterov", "milestones")} == {"momentum": 0.5,
                                                                                   "nesterov": False,
                                                                                   "milestones": [2]}
    assert recipes.Recipe().given() == {}
    assert recipes.Recipe(lr=0.1, optimizer="sgd", momentum=0.9).given() == {"lr": 0.1, "optimizer": "sgd",
                                                                             "momentum": 0.9}


def test_as_recipe_and_an_unchecked_sgd_recipe_in_make_optimizer():
    assert recipes.as_recipe(None) == recipes.Recipe()
    r = recipes.Recipe(lr=0.2)
    assert recipes.as_recipe(r) is r
    with pytest.raises(ConfigError, match=r"^recipe must be a robustest.train.recipes.Recipe \(or None for the "
                                          r"defaults\), got dict: build one with Recipe\(optimizer=\.\.\., lr=\.\.\., "
                                          r"\.\.\.\)$"):
        recipes.as_recipe({"lr": 0.1})
    adam = recipes.make_optimizer(fresh(), recipes.Recipe(lr=0.02, weight_decay=0.01))
    assert isinstance(adam, torch.optim.Adam) and (adam.defaults["lr"], adam.defaults["weight_decay"]) == (0.02, 0.01)
    opt = recipes.make_optimizer(fresh(), recipes.Recipe(optimizer="sgd", lr=0.1))
    assert isinstance(opt, torch.optim.SGD)
    assert (opt.defaults["momentum"], opt.defaults["nesterov"], opt.defaults["lr"]) == (0.9, True, 0.1)


def test_fit_takes_the_recipe_and_refuses_its_fields_as_keywords(digits_train):
    x, y = small(digits_train, 32)
    with pytest.raises(TypeError, match="lr"):
        fit(fresh(), (x, y), 1, lr=0.1, progress=False)
    a, b = fresh(), fresh()
    fit(a, (x, y), 1, 16, recipes.Recipe(optimizer="sgd", lr=0.05), progress=False)
    fit(b, (x, y), 1, 16, recipes.Recipe(optimizer="sgd", lr=0.05, momentum=0.9, nesterov=True), progress=False)
    assert same(weights(a), weights(b))  # unset momentum and Nesterov are SGD's 0.9 and on


def test_layered_recipe_keeps_a_named_recipes_sgd_settings_and_refuses_stray_milestones():
    _, batch, r = recipes.layered_recipe("imagenet-sgd", 2, {"schedule": "none", "augment": "none"})
    assert (batch, r.optimizer, r.momentum, r.nesterov, r.schedule, r.augment, r.milestones) == (
        256, "sgd", 0.9, False, None, None, None)  # "none" turns them off; the recipe's milestones go with its schedule
    with pytest.raises(ConfigError, match="milestones go with schedule='step'"):
        recipes.layered_recipe(None, 3, {"milestones": [1]})


def test_recipe_check_boundaries():
    R = recipes.Recipe
    assert R(lr=10.0).check(1).lr == 10.0 and R(weight_decay=1.0).check(1).weight_decay == 1.0
    assert R(schedule="constant").check(1).schedule is None and R(weight_decay=0.0).check(1).weight_decay == 0.0
    assert R().check(0) == R()  # no warm-up: zero epochs (fit's no-op) are fine
    for bad, pattern in ((R(lr=0.0), r"^lr must be"), (R(lr=10.5), r"^lr must be"), (R(lr=float("inf")), "^lr"),
                         (R(weight_decay=-0.1), "^weight_decay"), (R(weight_decay=1.5), "^weight_decay"),
                         (R(weight_decay=float("nan")), "^weight_decay")):
        with pytest.raises(ConfigError, match=pattern):
            bad.check(1)


def test_require_only_names_the_first_field_a_trainer_would_ignore():
    r = recipes.Recipe(lr=0.1, optimizer="sgd")
    assert r.require_only(("optimizer", "lr"), "fit") is r
    with pytest.raises(ConfigError, match=r"^loop does not take the recipe option amp \(it honours optimizer, lr\): "
                                          r"leave it unset$"):
        recipes.Recipe(lr=0.1, augment="crop-flip", amp="bf16").require_only(("optimizer", "lr"), "loop")


def test_recipe_in_effect_keeps_set_options_and_sgd_momentum_only_with_sgd():
    assert recipes.Recipe().check(2).in_effect() == {
        "optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0, "warmup_epochs": 0.0, "label_smoothing": 0.0,
        "decay_norm_bias": True, "compile": False}
    sgd = recipes.Recipe(optimizer="sgd", lr=0.1, schedule="step", milestones=[2, 3]).check(4).in_effect()
    assert sgd["momentum"] == 0.9 and sgd["nesterov"] is True and sgd["milestones"] == [2.0, 3.0]
    assert sgd["schedule"] == "step" and "amp" not in sgd and "augment" not in sgd
