"""Batched DeepHunter mutations: shapes and ranges, exact geometry, the validity rule, per-sample state."""

from __future__ import annotations

import pytest
import torch

from robustest.core.errors import ConfigError, DataError
from robustest.fuzzing import mutations as M


@pytest.fixture
def imgs() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.rand(16, 1, 12, 12, generator=gen)


def test_every_op_keeps_shape_dtype_and_range(imgs):
    gen = torch.Generator().manual_seed(0)
    for op in M.OPS:
        p = M.sample_params(op, imgs.shape[0], gen, size=12)
        assert p.shape == (imgs.shape[0], 2)
        out = M.apply(imgs, op, p, gen)
        assert out.shape == imgs.shape and out.dtype == imgs.dtype
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
        assert not torch.equal(out, imgs), op


def test_neutral_parameters_are_identity(imgs):
    n = imgs.shape[0]
    torch.testing.assert_close(M.translation(imgs, torch.zeros(n, 2)), imgs, atol=1e-5, rtol=0)
    torch.testing.assert_close(M.scale(imgs, 1.0), imgs, atol=1e-5, rtol=0)
    torch.testing.assert_close(M.shear(imgs, 0.0), imgs, atol=1e-5, rtol=0)
    torch.testing.assert_close(M.rotation(imgs, 0.0), imgs, atol=1e-5, rtol=0)
    torch.testing.assert_close(M.contrast(imgs, 1.0), imgs)
    torch.testing.assert_close(M.brightness(imgs, 0.0), imgs)
    torch.testing.assert_close(M.pixel_change(imgs, 0), imgs)


def test_geometry_matches_exact_shifts_and_quarter_turns(imgs):
    n = imgs.shape[0]
    right = M.translation(imgs, torch.tensor([[2.0, 0.0]]).expand(n, 2))
    torch.testing.assert_close(right[..., 2:], imgs[..., :-2], atol=1e-5, rtol=0)
    assert float(right[..., :2].abs().max()) == 0.0
    down = M.translation(imgs, torch.tensor([[0.0, 1.0]]).expand(n, 2))
    torch.testing.assert_close(down[..., 1:, :], imgs[..., :-1, :], atol=1e-5, rtol=0)
    # positive angle = counter-clockwise as displayed (OpenCV's convention), i.e. numpy/torch rot90
    torch.testing.assert_close(M.rotation(imgs, 90.0), imgs.rot90(1, (2, 3)), atol=1e-5, rtol=0)
    # per-sample parameters: sample 0 turns, sample 1 stays
    mixed = M.rotation(imgs[:2], torch.tensor([90.0, 0.0]))
    torch.testing.assert_close(mixed[0], imgs[0].rot90(1, (1, 2)), atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[1], imgs[1], atol=1e-5, rtol=0)


def test_pixel_value_ops_follow_their_formulas(imgs):
    torch.testing.assert_close(M.contrast(imgs, 1.3), (imgs * 1.3).clamp(0, 1))
    torch.testing.assert_close(M.brightness(imgs, -0.05), (imgs - 0.05).clamp(0, 1))
    flat = torch.full((3, 1, 9, 9), 0.4)
    for kind in range(len(M.BLUR_KINDS)):
        torch.testing.assert_close(M.blur(flat, kind), flat)
    gen = torch.Generator().manual_seed(0)
    changed = M.pixel_change(imgs, torch.arange(16) % 10, gen)
    n_changed = (changed != imgs).flatten(1).sum(1)
    assert bool((n_changed <= torch.arange(16) % 10).all())
    assert int(n_changed.sum()) > 0
    gen = torch.Generator().manual_seed(0)
    sp = M.noise(torch.full((4, 1, 50, 50), 0.5), 1, 0.0, gen)
    moved = sp != 0.5
    assert 0 < int(moved.sum()) < 0.02 * sp.numel()
    assert bool(((sp[moved] == 0) | (sp[moved] == 1)).all())


def test_is_valid_is_deephunters_rule():
    ref = torch.full((4, 1, 8, 8), 0.5)  # 64 values: alpha * size = 1.28
    x = ref.clone()
    x[0, 0, 0, 0] = 1.0          # one value changed by 0.5: L0 = 1 < 1.28 -> valid
    x[1, 0, 0, :2] = 0.0         # two values changed by 0.5: L0 = 2, Linf = 0.5 -> invalid
    x[2] += 0.15                 # every value by 0.15: Linf < 0.2 -> valid
    x[3] += 0.25                 # every value by 0.25 -> invalid
    assert M.is_valid(x, ref).tolist() == [True, False, True, False]
    # tiny float noise below half an 8-bit level is not a change
    assert bool(M.is_valid(ref + 1e-4, ref, beta=0.0).all())


def test_mutate_tracks_state_validity_and_reproduces(imgs):
    gen = torch.Generator().manual_seed(3)
    mb = M.mutate(imgs, gen, tries=3)
    assert mb.x.shape == imgs.shape and mb.valid.shape == (16,) and mb.op.shape == (16,)
    aff_idx = [M.OPS.index(o) for o in M.AFFINE]
    is_aff = torch.isin(mb.op, torch.tensor(aff_idx))
    assert torch.equal(mb.affine_done, is_aff)
    # pixel-value mutants are valid against the (unchanged) reference
    pix = mb.valid & ~is_aff
    assert bool(M.is_valid(mb.x[pix], imgs[pix]).all())
    torch.testing.assert_close(mb.ref[~is_aff], imgs[~is_aff])
    # affine mutants carry the same transform on their reference, so x == ref for them
    torch.testing.assert_close(mb.x[is_aff], mb.ref[is_aff])
    # samples without a valid mutant come back unchanged with op -1
    assert torch.equal(mb.x[~mb.valid], imgs[~mb.valid])
    assert bool((mb.op[~mb.valid] == -1).all())
    # after an affine mutation only pixel-value mutations are drawn
    nxt = M.mutate(mb.x, gen, ref=mb.ref, affine_done=mb.affine_done, tries=5)
    assert not bool(torch.isin(nxt.op[mb.affine_done], torch.tensor(aff_idx)).any())
    assert bool(nxt.affine_done[mb.affine_done].all())
    ok = nxt.valid
    assert bool(M.is_valid(nxt.x[ok & mb.affine_done], mb.ref[ok & mb.affine_done]).all())
    # same generator seed, same mutants
    again = M.mutate(imgs, torch.Generator().manual_seed(3), tries=3)
    assert torch.equal(again.x, mb.x) and torch.equal(again.op, mb.op)


def test_mutate_restricts_ops_and_validates_inputs(imgs):
    gen = torch.Generator().manual_seed(0)
    mb = M.mutate(imgs, gen, ops=["brightness"], tries=1)
    assert set(mb.op[mb.valid].tolist()) == {M.OPS.index("brightness")}
    # only affine ops allowed but every sample already used its affine mutation: nothing is valid
    none = M.mutate(imgs, gen, affine_done=torch.ones(16, dtype=torch.bool), ops=["rotation"])
    assert not bool(none.valid.any()) and torch.equal(none.x, imgs)
    with pytest.raises(ConfigError):
        M.mutate(imgs, gen, ops=["swirl"])
    with pytest.raises(ConfigError):
        M.mutate(imgs, gen, tries=0)
    with pytest.raises(DataError):
        M.mutate(imgs * 2, gen)
    with pytest.raises(ConfigError):
        M.sample_params("swirl", 3, gen)
