"""Readers of a coordinated pool batch (:class:`kinetic._backends.gke.pool._Follower`
reading commits: kinetic/_backends/gke/commit_reader.py) on a directory store. An input
recorded in two commits (a coordinator that died with a commit under way, landing
after its successor committed the input again) is reported the same by every reader,
whatever the order they listed and read them in (docs/pool-protocol.md, "The
coordinated pool")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from kinetic._storage.local import LocalStorage
from runner import protocol, results_log
from runner.pool.coordinator import commits
from tests.local.test_pool_readers import (
    _follower,
    _SlowBurst,
    _state,
    _write,
    _write_manifest,
)

GID = "grp-00000000bbbb"
TOTAL = 6

pytestmark = [pytest.mark.local, pytest.mark.timeout(60)]


def _record_batch(root: Path) -> None:
    _write_manifest(root, TOTAL, 2, protocol.ENGINE_COORDINATED)


def _commit(root: Path, epoch: int, seq: int, indices: range | list[int], state: str) -> str:
    record: protocol.FinalRecord = {"state": state}  # type: ignore[typeddict-item]
    records = [
        results_log.encode(i, protocol.outcome_header(0, record, worker=f"e{epoch}"), b"")
        for i in indices
    ]
    key = commits.commit_key(GID, epoch, seq)
    _write(root, key, commits.encode_commit(records))
    return key.rsplit("/", 1)[1]


@pytest.mark.anyio
async def test_a_coordinated_batch_is_read_from_its_commits(tmp_path: Path) -> None:
    _record_batch(tmp_path)
    _commit(tmp_path, 0, 0, [0, 4], "succeeded")
    _commit(tmp_path, 0, 1, [1, 2, 3, 5], "failed")
    reader = _follower(LocalStorage(tmp_path))
    loaded = await reader.load_many(list(range(TOTAL)))
    assert [_state(loaded, i) for i in range(TOTAL)] == [
        "succeeded", "failed", "failed", "failed", "succeeded", "failed",
    ]  # fmt: skip
    assert reader.book is not None
    assert reader.book.settled


@pytest.mark.anyio
async def test_readers_agree_when_a_dead_coordinators_commit_lands_late(tmp_path: Path) -> None:
    # Epoch 1 committed input 2 again; epoch 0's commit of it, under way when its
    # coordinator died, lands after. Reader A looked before it landed, B after.
    _record_batch(tmp_path)
    _commit(tmp_path, 0, 0, [0, 1], "succeeded")
    _commit(tmp_path, 1, 0, [2, 3, 4, 5], "succeeded")
    a = _follower(LocalStorage(tmp_path))
    early = await a.load_many(list(range(TOTAL)))
    assert _state(early, 0) == "succeeded"  # epoch 0's: nothing comes before it
    assert 2 not in early  # a later epoch's: held
    _commit(tmp_path, 0, 1, [2], "failed")
    b = _follower(LocalStorage(tmp_path))
    seen = [await reader.load_many([2]) for reader in (a, b)]
    assert [_state(loaded, 2) for loaded in seen] == ["failed", "failed"]


@pytest.mark.anyio
@pytest.mark.parametrize("slow_first", [False, True])
async def test_the_order_commits_are_read_in_does_not_matter(
    tmp_path: Path, slow_first: bool
) -> None:
    _record_batch(tmp_path)
    late = _commit(tmp_path, 0, 3, [2], "failed")
    again = _commit(tmp_path, 1, 0, [2], "succeeded")
    reader = _follower(_SlowBurst(tmp_path, late if slow_first else again))
    assert _state(await reader.load_many([2]), 2) == "failed"


@pytest.mark.anyio
async def test_a_later_epochs_outcome_is_reported_after_the_hold(tmp_path: Path) -> None:
    _record_batch(tmp_path)
    _commit(tmp_path, 2, 0, [4], "succeeded")
    reader = _follower(LocalStorage(tmp_path))
    assert await reader.load_many([4]) == {}
    assert reader.choice is not None
    reader.choice.hold = 0.2  # the batch's lease, shortened
    await anyio.sleep(0.3)
    assert _state(await reader.load_many([4]), 4) == "succeeded"


@pytest.mark.anyio
async def test_an_outcome_object_of_its_own_stands_over_commits(tmp_path: Path) -> None:
    _record_batch(tmp_path)
    name = _commit(tmp_path, 0, 0, [3], "succeeded")
    key = protocol.group_outcome_key(GID, 3)
    _write(tmp_path, key, protocol.encode_outcome(protocol.cancelled_header(), b""))
    for slow in (name, "0000003.res"):
        reader = _follower(_SlowBurst(tmp_path, slow))
        assert _state(await reader.load_many([3]), 3) == "cancelled"


@pytest.mark.anyio
async def test_a_corrupted_commit_is_skipped_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _record_batch(tmp_path)
    name = _commit(tmp_path, 0, 0, [0, 1], "succeeded")
    path = tmp_path / commits.commits_prefix(GID) / name
    path.write_bytes(path.read_bytes()[:-3])
    _commit(tmp_path, 0, 1, [2], "succeeded")
    reader = _follower(LocalStorage(tmp_path))
    loaded = await reader.load_many([0, 1, 2])
    assert sorted(loaded) == [2]
    assert f"commit {commits.commit_key(GID, 0, 0)} is corrupted" in caplog.text


@pytest.mark.anyio
async def test_a_batch_with_no_pod_left_is_read_whole_at_once(tmp_path: Path) -> None:
    # kinetic batch status, attach_batch on a batch that ended: no late commit can come.
    _record_batch(tmp_path)
    _commit(tmp_path, 0, 0, [0, 1, 2], "succeeded")
    _commit(tmp_path, 1, 0, [3, 4, 5], "succeeded")
    events = await _follower(LocalStorage(tmp_path)).snapshot(set())
    assert sorted(index for index, _ in events.done) == list(range(TOTAL))


class _FailedCoordinator:
    """A cluster where the pool's workers run and its coordinator's Job failed."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def list_objects(self, *args: object) -> dict[str, Any]:
        running = {"metadata": {"name": "w0"}, "status": {"phase": "Running"}}
        return {"items": [running]}

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        if not name.endswith("-coordinator"):
            return {"status": {}}
        failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
        return {"status": {"conditions": [failed]}}

    async def delete_jobs(self, namespace: str, selector: str) -> None:
        self.deleted.append("jobs")

    async def delete_pods(self, namespace: str, selector: str, *, grace: int = 0) -> None:
        self.deleted.append("pods")


@pytest.mark.anyio
async def test_a_failed_coordinator_fails_the_batch_and_ends_its_pool(tmp_path: Path) -> None:
    _record_batch(tmp_path)
    _commit(tmp_path, 0, 0, [0, 1], "succeeded")
    reader = _follower(LocalStorage(tmp_path))
    cluster = _FailedCoordinator()
    reader.backend.client = cluster
    events = await reader.step(set())
    assert sorted(i for i, _ in events.done) == [0, 1]
    stop = await reader.read_stop()
    assert stop is not None
    assert stop["reason"] == "failed"
    assert stop["detail"].startswith("the pool's coordinator failed: ")
    assert "BackoffLimitExceeded" in stop["detail"]
    assert cluster.deleted == ["jobs", "pods"]
