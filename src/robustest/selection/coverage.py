"""``coverage``: greedy additional coverage over a ``BoolTensor[N, F]`` saying which coverage cells (e.g.
KMNC sections, NC neurons; :meth:`robustest.metrics.coverage.CoverageProfile.bits`) each input covers.

Each step picks the input that covers the most cells not yet covered (ties: lower index). Once no input adds
coverage, the rest is filled by ``fill``: ``"total"`` (most cells covered, ties lower index) or
``"random"`` (seeded).
"""

from __future__ import annotations

import torch

from robustest.selection.registry import Request, Strategy

__all__ = ["FILLS", "STRATEGY", "greedy_coverage"]

#: how ``coverage`` completes the selection once no input adds coverage
FILLS = ("total", "random")


def greedy_coverage(req: Request) -> torch.Tensor:
    """Greedy additional coverage on the bits ``[N, F]`` -> int64 ``[n]`` in pick order."""
    bits, n, fill, gen = req.inputs, req.n, req.fill, req.gen
    num = bits.shape[0]
    bf = bits.to(torch.float32)
    gains = bf.sum(dim=1)
    total = gains.clone()
    covered = torch.zeros(bits.shape[1], dtype=torch.bool)
    taken = torch.zeros(num, dtype=torch.bool)
    picked: list[int] = []
    while len(picked) < n:
        g = gains.masked_fill(taken, -1.0)
        i = int(torch.argmax(g))  # first maximum: ties go to the lower index
        if g[i] <= 0:
            break
        picked.append(i)
        taken[i] = True
        new = bits[i] & ~covered
        covered |= new
        # the cells input i adds are now covered: nobody gains them any more (O(N * new cells))
        gains -= bf[:, new].sum(dim=1)
    rest = n - len(picked)
    if rest > 0:
        left = torch.nonzero(~taken).flatten()
        if fill == "total":
            order = torch.sort(-total[left], stable=True).indices
        else:
            order = torch.randperm(len(left), generator=gen)
        picked.extend(left[order[:rest]].tolist())
    return torch.tensor(picked, dtype=torch.int64)


STRATEGY = Strategy("coverage", "greedy additional coverage over a BoolTensor[N, F] of covered cells",
                    greedy_coverage, needs="bits", options=("fill",))
