"""Tests of the interoperability layer of robustest.corruptions: corrupt_image (a drop-in for imagecorruptions'
corrupt on H x W x C uint8 NumPy images) and the nn.Module forms Corruption / RandomCorruption."""

from __future__ import annotations

import inspect
import io

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from robustest import corruptions as C
from robustest.core.errors import ConfigError, DataError


def colour_image(h: int = 40, w: int = 36, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.repeat(np.repeat(rng.integers(0, 256, (h // 4 + 1, w // 4 + 1, 3)), 4, 0), 4, 1)[:h, :w]
    return img.astype(np.uint8)


# ---------------------------------------------------------------------------------------- corrupt_image
def test_corrupt_image_has_imagecorruptions_signature() -> None:
    params = list(inspect.signature(C.corrupt_image).parameters.values())[:4]
    assert [(p.name, p.default) for p in params[1:]] == [("severity", 1), ("corruption_name", None),
                                                         ("corruption_number", -1)]
    assert params[0].name == "image"


@pytest.mark.parametrize("name", C.names())
def test_corrupt_image_is_corrupt_on_uint8_hwc_truncated(name: str) -> None:
    img = colour_image()
    out = C.corrupt_image(img, 3, name, seed=4)
    assert out.shape == img.shape and out.dtype == np.uint8
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255
    want = C.corrupt(x, name, 3, seed=4, table="imagenet")[0].permute(1, 2, 0).numpy()
    # imagecorruptions returns np.uint8(float image): truncation, not rounding
    assert np.array_equal(out, np.floor(want * 255 + 1e-4).clip(0, 255).astype(np.uint8)), name


def test_corrupt_image_keeps_integer_levels_exact() -> None:
    # jpeg_compression equals Pillow's JPEG round trip; truncating its float32 result must not lose a level
    img = colour_image(48, 40, seed=1)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=int(C.parameters("jpeg_compression", 2, "imagenet")))
    buf.seek(0)
    want = np.asarray(Image.open(buf).convert("RGB"))
    assert np.array_equal(C.corrupt_image(img, 2, "jpeg_compression"), want)


def test_corrupt_image_grayscale_becomes_rgb_like_imagecorruptions() -> None:
    img = colour_image()[:, :, 0]
    for gray in (img, img[:, :, None]):
        out = C.corrupt_image(gray, 2, "contrast")
        assert out.shape == img.shape + (3,) and out.dtype == np.uint8
        assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 0], out[..., 2])
        assert np.array_equal(out, C.corrupt_image(np.repeat(img[:, :, None], 3, 2), 2, "contrast"))


def test_corrupt_image_by_number_and_names_by_subset() -> None:
    img = colour_image(seed=2)
    everything = C.get_corruption_names("all")
    assert everything == C.names()
    for i in (0, 7, 18):
        assert np.array_equal(C.corrupt_image(img, 2, corruption_number=i, seed=1),
                              C.corrupt_image(img, 2, everything[i], seed=1))
    sizes = {s: len(C.get_corruption_names(s)) for s in ("common", "validation", "noise", "blur", "weather",
                                                          "digital")}
    assert sizes == {"common": 15, "validation": 4, "noise": 3, "blur": 4, "weather": 4, "digital": 4}
    assert C.get_corruption_names() == everything[:15]
    with pytest.raises(ConfigError):
        C.get_corruption_names("everything")


def test_corrupt_image_draws_from_numpys_global_generator() -> None:
    img = colour_image(seed=3)
    np.random.seed(11)
    a = C.corrupt_image(img, 3, "gaussian_noise")
    b = C.corrupt_image(img, 3, "gaussian_noise")
    np.random.seed(11)
    assert not np.array_equal(a, b)  # successive calls: fresh noise, as in imagecorruptions
    assert np.array_equal(C.corrupt_image(img, 3, "gaussian_noise"), a)  # np.random.seed reproduces them


def test_corrupt_image_rejects_bad_input() -> None:
    img = colour_image()
    with pytest.raises(DataError, match="uint8"):
        C.corrupt_image(img.astype(np.float32) / 255, 1, "fog")
    with pytest.raises(DataError, match="shape"):
        C.corrupt_image(np.zeros((32, 32, 4), np.uint8), 1, "fog")
    with pytest.raises(DataError, match="numpy"):
        C.corrupt_image(torch.zeros(32, 32, 3, dtype=torch.uint8), 1, "fog")
    with pytest.raises(ConfigError, match="corruption_name or corruption_number"):
        C.corrupt_image(img, 1)
    with pytest.raises(ConfigError, match="0-18"):
        C.corrupt_image(img, 1, corruption_number=19)
    with pytest.raises(ConfigError, match="severity"):
        C.corrupt_image(img, 6, "fog")
    with pytest.raises(ConfigError, match="unknown corruption"):
        C.corrupt_image(img, 1, "rain")


# ---------------------------------------------------------------------------------------- nn.Module forms
def batch(n: int = 8, c: int = 3, size: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, c, size, size, generator=torch.Generator().manual_seed(seed))


def test_corruption_module_is_corrupt_with_a_drawn_seed() -> None:
    x = batch()
    m = C.Corruption("gaussian_noise", 2, generator=torch.Generator().manual_seed(5))
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(5)))
    first = m(x)
    assert torch.equal(first, C.corrupt(x, "gaussian_noise", 2, seed=seed))
    assert not torch.equal(m(x), first)  # a fresh seed per call
    torch.manual_seed(3)
    a = C.Corruption("shot_noise", 1)(x)
    torch.manual_seed(3)
    assert torch.equal(C.Corruption("shot_noise", 1)(x), a)  # global RNG by default
    assert repr(m) == "Corruption(name='gaussian_noise', severity=2)"


