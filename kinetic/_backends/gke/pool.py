"""Batches on GKE run by a worker pool: one Kubernetes Job for the whole batch.

The protocol as a whole is told in ``docs/pool-protocol.md``.

Theory of operation
-------------------
Submission recorded the batch (function, input chunks, manifest); :meth:`GKEPool.launch`
creates its one Job (:func:`kinetic._core.k8s_spec.pool_job_manifest`), whose pods are
workers (:mod:`runner.pool`) that claim inputs in storage, run them and write their
outcomes, and exit when none is left. From then on the batch needs no client: a
process that follows it (``results()``, ``as_completed()``, ``attach_batch`` from any
machine) only *reads*, and decides with :mod:`kinetic._core.pool_plan`:

1. storage shows the progress: bursts of outcomes (each read once, cached; an outcome
   is reported only once its burst is durable, since it is read from it), outcome
   objects of single inputs, claims (the spans running) and the stop record. Storage is
   polled (every 0.2 s while inputs finish, backing off to 2 s while nothing changes):
   it has no watch;
2. the cluster is looked at rarely (:func:`~kinetic._core.pool_plan.look_due`): a list
   of the pool's pods, and the Job itself only when no pod is active. Rarely, because
   Kubernetes requests are the scarce resource: a batch of thousands of inputs costs
   a handful (creating the Job, a few looks, deleting it at cleanup);
3. the decision: report what finished and what runs; once a stopped batch has no pod
   left, report the stop (every input without an outcome then never ran); fail the
   batch when the pool cannot run — pods that cannot start for ``start_grace`` seconds
   (an image that cannot be pulled, say: a stop record with reason ``failed``, phase
   ``start``, and the Job deleted), a failed Job, a Job that completed with inputs
   left; and re-create a Job that vanished while inputs remain (a pool keeps nothing
   but what is in storage: a new one carries on where the old one stopped).

``cancel()`` records ``stop.json`` and deletes the Job and its pods (two requests),
giving each worker a grace to write the outcomes it buffered (SIGTERM,
:data:`~kinetic._core.k8s_spec.POOL_GRACE_S`), and returns once no worker may still
write (a look at the pods every half second: a second or two); a follower likewise
reports the stop only then.
Delivery is at-least-once: an input whose worker died before its burst was written
runs again once its claim's lease expired. Each input is reported once, and every
reader reports the same outcome of it, whatever order it listed and read them in: the
rule is ``docs/pool-protocol.md``'s ("Which outcome of an input stands", applied by
:class:`~runner.pool.outcomes.OutcomeChoice`). An outcome object of its own stands over
burst records, and of two bursts with the same input (a worker whose burst landed
after its lease ran out) the earliest claim's; a record of a takeover (or of a hole's
slot) is reported a lease after it was first listed, when an earlier claim's late
burst would have landed, or at once when a look found no worker that may still write
(a batch that ended: a new process reads it whole at once).

:class:`GKEBatchEngines` is the backend's batch runner: it hands each batch to this
engine or to the one-Job-per-input engine (:mod:`kinetic._backends.gke.batch`),
as its manifest says.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Collection
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import cloudpickle

from kinetic._backends.base import BatchEvents, InputActivity, JobRef, Loaded, input_index
from kinetic._backends.gke.batch import GKEBatches, read_outcomes, read_stop
from kinetic._backends.gke.commit_reader import CommitReader
from kinetic._backends.gke.engine import GroupEngine, batch_job
from kinetic._core import k8s_coordinated, k8s_spec, pool_plan
from kinetic._core.exception_groups import one_error
from kinetic._exceptions import ObjectNotFoundError
from kinetic._storage.base import Storage
from runner import protocol, results_log
from runner.pool.coordinator import commits as coordinator_commits
from runner.pool.outcomes import OWN_OUTCOME, OutcomeChoice, outcome_rank

if TYPE_CHECKING:
    from kinetic._backends.cluster import ClusterBackend

log = logging.getLogger(__name__)

_IO_CONCURRENCY = 16


class GKEPool(GroupEngine["_Follower"]):
    """The worker-pool batch engine of one backend (a
    :class:`~kinetic._backends.base.BatchRunner`)."""

    def _new_follower(self, group_id: str) -> _Follower:
        return _Follower(self.backend, group_id)

    async def launch(self, group_id: str) -> None:
        """Create the batch's Job (idempotent: it exists already is success).

        :raises ConfigError: the namespace does not exist.
        """
        await self.follower(group_id).create_job()

    async def cancel(self, group_id: str) -> None:
        """Record the stop, delete the pool, and return once its workers wrote what they
        ran (:meth:`_Follower.wait_written`): what storage then holds is final."""
        record = protocol.stop_record("cancelled", "the batch was cancelled")
        follower = self.follower(group_id)
        await follower.stop_pool(record, gently=True)
        await follower.wait_written()

    async def release(self, group_id: str) -> None:
        follower = self.follower(group_id)
        await follower.delete_pool()
        if follower.coordinated:  # its token goes with it
            selector = k8s_spec.group_selector(group_id)
            await self.backend.client.delete_secrets(follower.namespace, selector)

    # -- one input (see kinetic._backends.base.BatchRunner) ----------------------------

    async def input_activity(self, job: JobRef) -> InputActivity:
        """Running while a live claim holds the input's span and the input is the one
        its worker runs (the first of the span without an outcome); in a coordinated
        pool, while its coordinator says a worker runs it."""
        follower = self.follower(str(job.group_id))
        index = input_index(job)
        claim = await follower.latest_claim(index)  # (storage looked at first)
        if follower.coordinated:
            return InputActivity(running=index in follower.told_undone())
        book = follower.book
        running = (
            claim is not None
            and book is not None
            and claim.expires > time.time()
            and book.next_undone(claim) == index
        )
        return InputActivity(running=running)

    async def input_changed(self, job: JobRef) -> None:
        """Follow the batch until an input finished, or it stopped."""
        follower = self.follower(str(job.group_id))
        await follower.step(set(follower.outcomes))

    async def input_logs(self, job: JobRef) -> str:
        """The input's output: kept in its outcome, else read from its worker's pod log."""
        group_id, index = str(job.group_id), input_index(job)
        follower = self.follower(group_id)
        loaded = await follower.load_many([index])
        if index in loaded:
            return str(loaded[index][0].get("output") or "")
        claim = await follower.latest_claim(index)
        if claim is None or claim.expires <= time.time() or claim.first > index:
            return ""
        text = await self.backend.client.pod_log(job.namespace, claim.worker)
        return _input_section(text or "", index)

    async def cancel_input(self, job: JobRef) -> None:
        """Record the input cancelled unless an outcome of it is known (reported, or held:
        another reader may have reported it); its worker skips it, or ends it at its next
        look for cancels (a pod runs many inputs: it is not deleted). The outcome object
        of its own stands over a burst written after the look."""
        group_id, index = str(job.group_id), input_index(job)
        follower = self.follower(group_id)
        await follower.refresh()
        if follower.known(index):
            return
        header = protocol.cancelled_header()
        payload = bytes(
            cloudpickle.dumps(protocol.result_payload(success=False, error="cancelled"))
        )
        key = protocol.group_outcome_key(group_id, index)
        await self.storage.create_if_absent(key, protocol.encode_outcome(header, payload))
        self.follower(group_id).forget(index)  # read back whichever outcome stood


class _Follower:
    """Follows one pool batch from storage and (rarely) the cluster; see the module
    docstring. Keeps only caches of what storage says, so any number of followers, in
    any processes, agree."""

    def __init__(self, backend: ClusterBackend, group_id: str) -> None:
        self.backend = backend
        self.group_id = group_id
        self.manifest: protocol.BatchManifest | None = None
        self.book: pool_plan.PoolBook | None = None
        self.state = pool_plan.FollowState()
        self.outcomes: Loaded = {}
        """The outcomes reported (:attr:`choice` says which, and when)."""
        self.choice: OutcomeChoice[tuple[protocol.OutcomeHeader, bytes]] | None = None
        self.lock = anyio.Lock()
        self._bursts_read: set[str] = set()
        self._bursts_seen: dict[str, float] = {}  # burst -> when first listed (monotonic)
        self._singles: set[int] = set()  # inputs whose outcome object of its own was read
        self.commits = CommitReader(backend.storage, group_id)
        self.told_running: list[int] = []
        """A coordinated pool's running inputs, as its coordinator last wrote them."""

    @property
    def storage(self) -> Storage:
        return self.backend.storage

    async def read_stop(self) -> protocol.StopRecord | None:
        """The batch's stop record, or None while it has none."""
        return await read_stop(self.storage, self.group_id)

    async def _load(self) -> pool_plan.PoolBook:
        if self.book is None:
            key = protocol.group_manifest_key(self.group_id)
            self.manifest = protocol.load_manifest(await self.storage.read(key))
            self.book = pool_plan.PoolBook(pool_plan.PoolOptions.from_manifest(self.manifest))
            self.choice = OutcomeChoice(hold=self.book.options.lease_s)
        return self.book

    @property
    def gke(self) -> protocol.GKEBatchRecord:
        """The manifest's GKE part (read first: :meth:`_load`)."""
        assert self.manifest is not None
        return self.manifest["gke"]

    @property
    def namespace(self) -> str:
        return self.gke["namespace"]

    # -- the cluster --------------------------------------------------------------------

    def _job_manifest(self) -> dict[str, Any]:
        assert self.manifest is not None
        assert self.book is not None
        workers = min(self.book.options.workers, self.book.options.total)
        build = partial(k8s_spec.pool_job_manifest, group_id=self.group_id, workers=workers)
        job = batch_job(self.backend, self.manifest, build)
        return k8s_coordinated.with_token(job, self.group_id) if self.coordinated else job

    async def create_job(self) -> None:
        """Create the pool's Job (and a coordinated pool's token and coordinator first);
        idempotent: what exists already is kept."""
        await self._load()
        client = self.backend.client
        if self.coordinated:
            assert self.manifest is not None
            token = secrets.token_hex(32)  # kept only if the Secret did not exist yet
            secret = k8s_coordinated.token_secret(self.group_id, token)
            await client.create_secret(self.namespace, secret)
            build = partial(
                k8s_coordinated.coordinator_job_manifest,
                group_id=self.group_id,
                host=self.backend.options.coordinator_host,
            )
            coordinator = batch_job(self.backend, self.manifest, build)
            await client.create_job(self.namespace, coordinator, exist_ok=True)
        await client.create_job(self.namespace, self._job_manifest(), exist_ok=True)

    async def delete_pool(self) -> None:
        """Delete the Job, then its pods (two requests), with a grace of
        :data:`~kinetic._core.k8s_spec.POOL_GRACE_S` seconds: on SIGTERM each worker
        ends its running input and writes the outcomes it buffered; the stop is reported
        once no pod may still write (:func:`~kinetic._core.pool_plan.cluster_view`)."""
        await self._load()
        selector = k8s_spec.group_selector(self.group_id)
        client = self.backend.client
        await client.delete_jobs(self.namespace, selector)
        await client.delete_pods(self.namespace, selector, grace=k8s_spec.POOL_GRACE_S)

    async def wait_written(self) -> None:
        """Wait until no deleted worker may still write its burst: its pod ended, or its
        grace ran out (a look at the pods every half second, a second or two after a
        cancel; at most the grace and a few seconds)."""
        deadline = anyio.current_time() + k8s_spec.POOL_GRACE_S + 2 * pool_plan.ENDING_SLACK
        while anyio.current_time() < deadline:
            view = await self.look()
            if view.active == view.ending == 0:
                return
            await anyio.sleep(0.5)

    async def look(self) -> pool_plan.ClusterView:
        """The pool's pods (one request), and its Job when no pod is active (one more);
        a coordinated pool's coordinator Job too (its failure fails the batch)."""
        client = self.backend.client
        selector = k8s_spec.group_selector(self.group_id)
        pods = (await client.list_objects("pods", self.namespace, selector)).get("items") or []
        wall = time.time()
        view = pool_plan.cluster_view(None, pods, job_known=False, wall=wall)
        if self.coordinated:
            name = k8s_coordinated.coordinator_job_name(self.group_id)
            failed = k8s_coordinated.coordinator_failure(await client.get_job(self.namespace, name))
            if failed is not None:
                return dataclasses.replace(view, exists=True, verdict="failed", reason=failed)
        if view.active:
            return view
        job = await client.get_job(self.namespace, k8s_spec.pool_job_name(self.group_id))
        return pool_plan.cluster_view(job, pods, job_known=True, wall=wall)

    # -- storage ------------------------------------------------------------------------

    async def load_many(self, indices: list[int]) -> Loaded:
        """The outcomes of ``indices`` that are durable (a look at storage first when
        one is not known yet)."""
        if any(i not in self.outcomes for i in indices):
            async with self.lock:
                await self.refresh()
        return {i: self.outcomes[i] for i in indices if i in self.outcomes}

    def known(self, index: int) -> bool:
        """Whether an outcome of input ``index`` is known (reported, or held)."""
        return self.choice is not None and self.choice.known(index)

    def forget(self, index: int) -> None:
        """Read input ``index``'s outcome object of its own again (just created or found):
        it stands over any record held, and a reported outcome is kept."""
        self._singles.discard(index)
        if self.choice is not None and index not in self.choice.reported:
            self.choice.forget_held(index)

    def _report(self, due: float | None = None) -> None:
        """Report the records whose time came (:class:`~runner.pool.outcomes.OutcomeChoice`),
        or every one due by ``due`` (monotonic)."""
        assert self.book is not None
        assert self.choice is not None
        late = self.choice.late
        now = anyio.current_time() if due is None else due
        for index, (header, payload) in self.choice.release(now):
            self.outcomes[index] = (header, payload)
            self.book.learn_outcome(index, protocol.as_input_state(header.get("state")))
        if self.choice.late > late:
            log.warning(
                "batch %s: %d outcome(s) came after another outcome of their input was "
                "reported: kept the reported ones",
                self.group_id,
                self.choice.late - late,
            )

    async def _read_burst(self, name: str) -> None:
        key = protocol.group_bursts_prefix(self.group_id) + name
        data = await self.storage.read(key)
        try:
            records = results_log.decode_burst(data)
        except ValueError as exc:
            # Bursts are written whole, once: this one will stay as it is. Its inputs
            # failed (their values are lost), with an empty payload: a ResultError.
            log.warning("batch %s: burst %s is corrupted: %s", self.group_id, name, exc)
            parsed = protocol.parse_burst_name(name)
            assert parsed is not None
            header: protocol.OutcomeHeader = {
                "state": "failed",
                "error": f"its outcome (burst {name}) is corrupted: {exc}",
            }
            records = [(i, header, b"") for i in range(parsed[0], parsed[1])]
        assert self.book is not None
        assert self.choice is not None
        rank = outcome_rank(name)
        first = self.book.first_claim(rank[1], rank[2])
        seen = self._bursts_seen[name]
        for index, header, payload in records:
            self.choice.offer(index, rank, (header, payload), first=first, seen=seen)

    async def _read_singles(
        self, choice: OutcomeChoice[tuple[protocol.OutcomeHeader, bytes]], listed: float
    ) -> None:
        """List the outcome objects of their own; read the new ones into ``choice``."""
        results = protocol.group_results_prefix(self.group_id)
        singles = [
            index
            async for key in self.storage.list(results)
            if (index := protocol.parse_outcome_name(key.removeprefix(results))) is not None
            and index not in self._singles
        ]
        if not singles:
            return
        self._singles.update(singles)

        def learn_single(index: int, header: protocol.OutcomeHeader, payload: bytes) -> None:
            choice.offer(index, OWN_OUTCOME, (header, payload), first=True, seen=listed)

        await read_outcomes(self.storage, self.group_id, singles, learn_single)

    async def _read_claim(self, start: int, number: int) -> pool_plan.Span | None:
        try:
            data = await self.storage.read(protocol.group_claim_key(self.group_id, start, number))
        except ObjectNotFoundError:
            return None
        return pool_plan.parse_claim(start, number, data)

    async def latest_claim(self, index: int) -> pool_plan.Span | None:
        """The latest claim of the span that holds input ``index`` (storage looked at
        first), or None."""
        async with self.lock:
            await self.refresh()
        assert self.book is not None
        return pool_plan.span_of(self.book, index)

    @property
    def coordinated(self) -> bool:
        """The batch is a coordinated pool's: commits, no claims or bursts."""
        return self.gke.get("engine") == protocol.ENGINE_COORDINATED

    async def refresh(self) -> None:
        """List bursts, single outcomes and claims (a coordinated batch's commits and
        single outcomes); read what is new (and claims whose lease seems to have run
        out: their holder may have renewed them); report the outcomes whose time came;
        read the stop record. Bursts are listed before single outcomes: a single written
        before the burst that covers its input is then always seen first; and before
        claims: the claims of a listed burst are listed too."""
        book = await self._load()
        choice = self.choice
        assert choice is not None
        if self.coordinated:
            await self.commits.refresh(choice)  # before the singles: they stand over commits
            await self._read_singles(choice, anyio.current_time())
            self.told_running = await self._read_running()
        else:
            await self._refresh_spans(book, choice)
        self._report()
        if book.stop is None:
            stop = await self.read_stop()
            if stop is not None:
                book.learn_stop(stop)

    async def _read_running(self) -> list[int]:
        """What the coordinator last wrote of its workers' running inputs (none yet, or
        unreadable: none)."""
        try:
            data = await self.storage.read(coordinator_commits.running_key(self.group_id))
            return coordinator_commits.decode_running(data)
        except (ObjectNotFoundError, ValueError):
            return []

    def running(self, decision: pool_plan.FollowDecision) -> list[int]:
        """The inputs running as far as can be told: a coordinated pool's coordinator
        says; a leaderless pool's claims do (``decision``)."""
        if not self.coordinated:
            return decision.running
        return [] if decision.stopped is not None else self.told_undone()

    def told_undone(self) -> list[int]:
        """The inputs the coordinator last said run that have no outcome yet."""
        assert self.book is not None
        return [i for i in self.told_running if i not in self.book.outcomes]

    async def _refresh_spans(
        self,
        book: pool_plan.PoolBook,
        choice: OutcomeChoice[tuple[protocol.OutcomeHeader, bytes]],
    ) -> None:
        """A leaderless pool's part of :meth:`refresh`: bursts, singles, claims."""
        bursts = protocol.group_bursts_prefix(self.group_id)
        new_bursts = [
            name
            async for key in self.storage.list(bursts)
            if (name := key.removeprefix(bursts)) not in self._bursts_read
            and protocol.parse_burst_name(name) is not None
        ]
        listed = anyio.current_time()  # they were there by now (a hold counts from here)
        for name in new_bursts:
            if name not in self._bursts_seen:
                self._bursts_seen[name] = listed
                span = protocol.parse_burst_name(name)
                assert span is not None
                book.learn_burst(span[0], span[1])  # durable outcomes, maybe held
        await self._read_singles(choice, listed)
        limiter = anyio.CapacityLimiter(_IO_CONCURRENCY)

        async def burst(name: str) -> None:
            async with limiter:
                await self._read_burst(name)
            self._bursts_read.add(name)

        prefix = protocol.group_claims_prefix(self.group_id)
        async for key in self.storage.list(prefix):
            parsed = protocol.parse_claim_name(key.removeprefix(prefix))
            if parsed is not None:
                book.learn_listed(*parsed)
        wall = time.time()
        stale = [(start, book.listed[start]) for start in book.suspects(wall)]

        async def claim(start: int, number: int) -> None:
            async with limiter:
                span = await self._read_claim(start, number)
            if span is not None:
                book.learn_span(span)

        with one_error():
            async with anyio.create_task_group() as tg:
                for name in sorted(new_bursts):
                    tg.start_soon(burst, name)
                for start, number in stale:
                    tg.start_soon(claim, start, number)

    async def stop_pool(self, record: protocol.StopRecord, *, gently: bool = False) -> None:
        """Record ``record`` as the stop (unless one stands), then end the pool. A
        coordinated pool stopped ``gently`` (a cancel) is given
        :data:`~kinetic._core.k8s_spec.POOL_GRACE_S` to end by itself first: its
        coordinator reads the stop within a second, ends its workers' inputs and commits
        what they finished before they exit."""
        book = await self._load()
        key = protocol.group_stop_key(self.group_id)
        if book.stop is None:
            await self.storage.create_if_absent(key, protocol.dump_json(record))
            stop = await self.read_stop()
            book.learn_stop(stop if stop is not None else record)
        if gently and self.coordinated:
            await self.wait_written()  # its pods end by themselves, or the grace ran out
        await self.delete_pool()

    # -- following ----------------------------------------------------------------------

    async def _decide(self, *, drive: bool) -> pool_plan.FollowDecision:
        """Look (when due), refresh, decide; with ``drive``, act on the decision."""
        book = await self._load()
        view: pool_plan.ClusterView | None = None
        if pool_plan.look_due(self.state, now=anyio.current_time(), stopped=book.stop is not None):
            view = await self.look()  # before storage: a finished pool's outcomes are all seen
        await self.refresh()
        if view is not None and _no_writer(view):
            self._report(due=float("inf"))  # no late burst can come: report what is held
        decision = pool_plan.follow_step(
            book,
            self.state,
            view=view,
            now=anyio.current_time(),
            wall=time.time(),
            start_grace=self.backend.options.start_grace,
        )
        if drive:
            self.state = decision.state
            if decision.fail is not None:
                log.info("batch %s: %s", self.group_id, decision.fail["detail"])
                await self.stop_pool(decision.fail)
            elif decision.create_job:
                await self.create_job()
        return decision

    def _events(self, known: Collection[int], decision: pool_plan.FollowDecision) -> BatchEvents:
        assert self.book is not None
        state = protocol.as_input_state
        done = [(i, state(s)) for i, s in self.book.outcomes.items() if i not in known]
        return BatchEvents(done=done, running=self.running(decision), stop=decision.stopped)

    async def step(self, known: Collection[int]) -> BatchEvents:
        """Follow the batch until an input not in ``known`` finished, or it stopped.

        Cancelling it leaves nothing behind: everything it knows is in storage.
        """
        while True:
            async with self.lock:
                decision = await self._decide(drive=True)
                events = self._events(known, decision)
                assert self.book is not None
                assert self.choice is not None
                held = self.choice.next_due()
                if events.done or events.stop is not None or (self.book.settled and held is None):
                    return events
            wait = decision.wait
            if held is not None:  # an outcome held back is reported then
                wait = min(wait, max(0.0, held - anyio.current_time()))
            await anyio.sleep(wait)

    async def snapshot(self, known: Collection[int]) -> BatchEvents:
        """One look without acting: outcomes, running inputs, the stop once settled."""
        async with self.lock:
            decision = await self._decide(drive=False)
            events = self._events(known, decision)
            events.snapshot_complete = True
            return events


