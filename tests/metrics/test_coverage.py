"""Neuron coverage: activation extraction (hooks, modes, per-channel reduction, layer choice), the streaming
profile, each metric on hand-made activations, image-level API, serialisation, and agreement with dnn-tip."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from robustest.core.errors import ConfigError, DataError
from robustest.metrics import activations as A
from robustest.metrics.coverage import CoverageProfile, per_input_scores


def _profile(mins, maxs, stds=None, sizes=None) -> CoverageProfile:
    mins = torch.tensor(mins, dtype=torch.float64)
    maxs = torch.tensor(maxs, dtype=torch.float64)
    stds = torch.zeros_like(mins) if stds is None else torch.tensor(stds, dtype=torch.float64)
    sizes = sizes or [len(mins)]
    return CoverageProfile(["l"], sizes, 10, mins, maxs, (mins + maxs) / 2, stds)


class TinyConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.drop = nn.Dropout(0.5)
        self.block = nn.Sequential(OrderedDict([("fc", nn.Linear(3 * 8 * 8, 5)), ("act", nn.ReLU())]))
        self.out = nn.Linear(5, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.relu1(self.conv(x)))
        return self.out(self.block(h.flatten(1)))


class FunctionalNet(nn.Module):
    """No activation modules: the default falls back to Conv/Linear except the last."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 2, 3)
        self.f1 = nn.Linear(2 * 6 * 6, 6)
        self.f2 = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f2(F.relu(self.f1(F.relu(self.c1(x)).flatten(1))))


# ------------------------------------------------------------------------------------------- extraction
def test_default_layers_and_choice_by_name_suffix_type() -> None:
    m = TinyConv()
    assert A.default_layers(m) == ["relu1", "block.act"]
    assert A.resolve_layers(m, "act") == ["block.act"]  # unique dotted suffix
    assert A.resolve_layers(m, ["block.fc", "conv"]) == ["conv", "block.fc"]  # module order
    assert A.resolve_layers(m, nn.Linear) == ["block.fc", "out"]
    assert A.resolve_layers(m, [nn.ReLU, "out"]) == ["relu1", "block.act", "out"]
    assert A.default_layers(FunctionalNet()) == ["c1", "f1"]
    with pytest.raises(ConfigError, match="no layer named"):
        A.resolve_layers(m, "nope")
    with pytest.raises(ConfigError, match="no Conv1d"):
        A.resolve_layers(m, nn.Conv1d)
    amb = nn.Sequential(OrderedDict([("a", nn.Sequential(OrderedDict([("r", nn.ReLU())]))),
                                     ("b", nn.Sequential(OrderedDict([("r", nn.ReLU())])))]))
    with pytest.raises(ConfigError, match="ambiguous"):
        A.resolve_layers(amb, "r")


def test_penultimate_features_are_the_last_hidden_layer() -> None:
    torch.manual_seed(0)
    m, x = TinyConv(), torch.rand(7, 1, 8, 8)
    feats = A.penultimate_features(m, x, batch_size=3)
    with torch.no_grad():
        m.eval()
        want = F.relu(m.block.fc(F.relu(m.conv(x)).flatten(1)))  # block.act: the input of the logits layer
    assert feats.shape == (7, 5) and feats.dtype == torch.float32
    torch.testing.assert_close(feats, want)
    f = FunctionalNet()
    assert A.penultimate_features(f, x).shape == (7, 6)  # no activation modules: the Linear before the logits


def test_per_channel_reduction_matches_manual_mean() -> None:
    torch.manual_seed(0)
    m = TinyConv().eval()
    x = torch.rand(7, 1, 8, 8)
    acts, logits = A.extract(m, x, ["conv", "relu1", "block.fc"], batch_size=3)
    conv = m.conv(x)
    expect = torch.cat([conv.mean((2, 3)), F.relu(conv).mean((2, 3)), m.block.fc(F.relu(conv).flatten(1))], 1)
    assert acts.shape == (7, 3 + 3 + 5)
    torch.testing.assert_close(acts, expect.detach())
    torch.testing.assert_close(logits, m(x).detach())


