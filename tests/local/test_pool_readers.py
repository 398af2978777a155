"""Readers of a GKE pool batch (``results()``, ``as_completed()``, ``attach_batch``,
``kinetic batch status``: :class:`kinetic._backends.gke.pool._Follower`) on a directory
store: an input with two outcomes (a worker whose burst landed after its lease ran
out, and the takeover that ran the input again) is reported the same by every reader,
whatever the order it listed and read the bursts in (docs/pool-protocol.md,
"Which outcome of an input stands")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from kinetic._backends.gke.pool import _Follower
from kinetic._storage.base import DEFAULT_TIMEOUT
from kinetic._storage.local import LocalStorage
from runner import protocol, results_log
from runner.pool.spans import Span, claim_record

GID = "grp-00000000bbbb"
TOTAL = 8

pytestmark = [pytest.mark.local, pytest.mark.timeout(60)]


class _SlowBurst(LocalStorage):
    """A directory store whose reads of one burst take a while (reads run concurrently:
    the other bursts' finish first)."""

    def __init__(self, root: Path, slow: str) -> None:
        super().__init__(root)
        self.slow = slow

    async def read(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        if key.endswith(self.slow):
            await anyio.sleep(0.3)
        return await super().read(key, timeout=timeout)


class _NoPods:
    """A cluster where the pool's pods and Job are gone (the batch ended)."""

    async def list_objects(self, *args: object) -> dict[str, Any]:
        return {"items": []}

    async def get_job(self, *args: object) -> None:
        return None


def _follower(storage: LocalStorage) -> _Follower:
    backend = SimpleNamespace(
        storage=storage, client=_NoPods(), options=SimpleNamespace(start_grace=60.0)
    )
    return _Follower(backend, GID)  # type: ignore[arg-type]


def _write(root: Path, key: str, data: bytes) -> None:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _write_manifest(root: Path, total: int, workers: int, engine: str) -> None:
    """The manifest of batch ``GID``: ``total`` inputs on ``workers``, run by ``engine``."""
    manifest: dict[str, Any] = {
        "format": protocol.FORMAT,
        "group_id": GID,
        "total": total,
        "chunk_size": total,
        "options": {
            "max_concurrent": workers,
            "retries": 0,
            "fail_fast": False,
            "cancel_running_on_fail": False,
        },
        "gke": {"engine": engine, "lease_s": 30.0, "namespace": "default"},
    }
    _write(root, protocol.group_manifest_key(GID), protocol.dump_json(manifest))


def _record_batch(root: Path) -> None:
    """A batch of 8 inputs on one worker at a time: claim 0 of the span [0, 8) lost its
    lease while it ran input 3, and claim 1 took the span over from there."""
    _write_manifest(root, TOTAL, 1, protocol.ENGINE_POOL)
    for span in (Span(0, 0, "pod-a", 1.0, TOTAL, 0), Span(0, 1, "pod-b", 1e12, TOTAL, 3, 2)):
        key = protocol.group_claim_key(GID, span.start, span.number)
        _write(root, key, claim_record(span))


def _burst(root: Path, first: int, end: int, number: int, state: str) -> str:
    """Write the burst of inputs ``[first, end)`` of claim ``number`` of span 0, each
    ended in ``state``; its name."""
    record: protocol.FinalRecord = {"state": state}  # type: ignore[typeddict-item]
    records = b"".join(
        results_log.encode(i, protocol.outcome_header(0, record, claim=number), b"")
        for i in range(first, end)
    )
    name = protocol.burst_name(first, end, 0, number)
    _write(root, protocol.group_bursts_prefix(GID) + name, protocol.encode_burst(records))
    return name


def _state(loaded: dict[int, Any], index: int) -> str | None:
    return str(loaded[index][0]["state"]) if index in loaded else None


@pytest.mark.anyio
async def test_readers_that_listed_the_bursts_at_different_times_agree(tmp_path: Path) -> None:
    # Reader A follows the batch while the takeover's burst is the only outcome of
    # inputs 3-7; the first claim's burst of input 3 lands after (its worker stalled
    # past its lease: the takeover ran input 3 again). Reader B comes after both.
    _record_batch(tmp_path)
    storage = LocalStorage(tmp_path)
    _burst(tmp_path, 0, 3, 0, "succeeded")
    _burst(tmp_path, 3, TOTAL, 1, "succeeded")
    a = _follower(storage)
    early = await a.load_many([0, 3])
    assert _state(early, 0) == "succeeded"  # the first claim's: nothing stands over it
    assert 3 not in early  # a takeover's: held, an earlier claim may still land
    _burst(tmp_path, 3, 4, 0, "failed")
    b = _follower(storage)
    seen = [await reader.load_many(list(range(TOTAL))) for reader in (a, b)]
    assert [_state(loaded, 3) for loaded in seen] == ["failed", "failed"]
    assert all(4 not in loaded for loaded in seen)  # still held: reported after the lease
    assert a.book is not None
    assert a.book.settled  # every input has a durable outcome


@pytest.mark.anyio
@pytest.mark.parametrize("slow_first", [False, True])
async def test_readers_that_read_the_bursts_in_different_orders_agree(
    tmp_path: Path, slow_first: bool
) -> None:
    # Both bursts of input 3 are there; a reader reads them concurrently, and which read
    # ends first must not matter.
    _record_batch(tmp_path)
    late = _burst(tmp_path, 3, 4, 0, "failed")
    takeover = _burst(tmp_path, 3, TOTAL, 1, "succeeded")
    reader = _follower(_SlowBurst(tmp_path, late if slow_first else takeover))
    assert _state(await reader.load_many([3]), 3) == "failed"


@pytest.mark.anyio
async def test_a_takeovers_outcome_is_reported_after_the_hold(tmp_path: Path) -> None:
    _record_batch(tmp_path)
    _burst(tmp_path, 3, TOTAL, 1, "succeeded")
    reader = _follower(LocalStorage(tmp_path))
    assert await reader.load_many([3]) == {}
    assert reader.choice is not None
    reader.choice.hold = 0.2  # the batch's lease, shortened
    assert reader.known(3)  # a cancel now would contradict a reader that reported it
    await anyio.sleep(0.3)
    assert _state(await reader.load_many([3]), 3) == "succeeded"
    _burst(tmp_path, 3, 4, 0, "failed")  # later than a lease: too late, not reported
    await reader.refresh()
    assert _state(await reader.load_many([3]), 3) == "succeeded"
    assert reader.choice.late == 1


@pytest.mark.anyio
async def test_an_outcome_object_of_its_own_stands_over_bursts(tmp_path: Path) -> None:
    _record_batch(tmp_path)
    _burst(tmp_path, 3, 4, 0, "succeeded")
    header = protocol.cancelled_header()
    key = protocol.group_outcome_key(GID, 3)
    _write(tmp_path, key, protocol.encode_outcome(header, b""))
    for slow in ("0000003-0000004.0000000.000", "0000003.res"):
        reader = _follower(_SlowBurst(tmp_path, slow))
        assert _state(await reader.load_many([3]), 3) == "cancelled"


@pytest.mark.anyio
async def test_a_batch_with_no_worker_left_is_read_whole_at_once(tmp_path: Path) -> None:
    # A new process (kinetic batch status, attach_batch) on a batch that ended: no late
    # burst can come, so the takeover's outcomes are not held.
    _record_batch(tmp_path)
    _burst(tmp_path, 0, 3, 0, "succeeded")
    _burst(tmp_path, 3, TOTAL, 1, "succeeded")
    events = await _follower(LocalStorage(tmp_path)).snapshot(set())
    assert sorted(index for index, _ in events.done) == list(range(TOTAL))
