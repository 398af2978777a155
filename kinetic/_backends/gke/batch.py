"""Batches on GKE with ``pod_per_input=True``: one Kubernetes Job per input, driven from
the consumer's awaits. (The default, a worker pool on one Job that needs no client, is
:mod:`kinetic._backends.gke.pool`.)

Theory of operation
-------------------
Submission recorded the batch (function, input chunks, manifest) and the first
``max_concurrent`` Jobs were created (:meth:`GKEBatches.launch`). From then on a
:class:`_Driver` advances the batch *while someone awaits it*: each
:meth:`_Driver.step` subscribes to the namespace's shared watch (no per-job
polling), and on every change it is a thin loop around the pure decisions of
:mod:`kinetic._core.batch_plan`:

1. it gathers a :class:`~kinetic._core.batch_plan.BatchSnapshot`: the batch's Jobs
   (label ``group-id``) and their pods in the watch's copy, the outcomes and the stop
   record it read from storage;
2. it takes :func:`~kinetic._core.batch_plan.step`; when the step needs storage read
   first (the outcome objects ``_groups/{gid}/results/{index:07d}.res`` of inputs whose
   latest attempt ended, written by their pods' runners; the stop record), it reads
   them and takes the step again;
3. it performs the step's actions in order: record a failure (an attempt that ended
   without an outcome once ``retries`` are spent), delete an attempt's Job, stop the
   batch (``fail_fast``), create Jobs (retries as ``kinetic-{member job id}-a{n}``,
   queued inputs up to ``max_concurrent`` alive);
4. it returns what finished since the caller last looked.

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
from collections.abc import Callable, Collection, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import cloudpickle

from kinetic._backends.base import BatchEvents, InputActivity, JobRef, Loaded, input_index
from kinetic._backends.gke.engine import GroupEngine, batch_job
from kinetic._core import batch_plan, k8s_spec, k8s_status
from kinetic._core.exception_groups import one_error
from kinetic._exceptions import ObjectNotFoundError
from kinetic._storage.base import Storage
from runner import protocol

if TYPE_CHECKING:
    from kinetic._backends.cluster import ClusterBackend
    from kinetic._backends.gke.watch import SharedWatch

log = logging.getLogger(__name__)

_IO_CONCURRENCY = 16


class GKEBatches(GroupEngine["_Driver"]):
    """The per-input batch engine of one backend (a
    :class:`~kinetic._backends.base.BatchRunner`)."""

    def _new_follower(self, group_id: str) -> _Driver:
        return _Driver(self.backend, group_id)

    async def launch(self, group_id: str) -> None:
        """Create the first Jobs of a freshly recorded batch (nothing else of it runs)."""
        await self.follower(group_id).start_fresh()

    async def cancel(self, group_id: str) -> None:
        await self.follower(group_id).stop_batch("cancelled", "the batch was cancelled", kill=True)

    async def release(self, group_id: str) -> None:
        namespace = await self.follower(group_id).namespace()
        await self.backend.client.delete_jobs(namespace, k8s_spec.group_selector(group_id))

    # -- one input (see kinetic._backends.base.BatchRunner) ----------------------------

    async def input_activity(self, job: JobRef) -> InputActivity:
        """Running while a Job of the input exists."""
        jobs = await self.backend.client.list_objects("jobs", job.namespace, _input_selector(job))
        return InputActivity(running=bool(jobs.get("items")))

    async def input_changed(self, job: JobRef) -> None:
        """Drive the batch until an input finished, or it stopped."""
        driver = self.follower(str(job.group_id))
        await driver.step(set(driver.done))

    async def input_logs(self, job: JobRef) -> str:
        """The input's stored output, else its live pod's."""
        group_id, index = str(job.group_id), input_index(job)
        try:
            data = await self.storage.read(protocol.group_member_logs_key(group_id, index))
            return data.decode(errors="replace")
        except ObjectNotFoundError:
            pass
        listing = await self.backend.client.list_objects(
            "pods", job.namespace, _input_selector(job)
        )
        pod = k8s_status.newest(listing["items"])
        if pod is None:
            return ""
        text = await self.backend.client.pod_log(job.namespace, pod["metadata"]["name"])
        return text or ""

    async def cancel_input(self, job: JobRef) -> None:
        """Record the input cancelled and delete its Jobs."""
        driver = self.follower(str(job.group_id))
        payload = protocol.result_payload(success=False, error="cancelled")
        await driver.write_outcome(
            input_index(job), protocol.cancelled_header(), bytes(cloudpickle.dumps(payload))
        )
        await _delete(self.backend, job.namespace, _input_selector(job))


class _Driver:
    """Advances one batch on the cluster; see the module docstring. The decisions are
    :func:`kinetic._core.batch_plan.step`'s; this gathers what it looks at and performs
    what it decides."""

    def __init__(self, backend: ClusterBackend, group_id: str) -> None:
        self.backend = backend
        self.group_id = group_id
        self.manifest: protocol.BatchManifest | None = None
        self.options: batch_plan.BatchOptions | None = None
        self.done: dict[int, protocol.InputState] = {}  # index -> final state, in order
        self.outcomes: Loaded = {}
        self.state = batch_plan.EngineState()
        self.stop: protocol.StopRecord | None = None
        self.lock = anyio.Lock()
        self._loaded = False

    # -- storage ----------------------------------------------------------------------

    @property
    def storage(self) -> Storage:
        return self.backend.storage

    async def read_stop(self) -> protocol.StopRecord | None:
        """The batch's stop record, or None while it has none."""
        return await read_stop(self.storage, self.group_id)

    async def _manifest(self) -> protocol.BatchManifest:
        if self.manifest is None:
            key = protocol.group_manifest_key(self.group_id)
            self.manifest = protocol.load_manifest(await self.storage.read(key))
            self.options = batch_plan.BatchOptions.from_manifest(
                self.manifest, start_grace=self.backend.options.start_grace
            )
        return self.manifest

    def _gke(self) -> protocol.GKEBatchRecord:
        """The manifest's GKE part (read first: :meth:`_manifest`)."""
        assert self.manifest is not None
        return self.manifest["gke"]

    async def namespace(self) -> str:
        """The namespace the batch's Jobs run in."""
        await self._manifest()
        return self._gke()["namespace"]

    async def _read_outcomes(self, indices: Iterable[int]) -> None:
        """Read (into the cache) the outcome objects of ``indices`` that exist."""
        wanted = [i for i in indices if i not in self.outcomes]
        await read_outcomes(self.storage, self.group_id, wanted, self._learn)

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
        await self._read_outcomes(indices)
        return {i: self.outcomes[i] for i in indices if i in self.outcomes}

    # -- the cluster ------------------------------------------------------------------

    def _manifest_for(self, index: int, attempt: int) -> dict[str, Any]:
        assert self.manifest is not None
        timeout = self.manifest["spec"].get("timeout")  # each input's run-time limit

        def build(template: k8s_spec.JobTemplate) -> dict[str, Any]:
            return k8s_spec.member_job_manifest(
                replace(template, timeout=timeout),
                group_id=self.group_id,
                index=index,
                attempt=attempt,
            )

        return batch_job(self.backend, self.manifest, build)

    async def _create(self, launches: list[batch_plan.Launch]) -> None:
        """Create the Jobs of ``launches``, concurrently; 409 is success. The state
        already counts them (the step's); what could not be created it forgets."""
        namespace = self._gke()["namespace"]
        limiter = anyio.CapacityLimiter(_IO_CONCURRENCY)
        failed: list[str] = []

        async def one(launch: batch_plan.Launch) -> None:
            async with limiter:
                try:
                    manifest = self._manifest_for(launch.index, launch.attempt)
                    await self.backend.client.create_job(namespace, manifest, exist_ok=True)
                except BaseException:
                    failed.append(
                        protocol.member_attempt_id(self.group_id, launch.index, launch.attempt)
                    )
                    raise

        try:
            with one_error():  # one Kinetic error, not a group of the same
                async with anyio.create_task_group() as tg:
                    for launch in launches:
                        tg.start_soon(one, launch)
        except BaseException:
            self.state = self.state.launch_failed(launches, failed)
            raise

    async def _perform(self, plan: batch_plan.BatchStep) -> None:
        """Do what a step decided, in order (its launches together, last)."""
        self.state = plan.state  # the step's bookkeeping precedes its requests
        for action in plan.actions:
            if isinstance(action, batch_plan.GiveUp):
                payload = bytes(cloudpickle.dumps(action.payload()))
                await self.write_outcome(action.index, action.header(), payload)
            elif isinstance(action, batch_plan.DeleteAttempt):  # rare: one after the other
                selector = k8s_spec.job_selector(action.attempt_id)
                await _delete(self.backend, await self.namespace(), selector)
            elif isinstance(action, batch_plan.StopBatch):
                await self.stop_batch(action.reason, action.detail, kill=action.kill)
        if plan.launches:
            await self._create(plan.launches)

    async def start_fresh(self) -> None:
        """Create the first ``max_concurrent`` Jobs of a batch that was just recorded."""
        async with self.lock:
            await self._manifest()
            assert self.options is not None
            self._loaded = True  # fresh: no outcomes, no stop record, no Jobs yet
            snap = batch_plan.BatchSnapshot()
            await self._perform(
                batch_plan.step(snap, self.state, self.options, anyio.current_time())
            )

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
            self.state = self.state.killed()  # seen by the watch or not: nothing of it runs

    def _events(self, known: Collection[int]) -> BatchEvents:
        done = [(i, s) for i, s in self.done.items() if i not in known]
        alive = self.state.alive
        stop = self.stop if self.stop is not None and not alive else None
        return BatchEvents(done=done, running=sorted(alive), stop=stop)

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
            jobs = listing.get("items") or []
            self.state = batch_plan.seen_in_listing(self.state, self.group_id, jobs, self.done)
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

    def _look(self, watch: SharedWatch) -> batch_plan.BatchSnapshot:
        """What the watch's copy and this driver's cache of storage show now."""
        objects = watch.objects
        return batch_plan.BatchSnapshot(
            attempts=batch_plan.cluster_attempts(
                self.group_id, objects["jobs"].values(), objects["pods"].values(), watch.lost
            ),
            lost=frozenset(a for a in watch.lost if protocol.attempt_in_group(a, self.group_id)),
            done=self.done,
            stop=self.stop,
        )

    async def _reconcile(self, watch: SharedWatch) -> float:
        """One decision, and what it takes; the seconds until the next look."""
        assert self.options is not None
        now = anyio.current_time()
        snap = self._look(watch)  # the cluster once: storage is read below as asked
        plan = batch_plan.step(snap, self.state, self.options, now)
        while plan.need is not None:
            await self._read_outcomes(plan.need.outcomes)
            if plan.need.stop and self.stop is None:
                self.stop = await self.read_stop()
            snap = replace(
                snap,
                done=self.done,
                stop=self.stop,
                read=snap.read | set(plan.need.outcomes),
                stop_read=snap.stop_read or plan.need.stop,
            )
            plan = batch_plan.step(snap, self.state, self.options, now)
        await self._perform(plan)
        return plan.wait


