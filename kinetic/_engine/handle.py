"""``kinetic.aio.JobHandle``: a job's durable record plus async methods to follow it.

A handle is plain data (see :class:`~kinetic._core.records.JobRecord`); the
backend and storage it talks to are found from its fields, so a handle made
in one process works in another. Cancelling an awaited method never cancels
the job itself: only :meth:`JobHandle.cancel` does.

A handle is a single job or an input of a batch (``group_id`` set): that is decided
here, once (:meth:`JobHandle._target`). A single job is answered by its backend's
single-job methods; a batch input by its batch's engine
(:class:`~kinetic._engine.batch_runner.BatchInput`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self

import anyio
import anyio.to_thread

from kinetic._backends.base import Backend, JobRef, StatusCallback
from kinetic._core.arg_checks import check_count, check_timeout
from kinetic._core.exception_groups import one_error
from kinetic._core.records import JobRecord
from kinetic._core.status import JobStatus, StatusReport
from kinetic._core.value_type import T
from kinetic._engine import runtime
from kinetic._engine.batch_runner import BatchInput, runner_for
from kinetic._engine.outcome import INLINE_DECODE_LIMIT, KnownOutcome
from kinetic._engine.results import load_payload, unwrap
from kinetic._exceptions import (
    ConfigError,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    JobPreemptedError,
    JobTimeoutError,
    ObjectNotFoundError,
    ResultError,
)
from kinetic._storage.trust import check_location, trust
from runner import protocol

if TYPE_CHECKING:
    from kinetic._debug.forward import DebugForward

logger = logging.getLogger(__name__)

StatusChangeCallback = Callable[[JobStatus], Awaitable[None] | None]


class _Target(Protocol):
    """What a handle's methods ask of the job it names: a backend's single-job methods
    (:class:`_SingleJob`) or a batch input's (:class:`BatchInput`)."""

    async def status(self) -> StatusReport: ...

    async def wait(self, on_change: StatusCallback | None = None) -> StatusReport: ...

    async def logs(self, *, tail: int | None = None) -> str: ...

    def follow_logs(self, finished: anyio.Event | None = None) -> AsyncIterator[str]: ...

    async def cancel(self) -> None: ...

    async def read_result(self) -> bytes: ...

    async def delete_objects(self) -> None: ...


class _SingleJob:
    """A single job, answered by its backend."""

    def __init__(self, backend: Backend, job: JobRef) -> None:
        self.backend = backend
        self.job = job

    async def status(self) -> StatusReport:
        return await self.backend.status(self.job)

    async def wait(self, on_change: StatusCallback | None = None) -> StatusReport:
        return await self.backend.wait(self.job, on_change)

    async def logs(self, *, tail: int | None = None) -> str:
        return await self.backend.logs(self.job, tail=tail)

    def follow_logs(self, finished: anyio.Event | None = None) -> AsyncIterator[str]:
        return self.backend.follow_logs(self.job, finished)

    async def cancel(self) -> None:
        await self.backend.cancel(self.job)

    async def read_result(self) -> bytes:
        return await self.backend.read_result(self.job)

    async def delete_objects(self) -> None:
        await self.backend.delete_objects(self.job)


