"""``for_each``: every item once, never more than ``limit`` at a time, the first error as
itself, and a fixed number of tasks whatever the number of items."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from kinetic._concurrency import for_each
from kinetic._exceptions import StorageError


async def test_every_item_once_within_the_limit() -> None:
    running, peak, seen = 0, 0, []

    async def one(i: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.001)
        seen.append(i)
        running -= 1

    await for_each(range(100), one, limit=7)
    assert sorted(seen) == list(range(100))
    assert peak == 7


async def test_tasks_do_not_grow_with_the_items() -> None:
    # A task per item made a 2,000-input batch hold the caller's loop for one long step.
    tasks: set[object] = set()

    async def one(_: int) -> None:
        tasks.add(anyio.get_current_task().id)
        await anyio.lowlevel.checkpoint()

    await for_each(list(range(5000)), one, limit=16)
    assert len(tasks) == 16


async def test_first_error_raised_as_itself_and_the_rest_cancelled() -> None:
    started: list[int] = []

    async def one(i: int) -> None:
        started.append(i)
        if i == 3:
            raise StorageError("write 3 failed")
        await anyio.sleep(10)

    with anyio.fail_after(5), pytest.raises(StorageError, match="write 3 failed"):
        await for_each(range(1000), one, limit=4)
    assert len(started) < 10


async def test_fewer_items_than_the_limit() -> None:
    seen: list[str] = []

    async def one(s: str) -> None:
        seen.append(s)

    await for_each(["a"], one, limit=32)
    await for_each([], one, limit=32)
    assert seen == ["a"]
    with pytest.raises(ValueError, match="at least 1"):
        await for_each(["a"], one, limit=0)
