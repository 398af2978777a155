"""Mistakes a type checker must catch: ``mypy --strict`` flags each line marked
``# E: <error code>`` here, and nothing else (``tests/unit/test_typing.py``).

Never run, only type-checked. Were ``result()`` typed ``Any`` again, these lines would pass
unflagged, and the test fails.
"""

from __future__ import annotations

import kinetic
from kinetic import aio


@kinetic.run()
def square(x: int) -> int:
    return x * x


@aio.run()
def shout(text: str) -> str:
    return text.upper()


def blocking_api() -> None:
    job = square.run_async(3)
    text: str = job.result()  # E: assignment
    texts: list[str] = square.run_async_map([1, 2]).results()  # E: assignment
    for done in square.run_async_map([1, 2]).as_completed():
        text = done.result()  # E: assignment
    square.run_async("3")  # E: arg-type
    square.run_async(3, 4)  # E: call-arg
    square.run_async(y=3)  # E: call-arg
    values: list[int] = square.run_async_map([1]).results(return_exceptions=True)  # E: assignment
    square.run_async_map([1], retries="2")  # E: arg-type
    del text, texts, values


async def async_api() -> None:
    job = await shout.run_async("hi")
    number: int = await job.result()  # E: assignment
    batch = await shout.run_async_map(["a"])
    async for done in batch.as_completed():
        number = await done.result()  # E: assignment
    numbers: list[int] = await batch.results()  # E: assignment
    await shout.run_async(1)  # E: arg-type
    also: int = await square.aio.run_async(3)  # E: assignment
    del number, numbers, also
