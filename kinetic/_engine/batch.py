"""``run_async_map`` and ``kinetic.aio.BatchHandle``: fan out, consume as completed.

Theory of operation
-------------------
Submission records the whole batch before returning: the function (pickled
once), the inputs in chunked objects, then the manifest — the commit point,
written once and never rewritten. Then the backend's batch engine (a
:class:`~kinetic._engine.batch_runner.BatchRunner`) runs it: on the local
backend a detached supervisor with a pool of workers (:mod:`runner.batch`), on
GKE one Kubernetes Job per input, driven from inside the consumer's awaits
(:mod:`kinetic._backends.gke.batch`). The caller consumes completions while
inputs still run.

A :class:`BatchHandle` learns of completions from the engine's :meth:`follow`
stream; if the batch is unfinished and nobody drives it (the submitting side
crashed), following it resumes it from the recorded outcomes. Any process can
do this through :func:`attach_batch`.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import anyio.to_thread

from kinetic._backends.base import Backend
from kinetic._backends.local import stopped_report
from kinetic._core.status import JobStatus
from kinetic._engine.batch_runner import BatchRunner, runner_for
from kinetic._engine.handle import JobHandle
from kinetic._engine.outcome import CARRY_LIMIT, CleanupTally, KnownOutcome
from kinetic._exceptions import (
    BatchError,
    JobCancelledError,
    JobFailedError,
    JobTimeoutError,
    ResultError,
)
from runner import protocol

_WRITE_CONCURRENCY = 16


class BatchHandle:
    """A batch of inputs fanned out over one function (``kinetic.aio.BatchHandle``).

    :ivar group_id: the batch id (``grp-…``).
    :ivar name: the name given at submission, or None.
    :ivar tags: the tags given at submission.
    :ivar jobs: a :class:`JobHandle` per input index (``None`` where submission failed).
    """

    def __init__(
        self,
        *,
        backend: Backend,
        manifest: dict[str, Any],
        submission_failures: Mapping[int, Exception] | None = None,
    ) -> None:
        self._backend = backend
        self._runner: BatchRunner = runner_for(backend)
        self._manifest = manifest
        self.group_id: str = manifest["group_id"]
        self.name: str | None = manifest.get("name")
        self.tags: dict[str, str] = dict(manifest.get("tags") or {})
        self._total: int = manifest["total"]
        self._job_cache: dict[int, JobHandle] = {}
        self._submission_failures = dict(submission_failures or {})
        self._states: dict[int, str] = {}  # index -> succeeded/failed/cancelled
        self._completion: list[int] = []  # indices in the order they finished
        self._reasons: dict[int, tuple[str, str | None]] = {}  # never-run inputs: reason, phase
        self._running: set[int] = set()
        self._cleaned = False
        # Inputs collected through carried outcomes; the batch is cleaned up once all were.
        self._tally = CleanupTally(
            self._total - len(self._submission_failures), self._cleanup_after_collection
        )

    def __repr__(self) -> str:
        return f"<BatchHandle {self.group_id} inputs={self._total}>"

    @property
    def submission_failures(self) -> dict[int, Exception]:
        """Input index -> the error that kept it from being submitted."""
        return dict(self._submission_failures)

    @property
    def total(self) -> int:
        """How many inputs the batch has."""
        return self._total

    @property
    def jobs(self) -> list[JobHandle | None]:
        """A handle per input index (``None`` where submission failed). Built on first use."""
        return [self._job(i) for i in range(self._total)]

    def _job(self, index: int) -> JobHandle | None:
        if index in self._submission_failures:
            return None
        job = self._job_cache.get(index)
        if job is None:
            job = self._job_cache[index] = member_job(self._manifest, index)
        return job

    # -- progress --------------------------------------------------------------------

    def _accounted(self) -> int:
        return len(self._states) + len(self._submission_failures)

    def progress(self) -> dict[str, int]:
        """done / failed / running / queued counts as last observed (no IO)."""
        done = sum(1 for s in self._states.values() if s == "succeeded")
        failed = len(self._states) - done + len(self._submission_failures)
        running = len(self._running - self._states.keys())
        return {
            "done": done,
            "failed": failed,
            "running": running,
            "queued": self.total - done - failed - running,
        }

    def _record(self, index: int, state: str) -> bool:
        if index in self._states:
            return False
        self._states[index] = state
        self._completion.append(index)
        self._running.discard(index)
        return True

    async def _stream(self, deadline: float | None) -> AsyncIterator[list[int]]:
        """Yield chunks of newly finished input indices, in completion order, until every
        input is accounted for.

        :raises JobTimeoutError: when ``deadline`` (monotonic) passes first.
        """
        cursor = 0

        def fresh() -> list[int]:
            nonlocal cursor
            new = self._completion[cursor:]
            cursor = len(self._completion)
            return new

        new = fresh()
        if new:
            yield new
        if self._accounted() >= self.total:
            return
        events_iter = self._runner.follow(self.group_id, self._states.keys())
        async for events in _bounded_iter(deadline, events_iter):
            self._running.update(events.running)
            for index, state in events.done:
                self._record(index, state)
            if events.stop is not None:
                self._settle_stopped(events.stop)
            new = fresh()
            if new:
                yield new
            if self._accounted() >= self.total:
                return

    def _pending_never_run(self) -> list[int]:
        return [i for i in range(self.total) if i not in self._states]

    def _settle_stopped(self, stop: dict[str, Any] | None) -> None:
        """Inputs without a result in a stopped batch never ran: they are cancelled."""
        if stop is None:
            return
        report = stopped_report(stop)
        state = "cancelled" if report.cancelled else "failed"
        for index in self._pending_never_run():
            if index not in self._submission_failures:
                self._reasons[index] = (str(report.reason), report.phase)
                self._record(index, state)

    # -- public API ------------------------------------------------------------------

    async def statuses(self) -> list[tuple[int, JobStatus]]:
        """``(index, status)`` for each submitted input."""
        await self._refresh()
        out: list[tuple[int, JobStatus]] = []
        for i in range(self._total):
            if i in self._submission_failures:
                continue
            state = self._states.get(i)
            if state is None:
                status = JobStatus.RUNNING if i in self._running else JobStatus.PENDING
            else:
                status = JobStatus.SUCCEEDED if state == "succeeded" else JobStatus.FAILED
            out.append((i, status))
        return out

    async def status_counts(self) -> dict[str, int]:
        """How many inputs are in each status (keys are ``JobStatus`` values)."""
        return dict(Counter(s.value for _, s in await self.statuses()))

    async def _refresh(self) -> None:
        """Bring the known states up to date: a snapshot from the engine, or the records."""
        events = await self._runner.snapshot(self.group_id, self._states.keys())
        if events.snapshot_complete:
            self._running.clear()
        self._running.update(events.running)
        for index, state in events.done:
            self._record(index, state)
        self._settle_stopped(events.stop)

    async def wait(self, timeout: float | None = None) -> None:
        """Wait until every input has finished.

        :raises JobTimeoutError: when ``timeout`` passes first; the batch keeps running.
        """
        async for _ in self._stream(_deadline(timeout)):
            pass

    async def as_completed(
        self, timeout: float | None = None, *, poll_interval: float | None = None
    ) -> AsyncIterator[JobHandle]:
        """Yield each input's handle as it finishes, in completion order.

        ``poll_interval`` is accepted for compatibility with the original API:
        completions are pushed by the engine, not polled.

        Each handle carries the input's outcome, read with its chunk in one pass:
        its ``result()`` decodes it in memory. With ``result()``'s default cleanup
        on every input, the batch is cleaned up once, after the last one.

        :raises JobTimeoutError: when ``timeout`` passes before all inputs finished.
        """
        async for chunk in self._as_completed_chunks(timeout):
            for job in chunk:
                yield job

    async def _as_completed_chunks(
        self, timeout: float | None = None
    ) -> AsyncIterator[list[JobHandle]]:
        """As :meth:`as_completed`, a list of ready handles at a time (for the sync facade)."""
        async for chunk in self._stream(_deadline(timeout)):
            outcomes = await self._outcomes(chunk)
            jobs: list[JobHandle] = []
            for index in chunk:
                job = self._job(index)
                if job is None:
                    continue
                outcome = outcomes.get(index)
                if outcome is not None and (
                    outcome.payload is None or len(outcome.payload) <= CARRY_LIMIT
                ):
                    job._outcome = outcome
                jobs.append(job)
            yield jobs

    async def results(
        self,
        timeout: float | None = None,
        ordered: bool = True,
        cleanup: bool = True,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Wait for every input and return their values.

        :param ordered: input order (True) or completion order (False).
        :param cleanup: delete the inputs' results and artifacts afterwards (the manifest
            and a summary stay, so :meth:`failures` remains accurate).
        :param return_exceptions: put each failed input's exception in its place instead
            of raising.
        :raises BatchError: when some inputs failed and ``return_exceptions`` is False.
        :raises JobTimeoutError: when ``timeout`` passes first.
        """
        values: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        completion: list[int] = []
        async for chunk in self._stream(_deadline(timeout)):
            loaded = await self._load_many(chunk)
            for index, ok, value in loaded:
                completion.append(index)
                (values if ok else errors)[index] = value
        if cleanup:
            await self.cleanup(k8s=True, gcs=True)
        order = range(self.total) if ordered else completion
        out: list[Any] = []
        for index in order:
            if index in values:
                out.append(values[index])
            elif return_exceptions:
                out.append(errors.get(index, self._submission_failures.get(index)))
            else:
                out.append(None)
        if (errors or self._submission_failures) and not return_exceptions:
            failed = [j for i in sorted(errors) if (j := self._job(i)) is not None]
            raise BatchError(self.group_id, failed, out, self._submission_failures)
        return out

    async def _load_many(self, indices: list[int]) -> list[tuple[int, bool, Any]]:
        outcomes = await self._outcomes(indices)
        return await anyio.to_thread.run_sync(self._decode_many, indices, outcomes)

    async def _outcomes(self, indices: list[int]) -> dict[int, KnownOutcome]:
        """The outcomes of finished inputs, read in one pass. An input recorded as done
        whose payload is not (yet) readable has none."""
        wanted = [
            i for i in indices if i not in self._submission_failures and i not in self._reasons
        ]
        loaded = await self._runner.load_many(self.group_id, wanted) if wanted else {}
        out: dict[int, KnownOutcome] = {}
        for index in indices:
            job_id = protocol.member_job_id(self.group_id, index)
            read = loaded.get(index)
            if read is not None:
                out[index] = KnownOutcome(job_id, index, read[1], None, self._tally)
            elif index in self._reasons or self._cleaned:
                # Never ran, or its result went with the batch's cleanup: nothing to wait for.
                error = functools.partial(self._never_ran_error, index, job_id)
                out[index] = KnownOutcome(job_id, index, None, error, self._tally)
        return out

    def _decode_many(
        self, indices: list[int], outcomes: dict[int, KnownOutcome]
    ) -> list[tuple[int, bool, Any]]:
        out: list[tuple[int, bool, Any]] = []
        for index in indices:
            outcome = outcomes.get(index)
            if outcome is None:
                job_id = protocol.member_job_id(self.group_id, index)
                out.append((index, False, self._never_ran_error(index, job_id)))
                continue
            try:
                out.append((index, True, outcome.decode()))
            except Exception as exc:  # noqa: BLE001 - the input's own outcome
                out.append((index, False, exc))
        return out

    def _never_ran_error(self, index: int, job_id: str) -> Exception:
        missing = "its result was deleted by the batch's cleanup" if self._cleaned else None
        reason, phase = self._reasons.get(index, (missing or "its result is missing", None))
        if self._states.get(index) == "cancelled":
            return JobCancelledError(f"input {index} ({job_id}): {reason}", job_id=job_id)
        if phase is not None:
            return JobFailedError(
                f"input {index} ({job_id}) failed: {reason}", job_id=job_id, phase=phase
            )
        return ResultError(f"input {index} ({job_id}): {reason}", job_id=job_id)

    async def failures(self) -> list[JobHandle]:
        """Handles of the inputs that failed or were cancelled (accurate after cleanup)."""
        if not self._cleaned:
            await self._refresh()
        return [
            job
            for i in sorted(self._states)
            if self._states[i] in ("failed", "cancelled") and (job := self._job(i)) is not None
        ]

    async def cancel(self) -> None:
        """Stop queued inputs from ever running and end the running ones. Not retried."""
        if await self._runner.cancel(self.group_id):
            return
        await self._refresh()
        if self._accounted() < self.total:
            record = {"reason": "cancelled", "detail": "the batch was cancelled", "phase": None}
            await self._backend.storage.write(
                protocol.group_stop_key(self.group_id), protocol.dump_json(record)
            )

    async def _cleanup_after_collection(self) -> None:
        if not self._cleaned:
            await self.cleanup(k8s=True, gcs=True)

    async def cleanup(self, k8s: bool = True, gcs: bool = True) -> None:
        """Stop what still runs (``k8s``) and delete inputs, results and logs (``gcs``).

        The manifest and a summary of each input's state are kept.
        """
        if k8s and self._accounted() < self.total:
            await self.cancel()
        if k8s:
            await self._runner.release(self.group_id)
        if not gcs:
            return
        await self._refresh()
        summary = {"states": {str(i): s for i, s in self._states.items()}}
        storage = self._backend.storage
        await storage.write(protocol.group_summary_key(self.group_id), protocol.dump_json(summary))
        for prefix in ("inputs/", "results/", "logs/"):
            await storage.delete_prefix(protocol.group_prefix(self.group_id) + prefix)
        await storage.delete(protocol.group_payload_key(self.group_id))
        self._cleaned = True


async def _bounded(deadline: float | None, awaitable: Any) -> Any:
    if deadline is None:
        return await awaitable
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        _close(awaitable)
        raise JobTimeoutError("timed out waiting for the batch")
    with anyio.move_on_after(remaining) as scope:
        return await awaitable
    if scope.cancelled_caught:
        raise JobTimeoutError("timed out waiting for the batch")
    return None


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


async def _bounded_iter(deadline: float | None, it: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        while True:
            try:
                item = await _bounded(deadline, it.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def member_job(manifest: dict[str, Any], index: int) -> JobHandle:
    """The handle of input ``index`` of the batch ``manifest`` describes."""
    group_id = manifest["group_id"]
    job_id = protocol.member_job_id(group_id, index)
    return JobHandle(
        **manifest["handle"],
        job_id=job_id,
        k8s_name=f"kinetic-{job_id}",
        display_name=f"kinetic-{manifest['func_name']}-{job_id}",
        group_id=group_id,
        group_kind="map",
        group_index=index,
    )
