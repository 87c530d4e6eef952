"""The corruptions as ``nn.Module`` s, kornia-style: :class:`Corruption` applies one corruption at one
severity, :class:`RandomCorruption` a random corruption and severity to a random subset of a batch. Both
take a batch B x C x H x W or a single image C x H x W (a DataLoader transform), floating in [0, 1] or
uint8, on any device, and return the same shape, dtype and device."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from robustest.core.errors import ConfigError, DataError
from robustest.corruptions.registry import _check_name, _check_severity, corrupt, resolve_names
from robustest.corruptions.spec import TABLES


def _draw_seed(generator: torch.Generator | None) -> int:
    """A corruption seed from ``generator`` (CPU), or from torch's global generator when None."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


def _as_batch(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if not isinstance(x, torch.Tensor):
        raise DataError(f"input must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 3:
        return x.unsqueeze(0), True
    if x.dim() != 4:
        raise DataError(f"input has shape {tuple(x.shape)}; expected B x C x H x W or C x H x W")
    return x, False


def _check_generator(generator: torch.Generator | None) -> torch.Generator | None:
    if generator is not None and (not isinstance(generator, torch.Generator) or generator.device.type != "cpu"):
        raise ConfigError("generator must be a CPU torch.Generator (it only draws the choices and seeds; the "
                          "corruption runs on the input's device)")
    return generator


class Corruption(nn.Module):
    """One corruption at one severity: ``Corruption("fog", 3)(x)`` is ``corrupt(x, "fog", 3, seed=s)`` with a
    fresh seed ``s`` per call, drawn from ``generator`` (a CPU ``torch.Generator``) or, when None, from
    torch's global generator (so ``torch.manual_seed`` and DataLoader worker seeding apply).

    Input: B x C x H x W or C x H x W (C = 1 or 3), floating in [0, 1] or uint8; output: same shape, dtype
    and device. ``table``: parameter table (None: by image size, see :func:`default_table`).
    """

    def __init__(self, name: str, severity: int = 3, *, generator: torch.Generator | None = None,
                 table: str | None = None) -> None:
        super().__init__()
        self.name = _check_name(name)
        self.severity = _check_severity(severity)
        if table is not None and table not in TABLES:
            raise ConfigError(f"unknown parameter table {table!r}: use one of {', '.join(TABLES)} or None")
        self.table = table
        self.generator = _check_generator(generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xb, single = _as_batch(x)
        out = corrupt(xb, self.name, self.severity, seed=_draw_seed(self.generator), table=self.table)
        return out[0] if single else out

    def extra_repr(self) -> str:
        return f"name={self.name!r}, severity={self.severity}" + (f", table={self.table!r}" if self.table else "")


class RandomCorruption(nn.Module):
    """With probability ``p`` per sample, a corruption drawn uniformly from ``names`` at a severity drawn
    uniformly from ``severities``; the other samples pass unchanged.

    ``names``: ``"all"``, a group (``"noise"``, ``"blur"``, ``"weather"``, ``"digital"``, ``"common"``,
    ``"held-out"``), a comma-separated string or a list (see :func:`resolve_names`). ``severities``: integers
    in 1-5. Choices and corruption seeds come from ``generator`` (a CPU ``torch.Generator``), or from
    torch's global generator when None (``torch.manual_seed`` and DataLoader worker seeding apply), so a
    seeded generator gives the same output for the same input. As a transform of a DataLoader with worker
    processes, leave ``generator`` None: each worker gets a copy of a given generator (the same draws in
    every worker), while torch's global generator is seeded per worker. The samples that share a
    (corruption, severity) are corrupted in one batched call.

    Input: B x C x H x W or a single C x H x W image (C = 1 or 3), floating in [0, 1] or uint8, on any
    device; output: same shape, dtype and device.
    """

    def __init__(self, names: str | Sequence[str] = "all", severities: Sequence[int] = (1, 2, 3, 4, 5),
                 p: float = 0.5, *, generator: torch.Generator | None = None, table: str | None = None) -> None:
        super().__init__()
        self.names = resolve_names(names)
        if isinstance(severities, int):
            severities = (severities,)
        self.severities = tuple(_check_severity(s) for s in severities)
        if not self.severities:
            raise ConfigError("severities is empty: give integers in 1-5")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
            raise ConfigError(f"p must be a probability in [0, 1], got {p!r}")
        self.p = float(p)
        if table is not None and table not in TABLES:
            raise ConfigError(f"unknown parameter table {table!r}: use one of {', '.join(TABLES)} or None")
        self.table = table
        self.generator = _check_generator(generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xb, single = _as_batch(x)
        n = xb.shape[0]
        g = self.generator
        apply = torch.rand(n, generator=g) < self.p
        which = torch.randint(0, len(self.names), (n,), generator=g)
        sev = torch.randint(0, len(self.severities), (n,), generator=g)
        out = xb.clone()
        if bool(apply.any()):
            combo = torch.where(apply, which * len(self.severities) + sev, torch.full_like(which, -1))
            for key in torch.unique(combo[apply]).tolist():  # one batched call per (corruption, severity) drawn
                idx = (combo == key).nonzero().squeeze(1).to(xb.device)
                name, severity = self.names[key // len(self.severities)], self.severities[key % len(self.severities)]
                out[idx] = corrupt(xb[idx], name, severity, seed=_draw_seed(g), table=self.table)
        return out[0] if single else out

    def extra_repr(self) -> str:
        shown = self.names if len(self.names) <= 4 else f"[{len(self.names)} corruptions]"
        return f"names={shown}, severities={self.severities}, p={self.p}" + (
            f", table={self.table!r}" if self.table else "")
