"""``run_async_map`` and ``kinetic.aio.BatchHandle``: fan out, consume as completed.

Theory of operation
-------------------
Submission records the whole batch before returning: the function (pickled
once), the inputs in chunked objects, then the manifest — the commit point,
written once and never rewritten. Then the backend's batch engine (a
:class:`~kinetic._engine.batch_runner.BatchRunner`) runs it: on the local
backend a detached supervisor with a pool of workers (:mod:`runner.batch`), on
GKE one Kubernetes Job whose pods are a worker pool claiming inputs in storage
(:mod:`kinetic._backends.gke.pool`, :mod:`runner.pool`; it needs no client process),
or with ``pod_per_input=True`` one Job per input, driven from inside the consumer's
awaits (:mod:`kinetic._backends.gke.batch`). The caller consumes completions while
inputs still run.

A :class:`BatchHandle` learns of completions from the engine's :meth:`follow`
stream; if the batch is unfinished and nobody drives it (the submitting side
crashed), following it resumes it from the recorded outcomes. Any process can
do this through :func:`attach_batch`.
"""

from __future__ import annotations

import functools
import pickle
import time
from array import array
from collections import Counter
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from typing import Any, Generic, Literal, overload

import anyio
import anyio.lowlevel
import anyio.to_thread

from kinetic._backends.base import Backend
from kinetic._core.arg_checks import check_timeout
from kinetic._core.records import job_names, utcnow_iso
from kinetic._core.status import JobStatus, stopped_report
from kinetic._core.value_type import T
from kinetic._engine.batch_runner import BatchRunner, Loaded, runner_for
from kinetic._engine.handle import JobHandle
from kinetic._engine.outcome import CARRY_LIMIT, CleanupTally, KnownOutcome
from kinetic._engine.results import load_payload, unwrap
from kinetic._exceptions import (
    BatchError,
    JobCancelledError,
    JobFailedError,
    JobTimeoutError,
    ResultError,
)
from runner import protocol

_WRITE_CONCURRENCY = 16
_STEP_BUDGET = 0.001
"""Seconds of the caller's loop one step of ``as_completed`` may hold before yielding it."""
_HANDLE_SLICE = 128  # finished inputs read and given handles per worker-thread call (~1 ms)
_CODES: dict[str, int] = {"succeeded": 1, "failed": 2, "cancelled": 3}
_NAMES: tuple[protocol.InputState | None, ...] = (None, *protocol.INPUT_STATES)
_LOAD_BATCH = 4096  # results() reads and decodes outcomes this many at a time


class CleanedSummary(protocol.BatchSummary, total=False):
    """``summary.json`` as this client writes it: also when the cleanup ran."""

    cleaned_at: str


class _States(Collection[int]):
    """Each input's final state in one byte (a million inputs: 1 MB), and counts.

    As a collection it is the (live) set of inputs that finished: what an engine's
    ``follow`` is told the caller already knows.
    """

    __slots__ = ("codes", "count", "succeeded")

    def __init__(self, total: int) -> None:
        self.codes = bytearray(total)
        self.count = 0
        self.succeeded = 0

    def __contains__(self, index: object) -> bool:
        return isinstance(index, int) and 0 <= index < len(self.codes) and self.codes[index] != 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        return (i for i, code in enumerate(self.codes) if code)

    def get(self, index: int) -> protocol.InputState | None:
        code = self.codes[index] if 0 <= index < len(self.codes) else 0
        return _NAMES[code]

    def set(self, index: int, state: str) -> bool:
        """Record ``index``'s state; False when it had one already (or is out of range)."""
        if not 0 <= index < len(self.codes) or self.codes[index]:
            return False
        code = _CODES.get(state, 2)
        self.codes[index] = code
        self.count += 1
        self.succeeded += code == 1
        return True

    def items(self) -> Iterator[tuple[int, protocol.InputState]]:
        return ((i, _state(code)) for i, code in enumerate(self.codes) if code)


def _state(code: int) -> protocol.InputState:
    """The state of a non-zero code of :class:`_States`."""
    state = _NAMES[code]
    assert state is not None
    return state


