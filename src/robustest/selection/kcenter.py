"""``kcenter``: k-center greedy, the core-set selection of Sener and Savarese (2018), over a float
``[N, D]`` of features (e.g. penultimate-layer activations).

The first centre is drawn uniformly at random (seeded); each further step picks the input farthest
(Euclidean) from its nearest chosen centre (ties: lower index), so the selection covers the feature space
with the smallest radius the greedy rule finds (within twice the optimal radius). One ``[N, D]`` distance
update per pick on the features' device; duplicates are picked only once every distinct point is taken.
Order: pick order.
"""

from __future__ import annotations

import torch

from robustest.selection.registry import Request, Strategy

__all__ = ["STRATEGY", "kcenter"]


def kcenter(req: Request) -> torch.Tensor:
    """k-center greedy on the features ``[N, D]``: ``n`` distinct indices (int64 ``[n]``, CPU) in pick order;
    the distances are computed on the features' device."""
    n, gen = req.n, req.gen
    f = req.inputs.to(torch.float64)  # ||a||^2 - 2<a, c> + ||c||^2 loses little in float64
    num = f.shape[0]
    sq = f.pow(2).sum(dim=1)
    first = int(torch.randint(num, (1,), generator=gen))
    picked = torch.empty(n, dtype=torch.int64, device=f.device)
    picked[0] = first
    # squared distance of every input to its nearest centre; -1 marks the centres themselves
    dist = (sq - 2 * (f @ f[first]) + sq[first]).clamp_min_(0)
    dist[first] = -1.0
    for i in range(1, n):  # O(n) iterations, each one batched [N, D] x [D] update; no host sync on CUDA
        j = torch.argmax(dist).view(1)  # first maximum: ties go to the lower index
        picked[i] = j[0]
        c = f.index_select(0, j)[0]
        dist = torch.minimum(dist, (sq - 2 * (f @ c) + sq[j]).clamp_min_(0))
        dist.index_fill_(0, j, -1.0)
    return picked.cpu()


STRATEGY = Strategy("kcenter", "k-center greedy (core-set) over a float [N, D] of features: each pick the farthest "
                    "from the chosen", kcenter, needs="features", seeded=True)
