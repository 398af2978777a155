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
import warnings
from typing import Any

import anyio
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


def test_the_blocking_warning_names_the_users_line() -> None:
    # Whatever the facade's own call depth (a call, a method, an iterator), the warning
    # points at the line that made the blocking call, not into kinetic.
    lines: dict[str, int] = {}

    async def cell() -> list[warnings.WarningMessage]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lines["call"] = _lineno() + 1
            job = double.run_async(1)
            lines["method"] = _lineno() + 1
            job.result()
            batch = double.run_async_map([1, 2])
            lines["iterator"] = _lineno() + 1
            for h in batch.as_completed():
                h.result()
        return caught

    caught = asyncio.run(cell())
    blocking = [w for w in caught if issubclass(w.category, kinetic.KineticBlockingWarning)]
    assert blocking
    assert {w.filename for w in blocking} == {__file__}
    assert set(lines.values()) <= {w.lineno for w in blocking}


def _lineno() -> int:
    return sys._getframe(1).f_lineno


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
    import signal, sys, threading, time, kinetic
    # Ctrl-C as at a terminal. pytest started in the background by a non-interactive
    # shell (`tox &` in CI) ignores SIGINT, and this child would inherit that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    @kinetic.run()
    def nap(seconds):
        time.sleep(seconds)
        return seconds
    job = nap.run_async(60)
    print(job.job_id, flush=True)

    def waiting(status):
        # Runs on the loop thread once result()'s wait has started: only now is
        # the main thread inside result(), where Ctrl-C must land for this test.
        print("waiting", status.value, flush=True)
        if sys.argv[1:] == ["loop-thread"]:
            # The kernel may hand a process's SIGINT to any thread that does not block
            # it: here, to the loop thread, as it sometimes does.
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    started = time.monotonic()
    try:
        job.result(on_status_change=waiting)
    except KeyboardInterrupt:
        waited = time.monotonic() - started
        print("interrupted", job.status().value, round(waited, 1), flush=True)
    """
)


def _next_line(proc: subprocess.Popen[str], what: str) -> str:
    """The child's next stdout line; a child that ends or says otherwise fails the test."""
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith(what):
        proc.kill()
        _, err = proc.communicate()  # reaps it and closes its pipes
        pytest.fail(f"expected {what!r} from the child, got {line!r}; stderr:\n{err}")
    return line


@pytest.mark.parametrize("landing", ["process", "loop-thread"])
def test_ctrl_c_cancels_the_wait_and_leaves_the_job_running(landing: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C_SCRIPT, landing],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job_id = _next_line(proc, "job-")
        # Ctrl-C once the child is blocked in result(), not after a guessed delay.
        _next_line(proc, "waiting")
        if landing == "process":
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            # Reap it and close its pipes: a killed but unwaited Popen is reported as a
            # ResourceWarning whenever the GC collects it, failing some later test.
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    word, status, waited = out.split()
    assert word == "interrupted"
    assert status == "RUNNING"
    assert float(waited) < 30
    job = kinetic.attach(job_id)
    assert job.status() is kinetic.JobStatus.RUNNING
    job.cancel()
    assert job.status() is kinetic.JobStatus.FAILED


def test_ctrl_c_while_the_task_is_being_spawned_still_cancels_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # start_task_soon blocks until the loop has spawned the task; a Ctrl-C landing in
    # that wait (or just after it) must not leave the task running, unseen, on the loop.
    from kinetic._sync import portal as portal_module

    portal = portal_module.LOOP._ensure_portal()
    real = portal.start_task_soon
    cancelled = threading.Event()

    def interrupted_after_the_spawn(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    async def forever() -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    with monkeypatch.context() as m:
        m.setattr(portal, "start_task_soon", interrupted_after_the_spawn)
        with pytest.raises(KeyboardInterrupt):
            portal_module.call(forever)
    assert cancelled.wait(30), "the task kept running after Ctrl-C"
    assert double(3) == 6  # and the facade still works