def _input_selector(job: JobRef) -> str:
    """The label selector of the Jobs (and pods) of batch input ``job``."""
    group = k8s_spec.group_selector(str(job.group_id))
    return f"{group},{k8s_spec.GROUP_INDEX_LABEL}={input_index(job)}"


async def read_stop(storage: Storage, group_id: str) -> protocol.StopRecord | None:
    """The batch's stop record, or None while it has none (or it is being written)."""
    try:
        data = await storage.read(protocol.group_stop_key(group_id))
        stop: protocol.StopRecord = protocol.load_json(data)
    except (ObjectNotFoundError, ValueError):
        return None
    return stop


async def read_outcomes(
    storage: Storage,
    group_id: str,
    indices: Collection[int],
    learn: Callable[[int, protocol.OutcomeHeader, bytes], None],
) -> None:
    """Read the outcome objects of ``indices`` that exist, a few at a time, and hand
    each to ``learn``; a corrupted one is logged and skipped.

    :raises KineticError: the first error of a read (itself, not an exception group).
    """
    limiter = anyio.CapacityLimiter(_IO_CONCURRENCY)

    async def one(index: int) -> None:
        async with limiter:
            try:
                data = await storage.read(protocol.group_outcome_key(group_id, index))
            except ObjectNotFoundError:
                return
        try:
            header, payload = protocol.decode_outcome(data)
        except ValueError as exc:
            # Outcome objects are written whole, once: this one will stay as it is. The
            # input failed (its value is lost), with an empty payload: a ResultError.
            log.warning("batch %s: outcome of input %d is corrupted: %s", group_id, index, exc)
            header = {"state": "failed", "error": f"its outcome object is corrupted: {exc}"}
            payload = b""
        learn(index, header, payload)

    if not indices:
        return
    with one_error():
        async with anyio.create_task_group() as tg:
            for index in indices:
                tg.start_soon(one, index)


async def _delete(backend: ClusterBackend, namespace: str, selector: str) -> None:
    """End Jobs and their pods now: the Jobs first (so none starts a replacement pod),
    then the pods without grace. Two requests, whatever the number of Jobs."""
    await backend.client.delete_jobs(namespace, selector)
    await backend.client.delete_pods(namespace, selector)