class JobHandle(JobRecord, Generic[T]):
    """A submitted job. Fields as :class:`JobRecord`; methods are coroutines.

    ``T`` is the type of the job's value (what :meth:`result` returns): the wrapped
    function's return type for ``fn.run_async(...)``, ``Any`` for a handle rebuilt from
    storage (``attach``, :meth:`from_dict`) unless the caller names it
    (``JobHandle[int].from_dict(d)``). Only type checkers see it.
    """

    # Set on the batch inputs a batch stream yielded: their outcome, already read.
    _outcome: KnownOutcome | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, trust_storage: bool = False) -> Self:
        """Rebuild a handle from :meth:`to_dict` output (unknown keys are ignored).

        The handle names its storage, and its result is unpickled from there: it is used
        only where this process trusts that storage (your own local root, your
        configured bucket). Each method raises
        :class:`~kinetic.UntrustedStorageError` before reading anything otherwise.

        :param trust_storage: trust the storage ``d`` names, for this process: only for
            a dict from someone you trust, naming storage no one else writes.
        :raises TypeError: when a required field is missing.
        """
        handle = super().from_dict(d)
        if trust_storage:
            trust(handle.backend, handle.bucket_name)
        return handle

    def _backend(self) -> Backend:
        # Before anything of the job is read (kinetic._storage.trust).
        check_location(self.backend, self.bucket_name, job_id=self.job_id)
        return runtime.backend_for_location(
            self.backend,
            self.bucket_name,
            self.namespace,
            project=self.project,
            zone=self.zone,
            cluster=self.cluster_name,
        )

    def _target(self) -> _Target:
        """Where this handle's questions go: its backend for a single job, its batch's
        engine for a batch input (the one place that tells them apart)."""
        backend = self._backend()
        if self.group_id is None:
            return _SingleJob(backend, self)
        return BatchInput(runner_for(backend), self)

    async def status(self) -> JobStatus:
        """The job's current status."""
        return (await self._target().status()).status

    async def status_report(self) -> StatusReport:
        """The status with its details: why it failed, or why it is stuck pending."""
        return await self._target().status()

    async def logs(self, follow: bool = False) -> str | None:
        """The job's output so far; with ``follow=True``, print it as it comes until the
        job ends, and return None."""
        target = self._target()
        if not follow:
            return await target.logs()
        async for chunk in target.follow_logs():
            sys.stdout.write(chunk)
            sys.stdout.flush()
        return None

    async def _print_logs(self, target: _Target, finished: anyio.Event) -> None:
        async for chunk in target.follow_logs(finished):
            sys.stdout.write(chunk)
            sys.stdout.flush()

    async def iter_logs(self) -> AsyncIterator[str]:
        """Yield the job's output in chunks from its start until it ends."""
        # An async generator: the backend is looked up on the loop, not by the caller.
        async for chunk in self._target().follow_logs():
            yield chunk

    async def tail(self, n: int = 100) -> str:
        """The last ``n`` lines of the job's output.

        :raises ConfigError: when ``n`` is not a non-negative integer.
        """
        check_count("n", n)
        return await self._target().logs(tail=n)

    async def result(
        self,
        timeout: float | None = None,
        cleanup: bool | None = None,
        cleanup_timeout: float = 180.0,
        cleanup_poll_interval: float = 2.0,
        stream_logs: bool | None = None,
        on_status_change: StatusChangeCallback | None = None,
    ) -> T:
        """Wait for the job and return its value, or raise what it ended with.

        :param timeout: seconds to wait; ``None`` waits for as long as the job runs.
        :param cleanup: delete the job's stored artifacts once its result is in hand
            (default True, False for debug jobs).
        :param cleanup_timeout: seconds the cleanup may take; past them it is abandoned
            with a warning (the value is still returned).
        :param cleanup_poll_interval: accepted for compatibility with the original API;
            nothing is polled (deletions are confirmed by their requests).
        :param stream_logs: print the job's output while waiting (default False).
        :param on_status_change: called (or awaited) with each new status, the first
            observation and the terminal one included; its exceptions are logged and
            swallowed.
        :raises JobTimeoutError: when ``timeout`` passes; the job keeps running.
        :raises JobCancelledError: when the job was cancelled.
        :raises JobFailedError: when it failed outside the user's code or ended via
            ``SystemExit``/a signal (the message names the phase).
        :raises ResultError: when its result is missing or corrupted.
        :raises Exception: the user's own exception, with the remote traceback as a note.

        Cancelling this call leaves the job running.

        :raises ConfigError: when ``timeout`` or ``cleanup_timeout`` is negative or not a
            number.
        """
        check_timeout("timeout", timeout)
        check_timeout("cleanup_timeout", cleanup_timeout, optional=False)
        if cleanup is None:
            cleanup = not self.debug
        if self._outcome is not None and not stream_logs and on_status_change is None:
            taken: T = await self._outcome.take(cleanup)
            return taken
        target = self._target()

        async def notify(report: StatusReport) -> None:
            if on_status_change is None:
                return
            try:
                outcome = on_status_change(report.status)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                logger.exception("on_status_change callback failed for job %s", self.job_id)

        report: StatusReport | None = None
        with anyio.move_on_after(timeout) as scope:
            if stream_logs:
                finished = anyio.Event()
                with one_error():
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._print_logs, target, finished)
                        report = await target.wait(notify)
                        finished.set()
            else:
                report = await target.wait(notify)
        if scope.cancelled_caught or report is None:
            raise JobTimeoutError(f"timed out after {timeout}s waiting for job {self.job_id}")

        value: T = await self._collect(target, report)
        if cleanup:
            # An ended job holds nothing on some backends: cleanup is deleting its objects.
            stop = not isinstance(target, _SingleJob) or target.backend.ended_jobs_hold_resources
            try:
                await self.cleanup(k8s=stop, gcs=True, cleanup_timeout=cleanup_timeout)
            except Exception:  # noqa: BLE001 - the value is in hand; cleanup is best effort
                logger.warning("could not clean up job %s after collecting its result", self.job_id)
        return value

    async def _collect(self, target: _Target, report: StatusReport) -> Any:
        if report.status is JobStatus.NOT_FOUND:
            raise JobNotFoundError(f"job {self.job_id} not found in {self.bucket_name}")
        if report.cancelled:
            # Whatever payload a cancelled batch input left, its outcome is the cancellation.
            raise self._no_result_error(report)
        try:
            data = await target.read_result()
        except ObjectNotFoundError:
            raise self._no_result_error(report) from None
        if len(data) <= INLINE_DECODE_LIMIT:  # tens of µs: less than a thread hop
            payload = load_payload(data, self.job_id)
        else:
            limiter = runtime.blocking_limiter()
            payload = await anyio.to_thread.run_sync(
                load_payload, data, self.job_id, limiter=limiter
            )
        return unwrap(payload, self.job_id)

    def _no_result_error(self, report: StatusReport) -> Exception:
        if report.cancelled:
            return JobCancelledError(
                f"job {self.job_id} was cancelled: {report.reason}", job_id=self.job_id
            )
        if report.status is JobStatus.FAILED and report.reason:
            kind = JobPreemptedError if report.preempted else JobFailedError
            return kind(
                f"job {self.job_id} failed: {report.reason}", job_id=self.job_id, phase=report.phase
            )
        return ResultError(
            f"the result of job {self.job_id} is missing from {self.bucket_name}",
            job_id=self.job_id,
        )

    async def debug_attach(
        self,
        local_port: int = 5678,
        working_dir: str | None = None,
        *,
        timeout: float | None = 600.0,
    ) -> DebugForward:
        """Forward a ``debug=True`` job's debugger to ``127.0.0.1:local_port`` and print a
        VS Code launch configuration that attaches to it.

        Waits until the job's debugpy listens (the job waits, in turn, up to
        ``KINETIC_DEBUG_WAIT_TIMEOUT`` seconds for a client before it gives up in phase
        ``debug``). On the local backend connections are relayed to the job's port on
        this machine; on GKE each goes through the Kubernetes API's port-forward to the
        job's pod (no ``kubectl`` needed).

        :param local_port: the local port to listen on; 0 picks a free one (see the
            returned forward's ``local_port``).
        :param working_dir: your local copy of the project, the launch configuration's
            ``localRoot`` (default: the project's directory on the machine that
            submitted the job).
        :param timeout: seconds to wait for the job's debugger to be ready.
        :returns: the running forward; close it with ``await forward.close()`` or use
            it as ``async with``. Closing never affects the job.
        :raises ConfigError: the job is not a debug job, is a batch input, has ended, or
            ``local_port`` is taken.
        :raises JobFailedError: the job failed before its debugger was ready.
        :raises JobTimeoutError: the debugger was not ready within ``timeout``.
        :raises BackendError: the job has no running pod, or the forward failed to start.
        """
        from kinetic._debug.attach import debug_attach

        return await debug_attach(
            self,
            self._backend(),
            local_port=local_port,
            working_dir=working_dir,
            timeout=timeout,
        )

    async def cancel(
        self,
        cleanup_timeout: float = 180.0,
        cleanup_poll_interval: float = 2.0,
    ) -> None:
        """End the job if it is still running (its process group, or its Kubernetes Job).

        :param cleanup_timeout: seconds the cancellation may take.
        :param cleanup_poll_interval: accepted for compatibility; nothing is polled.
        :raises JobTimeoutError: when it did not finish within ``cleanup_timeout``.
        """
        target = self._target()
        async with _bounded_cleanup(self.job_id, cleanup_timeout):
            await target.cancel()

    async def cleanup(
        self,
        k8s: bool = True,
        gcs: bool = True,
        cleanup_timeout: float = 180.0,
        cleanup_poll_interval: float = 2.0,
    ) -> None:
        """Stop the job's compute resources (``k8s``) and delete its stored artifacts (``gcs``).

        Shared, content-addressed artifacts (context archives) are kept.

        :param cleanup_timeout: seconds the deletions may take.
        :param cleanup_poll_interval: accepted for compatibility; nothing is polled.
        :raises JobTimeoutError: when they did not finish within ``cleanup_timeout``.
        """
        target = self._target()
        async with _bounded_cleanup(self.job_id, cleanup_timeout):
            if k8s:
                await target.cancel()
            if gcs:
                await target.delete_objects()


@contextlib.asynccontextmanager
async def _bounded_cleanup(job_id: str, cleanup_timeout: float) -> AsyncIterator[None]:
    if cleanup_timeout <= 0:
        raise ConfigError(f"cleanup_timeout must be > 0 (got {cleanup_timeout!r})")
    with anyio.move_on_after(cleanup_timeout) as scope:
        yield
    if scope.cancelled_caught:
        raise JobTimeoutError(
            f"cleaning up job {job_id} did not finish within {cleanup_timeout}s; "
            "what was not deleted yet stays (run cleanup() again)"
        )


async def load_handle(backend: Backend, job_id: str) -> JobHandle:
    """Read a job's stored handle.

    :raises JobNotFoundError: when the job has no stored handle.
    """
    try:
        data = await backend.storage.read(protocol.handle_key(job_id))
    except ObjectNotFoundError:
        raise JobNotFoundError(f"no job {job_id!r} in {backend.storage.url}") from None
    try:
        return JobHandle.from_dict(protocol.load_json(data))
    except (ValueError, TypeError) as exc:
        raise ResultError(
            f"the stored handle of job {job_id} is corrupted: {exc}", job_id=job_id
        ) from exc
