"""A store whose operations outlast a passing storage failure.

A pool worker (:mod:`runner.pool.worker`) that met a storage failure its client had already
retried (a burst of 429s or 503s, storage unreachable for a few seconds: the store
raises :class:`runner.store.StoreUnavailable`) used to die of it: its pod restarted, its claim lapsed only when its lease ran out, and a set-up read
that failed stopped the whole batch in phase ``fetch``. Wrapped in :class:`PatientStore`,
every operation is tried again, with growing pauses, for up to ``patience`` seconds.

Every operation of :class:`runner.store.RunnerStore` may be repeated: reads and
listings change nothing, and a write puts the same bytes again. A create-if-absent (or a
replace at a generation) whose answer was lost may have written the object: before
trying again the store reads it, and bytes equal to its own (a claim names its worker
and its lease's end) mean that the first try won.

The pool bounds the patience below a claim's lease. A renewal still in flight when the
lease ends may yet land, but it is a replace at the generation its worker last wrote:
if another worker took the span over meanwhile (which replaces the claim first), the
renewal fails, and its worker drops the span (``docs/pool-protocol.md``, invariant 1).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from runner.store import RunnerStore, StoreUnavailable

T = TypeVar("T")

FIRST_PAUSE = 0.5
"""Seconds before the first try again (doubling, up to :data:`LONGEST_PAUSE`)."""
LONGEST_PAUSE = 8.0


class PatientStore:
    """``store`` whose failures that may pass (:class:`StoreUnavailable`) are tried
    again for up to :attr:`patience` seconds. Others (a missing object, a refusal) are
    answers, raised at once.

    :param patience: seconds an operation may keep failing before its error is raised.
    :param clock: a monotonic clock; :param sleep: a pause (for tests).
    """

    def __init__(
        self,
        store: RunnerStore,
        *,
        patience: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.patience = patience
        self.retried = 0
        """Operations tried again (each time), for a worker's report."""
        self._clock, self._sleep = clock, sleep

    def _patiently(
        self, what: str, call: Callable[[], T], again: Callable[[], T] | None = None
    ) -> T:
        """``call()``; after a failure, ``again()`` (default ``call``) until one succeeds
        or :attr:`patience` is spent.

        :raises StoreUnavailable: the last failure, once the patience is spent.
        :raises OSError: at once, for a failure that will not pass.
        """
        deadline = self._clock() + self.patience
        pause = FIRST_PAUSE
        attempt = call
        while True:
            try:
                return attempt()
            except StoreUnavailable as exc:
                left = deadline - self._clock()
                if left <= 0:
                    raise
                wait = min(pause, left)
                print(
                    f"kinetic runner: storage {what} failed ({exc}); trying again in {wait:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
                self.retried += 1
                self._sleep(wait)
                pause = min(pause * 2, LONGEST_PAUSE)
                attempt = again or call

    def read(self, key: str) -> bytes:
        return self._patiently(f"read of {key}", lambda: self.store.read(key))

    def write(self, key: str, data: bytes, *, fresh: bool = False) -> None:
        self._patiently(f"write of {key}", lambda: self.store.write(key, data, fresh=fresh))

    def create_if_absent(self, key: str, data: bytes) -> bool:
        def again() -> bool:
            try:
                if self.store.read(key) == data:
                    return True  # the failed try created it: its answer was lost
            except FileNotFoundError:
                pass
            return self.store.create_if_absent(key, data)

        return self._patiently(
            f"create of {key}", lambda: self.store.create_if_absent(key, data), again
        )

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        return self._patiently(f"read of {key}", lambda: self.store.read_versioned(key))

    def create_versioned(self, key: str, data: bytes) -> int | None:
        return self._patiently(
            f"create of {key}",
            lambda: self.store.create_versioned(key, data),
            lambda: self._ours(key, data) or self.store.create_versioned(key, data),
        )

    def replace_if(self, key: str, data: bytes, generation: int) -> int | None:
        return self._patiently(
            f"replace of {key}",
            lambda: self.store.replace_if(key, data, generation),
            lambda: self._ours(key, data) or self.store.replace_if(key, data, generation),
        )

    def _ours(self, key: str, data: bytes) -> int | None:
        """The object's generation when it holds ``data``: a failed try wrote it (its
        answer was lost), else None."""
        try:
            found, generation = self.store.read_versioned(key)
        except FileNotFoundError:
            return None
        return generation if found == data else None

    def download(self, key: str, path: Path) -> None:
        self._patiently(f"download of {key}", lambda: self.store.download(key, path))

    def list(self, prefix: str) -> list[str]:
        return self._patiently(f"listing of {prefix}", lambda: self.store.list(prefix))

    def close(self) -> None:
        self.store.close()
