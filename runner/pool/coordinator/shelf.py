"""The coordinator's shelf: the batch's objects that never change, read from storage once
and served to its workers over their connections (:class:`~.messages.Read`,
:class:`~.messages.Data`).

A pool's workers start together and each would read the same few objects: the
manifest, the function, the context archive, and the input chunks of its first spans.
At 1,000 workers that is thousands of reads in the first second, over the bucket's
read rate (``benchmarks/README.md``, stop 50); through the shelf the bucket sees each
object once, and a worker's start costs it the one read that finds its coordinator.

What it serves is exactly those objects of its own batch, named by the manifest: any
other key is refused (answered None), so a worker, which proved the batch's token,
can read through it nothing it could not read already. An object over
:data:`SERVED_MAX` is not served, and the shelf keeps at most :data:`SHELF_BYTES`
(the least recently served go first). A refusal, a missing object or a storage failure
answers None: the worker reads the object from storage itself, which says why.

Reads of one key are coalesced: the first asker reads, the others wait for it. The
reads themselves are :class:`Readers`': a few threads with a store each, so that the
chunks of a pool's first spans are read side by side (one thread would read them one
after another, at a storage request's latency each).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from runner import protocol
from runner.store import RunnerStore

SERVED_MAX: Final = 16 << 20
"""Bytes of the largest object served (a larger one, a big context archive, each worker
reads from storage)."""
SHELF_BYTES: Final = 128 << 20
"""Bytes the shelf keeps at most (the coordinator's pod has 512 MiB)."""
READERS: Final = 16
"""Threads that read for the shelf, each with a store of its own."""


def servable_keys(group_id: str, manifest: protocol.BatchManifest) -> frozenset[str]:
    """The keys a batch's coordinator serves: its manifest, and what it reads ahead
    with nothing done yet (:func:`warm_keys`: function, context archive, input chunks)."""
    return frozenset([protocol.group_manifest_key(group_id), *warm_keys(group_id, manifest)])


def warm_keys(
    group_id: str, manifest: protocol.BatchManifest, done: Collection[int] = ()
) -> list[str]:
    """What a coordinator reads ahead as it starts (:meth:`Shelf.warm`): the function,
    the context archive, then each input chunk that holds an input not ``done``, in
    order (the regions of a pool's first spans are in the batch's order)."""
    total, size = int(manifest["total"]), max(1, int(manifest["chunk_size"]))
    keys = [protocol.group_payload_key(group_id)]
    context = manifest["spec"].get("context_key")
    if context:
        keys.append(str(context))
    left = {c for c in range(-(-total // size)) if not _all_done(c, size, total, done)}
    keys += [protocol.group_inputs_key(group_id, c) for c in sorted(left)]
    return keys


def _all_done(chunk: int, size: int, total: int, done: Collection[int]) -> bool:
    return bool(done) and all(
        i in done for i in range(chunk * size, min(total, (chunk + 1) * size))
    )


class _Reading:
    """A read under way, which later askers of its key wait for."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.failed = False  # the read failed (not: its reader was cancelled)


class Shelf:
    """Objects served (see the module docstring).

    :param keys: what may be served (:func:`servable_keys`).
    :param read: reads one object from storage; raises OSError (FileNotFoundError for
        a missing object) when it cannot.
    """

    def __init__(
        self,
        keys: frozenset[str],
        read: Callable[[str], Awaitable[bytes]],
        *,
        capacity: int = SHELF_BYTES,
        largest: int = SERVED_MAX,
    ) -> None:
        self.keys, self._read = keys, read
        self.capacity, self.largest = capacity, largest
        self._kept: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._reading: dict[str, _Reading] = {}
        self.reads = 0
        """Objects read from storage (benchmarks and tests count them)."""
        self.served = 0
        """Answers with bytes."""

    def put(self, key: str, data: bytes) -> None:
        """Keep ``data`` as ``key``'s (one the coordinator read for itself: the manifest)."""
        if key in self.keys and len(data) <= self.largest:
            self._keep(key, data)

    async def warm(self, keys: Sequence[str], parallel: int = READERS) -> None:
        """Read ``keys`` ahead, ``parallel`` at a time, while the shelf is under half
        full: a pool's workers start together and would all ask at once."""
        room = asyncio.Semaphore(parallel)

        async def one(key: str) -> None:
            async with room:
                if self._bytes < self.capacity // 2:
                    await self._get(key)  # (a failure: the asker reads it again)

        async with asyncio.TaskGroup() as reads:
            for key in keys:
                reads.create_task(one(key))

    async def get(self, key: str) -> bytes | None:
        """``key``'s bytes, or None when they are not served (see the module docstring).
        Cancellation ends this caller's wait; a read it started is abandoned and the
        next asker reads again."""
        data = await self._get(key)
        if data is not None:
            self.served += 1
        return data

    async def _get(self, key: str) -> bytes | None:
        if key not in self.keys:
            return None
        while True:
            data = self._kept.get(key)
            if data is not None:
                self._kept.move_to_end(key)
                return data
            reading = self._reading.get(key)
            if reading is None:
                break
            await reading.done.wait()
            if reading.failed:
                return None
        reading = self._reading[key] = _Reading()
        try:
            self.reads += 1
            data = await self._read(key)
            if len(data) > self.largest:
                reading.failed = True
                return None
            self._keep(key, data)
        except OSError:
            reading.failed = True
            return None
        finally:
            del self._reading[key]
            reading.done.set()
        return data

    def _keep(self, key: str, data: bytes) -> None:
        old = self._kept.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        self._kept[key] = data
        self._bytes += len(data)
        while self._bytes > self.capacity and len(self._kept) > 1:
            _, dropped = self._kept.popitem(last=False)
            self._bytes -= len(dropped)


class Readers:
    """Storage reads on threads of their own, each thread with its own store from
    ``open_store`` (the runner's stores are used by one thread at a time)."""

    def __init__(self, open_store: Callable[[], RunnerStore], threads: int = READERS) -> None:
        self._open = open_store
        self._local = threading.local()
        self._stores: list[RunnerStore] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kinetic-shelf")

    async def read(self, key: str) -> bytes:
        """:raises OSError: as the store's ``read``."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._read, key)

    def _read(self, key: str) -> bytes:
        store: RunnerStore | None = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = self._open()
            with self._lock:
                self._stores.append(store)
        return store.read(key)

    def close(self) -> None:
        """End the threads (after the reads under way), then close their stores."""
        self._pool.shutdown(wait=True)
        for store in self._stores:
            close = getattr(store, "close", None)
            if close is not None:
                close()
