"""Seeded random draws of the corruptions: uniform, normal and Poisson draws from one generator, cut on
the CPU into fixed, independently seeded chunks drawn on several threads (the same output for any thread
count)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

DRAW_CHUNK = 1 << 18  # CPU random draws: values per independently seeded chunk


def _chunked_draws(numel: int, gen: torch.Generator, device: torch.device,
                   fill: Callable[[int, int, torch.Generator], None]) -> None:
    """Call ``fill(start, stop, generator)`` over ``numel`` values: one call with ``gen`` off the CPU or for
    at most :data:`DRAW_CHUNK` values; otherwise fixed chunks of DRAW_CHUNK values, each with its own
    generator seeded from ``gen``, on up to ``torch.get_num_threads()`` threads (torch's CPU samplers are
    serial). The chunking does not depend on the thread count, so neither do the draws."""
    if device.type != "cpu" or numel <= DRAW_CHUNK:
        fill(0, numel, gen)
        return
    starts = range(0, numel, DRAW_CHUNK)
    seeds = torch.randint(0, 2**62, (len(starts),), generator=gen, device=device).tolist()

    def run(i: int) -> None:
        fill(starts[i], min(starts[i] + DRAW_CHUNK, numel), torch.Generator().manual_seed(seeds[i]))

    workers = min(torch.get_num_threads(), len(starts))
    if workers <= 1 or len(starts) < 4:  # a few chunks do not pay for starting threads
        for i in range(len(starts)):
            run(i)
        return
    # a pool per call: threads that outlive their work keep OpenMP thread teams alive, and with more
    # OpenMP threads than cores libgomp stops spinning between parallel regions, which made every later
    # small tensor operation of the process slower (measured: spatter 2x slower after shot_noise)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="robustest-draws") as pool:
        list(pool.map(run, range(len(starts))))


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
