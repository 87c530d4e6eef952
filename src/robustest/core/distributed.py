"""torch.distributed for robustest: one process per rank under ``torchrun``, rank 0 alone writes.

* :func:`init` starts the process group from torchrun's environment (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``; backend gloo on CPU, nccl on CUDA, each rank on ``cuda:LOCAL_RANK``) with a timeout on
  every collective, so a rank that dies ends the job instead of hanging it; :func:`shutdown` tears it
  down. The CLI calls both around every verb; Python users call them (or use torch.distributed directly).
* :class:`Shard` says which contiguous part of a data set this rank handles. Per-sample work (analysis,
  scoring, attacks, corruptions, evaluation) iterates ``Shard.current()``'s part and :func:`all_gather_cat`
  puts the parts back together in data-set order on every rank, so results equal a single process's
  whenever each sample's randomness depends on its index alone.
* :func:`is_main` guards every write: robustest's atomic writers do nothing on other ranks.
* :func:`local_work` marks work a rank does by itself (whole cells of a comparison): inside it the library
  sees a world of one, so its calls do not wait for the other ranks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from robustest.core.errors import ConfigError, RobustestError

__all__ = ["RankFailure", "Shard", "all_gather_cat", "all_gather_objects", "all_reduce_sum", "barrier",
           "broadcast", "count_share", "in_local_work", "in_sharded_work", "init", "is_main", "local_work", "rank",
           "shares", "sharded_work", "shutdown", "world_size"]

DEFAULT_TIMEOUT_S = 1800.0


class RankFailure(RobustestError):
    """Another rank stopped (it was killed, ran out of memory or failed): the job ends; --resume continues."""


@dataclass(frozen=True)
class Shard:
    """Which part of a data set this process handles: ``rank`` of ``world_size`` contiguous parts.

    ``Shard.current()`` reads the process group; without one (a single process) it is the whole set.
    """

    rank: int = 0
    world_size: int = 1

    @staticmethod
    def current() -> Shard:
        return Shard() if _LOCAL_DEPTH else Shard(_rank(), world_size())

    def bounds(self, n: int, align: int = 1) -> tuple[int, int]:
        """[lo, hi) of this rank's contiguous part of ``n`` samples; part boundaries fall on multiples of
        ``align`` (so blocks of ``align`` samples never straddle two ranks)."""
        blocks = -(-n // align)
        per = -(-blocks // self.world_size)
        return min(n, self.rank * per * align), min(n, (self.rank + 1) * per * align)


_SHARDED_DEPTH = 0
_LOCAL_DEPTH = 0


@contextmanager
def sharded_work() -> Iterator[None]:
    """Mark a block whose work the ranks share out (each rank does its part, e.g. :func:`attack`'s batches),
    so that counters of work done (``robot.compute.PassCounter``) add up the ranks' parts there and count
    the rest, which every rank repeats, once."""
    global _SHARDED_DEPTH
    _SHARDED_DEPTH += 1
    try:
        yield
    finally:
        _SHARDED_DEPTH -= 1


def in_sharded_work() -> bool:
    """Whether the caller runs inside :func:`sharded_work` under a process group of several ranks."""
    return _SHARDED_DEPTH > 0 and world_size() > 1


@contextmanager
def local_work() -> Iterator[None]:
    """A block this rank runs by itself, on work of its own (e.g. whole cells of ``compare``, each rank other
    cells): inside it :meth:`Shard.current` is the whole data set, :func:`world_size` is 1 and the collectives
    are no-ops, so the library's calls (attacks, scoring, training) do the whole job in this process without
    waiting for the other ranks. :func:`rank` and :func:`is_main` keep their values: writes stay with rank 0,
    so the results of other ranks' work reach rank 0 through a collective after the block."""
    global _LOCAL_DEPTH
    _LOCAL_DEPTH += 1
    try:
        yield
    finally:
        _LOCAL_DEPTH -= 1


_SHARE = [0]


def count_share(n: int) -> None:
    """Add ``n`` samples to this rank's tally of shared-out work (``batching.iter_batches`` counts every batch it
    reads of a rank's part)."""
    _SHARE[0] += int(n)


def shares() -> list[int] | None:
    """Samples each rank read of its parts so far, in rank order (None in a single process). A collective:
    every rank calls it at the same point (``results.write_results`` does, for ``rank_samples``)."""
    if world_size() == 1:
        return None
    return [int(v) for v in all_gather_objects(_SHARE[0])]


def in_local_work() -> bool:
    """Whether the caller runs inside :func:`local_work`."""
    return _LOCAL_DEPTH > 0


def _dist() -> Any:
    """torch.distributed when a process group is up and the caller is not inside :func:`local_work`."""
    if _LOCAL_DEPTH:
        return None
    return _initialized()


def _initialized() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _rank() -> int:
    d = _initialized()
    return int(d.get_rank()) if d is not None else 0


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return _rank()


def world_size() -> int:
    """Number of ranks in the process group (1 without one)."""
    d = _dist()
    return int(d.get_world_size()) if d is not None else 1


def is_main() -> bool:
    """True on rank 0 (and in a single process): the rank that writes outputs and prints."""
    return _rank() == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def launched() -> bool:
    """Whether torchrun (or another launcher) started this process as one of several ranks."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def init(device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Shard:
    """Join the process group torchrun describes (a no-op in a single process); returns this rank's Shard.

    ``device``: "cuda"/"cuda:N"/"auto" selects nccl and ``cuda:LOCAL_RANK``; otherwise gloo on the CPU.
    Every collective times out after ``timeout_s`` seconds.
    """
    if not launched() or _initialized() is not None:
        return Shard.current()
    import torch.distributed as dist

    for key in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise ConfigError(f"WORLD_SIZE is set but {key} is not: start the job with torchrun "
                              "(torchrun --nproc-per-node N -m robustest ...)")
    cuda = device is not None and (str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available()))
    if cuda:
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda under torchrun but CUDA is not available: use --device cpu")
        torch.cuda.set_device(local_rank())
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    return Shard.current()


def rank_device(device: str | None) -> str | None:
    """The device this rank uses: under torchrun a CUDA device becomes ``cuda:LOCAL_RANK``."""
    if device is not None and str(device).startswith("cuda") and world_size() > 1:
        return f"cuda:{local_rank()}"
    return device


def shutdown() -> None:
    """Leave the process group (a no-op without one)."""
    d = _initialized()
    if d is not None:
        d.destroy_process_group()


def _collective(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except RuntimeError as exc:  # a peer died: gloo/nccl raise (connection reset, timeout) instead of hanging
        text = " ".join(str(exc).split())[:160]
        raise RankFailure(f"another rank stopped ({text}); the job ends here: rerun with --resume to continue "
                          "from the last saved step") from exc


def barrier() -> None:
    """Wait for every rank (a no-op in a single process)."""
    d = _dist()
    if d is not None:
        _collective(d.barrier)


def all_gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order, on every rank (``[obj]`` in a single process)."""
    d = _dist()
    if d is None:
        return [obj]
    out: list[Any] = [None] * d.get_world_size()
    _collective(d.all_gather_object, out, obj)
    return out


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``values`` over every rank (``values`` itself in a single process). The tensor
    stays on its device (nccl needs CUDA tensors, gloo takes CPU ones)."""
    d = _dist()
    if d is None:
        return values
    out = values.clone()
    _collective(d.all_reduce, out)
    return out


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    d = _dist()
    if d is None:
        return obj
    box = [obj]
    _collective(d.broadcast_object_list, box, src=0)
    return box[0]


def all_gather_cat(parts: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """Concatenate every rank's per-sample tensors along dim 0 in rank order (= data-set order for the
    contiguous shards of :class:`Shard`), on every rank; tensors travel on the CPU. None stays None."""
    if world_size() == 1:
        return parts
    cpu = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in parts.items()}
    gathered = all_gather_objects(cpu)
    out: dict[str, torch.Tensor | None] = {}
    for k in cpu:
        pieces = [g[k] for g in gathered if g[k] is not None]
        cat = torch.cat(pieces) if pieces else None
        dev = parts[k].device if isinstance(parts[k], torch.Tensor) else None
        out[k] = cat.to(dev) if cat is not None and dev is not None else cat
    return out
