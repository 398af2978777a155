"""Shared watches: one per namespace and label selector, for every handle of a loop.

Theory of operation
-------------------
A :class:`SharedWatch` keeps an in-memory copy of the Kinetic Jobs and pods of one
namespace (label selector ``app=kinetic``), current through two watch streams
(``jobs`` and ``pods``). Waiters read that copy instead of polling the API server.
Each change bumps :attr:`SharedWatch.version` and wakes the waiters of the whole copy
(a batch driver), and the waiters of the one job the changed object belongs to
(:meth:`SharedWatch.job_changes`), who then re-derive that job's status (a dictionary
lookup, no IO). A re-list or an error wakes every waiter. Waking only the job's own
waiters matters when many jobs are awaited at once: each event would otherwise run
every waiter's step in one turn of the loop.

*Who drives.* The streams need a task, and every task needs an owner. A waiter
enters :meth:`SharedWatch.subscribe`, which starts a *driver candidate* in the
waiter's own task group. Candidates queue on one lock; the holder runs the two
streams, so there is exactly one watch per namespace, owned by the task group of
the subscriber that holds the lock. When that subscriber leaves, its task group
cancels its candidate, the lock passes to the next subscriber's candidate, which
resumes the streams from the last ``resourceVersion`` (no events lost, no
re-list). With no subscriber, nothing runs and nothing is leaked; the next first
subscriber re-lists, since the copy went stale meanwhile — unless it asks to
``resume`` and the gap was shorter than :data:`RESUME_WINDOW`: then the streams
resume from the last ``resourceVersion`` and the API server replays what changed
in the gap (or says ``410 Gone``, and it re-lists). A batch driver subscribes once
per step and tolerates a copy that lags until the replay arrives (a Job it created
is counted alive until seen), so this spares it a full list of the namespace per
completed input. Single-job waiters do not resume: their first report must be
current.

*Consistency.* A stream starts with a list (which also sets the resourceVersion)
when it has none, and resumes from it otherwise. ``410 Gone`` (the version is too
old) or an ``ERROR`` event forces a re-list. A broken connection (the API server
restarting, say) is retried with back-off and resumes from the last version.
A pod deleted before it finished is remembered (:attr:`SharedWatch.lost`), so that
a job whose pod was killed by deletion is reported FAILED, not re-run.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio

from kinetic._backends.gke.client import KubeClient, KubeHTTPError, collection_path
from kinetic._core import k8s_status
from kinetic._core.exception_groups import one_error
from kinetic._exceptions import BackendError, ConfigError

log = logging.getLogger(__name__)

KINDS = ("jobs", "pods")
SERVER_TIMEOUT = 240
"""Seconds the API server keeps one watch open before ending it (we then resume)."""
MAX_BACKOFF = 2.0
RESUME_WINDOW = 60.0
"""Seconds without subscribers after which the copy is re-listed rather than resumed."""


class _Gone(Exception):
    """The watch's resourceVersion expired: re-list."""


