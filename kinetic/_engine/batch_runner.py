"""What a :class:`~kinetic._engine.batch.BatchHandle` needs from the engine running its batch.

:class:`BatchRunner` is the narrow interface; two engines implement it:

* :class:`LocalBatchRunner` wraps the local backend's detached supervisor
  (:class:`~kinetic._backends.local_batch.LocalBatches`), unchanged: events come
  from its socket while it runs, from its results logs otherwise, and a batch
  nobody drives gets a new supervisor.
* :class:`kinetic._backends.gke.pool.GKEBatchEngines` (the GKE backend's
  ``batches``) hands each batch to the engine its manifest names: a worker pool on one
  Kubernetes Job that needs no client (:mod:`kinetic._backends.gke.pool`, the
  default), or one Job per input driven inside the consumer's awaits
  (:mod:`kinetic._backends.gke.batch`, ``pod_per_input=True``).

Both follow the same storage protocol for the stop marker (``stop.json``): once a
batch stopped and nothing of it runs, every input without an outcome never ran.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from typing import Any, Protocol

import anyio
import anyio.to_thread

from kinetic._backends.local import LocalBackend
from kinetic._backends.local_batch import BatchEvents, Loaded, LocalBatches, event_chunks
from kinetic._storage.base import Storage

__all__ = ["BatchEvents", "BatchRunner", "Loaded", "LocalBatchRunner", "runner_for"]


class BatchRunner(Protocol):
    """Runs batches recorded in :attr:`storage` and reports their progress."""

    @property
    def storage(self) -> Storage: ...

    async def launch(self, group_id: str) -> None:
        """Make sure the (durably recorded) batch gets driven. Idempotent."""
        ...

    def follow(self, group_id: str, known: Collection[int]) -> AsyncIterator[BatchEvents]:
        """Drive or follow the batch: yield what finished (inputs not in ``known``, a live
        view of the caller's records), the running inputs, and the stop record once it
        stopped with nothing left running. Endless: the caller stops iterating when
        every input is accounted for. Cancelling it never affects the batch."""
        ...

    async def snapshot(self, group_id: str, known: Collection[int]) -> BatchEvents:
        """One look at the batch, without driving it. ``snapshot_complete`` means
        ``running`` is the whole set of running inputs."""
        ...

    async def load_many(self, group_id: str, indices: list[int]) -> Loaded:
        """Headers and payloads of the given inputs that have outcomes."""
        ...

    async def cancel(self, group_id: str) -> bool:
        """Stop the batch: no queued input starts, running ones end.

        :returns: True when the engine settled it (every input accounted for);
            False when nothing drove it and the caller must record the stop.
        """
        ...

    async def release(self, group_id: str) -> None:
        """Free the compute objects a finished batch leaves behind (cleanup)."""
        ...


class LocalBatchRunner:
    """The local supervisor engine, as a :class:`BatchRunner`."""

    def __init__(self, batches: LocalBatches) -> None:
        self.batches = batches

    @property
    def storage(self) -> Storage:
        return self.batches.storage

    async def launch(self, group_id: str) -> None:
        await self.batches.launch(group_id)

    async def follow(self, group_id: str, known: Collection[int]) -> AsyncIterator[BatchEvents]:
        batches = self.batches
        seen = 0  # records already read (each is read once, however long this follows)
        while True:
            stream = await batches.connect(group_id)
            if stream is not None:
                async with stream:
                    async for events in event_chunks(stream):
                        yield events
                continue  # the supervisor ended: read what it left behind
            # No supervisor is listening: learn from the records it (or another) left.
            done, seen = await batches.read_states(group_id, known, seen)
            yield BatchEvents(done=done)
            stop = await batches.read_stop(group_id)
            running = await anyio.to_thread.run_sync(batches.supervisor_running, group_id)
            if stop is not None and not running:
                yield BatchEvents(stop=stop)
                continue
            if not running:
                # Unfinished and nobody drives it: resume (a duplicate supervisor exits at once).
                await batches.launch(group_id)
            await anyio.sleep(0.02)  # let the supervisor start listening

    async def snapshot(self, group_id: str, known: Collection[int]) -> BatchEvents:
        batches = self.batches
        out = BatchEvents()
        stream = await batches.connect(group_id)
        if stream is not None:
            out.snapshot_complete = True  # a supervisor answers: its view replaces ours
            async with stream:
                async for events in event_chunks(stream):
                    out.running.extend(events.running)
                    out.done.extend(events.done)
                    if events.snapshot_complete:
                        return out
        heard = {i for i, _ in out.done}
        recorded, _ = await batches.read_states(group_id, known)
        out.done.extend((i, state) for i, state in recorded if i not in heard)
        stop = await batches.read_stop(group_id)
        if stop is not None and not batches.supervisor_running(group_id):
            out.stop = stop
        return out

    async def load_many(self, group_id: str, indices: list[int]) -> Loaded:
        return await self.batches.load_many(group_id, indices)

    async def cancel(self, group_id: str) -> bool:
        batches = self.batches
        if not await batches.send(group_id, "C"):
            return False
        # Wait for the supervisor to finish stopping, so statuses are settled on return.
        stream = await batches.connect(group_id)
        if stream is not None:
            async with stream:
                async for _ in event_chunks(stream):
                    pass
        return True

    async def release(self, group_id: str) -> None:
        return None  # the supervisor and its workers exit by themselves


def runner_for(backend: Any) -> BatchRunner:
    """The batch engine of ``backend``: the local supervisor, or the GKE backend's
    ``batches`` (which picks the pool or the per-input engine per batch).

    :raises BackendError: for a backend that cannot run batches.
    """
    if isinstance(backend, LocalBackend):
        return LocalBatchRunner(backend.batches)
    batches = getattr(backend, "batches", None)
    if batches is None:
        from kinetic._exceptions import BackendError

        raise BackendError(f"batches are not available on the {backend.name} backend yet")
    runner: BatchRunner = batches
    return runner