class BatchHandle(Generic[T]):
    """A batch of inputs fanned out over one function (``kinetic.aio.BatchHandle``).

    ``T`` is the type of each input's value: the function's return type for
    ``fn.run_async_map(...)``, ``Any`` for a batch rebuilt by :func:`attach_batch`
    unless the caller annotates it. Only type checkers see it.

    :ivar group_id: the batch id (``grp-…``).
    :ivar name: the name given at submission, or None.
    :ivar tags: the tags given at submission.
    :ivar jobs: a :class:`JobHandle` per input index (``None`` where submission failed).
    """

    def __init__(
        self,
        *,
        backend: Backend,
        manifest: protocol.BatchManifest,
        submission_failures: Mapping[int, Exception] | None = None,
    ) -> None:
        self._backend = backend
        self._runner: BatchRunner = runner_for(backend)
        self._manifest = manifest
        self.group_id = manifest["group_id"]
        self.name = manifest.get("name")
        self.tags = dict(manifest.get("tags") or {})
        self._total = manifest["total"]
        self._job_cache: dict[int, JobHandle[T]] = {}
        self._submission_failures = dict(submission_failures or {})
        # Per input compactly: nothing is built per input until asked (jobs, statuses).
        self._states = _States(self._total)  # succeeded/failed/cancelled per index
        self._completion = array("q")  # indices in the order they finished
        self._reasons: dict[int, tuple[str, str | None]] = {}  # never-run inputs: reason, phase
        self._running: set[int] = set()
        self._cleaned = False
        self._cleaned_at: str | None = None  # when the cleanup ran, where known
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
    def jobs(self) -> list[JobHandle[T] | None]:
        """A handle per input index (``None`` where submission failed). Built on first use."""
        return [self._job(i) for i in range(self._total)]

    def _job(self, index: int) -> JobHandle[T] | None:
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
        states = self._states
        done = states.succeeded
        failed = states.count - done + len(self._submission_failures)
        running = sum(1 for i in self._running if i not in states)
        return {
            "done": done,
            "failed": failed,
            "running": running,
            "queued": self.total - done - failed - running,
        }

    def _record(self, index: int, state: str) -> bool:
        if not self._states.set(index, state):
            return False
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
            new = self._completion[cursor:].tolist()
            cursor = len(self._completion)
            return new

        new = fresh()
        if new:
            yield new
        if self._accounted() >= self.total:
            return
        events_iter = self._runner.follow(self.group_id, self._states)
        states, completion, running = self._states, self._completion, self._running
        async for events in _bounded_iter(deadline, events_iter):
            running.update(events.running)
            for index, state in events.done:
                if states.set(index, state):  # (as _record, inlined: this is per input)
                    completion.append(index)
                    running.discard(index)
            if events.stop is not None:
                self._settle_stopped(events.stop)
            new = fresh()
            if new:
                yield new
            if self._accounted() >= self.total:
                return

    def _pending_never_run(self) -> list[int]:
        codes = self._states.codes
        return [i for i in range(self.total) if not codes[i]]

    def _settle_stopped(self, stop: protocol.StopRecord | None) -> None:
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
        events = await self._runner.snapshot(self.group_id, self._states)
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
    ) -> AsyncIterator[JobHandle[T]]:
        """Yield each input's handle as it finishes, in completion order.

        ``poll_interval`` is accepted for compatibility with the original API:
        completions are pushed by the engine, not polled.

        Each handle carries the input's outcome, read with its chunk in one pass:
        its ``result()`` decodes it in memory. With ``result()``'s default cleanup
        on every input, the batch is cleaned up once, after the last one.

        :raises JobTimeoutError: when ``timeout`` passes before all inputs finished.
        """
        ran_since = time.perf_counter()
        async for chunk in self._as_completed_chunks(timeout):
            for job in chunk:
                yield job
                # A consumer whose result() answers from memory never suspends: hand the
                # loop back every millisecond so a large chunk never stalls it.
                if time.perf_counter() - ran_since > _STEP_BUDGET:
                    await anyio.lowlevel.checkpoint()
                    ran_since = time.perf_counter()

    async def _as_completed_chunks(
        self, timeout: float | None = None, *, slice_size: int | None = _HANDLE_SLICE
    ) -> AsyncIterator[list[JobHandle[T]]]:
        """As :meth:`as_completed`, a list of ready handles at a time (for the sync facade).

        :param slice_size: at most this many handles per list; None: each list holds
            what the stream delivered at once (the sync facade: one thread crossing each).
        """
        async for chunk in self._stream(_deadline(timeout)):
            # Thousands of handles take milliseconds to build: not on the caller's loop, and
            # a slice at a time, since a thread running Python holds the GIL for up to the
            # interpreter's switch interval (5 ms) while the loop waits for it.
            step = slice_size or max(1, len(chunk))
            for start in range(0, len(chunk), step):
                part = chunk[start : start + step]
                loaded = await self._read_outcomes(part)
                yield await anyio.to_thread.run_sync(self._carrying_handles, part, loaded)

    def _carrying_handles(self, chunk: list[int], loaded: Loaded) -> list[JobHandle[T]]:
        outcomes = self._outcomes(chunk, loaded)
        jobs: list[JobHandle[T]] = []
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
        return jobs

    @overload
    async def results(
        self,
        timeout: float | None = None,
        ordered: bool = True,
        cleanup: bool = True,
        return_exceptions: Literal[False] = False,
    ) -> list[T]: ...
    @overload
    async def results(
        self,
        timeout: float | None = None,
        ordered: bool = True,
        cleanup: bool = True,
        return_exceptions: bool = False,
    ) -> list[T | Exception]: ...
    async def results(
        self,
        timeout: float | None = None,
        ordered: bool = True,
        cleanup: bool = True,
        return_exceptions: bool = False,
    ) -> list[T] | list[T | Exception]:
        """Wait for every input and return their values.

        Typed ``list[T]``; with ``return_exceptions=True``, ``list[T | Exception]``.

        :param ordered: input order (True) or completion order (False).
        :param cleanup: delete the inputs' results and artifacts afterwards (the manifest
            and a summary stay, so :meth:`failures` remains accurate).
        :param return_exceptions: put each failed input's exception in its place instead
            of raising.
        :raises BatchError: when some inputs failed and ``return_exceptions`` is False.
        :raises JobTimeoutError: when ``timeout`` passes first.
        :raises ResultError: when the batch was collected and cleaned up before: its
            results are deleted (the message says when; :meth:`failures` and
            :meth:`status_counts` still answer).
        """
        check_timeout("timeout", timeout)
        if self._cleaned:
            raise ResultError(
                f"batch {self.group_id} was collected and cleaned up{self._when_cleaned()}: "
                "its results are deleted (failures() and status_counts() still answer; "
                "pass cleanup=False to results() to keep them next time)"
            )
        # One slot per input, filled chunk by chunk as outcomes are read in bulk.
        values: list[Any] = [None] * self.total
        got = bytearray(self.total)
        errors: dict[int, BaseException] = {}
        completion = array("q")

        async def take(indices: list[int]) -> None:
            for index, ok, value in await self._load_many(indices):
                completion.append(index)
                if ok:
                    values[index] = value
                    got[index] = 1
                else:
                    errors[index] = value

        # Outcomes are read in bulk: a few thousand at a time, not per event received.
        waiting: list[int] = []
        async for chunk in self._stream(_deadline(timeout)):
            waiting += chunk
            if len(waiting) >= _LOAD_BATCH:
                await take(waiting)
                waiting = []
        if waiting:
            await take(waiting)
        if cleanup:
            await self.cleanup(k8s=True, gcs=True)
        if ordered and not errors and not self._submission_failures:
            out = values  # every input has its value, in input order
        else:
            order: Collection[int] = range(self.total) if ordered else completion
            out = []
            for index in order:
                if got[index]:
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
        """``(index, ok, value or error)`` of finished inputs: their outcomes read in one
        pass and decoded in one worker thread, nothing kept per input."""
        wanted = [
            i for i in indices if i not in self._submission_failures and i not in self._reasons
        ]
        loaded = await self._runner.load_many(self.group_id, wanted) if wanted else {}
        return await anyio.to_thread.run_sync(self._decode_loaded, indices, loaded)

    def _decode_loaded(self, indices: list[int], loaded: Loaded) -> list[tuple[int, bool, Any]]:
        out: list[tuple[int, bool, Any]] = []
        for index in indices:
            read = loaded.get(index)
            if read is None:
                job_id = protocol.member_job_id(self.group_id, index)
                out.append((index, False, self._never_ran_error(index, job_id)))
                continue
            try:  # the common case first: a plain successful payload
                payload = pickle.loads(read[1])
            except Exception:  # noqa: BLE001 - load_payload below says what is wrong
                payload = None
            if type(payload) is dict and payload.get("success") is True and "result" in payload:
                out.append((index, True, payload["result"]))
                continue
            job_id = protocol.member_job_id(self.group_id, index)
            if read[0].get("state") == "cancelled":  # cancelled on its own, not by a stop
                error = JobCancelledError(f"input {index} ({job_id}): cancelled", job_id=job_id)
                out.append((index, False, error))
                continue
            try:
                out.append((index, True, unwrap(load_payload(read[1], job_id), job_id)))
            except Exception as exc:  # noqa: BLE001 - the input's own outcome
                out.append((index, False, exc))
        return out

    async def _read_outcomes(self, indices: list[int]) -> Loaded:
        """Headers and payloads of the given finished inputs, read in one pass."""
        wanted = [
            i for i in indices if i not in self._submission_failures and i not in self._reasons
        ]
        return await self._runner.load_many(self.group_id, wanted) if wanted else {}

    def _outcomes(self, indices: list[int], loaded: Loaded) -> dict[int, KnownOutcome]:
        """The outcomes of finished inputs from what :meth:`_read_outcomes` read. An input
        recorded as done whose payload is not (yet) readable has none. CPU: in a thread."""
        out: dict[int, KnownOutcome] = {}
        for index in indices:
            job_id = protocol.member_job_id(self.group_id, index)
            read = loaded.get(index)
            if read is not None and read[0].get("state") == "cancelled":
                # Cancelled on its own: the same error results() gives for it.
                cancelled = functools.partial(
                    JobCancelledError, f"input {index} ({job_id}): cancelled", job_id=job_id
                )
                out[index] = KnownOutcome(job_id, index, None, cancelled, self._tally)
            elif read is not None:
                out[index] = KnownOutcome(job_id, index, read[1], None, self._tally)
            elif index in self._reasons or self._cleaned:
                # Never ran, or its result went with the batch's cleanup: nothing to wait for.
                error = functools.partial(self._never_ran_error, index, job_id)
                out[index] = KnownOutcome(job_id, index, None, error, self._tally)
        return out

    def _when_cleaned(self) -> str:
        return f" at {self._cleaned_at}" if self._cleaned_at else ""

    def _never_ran_error(self, index: int, job_id: str) -> Exception:
        missing = (
            f"its result was deleted by the batch's cleanup{self._when_cleaned()}"
            if self._cleaned
            else None
        )
        reason, phase = self._reasons.get(index, (missing or "its result is missing", None))
        if self._states.get(index) == "cancelled":
            return JobCancelledError(f"input {index} ({job_id}): {reason}", job_id=job_id)
        if phase is not None:
            return JobFailedError(
                f"input {index} ({job_id}) failed: {reason}", job_id=job_id, phase=phase
            )
        return ResultError(f"input {index} ({job_id}): {reason}", job_id=job_id)

    async def failures(self) -> list[JobHandle[T]]:
        """Handles of the inputs that failed or were cancelled (accurate after cleanup)."""
        if not self._cleaned:
            await self._refresh()
        return [
            job
            for i, state in self._states.items()
            if state in ("failed", "cancelled") and (job := self._job(i)) is not None
        ]

    async def cancel(self) -> None:
        """Stop queued inputs from ever running and end the running ones. Not retried."""
        await self._runner.cancel(self.group_id)

    def _summary(self) -> CleanedSummary:
        """Each input's final state, for after cleanup: once all are accounted for, the
        inputs that did not succeed and ``"others": "succeeded"`` (a million successes
        make a few bytes, not a 20 MB map)."""
        states = self._states
        if self._accounted() < self.total:
            return {"states": {str(i): s for i, s in states.items()}}
        codes = states.codes
        succeeded = _CODES["succeeded"]
        others = {str(i): _state(c) for i, c in enumerate(codes) if c and c != succeeded}
        return {"states": others, "others": "succeeded"}

    def _restore_summary(self, summary: CleanedSummary) -> None:
        """Take the states a cleaned-up batch left in its summary (see :meth:`_summary`)."""
        self._cleaned_at = summary.get("cleaned_at")
        for key, state in summary.get("states", {}).items():
            self._record(int(key), state)
        others = summary.get("others")
        if isinstance(others, str):
            for index in self._pending_never_run():
                if index not in self._submission_failures:
                    self._record(index, others)
        self._mark_cleaned()

    def _mark_cleaned(self) -> None:
        """The batch's records are gone: no cleanup is due any more (see
        :meth:`CleanupTally.close`)."""
        self._cleaned = True
        self._tally.close()

    async def _cleanup_after_collection(self) -> None:
        if not self._cleaned:
            await self.cleanup(k8s=True, gcs=True)

    async def cleanup(self, k8s: bool = True, gcs: bool = True) -> None:
        """Stop what still runs (``k8s``) and delete inputs, results and logs (``gcs``;
        a pool's claims and bursts too: :data:`runner.protocol.GROUP_WORK_AREAS`).

        The manifest and a summary of each input's state are kept.
        """
        if k8s and self._accounted() < self.total:
            await self.cancel()
        if k8s:
            await self._runner.release(self.group_id)
        if not gcs:
            return
        await self._refresh()
        summary = self._summary()
        summary["cleaned_at"] = self._cleaned_at = utcnow_iso()
        storage = self._backend.storage
        await storage.write(protocol.group_summary_key(self.group_id), protocol.dump_json(summary))
        for prefix in protocol.GROUP_WORK_AREAS:
            await storage.delete_prefix(protocol.group_prefix(self.group_id) + prefix)
        await storage.delete(protocol.group_payload_key(self.group_id))
        self._mark_cleaned()


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
    check_timeout("timeout", timeout)
    return None if timeout is None else time.monotonic() + timeout


def member_job(manifest: protocol.BatchManifest, index: int) -> JobHandle:
    """The handle of input ``index`` of the batch ``manifest`` describes."""
    group_id = manifest["group_id"]
    job_id = protocol.member_job_id(group_id, index)
    return JobHandle(
        **manifest["handle"],
        job_id=job_id,
        **job_names(job_id, manifest["func_name"]),
        group_id=group_id,
        group_kind="map",
        group_index=index,
    )