def test_hooks_removed_modes_and_grad_flags_restored_even_on_error() -> None:
    m = TinyConv()
    m.train()
    m.block.eval()  # mixed modes must come back exactly
    m.out.weight.requires_grad_(False)
    x = torch.rand(5, 1, 8, 8)
    prof = CoverageProfile.build(m, x, batch_size=2)
    prof.bits(x, "kmnc")
    assert all(not mod._forward_hooks for mod in m.modules())
    assert m.training and m.relu1.training and not m.block.training and not m.block.fc.training
    assert m.conv.weight.requires_grad and not m.out.weight.requires_grad
    bad = torch.rand(3, 1, 9, 9)  # wrong size: the Linear layer raises inside the forward pass
    with pytest.raises(RuntimeError):
        prof.bits(bad, "nc")
    assert all(not mod._forward_hooks for mod in m.modules())
    assert m.training and not m.block.training


def test_dropout_off_during_extraction_and_deterministic() -> None:
    torch.manual_seed(1)
    m = TinyConv().train()
    x = torch.rand(6, 1, 8, 8)
    a1, _ = A.extract(m, x, "block.act")
    a2, _ = A.extract(m, x, "block.act")
    assert torch.equal(a1, a2)
    assert m.training


def test_module_called_twice_gives_one_part_per_call() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.act = nn.Linear(4, 3), nn.Linear(3, 2), nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.fc2(self.act(self.fc1(x.flatten(1)))))

    m = Shared()
    x = torch.rand(5, 1, 2, 2)
    prof = CoverageProfile.build(m, x)
    assert prof.sizes == [3, 2]
    a = prof.activations(x)
    torch.testing.assert_close(a[:, :3], F.relu(m.fc1(x.flatten(1))).detach())


def test_layer_not_in_forward_pass_is_a_config_error() -> None:
    m = TinyConv()
    m.unused = nn.ReLU()
    with pytest.raises(ConfigError, match="not used"):
        A.extract(m, torch.rand(2, 1, 8, 8), "unused")


