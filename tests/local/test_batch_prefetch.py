"""Workers hold a queue of inputs and report in bursts; nothing of that may show (issue 14).

A worker is granted a queue of inputs (credit) and reports their outcomes in bursts.
These tests look at what that could break: an outcome reported before it is durable,
an input queued at a worker that dies, an input cancelled while queued at a worker,
and workers that die before they start anything.

Real supervisor, real workers, real files (local backend).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import kinetic
from kinetic import aio
from kinetic._backends.local_batch import _LogIndex, event_chunks
from runner import protocol

pytestmark = pytest.mark.local


@kinetic.run()
def square(x: int) -> int:
    return x * x


@kinetic.run()
def gated(x: int, marker_dir: str, gate: int, then: str) -> int:
    """Marks that it ran; input ``gate`` waits for ``go`` (bounded), then returns or
    exits (``then``)."""
    with open(f"{marker_dir}/{x}.ran", "a") as f:
        f.write(".")
    if x == gate:
        deadline = time.monotonic() + 30
        while not os.path.exists(f"{marker_dir}/go") and time.monotonic() < deadline:
            time.sleep(0.01)
        if then == "exit":
            os._exit(3)
    return 10 * x


def _group_dir(batch: Any) -> Path:
    storage: Any = batch._backend.storage
    return Path(storage.path_for(protocol.group_prefix(batch.group_id).rstrip("/")))


def _granted(batch: kinetic.BatchHandle, index: int, timeout: float = 30.0) -> dict[int, Any]:
    """Statuses, once input ``index`` was sent to a worker (dispatched: RUNNING)."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = dict(batch.statuses())
        if statuses[index] == kinetic.JobStatus.RUNNING:
            return statuses
        assert time.monotonic() < deadline, f"input {index} was never sent to a worker"
        time.sleep(0.05)


def _wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


async def test_reported_outcomes_are_durable_and_workers_hold_a_queue() -> None:
    n = 20_000
    batch = await square.aio.run_async_map(range(n), max_concurrent=1)
    batches = batch._backend.batches  # type: ignore[attr-defined]
    stream = None
    with anyio.fail_after(30):
        while stream is None:
            stream = await batches.connect(batch.group_id)
            if stream is None:
                await anyio.sleep(0.01)
    results_dir = _group_dir(batch) / "results"
    index = _LogIndex()
    held: set[int] = set()  # dispatched to the (only) worker, not yet reported done
    most_held = 0
    done: set[int] = set()
    async with stream:
        async for events in event_chunks(stream):
            held.update(events.running)
            if events.done:
                # Every outcome the supervisor reports is already in a results log.
                index.scan(results_dir)
                missing = [i for i, _ in events.done if not index.has(i)]
                assert not missing, f"reported before recorded: {missing[:10]}"
            for i, state in events.done:
                assert state == "succeeded"
                done.add(i)
                held.discard(i)
            most_held = max(most_held, len(held))
    assert len(done) == n
    # One worker, yet many inputs were out at once: it held a queue (its credit).
    assert most_held > 16, most_held
    assert await batch.results() == [x * x for x in range(n)]


def test_inputs_queued_at_a_dead_worker_run_again_and_are_not_failed(tmp_path: Path) -> None:
    n, gate = 600, 500
    inputs = [(x, str(tmp_path), gate, "exit") for x in range(n)]
    batch = gated.run_async_map(inputs, max_concurrent=1)
    _wait_for(tmp_path / f"{gate}.ran")
    # The worker is inside input `gate`: the inputs after it are queued at that worker.
    statuses = _granted(batch, gate + 1)
    queued_there = [i for i in range(gate + 1, n) if statuses[i] == kinetic.JobStatus.RUNNING]
    assert queued_there, "no input was queued at the worker"
    (tmp_path / "go").touch()
    results = batch.results(return_exceptions=True, timeout=120)
    for x, result in enumerate(results):
        if x == gate:
            assert isinstance(result, kinetic.JobFailedError), result
            assert f"exited with status 3 while running input {gate}" in str(result)
        else:
            assert result == 10 * x, (x, result)
    # Only the input it died in was charged: it ran once (no retries), the others ran.
    assert (tmp_path / f"{gate}.ran").read_text() == "."
    for x in queued_there:
        assert (tmp_path / f"{x}.ran").exists()


