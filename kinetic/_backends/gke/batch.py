"""Batches on GKE with ``pod_per_input=True``: one Kubernetes Job per input, driven from
the consumer's awaits. (The default, a worker pool on one Job that needs no client, is
:mod:`kinetic._backends.gke.pool`.)

Theory of operation
-------------------
Submission recorded the batch (function, input chunks, manifest) and the first
``max_concurrent`` Jobs were created (:meth:`GKEBatches.launch`). From then on a
:class:`_Driver` advances the batch *while someone awaits it*: each
:meth:`_Driver.step` subscribes to the namespace's shared watch (no per-job
polling), and on every change

1. looks at the batch's Jobs (label ``group-id``) and their pods in the watch's copy;
2. for each input whose latest attempt ended, reads its outcome object
   (``_groups/{gid}/results/{index:07d}.res``, written by the pod's runner);
3. an attempt that ended without an outcome (a failed non-final attempt, a pod
   killed or deleted) is retried as a new Job (``kinetic-{member job id}-a{n}``)
   while ``retries`` allow, else the driver records the failure with its reason;
4. creates Jobs for queued inputs until ``max_concurrent`` are alive;
5. returns what finished since the caller last looked.

Budget per input: one Kubernetes write (creating its Job; names are
deterministic, so a ``409`` on resume means "already created") and two storage
writes, both by its pod (outcome and logs). Finished Jobs are deleted once per
batch, by label, at cleanup.

*Stopping.* ``fail_fast`` (after a final failure), ``cancel()`` and
``cancel_running_on_fail`` record ``stop.json`` — the same protocol as the local
engine — and the last two delete the batch's Jobs with one request. Once nothing
runs any more, every input without an outcome never ran: it is cancelled.

*Resuming.* The driver keeps nothing that is not in storage or in the cluster: a
new driver (another process, through ``attach_batch``) lists the outcomes, sees
the live Jobs in the watch and carries on. Delivery is at-least-once: an input
whose Job was deleted while it ran is run again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection
from typing import TYPE_CHECKING, Any

import anyio
import cloudpickle

from kinetic._backends.base import JobRef, StatusCallback
from kinetic._backends.local_batch import BatchEvents, Loaded
from kinetic._core import accelerators, k8s_spec, k8s_status
from kinetic._core.status import (
    START_PHASE,
    JobStatus,
    StatusReport,
    settled_input_report,
    start_failure,
    start_grace_left,
    unsettled_input_report,
)
from kinetic._exceptions import ObjectNotFoundError
from kinetic._storage.base import Storage
from runner import protocol

if TYPE_CHECKING:
    from kinetic._backends.gke.backend import GKEBackend
    from kinetic._backends.gke.watch import SharedWatch

log = logging.getLogger(__name__)

_IO_CONCURRENCY = 16
UNSEEN_GRACE = 30.0
"""Seconds a Job we created may stay unseen by the watch before it is created again."""
RECHECK_EVERY = 30.0
"""Seconds between two looks at the batch when the watch reports nothing."""


class GKEBatches:
    """The GKE batch engine of one backend (a :class:`~kinetic._engine.batch_runner.BatchRunner`)."""

    def __init__(self, backend: GKEBackend) -> None:
        self.backend = backend
        self._drivers: dict[str, _Driver] = {}

    @property
    def storage(self) -> Storage:
        return self.backend.storage

    def driver(self, group_id: str) -> _Driver:
        """This process's driver of the batch (one per batch and backend)."""
        found = self._drivers.get(group_id)
        if found is None:
            found = self._drivers[group_id] = _Driver(self.backend, group_id)
        return found

    async def launch(self, group_id: str) -> None:
        """Create the first Jobs of a freshly recorded batch (nothing else of it runs)."""
        await self.driver(group_id).start_fresh()

    async def follow(self, group_id: str, known: Collection[int]) -> AsyncIterator[BatchEvents]:
        driver = self.driver(group_id)
        while True:
            yield await driver.step(known)

    async def snapshot(self, group_id: str, known: Collection[int]) -> BatchEvents:
        return await self.driver(group_id).snapshot(known)

    async def load_many(self, group_id: str, indices: list[int]) -> Loaded:
        return await self.driver(group_id).load_many(indices)

    async def cancel(self, group_id: str) -> bool:
        await self.driver(group_id).stop_batch("cancelled", "the batch was cancelled", kill=True)
        return True

    async def release(self, group_id: str) -> None:
        namespace = await self.driver(group_id).namespace()
        await self.backend.client.delete_jobs(namespace, k8s_spec.group_selector(group_id))

    # -- one input's handle ---------------------------------------------------------

    async def member_status(self, job: JobRef) -> StatusReport:
        """The status of one input (its outcome, the stop record, or its Jobs)."""
        group_id, index = str(job.group_id), _index(job)
        driver = self.driver(group_id)
        loaded = await driver.load_many([index])
        header = loaded[index][0] if index in loaded else None
        stop = None if header is not None else await driver.read_stop()
        settled = settled_input_report(header, stop)
        if settled is not None:
            return settled
        recorded = await self.storage.exists(protocol.group_manifest_key(group_id))
        running = False
        if recorded:
            selector = f"{k8s_spec.group_selector(group_id)},{k8s_spec.GROUP_INDEX_LABEL}={index}"
            jobs = await self.backend.client.list_objects("jobs", job.namespace, selector)
            running = bool(jobs.get("items"))
        return unsettled_input_report(recorded=recorded, running=running)

    async def member_wait(self, job: JobRef, on_change: StatusCallback | None) -> StatusReport:
        """Drive the batch until input ``job`` is over."""
        driver = self.driver(str(job.group_id))
        last: StatusReport | None = None
        while True:
            report = await self.member_status(job)
            if on_change is not None and report != last:
                await on_change(report)
            last = report
            if report.status.is_terminal:
                return report
            await driver.step(set(driver.done))

    async def member_logs(self, job: JobRef) -> str:
        """The input's stored output, else its live pod's."""
        group_id, index = str(job.group_id), _index(job)
        try:
            data = await self.storage.read(protocol.group_member_logs_key(group_id, index))
            return data.decode(errors="replace")
        except ObjectNotFoundError:
            pass
        selector = f"{k8s_spec.group_selector(group_id)},{k8s_spec.GROUP_INDEX_LABEL}={index}"
        pods = (await self.backend.client.list_objects("pods", job.namespace, selector))["items"]
        pod = k8s_status.newest(pods)
        if pod is None:
            return ""
        text = await self.backend.client.pod_log(job.namespace, pod["metadata"]["name"])
        return text or ""

    async def member_cancel(self, job: JobRef) -> None:
        """Record the input cancelled (unless it has an outcome) and delete its Jobs."""
        group_id, index = str(job.group_id), _index(job)
        driver = self.driver(group_id)
        if await driver.load_many([index]):
            return
        payload = protocol.result_payload(success=False, error="cancelled")
        await driver.write_outcome(
            index, protocol.cancelled_header(), bytes(cloudpickle.dumps(payload))
        )
        selector = f"{k8s_spec.group_selector(group_id)},{k8s_spec.GROUP_INDEX_LABEL}={index}"
        await _delete(self.backend, job.namespace, selector)

    async def member_result(self, job: JobRef) -> bytes:
        """The input's result payload. :raises ObjectNotFoundError: when it has none."""
        group_id, index = str(job.group_id), _index(job)
        loaded = await self.driver(group_id).load_many([index])
        if index not in loaded:
            raise ObjectNotFoundError(protocol.group_outcome_key(group_id, index), self.storage.url)
        return loaded[index][1]


