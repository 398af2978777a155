"""The blocking ``kinetic.JobHandle``: declarations over ``kinetic.aio.JobHandle``.

Each method forwards to its async twin through :mod:`kinetic._sync.portal`, except
``result()`` on a batch input whose outcome its stream already read: that decodes on
the caller's thread, with no crossing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Self

from kinetic._core.records import JobRecord
from kinetic._core.status import JobStatus, StatusReport
from kinetic._core.value_type import T
from kinetic._engine import handle as _aio_handle
from kinetic._engine.outcome import KnownOutcome, capture
from kinetic._sync.portal import call, iterate

if TYPE_CHECKING:
    from kinetic._sync.debug import DebugForward

StatusChangeCallback = Callable[[JobStatus], None]


class JobHandle(JobRecord, Generic[T]):
    """A submitted job (blocking API). Fields as the async handle; see ``kinetic.aio.JobHandle``.

    ``T`` is the type of the job's value, as ``kinetic.aio.JobHandle[T]``'s.
    """

    # Set on the batch inputs a batch stream yielded: their outcome, already read.
    _outcome: KnownOutcome | None = None

    @property
    def aio(self) -> _aio_handle.JobHandle[T]:
        """The same job as a ``kinetic.aio.JobHandle``."""
        h: _aio_handle.JobHandle[T] = _aio_handle.JobHandle(**self.record().__dict__)
        h._outcome = self._outcome
        return h

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, trust_storage: bool = False) -> Self:
        """Rebuild a handle from :meth:`to_dict` output; see
        ``kinetic.aio.JobHandle.from_dict`` (``trust_storage``: trust the storage ``d``
        names, for this process)."""
        return cls._from_aio(_aio_handle.JobHandle.from_dict(d, trust_storage=trust_storage))

    @classmethod
    def _from_aio(cls, h: _aio_handle.JobHandle[Any]) -> Self:
        job = cls(**h.record().__dict__)
        job._outcome = h._outcome
        return job

    def status(self) -> JobStatus:
        """The job's current status."""
        return call(self.aio.status)

    def status_report(self) -> StatusReport:
        """The status with its details (failure reason, phase)."""
        return call(self.aio.status_report)

    def logs(self, follow: bool = False) -> str | None:
        """The job's output so far; with ``follow=True`` print it until the job ends."""
        return call(self.aio.logs, follow)

    def iter_logs(self) -> Iterator[str]:
        """Yield the job's output in chunks until it ends."""
        return iterate(self.aio.iter_logs)

    def tail(self, n: int = 100) -> str:
        """The last ``n`` lines of the job's output."""
        return call(self.aio.tail, n)

    def result(
        self,
        timeout: float | None = None,
        cleanup: bool | None = None,
        cleanup_timeout: float = 180.0,
        cleanup_poll_interval: float = 2.0,
        stream_logs: bool | None = None,
        on_status_change: StatusChangeCallback | None = None,
    ) -> T:
        """Block for the job's value; see ``kinetic.aio.JobHandle.result``.

        Ctrl-C stops waiting (KeyboardInterrupt) and leaves the job running.
        """
        outcome = self._outcome
        if outcome is not None and not stream_logs and on_status_change is None:
            # Decoded on this thread: no crossing into the loop for an outcome in hand.
            taken: T = _take_blocking(outcome, not self.debug if cleanup is None else cleanup)
            return taken
        return call(
            functools.partial(
                self.aio.result,
                timeout=timeout,
                cleanup=cleanup,
                cleanup_timeout=cleanup_timeout,
                cleanup_poll_interval=cleanup_poll_interval,
                stream_logs=stream_logs,
                on_status_change=on_status_change,
            )
        )

    def debug_attach(
        self,
        local_port: int = 5678,
        working_dir: str | None = None,
        *,
        timeout: float | None = 600.0,
    ) -> DebugForward:
        """Forward a debug job's debugger to ``127.0.0.1:local_port`` and print a VS Code
        launch configuration; see ``kinetic.aio.JobHandle.debug_attach``."""
        from kinetic._sync.debug import DebugForward

        return DebugForward(
            call(functools.partial(self.aio.debug_attach, local_port, working_dir, timeout=timeout))
        )

    def cancel(self, cleanup_timeout: float = 180.0, cleanup_poll_interval: float = 2.0) -> None:
        """End the job if it is still running."""
        call(self.aio.cancel, cleanup_timeout, cleanup_poll_interval)

    def cleanup(
        self,
        k8s: bool = True,
        gcs: bool = True,
        cleanup_timeout: float = 180.0,
        cleanup_poll_interval: float = 2.0,
    ) -> None:
        """Stop the job's compute resources and/or delete its stored artifacts."""
        call(self.aio.cleanup, k8s, gcs, cleanup_timeout, cleanup_poll_interval)


def _take_blocking(outcome: KnownOutcome, cleanup: bool) -> Any:
    """:meth:`KnownOutcome.take` for a blocking caller: the batch's cleanup, when due,
    is the only crossing into the loop."""
    ok, value = capture(outcome.decode)
    if outcome.taken(cleanup):
        call(outcome.cleanup_batch)
    if not ok:
        raise value
    return value
