"""A pool worker's store that counts its requests by kind: the worker reports them when
it exits (:data:`REQUESTS_MARKER`), so a benchmark can tell the cost per input
(``docs/pool-protocol.md``, "Cost per input"); and its CPU time (:func:`report_cpu`).
"""

from __future__ import annotations

import resource
from pathlib import Path

from runner import protocol
from runner.store import RunnerStore

REQUESTS_MARKER = "kinetic pool: storage requests"
CPU_MARKER = "kinetic pool: cpu seconds"


class CountingStore:
    """A store that counts its requests by kind (``read``, ``write``, ...): a worker
    reports them when it exits, so a benchmark can tell the cost per input."""

    def __init__(self, store: RunnerStore) -> None:
        self.store = store
        self.counts: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def read(self, key: str) -> bytes:
        self._count("read")
        return self.store.read(key)

    def write(self, key: str, data: bytes, *, fresh: bool = False) -> None:
        self._count("write")
        self.store.write(key, data, fresh=fresh)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        self._count("create")
        return self.store.create_if_absent(key, data)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        self._count("read")
        return self.store.read_versioned(key)

    def create_versioned(self, key: str, data: bytes) -> int | None:
        self._count("create")
        return self.store.create_versioned(key, data)

    def replace_if(self, key: str, data: bytes, generation: int) -> int | None:
        self._count("write")
        return self.store.replace_if(key, data, generation)

    def download(self, key: str, path: Path) -> None:
        self._count("read")
        self.store.download(key, path)

    def list(self, prefix: str) -> list[str]:
        self._count("list")
        return self.store.list(prefix)

    def close(self) -> None:
        self.store.close()


def report_cpu() -> None:
    """One log line with the CPU this worker spent, its own and its children's (the
    zygote and the inputs' processes, all reaped by now): benchmarks read it."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    spent = {
        "worker": round(own.ru_utime + own.ru_stime, 3),
        "inputs": round(children.ru_utime + children.ru_stime, 3),
    }
    print(f"{CPU_MARKER} {protocol.dump_json(spent).decode()}", flush=True)