class _Driver:
    """Advances one batch on the cluster; see the module docstring."""

    def __init__(self, backend: GKEBackend, group_id: str) -> None:
        self.backend = backend
        self.group_id = group_id
        self.manifest: protocol.BatchManifest | None = None
        self.done: dict[int, protocol.InputState] = {}  # index -> final state, in order
        self.outcomes: Loaded = {}
        self.created: dict[str, tuple[int, float]] = {}  # attempt id -> index, when
        self.handled: set[str] = set()  # attempts whose end was dealt with
        self.attempts: dict[int, int] = {}  # index -> its latest attempt known
        self.alive: set[int] = set()  # inputs running at the last look
        self.stuck: dict[str, float] = {}  # attempt id -> since when it cannot start
        self.stop: protocol.StopRecord | None = None
        self.lock = anyio.Lock()
        self._loaded = False

    # -- storage ----------------------------------------------------------------------

    @property
    def storage(self) -> Storage:
        return self.backend.storage

    async def read_json(self, key: str) -> Any:
        try:
            return protocol.load_json(await self.storage.read(key))
        except (ObjectNotFoundError, ValueError):
            return None

    async def read_stop(self) -> protocol.StopRecord | None:
        """The batch's stop record, or None while it has none."""
        stop: protocol.StopRecord | None = await self.read_json(
            protocol.group_stop_key(self.group_id)
        )
        return stop

    async def _manifest(self) -> protocol.BatchManifest:
        if self.manifest is None:
            key = protocol.group_manifest_key(self.group_id)
            self.manifest = protocol.load_manifest(await self.storage.read(key))
        return self.manifest

    def _gke(self) -> protocol.GKEBatchRecord:
        """The manifest's GKE part (read first: :meth:`_manifest`)."""
        assert self.manifest is not None
        return self.manifest["gke"]

    async def namespace(self) -> str:
        """The namespace the batch's Jobs run in."""
        await self._manifest()
        return self._gke()["namespace"]

    async def _read_outcomes(self, indices: Collection[int]) -> None:
        """Read (into the cache) the outcome objects of ``indices`` that exist."""
        limiter = anyio.CapacityLimiter(_IO_CONCURRENCY)

        async def one(index: int) -> None:
            async with limiter:
                try:
                    data = await self.storage.read(protocol.group_outcome_key(self.group_id, index))
                except ObjectNotFoundError:
                    return
            try:
                header, payload = protocol.decode_outcome(data)
            except ValueError:
                log.warning("batch %s: outcome of input %d is corrupted", self.group_id, index)
                return
            self._learn(index, header, payload)

        try:
            async with anyio.create_task_group() as tg:
                for index in indices:
                    if index not in self.outcomes:
                        tg.start_soon(one, index)
        except BaseExceptionGroup as group:
            raise _first_error(group) from None

    def _learn(self, index: int, header: protocol.OutcomeHeader, payload: bytes) -> None:
        self.outcomes[index] = (header, payload)
        if index not in self.done:
            self.done[index] = protocol.as_input_state(header.get("state"))

    async def _scan_outcomes(self) -> None:
        """List the batch's outcome objects and read the ones not cached yet."""
        prefix = protocol.group_results_prefix(self.group_id)
        found: list[int] = []
        async for key in self.storage.list(prefix):
            index = protocol.parse_outcome_name(key.removeprefix(prefix))
            if index is not None:
                found.append(index)
        await self._read_outcomes(found)

    async def _load(self) -> None:
        if self._loaded:
            return
        await self._manifest()
        await self._scan_outcomes()
        self.stop = await self.read_stop()
        self._loaded = True

    async def write_outcome(
        self, index: int, header: protocol.OutcomeHeader, payload: bytes
    ) -> None:
        """Record an outcome the pod could not (it died, or never started)."""
        key = protocol.group_outcome_key(self.group_id, index)
        await self.storage.write(key, protocol.encode_outcome(header, payload))
        self._learn(index, header, payload)

    async def load_many(self, indices: list[int]) -> Loaded:
        await self._read_outcomes([i for i in indices if i not in self.outcomes])
        return {i: self.outcomes[i] for i in indices if i in self.outcomes}

    # -- the cluster ------------------------------------------------------------------

    def _manifest_for(self, index: int, attempt: int) -> dict[str, Any]:
        assert self.manifest is not None
        gke = self._gke()
        accel = accelerators.parse_accelerator(gke["accelerator"])
        job = k8s_spec.member_job_manifest(
            group_id=self.group_id,
            index=index,
            attempt=attempt,
            namespace=gke["namespace"],
            image=gke["image"],
            bucket=self.backend.bucket,
            accelerator=accel,
            output_dir=self.manifest["spec"]["output_dir"],
            env=self.manifest["spec"]["env"],
            pod=self.backend.options.pod,
            func_name=self.manifest["func_name"],
        )
        if gke.get("fuse_buckets"):
            job = k8s_spec.with_gcs_fuse(job, gke["fuse_buckets"])
        return job

    async def _create(self, launches: list[tuple[int, int]]) -> None:
        """Create the Jobs of these (index, attempt) pairs, concurrently; 409 is success."""
        namespace = self._gke()["namespace"]
        limiter = anyio.CapacityLimiter(_IO_CONCURRENCY)

        async def one(index: int, attempt: int) -> None:
            attempt_id = protocol.member_attempt_id(self.group_id, index, attempt)
            self.created[attempt_id] = (index, anyio.current_time())
            self.attempts[index] = max(attempt, self.attempts.get(index, 0))
            async with limiter:
                try:
                    await self.backend.client.create_job(
                        namespace, self._manifest_for(index, attempt), exist_ok=True
                    )
                except BaseException:
                    self.created.pop(attempt_id, None)
                    raise

        try:
            async with anyio.create_task_group() as tg:
                for index, attempt in launches:
                    tg.start_soon(one, index, attempt)
        except BaseExceptionGroup as group:
            raise _first_error(group) from None  # one Kinetic error, not a group of the same

    async def start_fresh(self) -> None:
        """Create the first ``max_concurrent`` Jobs of a batch that was just recorded."""
        async with self.lock:
            manifest = await self._manifest()
            self._loaded = True  # fresh: no outcomes, no stop record, no Jobs yet
            limit = max(1, int(manifest["options"]["max_concurrent"]))
            first = [(i, 0) for i in range(min(limit, int(manifest["total"])))]
            await self._create(first)
            self.alive.update(i for i, _ in first)

    async def stop_batch(self, reason: protocol.StopReason, detail: str, *, kill: bool) -> None:
        """Record ``stop.json`` (nothing new starts); with ``kill``, delete the batch's Jobs."""
        record = protocol.stop_record(reason, detail)
        if self.stop is None:
            self.stop = record
            await self.storage.write(
                protocol.group_stop_key(self.group_id), protocol.dump_json(record)
            )
        if kill:
            namespace = await self.namespace()
            await _delete(self.backend, namespace, k8s_spec.group_selector(self.group_id))
            self.created.clear()  # deleted, seen by the watch or not: nothing of it runs

    def _events(self, known: Collection[int]) -> BatchEvents:
        done = [(i, s) for i, s in self.done.items() if i not in known]
        stop = self.stop if self.stop is not None and not self.alive else None
        return BatchEvents(done=done, running=sorted(self.alive), stop=stop)

    async def snapshot(self, known: Collection[int]) -> BatchEvents:
        """One look without driving: outcomes in storage, the stop record, live Jobs."""
        async with self.lock:
            await self._load()
            await self._scan_outcomes()
            if self.stop is None:
                self.stop = await self.read_stop()
            listing = await self.backend.client.list_objects(
                "jobs", self._gke()["namespace"], k8s_spec.group_selector(self.group_id)
            )
            alive: set[int] = set()
            for obj in listing.get("items") or []:
                labels = (obj.get("metadata") or {}).get("labels") or {}
                index = int(labels.get(k8s_spec.GROUP_INDEX_LABEL, -1))
                self.created.pop(str(labels.get(k8s_spec.JOB_ID_LABEL)), None)
                over = k8s_status.job_conditions_report(obj) is not None
                if index >= 0 and index not in self.done and not over:
                    alive.add(index)
            alive.update(i for i, _ in self.created.values() if i not in self.done)
            self.alive = alive
            events = self._events(known)
            events.snapshot_complete = True
            return events

    async def step(self, known: Collection[int]) -> BatchEvents:
        """Drive the batch until an input not in ``known`` finished, or it stopped.

        Holds a watch subscription only for the duration of the call, so the
        caller's task owns every task this starts. Cancelling it leaves the batch
        consistent: a Job whose creation was interrupted is found (or re-created)
        by the next step.
        """
        await self._load()
        watch = self.backend.cluster.watch(await self.namespace())
        async with watch.subscribe(resume=True):
            while True:
                version = watch.version
                if watch.error is not None:
                    raise watch.error
                timeout: float | None = None
                if watch.synced:
                    async with self.lock:
                        timeout = await self._reconcile(watch)
                    events = self._events(known)
                    if events.done or events.stop is not None:
                        return events
                await watch.changed(version, timeout)

    async def _reconcile(self, watch: SharedWatch) -> float:
        """One pass of the module docstring's steps 1-4; the seconds until the next look."""
        assert self.manifest is not None
        options = self.manifest["options"]
        retries, total = int(options["retries"]), int(self.manifest["total"])
        now = anyio.current_time()
        latest: dict[int, tuple[int, dict[str, Any]]] = {}
        for obj in watch.objects["jobs"].values():
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels.get(k8s_spec.GROUP_ID_LABEL) != self.group_id:
                continue
            index = int(labels.get(k8s_spec.GROUP_INDEX_LABEL, -1))
            attempt = int(labels.get(k8s_spec.ATTEMPT_LABEL, 0))
            if index >= 0 and (index not in latest or attempt > latest[index][0]):
                latest[index] = (attempt, obj)
                self.attempts[index] = max(attempt, self.attempts.get(index, 0))
        alive: set[int] = set()
        ended: dict[int, tuple[int, StatusReport]] = {}
        lost = {a for a in watch.lost if protocol.attempt_in_group(a, self.group_id)}
        next_look = RECHECK_EVERY
        for index, (attempt, obj) in latest.items():
            attempt_id = protocol.member_attempt_id(self.group_id, index, attempt)
            self.created.pop(attempt_id, None)
            if index in self.done or attempt_id in self.handled:
                continue
            report = k8s_status.status_from_k8s(
                final=None,
                cancelled=False,
                job=obj,
                pods=watch.pods(attempt_id),
                lost_pod=watch.lost.get(attempt_id),
            )
            if report.status.is_terminal:
                ended[index] = (attempt, report)
            elif k8s_status.cannot_start(report):
                since = self.stuck.setdefault(attempt_id, now)
                grace = self.backend.options.start_grace
                left = start_grace_left(stuck_since=since, now=now, grace=grace)
                if left <= 0:
                    # Not retried: it would not start either.
                    ended[index] = (attempt, start_failure(report.reason, grace))
                else:
                    alive.add(index)
                    next_look = min(next_look, left)
            else:
                self.stuck.pop(attempt_id, None)
                alive.add(index)
        for attempt_id, (index, when) in list(self.created.items()):
            if now - when > UNSEEN_GRACE:
                self.created.pop(attempt_id)  # never seen: create it again (409 if it exists)
            else:
                alive.add(index)
                next_look = min(next_look, UNSEEN_GRACE)
        # An input seen running before whose Jobs are all gone (deleted): it ended too.
        for index in self.alive - alive - set(latest) - set(self.done):
            gone = StatusReport(JobStatus.FAILED, reason="its Kubernetes Job was deleted")
            ended.setdefault(index, (self.attempts.get(index, 0), gone))
        self.alive = alive
        if ended:
            await self._settle_ended(ended, retries, lost)
        if self.stop is None:
            await self._launch(total)
        return next_look

    async def _settle_ended(
        self,
        ended: dict[int, tuple[int, StatusReport]],
        retries: int,
        lost: set[str],
    ) -> None:
        """Outcomes of ended attempts; record the failure of those that wrote none."""
        await self._read_outcomes(list(ended))
        silent = [i for i in ended if i not in self.outcomes]
        if silent and self.stop is None:
            self.stop = await self.read_stop()
        to_kill: list[str] = []
        for index in silent:
            attempt, report = ended[index]
            attempt_id = protocol.member_attempt_id(self.group_id, index, attempt)
            self.handled.add(attempt_id)
            if self.stop is not None:
                continue  # never retried: settled as cancelled once nothing runs
            if attempt_id in lost or report.phase == START_PHASE:
                to_kill.append(attempt_id)  # no replacement pod; no Job left waiting
            if attempt < retries and report.phase != START_PHASE:
                continue  # _launch starts the next attempt
            error = report.reason or "the pod ended without recording an outcome"
            phase = report.phase or "execute"
            header = protocol.ended_header("failed", attempt, error, phase)
            payload = protocol.result_payload(
                success=False, phase=phase, error=error, error_type=""
            )
            await self.write_outcome(index, header, bytes(cloudpickle.dumps(payload)))
        if to_kill:
            namespace = await self.namespace()
            for attempt_id in to_kill:  # rare (failures only): one after the other
                await _delete(self.backend, namespace, k8s_spec.job_selector(attempt_id))
        for index in ended:
            if self.done.get(index) == "failed" and self._fail_fast() and self.stop is None:
                kill = bool((await self._manifest())["options"]["cancel_running_on_fail"])
                await self.stop_batch("fail_fast", f"input {index} failed", kill=kill)

    def _fail_fast(self) -> bool:
        assert self.manifest is not None
        return bool(self.manifest["options"]["fail_fast"])

    async def _launch(self, total: int) -> None:
        """Create Jobs for queued inputs (retries first) up to ``max_concurrent`` alive."""
        assert self.manifest is not None
        room = max(1, int(self.manifest["options"]["max_concurrent"])) - len(self.alive)
        if room <= 0:
            return
        retry: list[tuple[int, int]] = []
        fresh: list[tuple[int, int]] = []
        for index in range(total):
            if index in self.done or index in self.alive:
                continue
            if index in self.attempts:  # it ran and ended without an outcome: retry
                retry.append((index, self.attempts[index] + 1))
            else:
                fresh.append((index, 0))
            if len(fresh) >= room:
                break
        launches = (retry + fresh)[:room]
        if launches:
            await self._create(launches)
            self.alive.update(i for i, _ in launches)


def _index(job: JobRef) -> int:
    index = job.group_index
    if index is None:
        raise ValueError(f"job {job.job_id} belongs to a batch but has no index")
    return index


async def _delete(backend: GKEBackend, namespace: str, selector: str) -> None:
    """End Jobs and their pods now: the Jobs first (so none starts a replacement pod),
    then the pods without grace. Two requests, whatever the number of Jobs."""
    await backend.client.delete_jobs(namespace, selector)
    await backend.client.delete_pods(namespace, selector)


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first ordinary exception in ``group`` (nested groups flattened), else the group."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            inner = _first_error(exc)
            if not isinstance(inner, BaseExceptionGroup):
                return inner
        elif isinstance(exc, Exception):
            return exc
    return group
