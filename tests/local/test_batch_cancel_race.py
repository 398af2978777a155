"""A batch's cancellation reaches a supervisor that holds the batch but does not listen yet.

A supervisor takes the batch's lock, reads the stop record, and only then prepares the
workspace and starts listening: on a loaded machine that takes seconds. A cancellation
that came then once found nobody listening, recorded the stop the supervisor had already
read, and returned; the supervisor went on to run every input (``kinetic batch cancel``
right after a submission, in CI). Real supervisor, real workers, real files: the
supervisor is held in that phase by its function's payload, a named pipe that the test
fills when it chooses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import kinetic
from kinetic import aio
from runner import protocol
from runner.batch import SUPERVISOR_LOCK
from runner.fs import lock_held

pytestmark = pytest.mark.local


@kinetic.run()
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _wait_for(check: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.02)
    return found


def _supervisor_pid(gdir: Path) -> int | None:
    try:
        pid = protocol.load_json((gdir / "supervisor.json").read_bytes())["pid"]
    except (FileNotFoundError, ValueError):
        return None
    return int(pid)


def _orphan(gdir: Path) -> None:
    """End the batch's supervisor and its workers (its process group): the batch is then
    driven by nobody, with its inputs unfinished."""
    pid = _wait_for(lambda: _supervisor_pid(gdir), "the supervisor to start")
    group = os.getpgid(pid)
    assert group != os.getpgrp()
    os.killpg(group, signal.SIGKILL)
    _wait_for(lambda: not lock_held(gdir / SUPERVISOR_LOCK), "its lock to be let go")


def _supervisor(storage_url: str, group_id: str) -> list[str]:
    return [sys.executable, "-m", "runner.batch", "--storage", storage_url, "--group", group_id]


def _start_held(storage: Any, group_id: str) -> tuple[subprocess.Popen[bytes], Path, bytes]:
    """A new supervisor that took the lock and read no stop record, blocked reading the
    function's payload (a named pipe now) until the test writes it; the pipe and the
    payload."""
    gdir = Path(storage.path_for(protocol.group_prefix(group_id).rstrip("/")))
    pipe = Path(storage.path_for(protocol.group_payload_key(group_id)))
    payload = pipe.read_bytes()
    pipe.unlink()
    os.mkfifo(pipe, 0o600)
    # In a session of its own: its workers with it, one process group to end.
    supervisor = subprocess.Popen(_supervisor(storage.url, group_id), start_new_session=True)
    _wait_for(lambda: lock_held(gdir / SUPERVISOR_LOCK), "the new supervisor to take it")
    return supervisor, pipe, payload


async def test_a_cancel_waits_for_a_supervisor_that_does_not_listen_yet(
    kinetic_env: Path,
) -> None:
    batch = await nap.aio.run_async_map([60.0, 60.0], max_concurrent=1)
    storage: Any = batch._backend.storage  # the local backend's directory
    gdir = Path(storage.path_for(protocol.group_prefix(batch.group_id).rstrip("/")))
    await anyio.to_thread.run_sync(_orphan, gdir)
    supervisor, pipe, payload = await anyio.to_thread.run_sync(_start_held, storage, batch.group_id)
    try:
        cancelled = anyio.Event()

        async def cancel() -> None:
            await batch.cancel()
            cancelled.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel)
            with anyio.move_on_after(1):
                await cancelled.wait()
            # It waits for the supervisor: recording the stop now would come too late.
            assert not cancelled.is_set()
            assert not await anyio.Path(gdir / "stop.json").exists()
            await anyio.to_thread.run_sync(pipe.write_bytes, payload)
            with anyio.fail_after(60):
                await cancelled.wait()
        # Told to stop, the supervisor ended its worker and exits: no input runs on.
        await anyio.to_thread.run_sync(lambda: supervisor.wait(timeout=30))
        stop = protocol.load_json(await anyio.Path(gdir / "stop.json").read_bytes())
        assert stop["reason"] == "cancelled"
        counts = await (await aio.attach_batch(batch.group_id, backend="local")).status_counts()
        assert counts == {"FAILED": 2}, counts
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            await anyio.to_thread.run_sync(supervisor.wait)
        await batch.cleanup()


async def test_a_cancel_with_no_supervisor_records_the_stop_under_its_lock(
    kinetic_env: Path,
) -> None:
    batch = await nap.aio.run_async_map([60.0, 60.0], max_concurrent=1)
    storage: Any = batch._backend.storage
    gdir = Path(storage.path_for(protocol.group_prefix(batch.group_id).rstrip("/")))
    await anyio.to_thread.run_sync(_orphan, gdir)
    await batch.cancel()
    stop = protocol.load_json(await anyio.Path(gdir / "stop.json").read_bytes())
    assert stop["reason"] == "cancelled"
    # A supervisor started afterwards reads the stop and leaves the batch alone.
    with anyio.fail_after(60):
        await anyio.run_process(_supervisor(storage.url, batch.group_id), check=True)
    assert await batch.status_counts() == {"FAILED": 2}
    await batch.cleanup()


async def test_a_stopped_batch_reads_as_stopped_while_its_supervisor_holds_it_silently(
    kinetic_env: Path,
) -> None:
    """A supervisor that took the lock reads the stop record, then exits: a reader in
    between once ignored the stop and saw every input PENDING (the pytest plugin's
    cancelled batch, read at once on a loaded machine)."""
    batch = await nap.aio.run_async_map([60.0, 60.0], max_concurrent=1)
    storage: Any = batch._backend.storage
    gdir = Path(storage.path_for(protocol.group_prefix(batch.group_id).rstrip("/")))
    await anyio.to_thread.run_sync(_orphan, gdir)
    supervisor, _, _ = await anyio.to_thread.run_sync(_start_held, storage, batch.group_id)
    try:
        # Held, silent, with the batch's stop recorded: as between its read and its exit.
        stop = protocol.stop_record("cancelled", "the batch was cancelled")
        await anyio.Path(gdir / "stop.json").write_bytes(protocol.dump_json(stop))
        again = await aio.attach_batch(batch.group_id, backend="local")
        assert await again.status_counts() == {"FAILED": 2}
    finally:
        os.killpg(supervisor.pid, signal.SIGKILL)
        await anyio.to_thread.run_sync(supervisor.wait)
    await batch.cleanup()
