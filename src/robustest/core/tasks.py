"""Independent CPU tasks on several threads (seeded draws that torch runs serially)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


def run_tasks(count: int, task: Callable[[int], T]) -> list[T]:
    """``[task(0), ..., task(count - 1)]``, on up to ``torch.get_num_threads()`` threads that each take the
    next task as soon as they finish one (dynamic scheduling: a thread that the OS deschedules because other
    processes share the cores delays only the task it holds, never waits at a barrier for the others). For
    work torch runs serially on the CPU, such as seeded random draws. The tasks must not depend on each other
    or on the order they run in; results come back in task order."""
    workers = min(torch.get_num_threads(), count)
    if workers <= 1 or count < 4:  # a few tasks do not pay for starting threads
        return [task(i) for i in range(count)]
    # a pool per call: threads that outlive their work keep OpenMP thread teams alive, and with more
    # OpenMP threads than cores libgomp stops spinning between parallel regions, which made every later
    # small tensor operation of the process slower (measured: spatter 2x slower after shot_noise).
    # ThreadPoolExecutor hands each idle worker the next queued task.
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="robustest-tasks") as pool:
        return list(pool.map(task, range(count)))
