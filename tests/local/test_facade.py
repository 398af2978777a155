"""The sync facade: one private loop thread, safe from re-entry, Ctrl-C, Jupyter and fork."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import kinetic

pytestmark = pytest.mark.local


@kinetic.run()
def double(x: int) -> int:
    return 2 * x


@kinetic.run()
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_blocking_call_from_the_loop_thread_raises_instead_of_deadlocking() -> None:
    job = double.run_async(1)
    errors: list[BaseException] = []

    def callback(status: kinetic.JobStatus) -> None:
        # Runs on Kinetic's loop thread: a blocking call here would wait on itself.
        try:
            job.status()
        except BaseException as exc:  # noqa: BLE001 - the test inspects what was raised
            errors.append(exc)

    assert job.result(on_status_change=callback) == 2
    assert errors
    assert all(isinstance(e, kinetic.BlockingCallError) for e in errors)
    assert "deadlock" in str(errors[0])


def test_works_from_a_thread_whose_event_loop_is_running() -> None:
    # As in Jupyter: the calling thread runs a loop and calls the blocking API.
    async def notebook_cell() -> int:
        with pytest.warns(kinetic.KineticBlockingWarning, match="aio"):
            return double(21)

    assert asyncio.run(notebook_cell()) == 42


def test_many_threads_share_the_facade() -> None:
    results: dict[int, int] = {}

    def worker(i: int) -> None:
        results[i] = double(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == {i: 2 * i for i in range(4)}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_keeps_working_in_a_forked_child() -> None:
    assert double(1) == 2  # the parent's loop thread is running now
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            value = double(5)
            os.write(write_fd, json.dumps({"value": value}).encode())
        except BaseException as exc:  # noqa: BLE001 - report; never return into pytest here
            os.write(write_fd, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as r:
        data = r.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status)
    assert json.loads(data) == {"value": 10}
    assert double(2) == 4  # and the parent still works


_CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys, time, kinetic
    @kinetic.run()
    def nap(seconds):
        time.sleep(seconds)
        return seconds
    job = nap.run_async(60)
    print(job.job_id, flush=True)
    started = time.monotonic()
    try:
        job.result()
    except KeyboardInterrupt:
        waited = time.monotonic() - started
        print("interrupted", job.status().value, round(waited, 1), flush=True)
    """
)


def test_ctrl_c_cancels_the_wait_and_leaves_the_job_running() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C_SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().strip()
        assert job_id.startswith("job-")
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    word, status, waited = out.split()
    assert word == "interrupted"
    assert status == "RUNNING"
    assert float(waited) < 30
    job = kinetic.attach(job_id)
    assert job.status() is kinetic.JobStatus.RUNNING
    job.cancel()
    assert job.status() is kinetic.JobStatus.FAILED