def test_random_corruption_p0_and_p1() -> None:
    x = batch()
    assert torch.equal(C.RandomCorruption("all", p=0.0)(x), x)
    out = C.RandomCorruption("contrast", (2,), p=1.0)(x)
    assert torch.equal(out, C.corrupt(x, "contrast", 2))  # contrast draws nothing: per image, deterministic


def test_random_corruption_draws_name_and_severity_per_sample() -> None:
    x = batch(64)
    m = C.RandomCorruption(["contrast", "brightness"], (1, 5), p=1.0, generator=torch.Generator().manual_seed(0))
    out = m(x)
    candidates = {(n, s): C.corrupt(x, n, s) for n in ("contrast", "brightness") for s in (1, 5)}
    seen = set()
    for i in range(len(x)):
        hits = [k for k, v in candidates.items() if torch.equal(out[i], v[i])]
        assert len(hits) == 1, i
        seen.add(hits[0])
    assert seen == set(candidates)  # every (corruption, severity) drawn somewhere in 64 samples


def test_random_corruption_applies_to_a_fraction_p() -> None:
    x = torch.rand(4000, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    out = C.RandomCorruption("contrast", (5,), p=0.3, generator=torch.Generator().manual_seed(2))(x)
    changed = (out != x).flatten(1).any(1).float().mean().item()
    assert abs(changed - 0.3) < 0.03  # 4 binomial standard deviations


def test_random_corruption_is_seeded_and_varies_between_calls() -> None:
    x = batch(16)

    def make() -> C.RandomCorruption:
        return C.RandomCorruption("noise", p=0.7, generator=torch.Generator().manual_seed(9))

    m = make()
    a, b = m(x), m(x)
    assert torch.equal(a, make()(x)) and not torch.equal(a, b)
    assert "p=0.7" in repr(m) and "gaussian_noise" in repr(m)


def test_random_corruption_as_a_dataloader_transform_and_in_a_pipeline() -> None:
    images = (batch(10, 1, 12) * 255).round().to(torch.uint8)

    class Images(Dataset):
        def __init__(self, transform: nn.Module) -> None:
            self.transform = transform

        def __len__(self) -> int:
            return len(images)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return self.transform(images[i]), i  # one C x H x W uint8 image

    tf = C.RandomCorruption("all", (1, 2), p=1.0, generator=torch.Generator().manual_seed(0))
    xs = torch.cat([xb for xb, _ in DataLoader(Images(tf), batch_size=4)])
    assert xs.shape == images.shape and xs.dtype == torch.uint8 and not torch.equal(xs, images)
    pipeline = nn.Sequential(C.RandomCorruption("blur", p=1.0), nn.Flatten(), nn.Linear(3 * 16 * 16, 2))
    assert pipeline(batch()).shape == (8, 2)


def test_random_corruption_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError, match="probability"):
        C.RandomCorruption(p=1.5)
    with pytest.raises(ConfigError, match="severity"):
        C.RandomCorruption(severities=(0, 3))
    with pytest.raises(ConfigError, match="unknown corruption"):
        C.RandomCorruption(["rain"])
    with pytest.raises(DataError, match="shape"):
        C.RandomCorruption()(torch.rand(2, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_random_corruption_on_cuda() -> None:
    x = batch(32).cuda()
    out = C.RandomCorruption("all", p=0.5, generator=torch.Generator().manual_seed(0))(x)
    assert out.device == x.device and out.shape == x.shape and bool(((out >= 0) & (out <= 1)).all())
