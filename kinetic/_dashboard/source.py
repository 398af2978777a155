"""Where the dashboard reads: the storage the settings point at (a local root or a GCS
bucket), through the async core (the same backend and batch engine the CLI uses).

Theory of operation
-------------------
A :class:`Source` serves every page of one dashboard. Batches are watched by one
:class:`BatchWatch` each, shared by every page and event stream showing them: a
refresh happens at most once per :data:`REFRESH_INTERVAL` whatever the number of
viewers, and costs a bounded number of reads of the core:

* one ``snapshot`` of the batch's engine (the local engine reads only what its results
  logs gained since the last refresh, or the supervisor's snapshot; a GKE pool its
  bursts), never one read per input;
* one ``load_many`` of the inputs that newly failed (their headers give the exception
  type), capped at :data:`FAILED_PER_REFRESH` inputs; each input is read so once in the
  dashboard's life;
* one ``read_stop`` when the batch stopped.

:attr:`BatchWatch.reads` counts those calls (the benchmark reports reads per refresh).
Job statuses the dashboard read are kept (:attr:`Source.history`): a job's page shows
the statuses seen, with when they were first seen; the records carry no timings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread

from kinetic._backends.base import Backend
from kinetic._backends.local_batch import LocalBatches, event_chunks
from kinetic._concurrency import for_each
from kinetic._core.status import StatusReport, stopped_report
from kinetic._dashboard.progress import BatchProgress
from kinetic._engine.batch import member_job
from kinetic._engine.batch_listing import batch_summaries
from kinetic._engine.batch_runner import BatchRunner, runner_for
from kinetic._engine.handle import JobHandle
from kinetic._engine.results import load_payload
from kinetic._exceptions import KineticError, ObjectNotFoundError
from runner import protocol

log = logging.getLogger("kinetic")

REFRESH_INTERVAL = 1.0
FAILED_PER_REFRESH = 4096
_CONCURRENCY = 16
_APPLY_SLICE = 8192  # finished inputs applied per step of the loop (~2 ms)
_HISTORY = 20  # statuses kept per job
_RESULT_TYPE_LIMIT = 64 << 20  # results larger than this are sized, not unpickled


@dataclass
class Seen:
    """A status the dashboard read, and when it first read it (UTC, ISO)."""

    at: str
    status: str
    reason: str | None


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> float | None:
    """Seconds since the epoch of a record's ISO time, or None."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class BatchWatch:
    """One batch: its manifest, and what its records said at the last refresh."""

    def __init__(
        self,
        runner: BatchRunner,
        manifest: protocol.BatchManifest,
        followers: anyio.abc.TaskGroup | None = None,
    ) -> None:
        self.runner = runner
        self.manifest = manifest
        self.group_id = manifest["group_id"]
        self.progress = BatchProgress(int(manifest["total"]))
        self.stop: protocol.StopRecord | None = None
        self.reads = 0
        self.refreshes = 0
        self.following = False  # a local supervisor's events are being applied
        self._followers = followers
        self._follow_started = False
        self._lock = anyio.Lock()
        self._last = -REFRESH_INTERVAL
        self._backlog: list[int] = []  # failed inputs not grouped yet (over the cap)

    def _start_following(self) -> None:
        """Follow the local supervisor's event stream while it runs, once per watch (in
        the dashboard's task group): its snapshot names every finished input, so taking
        one per refresh costs a pass over the batch; its stream says only what changed."""
        if self._follow_started or self._followers is None:
            return
        batches = getattr(self.runner, "batches", None)
        if not isinstance(batches, LocalBatches):
            return
        self._follow_started = True
        self._followers.start_soon(self._follow, batches)

    async def _follow(self, batches: LocalBatches) -> None:
        """Apply the supervisor's events until it closes the stream (the batch ended, or
        it stopped); then refreshes read the records again. With no supervisor listening,
        the next refresh tries again. Never raises: a follower that fails leaves the
        batch to snapshots."""
        try:
            stream = await batches.connect(self.group_id)
        except KineticError as exc:
            log.warning(
                "dashboard: batch %s: its events cannot be followed: %s", self.group_id, exc
            )
            return
        if stream is None:  # not listening yet (starting), or gone: try again next refresh
            self._follow_started = False
            return
        p = self.progress
        async with stream:
            try:
                async for events in event_chunks(stream):
                    async with self._lock:
                        self.following = events.snapshot_complete or self.following
                        now = time.monotonic()
                        self._backlog += p.apply(
                            [(i, str(s)) for i, s in events.done],
                            events.running,
                            running_complete=False,
                            now=now,
                        )
            finally:
                self.following = False

    async def refresh(self, *, force: bool = False) -> None:
        """Look at the batch's records unless another look was taken within
        :data:`REFRESH_INTERVAL` (viewers share one look)."""
        async with self._lock:
            now = time.monotonic()
            if not force and now - self._last < REFRESH_INTERVAL:
                return
            await self._refresh(now)
            self._last = time.monotonic()

    async def _refresh(self, now: float) -> None:
        p = self.progress
        self.refreshes += 1
        self._start_following()
        if not p.finished and not self.following:
            events = await self.runner.snapshot(self.group_id, p.known)
            self.reads += 1
            self._backlog += p.apply(
                [], events.running, running_complete=events.snapshot_complete, now=now
            )
            done = events.done
            for start in range(0, len(done), _APPLY_SLICE):
                # A supervisor's snapshot names every finished input: a slice at a time,
                # so pages are answered between slices (each slice is applied whole).
                part = [(i, str(s)) for i, s in done[start : start + _APPLY_SLICE]]
                self._backlog += p.apply(part, [], running_complete=False, now=now)
                await anyio.lowlevel.checkpoint()
            if events.stop is not None and not p.finished:
                self.stop = events.stop
                report = stopped_report(events.stop)
                state = "cancelled" if report.cancelled else "failed"
                label = f"never ran: {report.reason}"
                for index in p.settle(state):
                    p.group(index, label, str(report.reason))
        if self._backlog:
            batch, self._backlog = (
                self._backlog[:FAILED_PER_REFRESH],
                self._backlog[FAILED_PER_REFRESH:],
            )
            loaded = await self.runner.load_many(self.group_id, batch)
            self.reads += 1
            examples: list[tuple[str, bytes]] = []
            for index in batch:
                read = loaded.get(index)
                header: dict[str, Any] = dict(read[0]) if read is not None else {}
                key = _failure_key(header)
                if p.group(index, key, str(header.get("error") or key)) and read is not None:
                    examples.append((key, read[1]))
            for key, payload in examples:
                p.groups[key].traceback = await anyio.to_thread.run_sync(
                    _traceback_of, payload, f"{self.group_id}"
                )
        p.sample(time.monotonic())

    def job(self, index: int) -> JobHandle:
        return member_job(self.manifest, index)


