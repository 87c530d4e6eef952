"""Seeded random draws of the corruptions: uniform, normal and Poisson draws from one generator, cut on
the CPU into fixed, independently seeded chunks drawn on several threads (the same output for any thread
count)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from robustest.core.tasks import run_tasks

DRAW_CHUNK = 1 << 18  # CPU random draws: values per independently seeded chunk
SERIAL_CHUNK = 1 << 14  # values per tensor operation inside a chunk task: below torch's grain size (32768),
# so those operations run on the task's own thread instead of opening an OpenMP team


def _chunk_generators(numel: int, gen: torch.Generator, device: torch.device
                      ) -> list[tuple[int, int, torch.Generator]]:
    """The fixed chunks of a draw of ``numel`` values as ``(start, stop, generator)``: one chunk with ``gen``
    off the CPU or for at most :data:`DRAW_CHUNK` values; otherwise chunks of DRAW_CHUNK values, chunk ``i``
    with its own generator seeded by the ``i``-th of ``len(chunks)`` seeds drawn from ``gen``. The chunks
    depend only on ``numel``, never on threads or scheduling."""
    if device.type != "cpu" or numel <= DRAW_CHUNK:
        return [(0, numel, gen)]
    starts = range(0, numel, DRAW_CHUNK)
    seeds = torch.randint(0, 2**62, (len(starts),), generator=gen, device=device).tolist()
    return [(a, min(a + DRAW_CHUNK, numel), torch.Generator().manual_seed(s)) for a, s in zip(starts, seeds)]


def _chunked_draws(numel: int, gen: torch.Generator, device: torch.device,
                   fill: Callable[[int, int, torch.Generator], None]) -> None:
    """Call ``fill(start, stop, generator)`` on every chunk of :func:`_chunk_generators` (torch's CPU samplers
    are serial: the chunks run on several threads through :func:`robustest.core.tasks.run_tasks`). The chunking
    does not depend on the thread count, so neither do the draws."""
    chunks = _chunk_generators(numel, gen, device)
    run_tasks(len(chunks), lambda i: fill(*chunks[i]))


def _uniform(shape: Sequence[int], lo: float, hi: float, gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """Uniform draws in [lo, hi) of the given shape, on like's device in like's dtype."""
    out = torch.empty(tuple(shape), device=like.device, dtype=like.dtype)
    flat = out.view(-1)
    _chunked_draws(flat.numel(), gen, like.device, lambda a, b, g: flat[a:b].uniform_(lo, hi, generator=g))
    return out


def _randn(shape: Sequence[int], gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """Standard normal draws of the given shape, on like's device in like's dtype."""
    out = torch.empty(tuple(shape), device=like.device, dtype=like.dtype)
    flat = out.view(-1)
    _chunked_draws(flat.numel(), gen, like.device, lambda a, b, g: flat[a:b].normal_(generator=g))
    return out



def _poisson(lam: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Poisson draws with rates ``lam`` (any shape), chunked over threads on the CPU (:func:`_chunked_draws`)."""
    out = torch.empty_like(lam)
    src, dst = lam.reshape(-1), out.view(-1)

    def fill(a: int, b: int, g: torch.Generator) -> None:
        dst[a:b] = torch.poisson(src[a:b], generator=g)

    _chunked_draws(src.numel(), gen, lam.device, fill)
    return out
