"""Bounded fan-out over many items: a few workers, not a task per item.

Starting a task per item costs one loop step per thousand or so items, and in asyncio
debug mode (which records where each task was created) far more: a batch of thousands
of inputs would hold the caller's loop for tens of milliseconds at once. A fixed number
of workers sharing one iterator does the same work at the same concurrency.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sized
from typing import TypeVar

import anyio

from kinetic._core.exception_groups import one_error

T = TypeVar("T")


async def for_each(items: Iterable[T], fn: Callable[[T], Awaitable[object]], *, limit: int) -> None:
    """Await ``fn(item)`` for every item, at most ``limit`` at a time.

    The first error cancels the rest and is raised as itself (not an exception group);
    items already done stay done. Cancellation cancels every running call.

    :raises ValueError: ``limit`` below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    pending = iter(items)

    async def work() -> None:
        for item in pending:  # shared: each item goes to exactly one worker
            await fn(item)

    workers = min(limit, len(items)) if isinstance(items, Sized) else limit
    with one_error():
        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(work)
