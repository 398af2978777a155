"""A coordinated pool worker's store: reads of the batch's objects that never change go
to the coordinator's shelf (:mod:`runner.pool.coordinator.shelf`) while the worker is
linked to it; everything else, and what the shelf does not serve, goes to storage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from runner.pool.coordinator.link import Dropped, Link
from runner.store import RunnerStore


class ServedStore:
    """``store``, its reads first asked of ``link()``'s coordinator (when there is one).

    The shelf serves only the batch's manifest, function, context archive and input
    chunks; for any other key it answers None at once, and a dropped link or a slow
    answer falls back to storage: a read through this store never fails for the
    coordinator's sake.
    """

    def __init__(self, store: RunnerStore, link: Callable[[], Link | None]) -> None:
        self.store, self._link = store, link
        self.served = 0
        """Reads the coordinator answered."""

    def read(self, key: str) -> bytes:
        link = self._link()
        if link is not None:
            try:
                data = link.read(key)
            except Dropped:
                data = None  # the loop hears of it at its next look at the link
            if data is not None:
                self.served += 1
                return data
        return self.store.read(key)

    def write(self, key: str, data: bytes, *, fresh: bool = False) -> None:
        self.store.write(key, data, fresh=fresh)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        return self.store.create_if_absent(key, data)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        return self.store.read_versioned(key)

    def create_versioned(self, key: str, data: bytes) -> int | None:
        return self.store.create_versioned(key, data)

    def replace_if(self, key: str, data: bytes, generation: int) -> int | None:
        return self.store.replace_if(key, data, generation)

    def download(self, key: str, path: Path) -> None:
        self.store.download(key, path)

    def list(self, prefix: str) -> list[str]:
        return self.store.list(prefix)

    def close(self) -> None:
        self.store.close()
