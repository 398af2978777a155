"""The blocking ``kinetic.BatchHandle``: declarations over ``kinetic.aio.BatchHandle``.

Iterators cross into the event loop once per chunk of ready handles, not once
per handle. Blocking waits show a progress display (done / failed / running /
queued) when standard error is a terminal, and nothing otherwise.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, Literal, TypeVar, overload

import anyio

from kinetic._core.exception_groups import one_error
from kinetic._core.status import JobStatus
from kinetic._core.value_type import T
from kinetic._engine import batch as _aio_batch
from kinetic._engine import batch_submit as _aio_batch_submit
from kinetic._engine.handle import JobHandle as _AioJobHandle
from kinetic._sync.handle import JobHandle
from kinetic._sync.portal import call, iterate

W = TypeVar("W")

_REFRESH = 0.2  # seconds between progress repaints (a display, not a wait)


class BatchHandle(Generic[T]):
    """A batch of inputs fanned out over one function (blocking API).

    Same methods as ``kinetic.aio.BatchHandle``; ``aio`` is the async twin. ``T`` is the
    type of each input's value, as ``kinetic.aio.BatchHandle[T]``'s.
    """

    def __init__(self, aio: _aio_batch.BatchHandle[T]) -> None:
        self.aio = aio
        self._jobs: dict[int, JobHandle[T]] = {}

    def __repr__(self) -> str:
        return repr(self.aio).replace("<BatchHandle", "<kinetic.BatchHandle")

    @property
    def group_id(self) -> str:
        return self.aio.group_id

    @property
    def name(self) -> str | None:
        return self.aio.name

    @property
    def tags(self) -> dict[str, str]:
        return self.aio.tags

    @property
    def total(self) -> int:
        return self.aio.total

    @property
    def jobs(self) -> list[JobHandle[T] | None]:
        """A handle per input index (``None`` where submission failed)."""
        return [self._job(h) if h is not None else None for h in self.aio.jobs]

    @property
    def submission_failures(self) -> dict[int, Exception]:
        return self.aio.submission_failures

    def _job(self, h: _AioJobHandle[T]) -> JobHandle[T]:
        index = h.group_index if h.group_index is not None else -1
        job = self._jobs.get(index)
        if job is None:
            job = self._jobs[index] = JobHandle._from_aio(h)
        elif h._outcome is not None:
            job._outcome = h._outcome  # read since this handle was first handed out
        return job

    def progress(self) -> dict[str, int]:
        """done / failed / running / queued counts as last observed (no IO)."""
        return self.aio.progress()

    def statuses(self) -> list[tuple[int, JobStatus]]:
        """``(index, status)`` for each submitted input."""
        return call(self.aio.statuses)

    def status_counts(self) -> dict[str, int]:
        """How many inputs are in each status."""
        return call(self.aio.status_counts)

    def wait(self, timeout: float | None = None) -> None:
        """Block until every input has finished (progress shown on a terminal)."""
        _with_progress(self.aio, functools.partial(self.aio.wait, timeout))

    def as_completed(
        self, timeout: float | None = None, *, poll_interval: float | None = None
    ) -> Iterator[JobHandle[T]]:
        """Yield each input's handle as it finishes, in completion order.

        ``poll_interval`` is accepted for compatibility; completions are pushed, not polled.
        """
        for chunk in iterate(lambda: self.aio._as_completed_chunks(timeout, slice_size=None)):
            for h in chunk:
                yield self._job(h)

    @overload
    def results(
        self,
        timeout: float | None = None,
        ordered: bool = True,
        cleanup: bool = True,
        return_exceptions: Literal[False] = False,
    ) -> list[T]: ...
    @overload
    def results(
        self,
        timeout: float | None = None,
        ordered: bool = True,
        cleanup: bool = True,
        return_exceptions: bool = False,
    ) -> list[T | Exception]: ...
    def results(
        self,
        timeout: float | None = None,
        ordered: bool = True,
        cleanup: bool = True,
        return_exceptions: bool = False,
    ) -> list[T] | list[T | Exception]:
        """Block for every input's value; see ``kinetic.aio.BatchHandle.results``."""
        return _with_progress(
            self.aio,
            functools.partial(
                self.aio.results,
                timeout=timeout,
                ordered=ordered,
                cleanup=cleanup,
                return_exceptions=return_exceptions,
            ),
        )

    def failures(self) -> list[JobHandle[T]]:
        """Handles of the inputs that failed or were cancelled."""
        return [self._job(h) for h in call(self.aio.failures)]

    def cancel(self) -> None:
        """Stop queued inputs from ever running and end the running ones."""
        call(self.aio.cancel)

    def cleanup(self, k8s: bool = True, gcs: bool = True) -> None:
        """Stop what still runs and delete inputs, results and logs."""
        call(self.aio.cleanup, k8s, gcs)


def _with_progress(batch: _aio_batch.BatchHandle[Any], work: Callable[[], Awaitable[W]]) -> W:
    if not sys.stderr.isatty():
        return call(work)

    async def run() -> W:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (
            TextColumn(f"[bold]{batch.group_id}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("batch", total=batch.total, counts="")

            def paint() -> None:
                c = batch.progress()
                text = (
                    f"done {c['done']}  failed {c['failed']}  "
                    f"running {c['running']}  queued {c['queued']}"
                )
                bar.update(task, completed=c["done"] + c["failed"], counts=text)

            async def repaint() -> None:
                while True:
                    paint()
                    await anyio.sleep(_REFRESH)

            with one_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(repaint)
                    try:
                        result = await work()
                    finally:
                        tg.cancel_scope.cancel()
                        paint()
            return result

    return call(run)


def attach_batch(
    group_id: str,
    project: str | None = None,
    cluster: str | None = None,
    poll_interval: float | None = None,
    poll_timeout: float | None = None,
    *,
    backend: str | None = None,
    timeout: float | None = None,
) -> BatchHandle:
    """Rebuild a batch's handle in any process; see ``kinetic.aio.attach_batch``."""
    return BatchHandle(
        call(
            functools.partial(
                _aio_batch_submit.attach_batch,
                group_id,
                project,
                cluster,
                poll_interval,
                poll_timeout,
                backend=backend,
                timeout=timeout,
            )
        )
    )