def test_cancelling_an_input_queued_at_a_worker_never_runs_it(tmp_path: Path) -> None:
    n, gate = 260, 200
    inputs = [(x, str(tmp_path), gate, "return") for x in range(n)]
    batch = gated.run_async_map(inputs, max_concurrent=1)
    _wait_for(tmp_path / f"{gate}.ran")
    victim = gate + 1
    _granted(batch, victim)  # (the only worker is busy with `gate`: it holds the victim)
    job = batch.jobs[victim]
    assert job is not None
    job.cancel()
    (tmp_path / "go").touch()
    results = batch.results(return_exceptions=True, timeout=120, cleanup=False)
    for x, result in enumerate(results):
        if x == victim:
            assert isinstance(result, kinetic.JobCancelledError), result
        else:
            assert result == 10 * x, (x, result)
    # The handle as_completed yields says the same as results().
    carried = next(h for h in batch.as_completed() if h.group_index == victim)
    with pytest.raises(kinetic.JobCancelledError):
        carried.result(cleanup=False)
    # So does a handle that reads it through the backend.
    attached = kinetic.attach_batch(batch.group_id).jobs[victim]
    assert attached is not None
    with pytest.raises(kinetic.JobCancelledError):
        attached.result(cleanup=False)
    assert not (tmp_path / f"{victim}.ran").exists()
    # The worker was not killed to drop it: the input it was running ran once.
    assert (tmp_path / f"{gate}.ran").read_text() == "."


def test_cancelling_the_batch_drops_inputs_queued_at_workers(tmp_path: Path) -> None:
    n, gate = 300, 100
    inputs = [(x, str(tmp_path), gate, "return") for x in range(n)]
    batch = gated.run_async_map(inputs, max_concurrent=1)
    _wait_for(tmp_path / f"{gate}.ran")
    batch.cancel()
    (tmp_path / "go").touch()
    results = batch.results(return_exceptions=True, timeout=60)
    ran = {int(p.name.split(".")[0]) for p in tmp_path.glob("*.ran")}
    assert max(ran) == gate  # nothing queued behind the running input ever started
    for x in range(gate + 1, n):
        assert isinstance(results[x], kinetic.JobCancelledError), (x, results[x])


def test_workers_that_die_before_any_input_stop_the_batch(tmp_path: Path) -> None:
    """Its records deleted under it (a cleanup racing a run), a batch ends, failed;
    its supervisor does not start worker after worker forever."""
    inputs = [(x, str(tmp_path), 0, "exit") for x in range(10)]
    batch = gated.run_async_map(inputs, max_concurrent=1)
    _wait_for(tmp_path / "0.ran")
    shutil.rmtree(_group_dir(batch.aio) / "results")
    (tmp_path / "go").touch()
    results = batch.results(return_exceptions=True, timeout=60, cleanup=False)
    # Input 0's failure was recorded in a log that is gone: its result is missing.
    assert isinstance(results[0], kinetic.ResultError), results[0]
    for result in results[1:]:
        assert isinstance(result, kinetic.JobFailedError), result
        assert "before running any input" in str(result)
    stop = protocol.load_json((_group_dir(batch.aio) / "stop.json").read_bytes())
    assert stop["reason"] == "failed"
    assert "before running any input" in stop["detail"]


async def test_attach_after_cleanup_knows_every_state() -> None:
    @kinetic.run()
    def fail_on_7(x: int) -> int:
        if x % 10 == 7:
            raise ValueError(x)
        return x

    batch = await fail_on_7.aio.run_async_map(range(50))
    with pytest.raises(kinetic.BatchError):
        await batch.results()  # cleans up: a summary of the states stays
    attached = await aio.attach_batch(batch.group_id, backend="local")
    assert attached.progress() == {"done": 45, "failed": 5, "running": 0, "queued": 0}
    failed = [h.group_index for h in await attached.failures()]
    assert failed == [7, 17, 27, 37, 47]