class SharedWatch:
    """Jobs and pods matching ``selector`` in ``namespace``, kept current.

    :ivar version: bumped on every change; pass it to :meth:`changed`.
    :ivar error: a permanent problem seen by the streams (a missing namespace), or None.
    :ivar lists: full lists made (the first ones and every re-list).
    :ivar connects: watch connections opened.
    """

    def __init__(self, client: KubeClient, namespace: str, selector: str) -> None:
        self.client = client
        self.namespace = namespace
        self.selector = selector
        self.objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
        # The same objects by job id (kind -> job id -> name -> object): every waiter
        # looks up its own job at every change, which must not scan the namespace.
        self._by_job: dict[str, dict[str, dict[str, dict[str, Any]]]] = {k: {} for k in KINDS}
        self.lost: dict[str, str] = {}
        self.error: BaseException | None = None
        self.version = 0
        self.lists = 0
        self.connects = 0
        self._rv: dict[str, str | None] = dict.fromkeys(KINDS)
        self._synced: dict[str, bool] = dict.fromkeys(KINDS, False)
        self._changed = anyio.Event()
        # Only jobs someone waits for have one; set and dropped at the job's next change.
        self._job_changed: dict[str, anyio.Event] = {}
        self._driver = anyio.Lock()
        self._subscribers = 0
        self._idle_since: float | None = None

    def __repr__(self) -> str:
        return f"SharedWatch({self.namespace!r}, {self.selector!r})"

    # -- for waiters ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def subscribe(self, *, resume: bool = False) -> AsyncIterator[SharedWatch]:
        """Keep the streams running (here or in another subscriber) while inside.

        The first subscriber after a time with none re-lists: the copy was not kept
        current meanwhile, and must not be read as if it were. With ``resume`` and a gap
        shorter than :data:`RESUME_WINDOW`, the streams resume and replay what changed
        instead: the copy may lag until the replay arrives.
        """
        recent = (
            self._idle_since is not None
            and anyio.current_time() - self._idle_since <= RESUME_WINDOW
        )
        if self._subscribers == 0 and not (resume and recent):
            self._rv = dict.fromkeys(KINDS)
            self._synced = dict.fromkeys(KINDS, False)
        self._subscribers += 1
        try:
            with one_error():  # the subscriber's own error, not a group of it
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._drive)
                    try:
                        yield self
                    finally:
                        tg.cancel_scope.cancel()
        finally:
            self._subscribers -= 1
            if self._subscribers == 0:
                self._idle_since = anyio.current_time()

    @property
    def synced(self) -> bool:
        """Whether both kinds have been listed at least once."""
        return all(self._synced.values())

    async def changed(self, version: int, timeout: float | None = None) -> None:
        """Return once :attr:`version` differs from ``version``, or ``timeout`` passed."""
        with anyio.move_on_after(timeout):
            while self.version == version:
                await self._changed.wait()

    def job_changes(self, job_id: str) -> anyio.Event:
        """An event set at the next change of job ``job_id``'s Job or pods, or of the
        whole copy (a re-list, an error). Take it *before* reading the copy and await it
        after: a change in between is not missed."""
        event = self._job_changed.get(job_id)
        if event is None:
            event = self._job_changed[job_id] = anyio.Event()
        return event

    def job(self, job_id: str) -> dict[str, Any] | None:
        """The job's Job as last seen, or None."""
        found = self._by_job["jobs"].get(job_id)
        return next(iter(found.values())) if found else None

    def pods(self, job_id: str) -> list[dict[str, Any]]:
        """The job's pods as last seen."""
        return list(self._by_job["pods"].get(job_id, {}).values())

    def _put(self, kind: str, obj: dict[str, Any]) -> None:
        # The API server's record of field ownership is three quarters of each pod's and
        # Job's JSON, and nothing reads it: cached, it would only grow the heap that the
        # caller's garbage collector walks, and make its full passes come more often.
        obj["metadata"].pop("managedFields", None)
        name = obj["metadata"]["name"]
        self._drop(kind, name)
        self.objects[kind][name] = obj
        job_id = k8s_status.job_id_of(obj)
        if job_id is not None:
            self._by_job[kind].setdefault(job_id, {})[name] = obj

    def _drop(self, kind: str, name: str) -> dict[str, Any] | None:
        old = self.objects[kind].pop(name, None)
        job_id = None if old is None else k8s_status.job_id_of(old)
        if job_id is not None:
            same_job = self._by_job[kind].get(job_id, {})
            same_job.pop(name, None)
            if not same_job:
                self._by_job[kind].pop(job_id, None)
        return old

    # -- driving ----------------------------------------------------------------------

    def _notify(self, obj: dict[str, Any] | None = None) -> None:
        """Wake the waiters of the whole copy, and those of ``obj``'s job (of every job
        when ``obj`` is None)."""
        self.version += 1
        event, self._changed = self._changed, anyio.Event()
        event.set()
        if obj is None:
            woken, self._job_changed = list(self._job_changed.values()), {}
        else:
            job_id = k8s_status.job_id_of(obj)
            one = None if job_id is None else self._job_changed.pop(job_id, None)
            woken = [] if one is None else [one]
        for job_event in woken:
            job_event.set()

    async def _drive(self) -> None:
        async with self._driver, anyio.create_task_group() as tg:
            for kind in KINDS:
                tg.start_soon(self._pump, kind)

    async def _pump(self, kind: str) -> None:
        backoff = 0.1
        while True:
            try:
                if self._rv[kind] is None:
                    await self._relist(kind)
                await self._follow(kind)
                backoff = 0.1
            except _Gone:
                log.debug("%r: %s watch expired, re-listing", self, kind)
                self._rv[kind] = None
            except ConfigError as exc:  # the namespace is missing: tell the waiters
                self.error = exc
                self._notify()
                await anyio.sleep(MAX_BACKOFF)
            except (BackendError, KubeHTTPError) as exc:
                log.debug("%r: %s watch interrupted (%s); resuming", self, kind, exc)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    async def _relist(self, kind: str) -> None:
        listing = await self.client.list_objects(kind, self.namespace, self.selector)
        self.lists += 1
        fresh = {o["metadata"]["name"]: o for o in listing.get("items") or []}
        if kind == "pods":
            for name, old in self.objects["pods"].items():
                if name not in fresh:
                    self._forget_pod(old)
        self.objects[kind], self._by_job[kind] = {}, {}
        for obj in fresh.values():
            self._put(kind, obj)
        self._rv[kind] = (listing.get("metadata") or {}).get("resourceVersion")
        self._synced[kind] = True
        self.error = None
        self._notify()

    def _forget_pod(self, pod: dict[str, Any]) -> None:
        job_id = k8s_status.job_id_of(pod)
        if job_id is not None and not k8s_status.pod_finished(pod):
            self.lost.setdefault(job_id, pod["metadata"]["name"])

    async def _follow(self, kind: str) -> None:
        query: list[tuple[str, Any]] = [
            ("labelSelector", self.selector),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", SERVER_TIMEOUT),
            ("resourceVersion", self._rv[kind] or ""),
        ]
        self.connects += 1
        buffer = b""
        try:
            async for chunk in self.client.stream(
                collection_path(kind, self.namespace),
                what=f"watch {kind} in {self.namespace}",
                query=query,
                read_timeout=SERVER_TIMEOUT + 30,
            ):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._apply(kind, json.loads(line))
        except KubeHTTPError as exc:
            if exc.status == 410:
                raise _Gone from exc
            if exc.status == 404 and (exc.body.get("details") or {}).get("kind") == "namespaces":
                raise ConfigError(
                    f"Kubernetes namespace {self.namespace!r} does not exist"
                ) from exc
            raise

    def _apply(self, kind: str, event: dict[str, Any]) -> None:
        kind_of_event = event.get("type")
        obj = event.get("object") or {}
        if kind_of_event == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise BackendError(f"watch of {kind} reported an error: {obj.get('message')}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self._rv[kind] = rv
        if kind_of_event == "BOOKMARK":
            return
        if kind_of_event == "DELETED":
            self._drop(kind, obj["metadata"]["name"])
            if kind == "pods":
                self._forget_pod(obj)
        else:
            self._put(kind, obj)
        self._notify(obj)


async def either_set(first: anyio.Event, second: anyio.Event | None) -> None:
    """Return once ``first`` or ``second`` (when given) is set: a waiter's job changed
    (:meth:`SharedWatch.job_changes`), or its caller is done."""
    if second is None:
        await first.wait()
        return
    async with anyio.create_task_group() as tg:

        async def _first(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(_first, first)
        tg.start_soon(_first, second)