# ---------------------------------------------------------------------------------------------- profile
def test_streaming_profile_equals_full_numpy_statistics_for_any_batch_size() -> None:
    torch.manual_seed(0)
    m = TinyConv()
    x = torch.rand(29, 1, 8, 8)
    for bs in (1, 7, 64):
        # same batch size: a BLAS result may differ in the last bit between batch sizes
        a = A.extract(m, x, batch_size=bs)[0].double().numpy()
        p = CoverageProfile.build(m, x, batch_size=bs)
        assert p.count == 29 and p.sizes == [3, 5]
        np.testing.assert_array_equal(p.min.numpy(), a.min(0))
        np.testing.assert_array_equal(p.max.numpy(), a.max(0))
        np.testing.assert_allclose(p.mean.numpy(), a.mean(0), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(p.std.numpy(), a.std(0, ddof=1), rtol=1e-10, atol=1e-14)


def test_profile_accepts_datasets_and_pairs(digits_train) -> None:
    torch.manual_seed(0)
    from robustest import models

    m = models.create("digits_cnn", input_size=8)
    sub = torch.utils.data.TensorDataset(*(t[:100] for t in digits_train.tensors))
    p1 = CoverageProfile.build(m, sub, batch_size=32)
    # same batch size: a convolution's last bits may differ between batch sizes (oneDNN picks kernels by shape)
    p2 = CoverageProfile.build(m, (sub.tensors[0], sub.tensors[1]), batch_size=32)
    assert torch.equal(p1.max, p2.max) and p1.count == 100
    assert p1.layers == ["relu1", "relu2", "relu3"] and p1.sizes == [32, 64, 128]


# ---------------------------------------------------------------------------------------------- metrics
def test_nc_threshold_is_strict_and_raw() -> None:
    p = _profile([0, 0, 0], [1, 1, 1])
    a = torch.tensor([[0.5, 0.51, -1.0], [2.0, 0.0, 0.6]])
    bits = p.bits_from_activations(a, "nc")
    assert bits.tolist() == [[False, True, False], [True, False, True]]
    assert p.bits_from_activations(a, "nc", threshold=0.0).tolist() == [[True, True, False], [True, False, True]]
    assert p.per_input_from_activations(a, "nc").tolist() == pytest.approx([1 / 3, 2 / 3])
    assert p.set_coverage_from_activations(a, "nc") == pytest.approx(1.0)
    assert p.set_coverage_from_activations(a[:1], "nac") == pytest.approx(1 / 3)


def test_nc_scaled_per_layer() -> None:
    p = _profile([0] * 4, [1] * 4, sizes=[2, 2])
    a = torch.tensor([[10.0, 20.0, -1.0, -3.0]])  # scaled per layer: [0, 1] and [1, 0]
    assert p.bits_from_activations(a, "nc", scaled=True).tolist() == [[False, True, True, False]]


def test_kmnc_sections_and_boundaries() -> None:
    p = _profile([0.0, -1.0], [1.0, 1.0])
    a = torch.tensor([
        [0.0, -1.0],   # both at min: section 0
        [0.5, 0.0],    # neuron 0 section 2 of 4 ([0.5, 0.75)); neuron 1 section 2 ([0, 0.5))
        [1.0, 1.0],    # at max: no section (t_{k-1} <= a < t_k fails)
        [-0.1, 2.0],   # outside: nothing
        [0.9999, 0.49],
    ])
    bits = p.bits_from_activations(a, "kmnc", k=4).view(5, 2, 4)
    expect = torch.zeros(5, 2, 4, dtype=torch.bool)
    expect[0, 0, 0] = expect[0, 1, 0] = True
    expect[1, 0, 2] = expect[1, 1, 2] = True
    expect[4, 0, 3] = expect[4, 1, 2] = True
    assert torch.equal(bits, expect)
    per = p.per_input_from_activations(a, "kmnc", k=4)
    assert per.tolist() == pytest.approx([2 / 8, 2 / 8, 0, 0, 2 / 8])
    assert p.set_coverage_from_activations(a, "kmnc", k=4) == pytest.approx(5 / 8)
    assert p.num_cells("kmnc", k=4) == 8


def test_kmnc_constant_neuron_covers_nothing() -> None:
    p = _profile([0.3], [0.3])
    assert not p.bits_from_activations(torch.tensor([[0.3], [0.2], [0.4]]), "kmnc", k=3).any()


def test_nbc_and_snac_inclusive_boundaries_with_std_scale() -> None:
    p = _profile([0.0, 0.0], [1.0, 2.0], stds=[0.5, 1.0])
    a = torch.tensor([[0.0, 2.0], [-0.25, 2.5], [1.5, -1.0], [0.5, 1.0]])
    nbc0 = p.bits_from_activations(a, "nbc").view(4, 2, 2)  # (lower, upper) per neuron
    assert nbc0.tolist() == [[[True, False], [False, True]], [[True, False], [False, True]],
                             [[False, True], [True, False]], [[False, False], [False, False]]]
    nbc1 = p.bits_from_activations(a, "nbc", scale=0.5).view(4, 2, 2)
    assert nbc1.tolist() == [[[False, False], [False, False]], [[True, False], [False, True]],
                             [[False, True], [True, False]], [[False, False], [False, False]]]
    assert p.bits_from_activations(a, "snac").tolist() == [[False, True], [False, True], [True, False],
                                                           [False, False]]
    assert p.bits_from_activations(a, "snac", scale=1.0).tolist() == [[False, False], [False, False],
                                                                      [True, False], [False, False]]
    assert p.set_coverage_from_activations(a, "nbc", scale=0.5) == pytest.approx(4 / 4)


def test_tknc_per_layer_top_k() -> None:
    p = _profile([0] * 5, [1] * 5, sizes=[3, 2])
    a = torch.tensor([[0.1, 0.9, 0.5, 3.0, -1.0], [0.7, 0.2, 0.1, -2.0, -1.0]])
    assert p.bits_from_activations(a, "tknc").tolist() == [[False, True, False, True, False],
                                                           [True, False, False, False, True]]
    assert p.bits_from_activations(a, "tknc", top_k=2).tolist() == [[False, True, True, True, True],
                                                                    [True, True, False, True, True]]
    assert p.per_input_from_activations(a, "tknc").tolist() == pytest.approx([2 / 5, 2 / 5])
    assert p.set_coverage_from_activations(a, "tknc") == pytest.approx(4 / 5)
    ties = torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0]])  # a stable ascending sort puts the later neuron last
    assert p.bits_from_activations(ties, "tknc").tolist() == [[False, False, True, False, True]]


