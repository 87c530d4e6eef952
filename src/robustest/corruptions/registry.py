"""The corruptions by name: the 19 built-in ones registered in the benchmarks' order (their records, parameter
tables included, live beside their functions in the family modules; the record and the registry in
:mod:`robustest.corruptions.spec`), their names, groups and parameters, and :func:`corrupt`, which validates the
input, seeds the generator and runs a corruption (on the CPU in cache-sized chunks)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from robustest.core.errors import ConfigError, DataError
from robustest.core.inputs import check_images
from robustest.corruptions import blur, digital, jpeg, noise, spatter, weather
from robustest.corruptions.filters import DENSE_MAX_PIXELS
from robustest.corruptions.spec import CORRUPTIONS, SMALL_IMAGE_MAX, TABLES, CorruptionSpec, group, register

# On the CPU, multi-pass corruptions (and all corruptions of images larger than 32 x 32 x 3) run on chunks of
# about this many values: large temporaries cost page faults and cache misses on every pass.
CPU_CHUNK_VALUES = 3 * 32 * 32 * 256

for _spec in sorted((r for m in (noise, blur, weather, digital, jpeg, spatter) for r in m.RECORDS),
                    key=lambda r: r.number):
    register(_spec)


# ------------------------------------------------------------------------------------------------ public
def names() -> list[str]:
    """The corruption names: the 19 built-in ones in the benchmarks' order (the 15 common ones, then the 4
    held-out ones), then any registered from outside."""
    return CORRUPTIONS.names()


def describe(name: str) -> str:
    """One-line description of corruption ``name``."""
    return spec_of(name).description


def spec_of(name: str) -> CorruptionSpec:
    """The :class:`CorruptionSpec` record of corruption ``name`` (any spelling or alias)."""
    return CORRUPTIONS.get(_check_name(name))


def published() -> list[str]:
    """The 19 corruptions of the -C benchmarks in their published order (imagecorruptions' list)."""
    return [n for n, s in sorted(((n, s) for n, s in CORRUPTIONS.items() if s.number is not None),
                                 key=lambda p: p[1].number)]


def resolve_names(spec: str | Sequence[str]) -> list[str]:
    """Expand ``"all"``, a group (``noise``, ``blur``, ``weather``, ``digital``, ``common``, ``held-out``),
    one name, a comma-separated string or a list of names into a list of corruption names (no duplicates)."""
    items: list[str]
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
    else:
        items = [str(s).strip() for s in spec]
    if not items:
        raise ConfigError("no corruption given: use 'all' or names from robustest.corruptions.names()")
    out: list[str] = []
    for item in items:
        key = item.lower().replace("-", "_")
        members: Sequence[str] | None = names() if key == "all" else group(key)
        if members is None:
            members = (_check_name(item),)
        for g in members:
            if g not in out:
                out.append(g)
    return out


def default_table(height: int, width: int) -> str:
    """``"cifar"`` for images with ``max(height, width) <= 64``, else ``"imagenet"``."""
    return "cifar" if max(height, width) <= SMALL_IMAGE_MAX else "imagenet"


def parameters(name: str, severity: int, table: str = "cifar") -> object:
    """The reference parameter(s) of ``name`` at ``severity`` in ``table`` (as published)."""
    name = _check_name(name)
    severity = _check_severity(severity)
    if table not in TABLES:
        raise ConfigError(f"unknown parameter table {table!r}: use one of {', '.join(TABLES)}")
    return CORRUPTIONS.get(name).params[table][severity - 1]


def corrupt(x: torch.Tensor, name: str, severity: int, seed: int = 0, *, table: str | None = None) -> torch.Tensor:
    """Apply corruption ``name`` at ``severity`` (1-5) to a batch of images.

    ``x``: tensor N x C x H x W (C = 1 or 3), either floating with values in [0, 1] or uint8 with levels
    0..255 (images as stored in files; a channels-last view such as ``torch.from_numpy(a).permute(0, 3, 1,
    2)`` of an N x H x W x C array is fine). Returns a tensor of the same shape, dtype and device: floating
    input gives values in [0, 1], uint8 input the corrupted levels rounded to uint8 (the -C data set format).
    ``seed`` fixes every random draw (same seed and device: bit-identical output); different images in the
    batch get independent draws. ``table`` selects the parameter table (``"cifar"`` or ``"imagenet"``;
    default by image size, see :func:`default_table`).
    """
    name = _check_name(name)
    severity = _check_severity(severity)
    check_images(x, allow_uint8=True)
    as_u8 = x.dtype == torch.uint8
    if x.shape[1] not in (1, 3):
        raise DataError(f"x has {x.shape[1]} channels; corruptions need 1 (grayscale) or 3 (RGB) channels")
    if table is None:
        table = default_table(x.shape[2], x.shape[3])
    elif table not in TABLES:
        raise ConfigError(f"unknown parameter table {table!r}: use one of {', '.join(TABLES)}")
    if x.shape[0] == 0:
        return x.clone()
    spec = CORRUPTIONS.get(name)
    param = spec.params[table][severity - 1]
    if as_u8:  # one pass to contiguous float32 (e.g. from a channels-last view), scaled in place
        xw = x.to(torch.float32, memory_format=torch.contiguous_format).div_(255)
    else:
        work_dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
        xw = x.to(work_dtype).contiguous()  # e.g. channels-last input (a permuted H x W x C array): one copy
    gen = _generator(seed, spec, x.device)
    fn = spec.fn
    per_image = x.shape[1] * x.shape[2] * x.shape[3]
    chunk = max(1, CPU_CHUNK_VALUES // per_image)
    big = per_image > DENSE_MAX_PIXELS * 3 and name != "jpeg_compression"
    if x.device.type == "cpu" and x.shape[0] > chunk and (spec.chunked or big):
        # many passes over the data: work through cache-sized chunks, drawing from the same generator in order
        out = torch.cat([fn(xw[s:s + chunk], param, gen, table) for s in range(0, x.shape[0], chunk)])
    else:
        out = fn(xw, param, gen, table)
    out = out.clamp_(0.0, 1.0)
    if as_u8:
        return out.mul_(255).round_().to(torch.uint8)
    return out.to(x.dtype)


# ------------------------------------------------------------------------------------------------ checks
def _check_name(name: str) -> str:
    """The registered name ``name`` stands for (aliases resolved); a one-line ConfigError otherwise."""
    if name not in CORRUPTIONS:
        raise ConfigError(f"unknown corruption {name!r}: choose from {', '.join(names())} (or 'all')")
    return CORRUPTIONS.key(name)


def _check_severity(severity: int) -> int:
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= int(severity) <= 5:
        raise ConfigError(f"severity must be an integer in 1-5, got {severity!r}")
    return int(severity)


def _generator(seed: int, spec: CorruptionSpec, device: torch.device) -> torch.Generator:
    """The generator of one call: seeded from (seed, the corruption's benchmark number, or its place in the
    registry for one registered from outside)."""
    number = spec.number if spec.number is not None else CORRUPTIONS.names().index(spec.name)
    state = np.random.SeedSequence([int(seed) % 2**64, number]).generate_state(1, np.uint64)[0]
    gen = torch.Generator(device=device)
    gen.manual_seed(int(state) & (2**63 - 1))
    return gen