def _failure_key(header: dict[str, Any]) -> str:
    if header.get("state") == "cancelled":
        return "cancelled"
    kind = str(header.get("error_type") or "")
    kind = kind.removeprefix("builtins.")
    if kind:
        return kind
    phase = header.get("phase")
    return f"failed in phase {phase}" if phase else "failed"


def _traceback_of(payload: bytes, where: str) -> str | None:
    """The remote traceback a failure's payload carries (None when it cannot be read)."""
    try:
        decoded = load_payload(payload, where)
    except KineticError:
        return None
    tb = decoded.get("traceback")
    return str(tb) if tb else decoded.get("error")


class Source:
    """Every read the dashboard makes, on one backend."""

    def __init__(self, backend: Backend, followers: anyio.abc.TaskGroup | None = None) -> None:
        """:param followers: where batches' event followers run (the dashboard's task
        group); without one, every refresh takes a snapshot."""
        self.backend = backend
        self._followers = followers
        self.history: dict[str, list[Seen]] = {}
        self._batches: dict[str, BatchWatch] = {}
        self._lock = anyio.Lock()

    @property
    def storage_url(self) -> str:
        return str(self.backend.storage.url)

    def saw(self, job_id: str, report: StatusReport | KineticError) -> None:
        """Remember ``job_id``'s status when it changed since last seen."""
        status = "UNKNOWN" if isinstance(report, KineticError) else report.status.value
        reason = str(report) if isinstance(report, KineticError) else report.reason
        seen = self.history.setdefault(job_id, [])
        if not seen or seen[-1].status != status:
            seen.append(Seen(utc_now(), status, reason))
            del seen[:-_HISTORY]

    async def jobs(self) -> list[tuple[JobHandle, StatusReport | KineticError]]:
        """The recorded single jobs (newest first), each with its status."""
        from kinetic._engine.job_listing import single_jobs

        handles = await single_jobs(self.backend)
        reports: dict[str, StatusReport | KineticError] = {}

        async def one(h: JobHandle) -> None:
            reports[h.job_id] = await self.status(h)

        await for_each(handles, one, limit=_CONCURRENCY)
        return [(h, reports[h.job_id]) for h in handles]

    async def status(self, handle: JobHandle) -> StatusReport | KineticError:
        try:
            report: StatusReport | KineticError = await handle.status_report()
        except KineticError as exc:
            report = exc
        self.saw(handle.job_id, report)
        return report

    async def job(self, job_id: str) -> JobHandle:
        """The handle of a single job or a batch input.

        :raises JobNotFoundError: no such job.
        """
        from kinetic._engine.handle import load_handle
        from kinetic._exceptions import JobNotFoundError

        try:
            return await load_handle(self.backend, job_id)
        except JobNotFoundError:
            member = protocol.parse_member_job_id(job_id)
            if member is None:
                raise
            return (await self.batch(member[0])).job(member[1])

    async def finished_at(self, job_id: str) -> float | None:
        """When a single job's final record was written, where the storage tells it (a
        local root: the file's time); None otherwise."""
        path_for: Callable[[str], Any] | None = getattr(self.backend.storage, "path_for", None)
        if path_for is None:
            return None
        path = path_for(protocol.final_key(job_id))

        def _mtime() -> float | None:
            try:
                return float(path.stat().st_mtime)
            except OSError:
                return None

        return await anyio.to_thread.run_sync(_mtime)

    async def result_info(self, handle: JobHandle) -> tuple[str, int] | None:
        """(type name, size in bytes) of a finished job's value, or None without one."""
        if handle.group_id is not None:
            runner = runner_for(self.backend)
            index = int(handle.group_index or 0)
            loaded = await runner.load_many(handle.group_id, [index])
            if index not in loaded:
                return None
            data = loaded[index][1]
        else:
            key = protocol.result_key(handle.job_id)
            try:
                size = await self.backend.storage.size(key)
            except ObjectNotFoundError:
                return None
            if size > _RESULT_TYPE_LIMIT:
                return ("(too large to open here)", size)
            try:
                data = await self.backend.storage.read(key)
            except ObjectNotFoundError:
                return None
        return (await anyio.to_thread.run_sync(_type_of, data, handle.job_id), len(data))

    async def batch(self, group_id: str) -> BatchWatch:
        """The watch of batch ``group_id`` (made on first use: one manifest read).

        :raises JobNotFoundError: no such batch.
        """
        from kinetic._core.ids import check_group_id
        from kinetic._exceptions import JobNotFoundError

        check_group_id(group_id)
        async with self._lock:
            watch = self._batches.get(group_id)
            if watch is None:
                try:
                    data = await self.backend.storage.read(protocol.group_manifest_key(group_id))
                except ObjectNotFoundError:
                    raise JobNotFoundError(f"no batch {group_id!r}") from None
                manifest = protocol.load_manifest(data)
                runner = runner_for(self.backend)
                watch = BatchWatch(runner, manifest, self._followers)
                self._batches[group_id] = watch
        return watch

    async def batches(self) -> list[dict[str, Any]]:
        """A summary of each recorded batch's manifest, newest first."""
        return await batch_summaries(self.backend.storage)

    async def cancel_batch(self, group_id: str) -> None:
        watch = await self.batch(group_id)
        await watch.runner.cancel(group_id)
        await watch.refresh(force=True)

    async def cancel_job(self, job_id: str) -> None:
        handle = await self.job(job_id)
        await handle.cancel()


def _type_of(data: bytes, job_id: str) -> str:
    try:
        payload = load_payload(data, job_id)
    except KineticError as exc:
        return f"(unreadable: {exc})"
    if not payload.get("success"):
        return f"(raised {payload.get('error_type') or 'an error'})"
    value = payload.get("result")
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


Refresh = Callable[[], Awaitable[None]]
