"""A pool worker's input chunks (``inputs/{c}.pkl``, written by the submitting client):
read on first use, the last few kept. The worker (:mod:`runner.pool.worker`) reads them;
the protocol as a whole is told in ``docs/pool-protocol.md``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import cloudpickle

from runner import protocol
from runner.pool.courier import Courier
from runner.store import RunnerStore

CHUNKS_KEPT = 4


class Chunks:
    """Input chunks, read on first use; the last few kept (a worker stays in a span).
    A read waits for the courier's request first: one thread uses the store at a time."""

    def __init__(
        self, store: RunnerStore, group_id: str, chunk_size: int, courier: Courier
    ) -> None:
        self.store, self.group_id, self.chunk_size = store, group_id, chunk_size
        self.courier = courier
        self.cache: OrderedDict[int, list[tuple[tuple[Any, ...], dict[str, Any]]]] = OrderedDict()

    def get(self, index: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        chunk, offset = divmod(index, self.chunk_size)
        if chunk not in self.cache:
            self.courier.settle()  # its request may be this chunk's read ahead
        items = self.cache.get(chunk)
        if items is None:
            items = self.read(chunk)
            self.keep(chunk, items)
        self.cache.move_to_end(chunk)
        return items[offset]

    def read(self, chunk: int) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """Chunk ``chunk``'s inputs, from storage (in the thread that uses the store)."""
        return cloudpickle.loads(self.store.read(protocol.group_inputs_key(self.group_id, chunk)))  # type: ignore[no-any-return]

    def keep(self, chunk: int, items: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
        """Keep ``items`` as chunk ``chunk``'s (the last few chunks are kept)."""
        self.cache[chunk] = items
        self.cache.move_to_end(chunk)
        while len(self.cache) > CHUNKS_KEPT:
            self.cache.popitem(last=False)
