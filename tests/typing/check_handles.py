"""What type checkers see of the handles: ``mypy --strict`` must pass on this file.

Never run, only type-checked (``tests/unit/test_typing.py``); pytest does not collect it.
Each ``assert_type`` states a type exactly: a ``result()`` typed ``Any`` fails it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, assert_type

import kinetic
from kinetic import aio


@kinetic.run(accelerator="cpu")
def square(x: int, scale: float = 1.0) -> int:
    return int(x * x * scale)


@aio.run(accelerator="cpu")
def shout(text: str) -> str:
    return text.upper()


class Model:
    @kinetic.run()
    def predict(self, x: float) -> list[float]:
        return [x]


def blocking_api(flag: bool) -> None:
    assert_type(square(3), int)

    job = square.run_async(3, scale=2.0)
    assert_type(job, kinetic.JobHandle[int])
    assert_type(job.result(), int)
    assert_type(job.result(timeout=5, cleanup=False), int)
    assert_type(job.aio, aio.JobHandle[int])
    assert_type(Model().predict.run_async(1.0).result(), list[float])

    batch = square.run_async_map(range(10))
    assert_type(batch, kinetic.BatchHandle[int])
    assert_type(batch.aio, aio.BatchHandle[int])
    assert_type(batch.results(), list[int])
    assert_type(batch.results(None, False, True, False), list[int])
    assert_type(batch.results(return_exceptions=True), list[int | Exception])
    assert_type(batch.results(None, True, True, True), list[int | Exception])
    assert_type(batch.results(return_exceptions=flag), list[int | Exception])
    assert_type(batch.as_completed(), Iterator[kinetic.JobHandle[int]])
    retried = square.run_async_map([1], retries=kinetic.Retries(2, on=(OSError,)))
    assert_type(retried, kinetic.BatchHandle[int])
    assert_type(square.run_async_map([1], retries=2).results(), list[int])
    for done in batch.as_completed(timeout=60):
        assert_type(done.result(), int)
    assert_type(batch.jobs, list[kinetic.JobHandle[int] | None])
    assert_type(batch.failures(), list[kinetic.JobHandle[int]])


def blocking_handles_from_storage(record: dict[str, Any]) -> None:
    assert_type(kinetic.attach("job-1"), kinetic.JobHandle[Any])
    assert_type(kinetic.attach("job-1").result(), Any)
    assert_type(kinetic.list_jobs(), list[kinetic.JobHandle[Any]])
    assert_type(kinetic.JobHandle.from_dict(record), kinetic.JobHandle[Any])
    assert_type(kinetic.JobHandle[int].from_dict(record), kinetic.JobHandle[int])
    assert_type(kinetic.attach_batch("grp-1"), kinetic.BatchHandle[Any])
    typed: kinetic.BatchHandle[int] = kinetic.attach_batch("grp-1")
    assert_type(typed.results(), list[int])


def bare_annotations_mean_any(job: kinetic.JobHandle, batch: aio.BatchHandle) -> None:
    # No type parameter needed, even under --strict: it defaults to Any.
    assert_type(job, kinetic.JobHandle[Any])
    assert_type(batch, aio.BatchHandle[Any])


async def async_api() -> None:
    assert_type(await square.aio(3), int)
    assert_type(await shout("hi"), str)

    job = await square.aio.run_async(3, scale=0.5)
    assert_type(job, aio.JobHandle[int])
    assert_type(await job.result(), int)
    assert_type(await (await shout.run_async("hi")).result(timeout=5), str)

    batch = await shout.run_async_map(["a", "b"])
    assert_type(batch, aio.BatchHandle[str])
    assert_type(
        await shout.run_async_map(["a"], retries=aio.Retries(1, initial_delay=0)),
        aio.BatchHandle[str],
    )
    assert_type(await batch.results(), list[str])
    assert_type(await batch.results(return_exceptions=True), list[str | Exception])
    assert_type(batch.as_completed(), AsyncIterator[aio.JobHandle[str]])
    async for done in batch.as_completed():
        assert_type(await done.result(), str)
    assert_type(batch.jobs, list[aio.JobHandle[str] | None])
    assert_type(await batch.failures(), list[aio.JobHandle[str]])


async def async_handles_from_storage(record: dict[str, Any]) -> None:
    assert_type(await aio.attach("job-1"), aio.JobHandle[Any])
    assert_type(await aio.list_jobs(), list[aio.JobHandle[Any]])
    assert_type(aio.JobHandle.from_dict(record), aio.JobHandle[Any])
    assert_type(aio.JobHandle[str].from_dict(record), aio.JobHandle[str])
    assert_type(await aio.attach_batch("grp-1"), aio.BatchHandle[Any])