class GKEBatchEngines:
    """The GKE backend's batch runner: each batch goes to the engine its manifest names
    (a worker pool by default; one Job per input with ``pod_per_input=True``)."""

    def __init__(self, backend: ClusterBackend) -> None:
        self.backend = backend
        self.pool = GKEPool(backend)
        self.per_input = GKEBatches(backend)
        self._engines: dict[str, str] = {}

    @property
    def storage(self) -> Storage:
        return self.backend.storage

    async def engine(self, group_id: str) -> GKEPool | GKEBatches:
        """The engine of the batch (an unknown batch goes to the per-input engine, which
        reports it missing)."""
        name = self._engines.get(group_id)
        if name is None:
            try:
                data = await self.storage.read(protocol.group_manifest_key(group_id))
            except ObjectNotFoundError:
                return self.per_input
            name = self._engines[group_id] = protocol.batch_engine(protocol.load_manifest(data))
        pools = (protocol.ENGINE_POOL, protocol.ENGINE_COORDINATED)
        return self.pool if name in pools else self.per_input

    async def launch(self, group_id: str) -> None:
        await (await self.engine(group_id)).launch(group_id)

    async def follow(self, group_id: str, known: Collection[int]) -> AsyncIterator[BatchEvents]:
        engine = await self.engine(group_id)
        async for events in engine.follow(group_id, known):
            yield events

    async def snapshot(self, group_id: str, known: Collection[int]) -> BatchEvents:
        return await (await self.engine(group_id)).snapshot(group_id, known)

    async def load_many(self, group_id: str, indices: list[int]) -> Loaded:
        return await (await self.engine(group_id)).load_many(group_id, indices)

    async def cancel(self, group_id: str) -> None:
        await (await self.engine(group_id)).cancel(group_id)

    async def release(self, group_id: str) -> None:
        await (await self.engine(group_id)).release(group_id)

    async def read_stop(self, group_id: str) -> protocol.StopRecord | None:
        return await (await self.engine(group_id)).read_stop(group_id)

    async def input_activity(self, job: JobRef) -> InputActivity:
        return await (await self.engine(str(job.group_id))).input_activity(job)

    async def input_changed(self, job: JobRef) -> None:
        await (await self.engine(str(job.group_id))).input_changed(job)

    async def input_logs(self, job: JobRef) -> str:
        return await (await self.engine(str(job.group_id))).input_logs(job)

    async def cancel_input(self, job: JobRef) -> None:
        await (await self.engine(str(job.group_id))).cancel_input(job)


def _no_writer(view: pool_plan.ClusterView) -> bool:
    """Whether no worker of the pool may write anymore: no pod runs or starts, and none
    being deleted is still within its grace (``ending``, where the view counts them).
    Every burst is then in storage, and an outcome held back is the one that stands."""
    return view.active == 0 and not getattr(view, "ending", 0)


def _input_section(text: str, index: int) -> str:
    """The part of a worker's log written while it ran input ``index`` (its last run)."""
    start = text.rfind(f"{protocol.INPUT_MARKER} {index}\n")
    if start < 0:
        return ""
    body = text[text.index("\n", start) + 1 :]
    end = body.find(protocol.INPUT_MARKER)
    return body if end < 0 else body[:end]
