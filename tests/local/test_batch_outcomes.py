"""Batch inputs' handles from ``as_completed`` carry their outcome; cleanup is batched.

Real supervisor, real workers, real files (local backend).
"""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

import kinetic
from kinetic import aio
from runner import protocol

pytestmark = pytest.mark.local


class OddError(Exception):
    pass


@kinetic.run()
def reject_odd(x: int) -> int:
    if x % 2:
        raise OddError(f"{x} is odd")
    return x * 10


@kinetic.run()
def blob(n: int) -> bytes:
    return bytes(n)


def _group_dir(batch: aio.BatchHandle) -> Path:
    storage: Any = batch._backend.storage  # the local backend's directory
    return Path(storage.path_for(protocol.group_prefix(batch.group_id).rstrip("/")))


async def test_handles_from_as_completed_return_values_and_errors_in_memory() -> None:
    batch = await reject_odd.aio.run_async_map(range(8))
    handles = [h async for h in batch.as_completed()]
    # Delete the batch's records: the handles the stream yielded still have their outcomes,
    # decoded from memory (small and large payloads alike) ...
    await batch.cleanup()
    values: dict[int, Any] = {}
    for h in handles:
        assert h.group_index is not None
        if h.group_index % 2:
            with pytest.raises(OddError, match=f"{h.group_index} is odd") as info:
                await h.result(cleanup=False)
            assert any("Remote traceback" in n for n in info.value.__notes__)
        else:
            values[h.group_index] = await h.result()
    assert values == {i: i * 10 for i in range(0, 8, 2)}
    # ... while a handle obtained another way reads the (now deleted) records.
    attached = await aio.attach_batch(batch.group_id, backend="local")
    async for h in attached.as_completed():
        with pytest.raises(kinetic.ResultError, match="deleted by the batch's cleanup"):
            await h.result()


def test_blocking_handles_carry_large_outcomes_too() -> None:
    sizes = [10, 200_000]  # one decoded inline, one in a worker thread (async) / caller thread
    batch = blob.run_async_map(sizes)
    got = {h.group_index: len(h.result(cleanup=False)) for h in batch.as_completed()}
    assert got == {0: 10, 1: 200_000}
    assert batch.results() == [bytes(10), bytes(200_000)]


async def test_default_cleanup_on_every_input_cleans_the_batch_once() -> None:
    batch = await reject_odd.aio.run_async_map([0, 2, 4, 6])
    gdir = _group_dir(batch)
    async for h in batch.as_completed():
        assert (gdir / "results").exists()  # not deleted input by input
        await h.result()
    assert not (gdir / "results").exists()
    assert not (gdir / "inputs").exists()
    assert (gdir / "manifest.json").exists()
    assert await batch.failures() == []  # the summary answers after cleanup


async def test_a_cleaned_up_batch_is_freed_as_soon_as_it_is_dropped() -> None:
    """A service that runs batch after batch gets each one's memory (its handles, their
    outcomes) back when it drops the batch, not at the collector's next full pass (a
    pause of its event loop that grows with what is waiting for it)."""
    gc.collect()
    gc.disable()
    try:
        batch = await reject_odd.aio.run_async_map([0, 2, 4, 6])
        handles = [h async for h in batch.as_completed()]
        values = [await h.result() for h in handles]  # the last one cleans the batch up
        assert sorted(values) == [0, 20, 40, 60]
        dropped = [weakref.ref(batch), *(weakref.ref(h) for h in handles)]
        del batch, handles
        assert [ref() for ref in dropped] == [None] * len(dropped)
    finally:
        gc.enable()


async def test_one_input_kept_keeps_the_batch() -> None:
    batch = await reject_odd.aio.run_async_map([0, 2, 4])
    gdir = _group_dir(batch)
    async for h in batch.as_completed():
        await h.result(cleanup=h.group_index != 2)
    assert (gdir / "results").exists()
    assert await batch.results() == [0, 20, 40]  # still collectable, then cleaned
    assert not (gdir / "results").exists()


def test_blocking_default_cleanup_cleans_the_batch_once() -> None:
    batch = reject_odd.run_async_map([0, 2])
    gdir = _group_dir(batch.aio)
    assert sorted(h.result() for h in batch.as_completed()) == [0, 20]
    assert not (gdir / "results").exists()
    assert (gdir / "manifest.json").exists()


def test_a_supervisor_started_after_cleanup_leaves_the_batch_alone() -> None:
    # A follower that found no supervisor listening starts one; on a loaded machine it
    # may come up after the batch was collected and cleaned. It must not resume it.
    batch = reject_odd.run_async_map([0, 2])
    assert batch.results() == [0, 20]
    gdir = _group_dir(batch.aio)
    storage: Any = batch.aio._backend.storage
    assert not (gdir / "results").exists()
    subprocess.run(
        [sys.executable, "-m", "runner.batch", "--storage", storage.url, "--group", batch.group_id],
        check=True,
        timeout=60,
    )
    assert sorted(p.name for p in gdir.iterdir() if p.is_dir()) == []  # no results, no logs
    assert not (gdir / "stop.json").exists()
    assert kinetic.attach_batch(batch.group_id, backend="local").failures() == []


async def test_jobs_and_attached_members_still_work() -> None:
    batch = await reject_odd.aio.run_async_map(range(4))
    await batch.wait()
    # Handles built without the stream (no carried outcome) take the backend's path.
    assert await batch.jobs[2].result(cleanup=False) == 20  # type: ignore[union-attr]
    attached = await aio.attach_batch(batch.group_id, backend="local")
    with pytest.raises(OddError):
        await attached.jobs[1].result(cleanup=False)  # type: ignore[union-attr]
    results = await batch.results(return_exceptions=True)
    assert [type(r) for r in results] == [int, OddError, int, OddError]


def test_a_batch_leaves_nothing_in_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the supervisor inherits it
    batch = reject_odd.run_async_map([0, 2, 4])
    assert batch.results() == [0, 20, 40]
    leftovers = [p.name for p in temp.iterdir()]
    assert leftovers == []