def _kmnc_brute(a: np.ndarray, lo: np.ndarray, hi: np.ndarray, k: int) -> np.ndarray:
    """The definition, written out: section i covered iff lo + i * ((hi - lo) / k) <= a < lo + (i + 1) * (...)."""
    jump = (hi - lo) / k
    t = [lo + jump * i for i in range(k + 1)]
    return np.stack([(t[i] <= a) & (a < t[i + 1]) for i in range(k)], axis=2).reshape(len(a), -1)


@pytest.mark.parametrize("k", [1, 3, 10, 97])
def test_kmnc_equals_written_out_definition(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    lo = torch.randn(40, generator=gen, dtype=torch.float64)
    hi = lo + torch.rand(40, generator=gen, dtype=torch.float64) * 3
    hi[:3] = lo[:3]  # constant neurons
    p = _profile(lo.tolist(), hi.tolist())
    a = (lo + (hi - lo) * (torch.rand(500, 40, generator=gen, dtype=torch.float64) * 1.2 - 0.1)).float()
    a[:40, :] = p.min.float()  # exactly at min and (as far as float32 allows) at the bounds
    a[40:80, :] = p.max.float()
    want = _kmnc_brute(a.double().numpy(), lo.numpy(), hi.numpy(), k)
    np.testing.assert_array_equal(p.bits_from_activations(a, "kmnc", k=k).numpy(), want)


@pytest.mark.parametrize("k", [10, 40])  # the bound-table path and the formula path
def test_kmnc_degenerate_range_below_float64_spacing(k: int) -> None:
    lo, hi = 1.0, 1.0 + 4e-16  # bounds 1 + i * (4e-16 / k) collapse onto two float64 values
    p = _profile([lo], [hi])
    a = torch.tensor([[1.0], [0.99999994]])
    want = _kmnc_brute(a.double().numpy(), np.array([lo]), np.array([hi]), k)
    assert want[0].sum() == 1 and not want[0, 0] and not want[1].any()
    np.testing.assert_array_equal(p.bits_from_activations(a, "kmnc", k=k).numpy(), want)
    assert p.set_coverage_from_activations(a, "kmnc", k=k) == pytest.approx(1 / k)


def test_float32_activations_against_float64_bounds_are_exact() -> None:
    # a bound between two float32 values: a float32 activation just below / above must land on the right side
    bound = 0.1  # not a float32
    below, above = np.float32(0.1), np.nextafter(np.float32(0.1), np.float32(1))
    if float(below) > bound:
        below = np.nextafter(below, np.float32(0))
    p = _profile([-1.0], [bound], stds=[0.0])
    a = torch.tensor([[float(below)], [float(above)]], dtype=torch.float32)
    assert p.bits_from_activations(a, "snac").flatten().tolist() == [False, True]
    q = _profile([bound], [2.0])
    assert p.bits_from_activations(a, "nbc").view(2, 2)[:, 1].tolist() == [False, True]
    assert q.bits_from_activations(a, "nbc").view(2, 2)[:, 0].tolist() == [True, False]


@pytest.mark.parametrize("top_k", [1, 2, 5])
def test_tknc_equals_stable_sort_with_many_ties(top_k: int) -> None:
    gen = torch.Generator().manual_seed(top_k)
    sizes = [4, 9, 30]
    a = torch.randint(-3, 4, (300, sum(sizes)), generator=gen).float() * 0.5  # few distinct values: many ties
    a[:50] = torch.rand(50, sum(sizes), generator=gen)  # and some rows without ties
    a[5, :] = -0.0  # signed zeros tie with zeros
    p = _profile([0.0] * sum(sizes), [1.0] * sum(sizes), sizes=sizes)
    want, s = [], 0
    for n in sizes:
        layer = a[:, s:s + n].numpy()
        top = np.argsort(layer, axis=1, kind="stable")[:, -top_k:]
        prof = np.zeros_like(layer, dtype=bool)
        np.put_along_axis(prof, top, True, axis=1)
        want.append(prof)
        s += n
    np.testing.assert_array_equal(p.bits_from_activations(a, "tknc", top_k=top_k).numpy(), np.concatenate(want, 1))


def test_option_and_shape_errors() -> None:
    p = _profile([0.0], [1.0])
    a = torch.zeros(2, 1)
    with pytest.raises(ConfigError, match="unknown coverage metric"):
        p.bits_from_activations(a, "foo")
    with pytest.raises(ConfigError, match="takes options"):
        p.bits_from_activations(a, "kmnc", top_k=2)
    with pytest.raises(ConfigError, match="k >= 1"):
        p.bits_from_activations(a, "kmnc", k=0)
    with pytest.raises(ConfigError, match="top_k"):
        p.bits_from_activations(a, "tknc", top_k=1.5)
    with pytest.raises(DataError, match=r"\[N, 1\]"):
        p.bits_from_activations(torch.zeros(2, 3), "nc")
    with pytest.raises(ConfigError, match="no model"):
        p.bits(torch.rand(2, 1, 8, 8), "nc")


# ------------------------------------------------------------------------------------------- image API
def test_image_api_consistent_with_activation_api_and_batching() -> None:
    torch.manual_seed(0)
    m = TinyConv()
    train, test = torch.rand(40, 1, 8, 8), torch.rand(25, 1, 8, 8)
    p = CoverageProfile.build(m, train, batch_size=16)
    acts = p.activations(test)
    for metric, opts in [("nc", {}), ("kmnc", {"k": 5}), ("nbc", {}), ("snac", {"scale": 0.1}), ("tknc", {})]:
        bits = p.bits(test, metric, batch_size=4, **opts)
        assert bits.dtype == torch.bool and bits.shape == (25, p.num_cells(metric, **opts))
        assert torch.equal(bits, p.bits_from_activations(acts, metric, **opts))
        per = p.per_input(test, metric, batch_size=7, **opts)
        torch.testing.assert_close(per, bits.float().mean(1))
        assert p.set_coverage(test, metric, batch_size=6, **opts) == pytest.approx(bits.any(0).float().mean().item())
    # training inputs lie within the profile's range: every KMNC hit, no SNAC hit at scale > 0
    assert p.per_input(train, "snac", scale=0.5).sum() == 0
    assert p.set_coverage(train, "kmnc", k=2) > 0.5


def test_per_input_scores_and_registry_compute(digits_train, digits_test) -> None:
    from robustest import metrics, models

    torch.manual_seed(0)
    m = models.create("digits_cnn", input_size=8)
    train = digits_train.tensors[0][:200]
    x = digits_test.tensors[0][:30]
    s = per_input_scores(m, train, x, "kmnc", k=4, batch_size=64)
    assert s.shape == (30,) and s.dtype == torch.float32 and bool(((s >= 0) & (s <= 1)).all())
    expect = CoverageProfile.build(m, train).per_input(x, "kmnc", k=4)
    assert torch.equal(s, expect)
    s2 = per_input_scores(m, train, x, "kmnc", k=4)
    assert torch.equal(s, s2)  # deterministic
    via = metrics.compute("nc", m, x, train=train, threshold=0.1)
    assert torch.equal(via, per_input_scores(m, train, x, "nc", threshold=0.1))
    with pytest.raises(DataError):
        per_input_scores(m, train, x * 3, "nc")


def test_to_dict_from_dict_roundtrip(tmp_path) -> None:
    torch.manual_seed(0)
    m = TinyConv()
    x = torch.rand(20, 1, 8, 8)
    p = CoverageProfile.build(m, x)
    path = tmp_path / "profile.pt"
    torch.save(p.to_dict(), path)
    q = CoverageProfile.from_dict(torch.load(path, weights_only=True), model=m)
    assert q.layers == p.layers and q.sizes == p.sizes and q.count == p.count
    for k in ("min", "max", "mean", "std"):
        assert torch.equal(getattr(p, k), getattr(q, k))
    assert torch.equal(p.bits(x, "kmnc"), q.bits(x, "kmnc"))
    with pytest.raises(DataError):
        CoverageProfile.from_dict({"format": "other"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    torch.manual_seed(0)
    m = TinyConv()
    train, test = torch.rand(64, 1, 8, 8), torch.rand(32, 1, 8, 8)
    p = CoverageProfile.build(m, train)
    mc = TinyConv().cuda()
    mc.load_state_dict(m.state_dict())
    pc = CoverageProfile.build(mc, train.cuda())
    torch.testing.assert_close(pc.max, p.max)
    for metric in ("nc", "kmnc", "nbc", "snac", "tknc"):
        bc = pc.bits(test.cuda(), metric)
        assert bc.device.type == "cuda"
        assert (bc.cpu() != p.bits(test, metric)).float().mean() < 0.01  # float rounding may flip a boundary cell


# ---------------------------------------------------------------------------------------- dnn-tip parity
def _layers_np(acts: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    out, s = [], 0
    for n in sizes:
        out.append(acts[:, s:s + n])
        s += n
    return out


def test_matches_dnn_tip_on_same_activations(digits_model, digits_train, digits_test) -> None:
    nc = pytest.importorskip("dnn_tip.neuron_coverage")
    p = CoverageProfile.build(digits_model, digits_train, batch_size=512)
    acts = p.activations(torch.cat([digits_test.tensors[0][:150], digits_train.tensors[0][:50]]))
    a = acts.numpy()
    layers = _layers_np(a, p.sizes)
    mins, maxs, stds = [p.min.numpy()], [p.max.numpy()], [p.std.numpy()]
    t_hi = round(float(np.quantile(a, 0.9)), 3)  # an untrained model's activations are small
    cases = [
        ("nc", {"threshold": 0.0}, nc.NAC(0.0)), ("nc", {"threshold": t_hi}, nc.NAC(t_hi)),
        ("kmnc", {"k": 2}, nc.KMNC(mins, maxs, 2)), ("kmnc", {"k": 10}, nc.KMNC(mins, maxs, 10)),
        ("kmnc", {"k": 200}, nc.KMNC(mins, maxs, 200)),
        ("nbc", {"scale": 0}, nc.NBC(mins, maxs, stds, 0)), ("nbc", {"scale": 0.5}, nc.NBC(mins, maxs, stds, 0.5)),
        ("snac", {"scale": 0}, nc.SNAC(maxs, stds, 0)), ("snac", {"scale": 1}, nc.SNAC(maxs, stds, 1)),
        ("tknc", {"top_k": 1}, nc.TKNC(1)), ("tknc", {"top_k": 3}, nc.TKNC(3)),
    ]
    for metric, opts, ref in cases:
        scores, profiles = ref(layers)
        profiles = profiles.reshape(len(a), -1)
        bits = p.bits_from_activations(acts, metric, **opts).numpy()
        assert profiles.sum() > 0, metric
        np.testing.assert_array_equal(bits, profiles, err_msg=f"{metric} {opts}")
        per = p.per_input_from_activations(acts, metric, **opts).double().numpy()
        np.testing.assert_array_equal(np.rint(per * bits.shape[1]).astype(np.int64), scores.astype(np.int64))
        assert p.set_coverage_from_activations(acts, metric, **opts) == pytest.approx(profiles.any(0).mean())
