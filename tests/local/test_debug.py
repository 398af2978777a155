"""Debug mode on the local backend: a real job, a real debugpy, a real DAP client.

A ``debug=True`` job starts debugpy and waits for a client before running;
``debug_attach`` forwards a local port to it; the client (tests/fix_dap.py, the
messages VS Code sends) attaches with a breakpoint in the function, sees the job
stop there, continues, and the value comes back. A job nobody attaches to fails
bounded, in phase ``debug``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import socket
import struct
import threading
import time
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

import kinetic
from kinetic import aio
from kinetic._debug.forward import ForwardLoop, LocalUpstream
from tests.fix_dap import DapClient
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local

REPO = str(Path(__file__).resolve().parents[2])


@kinetic.run(debug=True)
def doubled(x: int) -> int:
    y = x * 2  # BREAK HERE
    return y + 1


@kinetic.run()
def plain(x: int) -> int:
    return x


def _break_line() -> int:
    lines, first = inspect.getsourcelines(doubled.__wrapped__)
    return first + next(i for i, line in enumerate(lines) if "# BREAK HERE" in line)


def _debug_to_value(port: int, mappings: list[dict[str, str]]) -> tuple[int, str]:
    """Attach as VS Code would with the printed configuration's path mappings, with a
    breakpoint in ``doubled``; wait for the stop, continue. Returns the stopped line
    and file (as the client sees it)."""
    with DapClient(port, timeout=60) as client:
        client.attach({__file__: [_break_line()]}, path_mappings=mappings)
        stopped = client.stopped(timeout=60)
        frame = client.top_frame(stopped["threadId"])
        client.resume(stopped["threadId"])
        return frame["line"], frame["source"]["path"]


def test_debug_job_waits_for_a_client_stops_at_a_breakpoint_and_returns(
    kinetic_env: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    job = doubled.run_async(20)
    assert job.debug
    with job.debug_attach(local_port=0, working_dir=str(tmp_path)) as forward:
        assert forward.local_port > 0
        printed = capsys.readouterr().out
        assert "VS Code launch configuration" in printed
        config = forward.launch_config
        assert json.dumps(config, indent=2) in printed
        assert config["request"] == "attach"
        assert config["type"] == "debugpy"
        assert config["connect"] == {"host": "127.0.0.1", "port": forward.local_port}
        mapping = config["pathMappings"][0]
        assert mapping["localRoot"] == str(tmp_path)
        assert Path(mapping["remoteRoot"]).is_dir()  # the job's copy of the project

        # Ready, and waiting: without a client the function does not run.
        time.sleep(1.0)
        assert job.status() is kinetic.JobStatus.RUNNING
        assert "waits up to 600s for a debugger" in job.logs()

        line, path = _debug_to_value(forward.local_port, [{**mapping, "localRoot": REPO}])
        assert line == _break_line()
        assert path == __file__
        assert job.result(timeout=60) == 41
    assert forward.closed
    assert not forward.errors
    # Debug jobs keep their artifacts after the value is read.
    assert job.job_id in job_dirs(kinetic_env)
    job.cleanup()
    assert job.job_id not in job_dirs(kinetic_env)


def test_unattended_debug_job_fails_bounded_in_phase_debug(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KINETIC_DEBUG_WAIT_TIMEOUT", "2")
    started = time.monotonic()
    # Calling a debug function waits for its value without streaming the job's output.
    with pytest.raises(
        kinetic.JobFailedError, match="no debugger client attached within 2s"
    ) as info:
        doubled(1)
    assert info.value.phase == "debug"
    assert time.monotonic() - started < 45
    assert "waits up to" not in capfd.readouterr().out

    # A handle of that job: nothing to attach to any more, said at once.
    job = kinetic.list_jobs()[0]
    assert job.func_name == "doubled"
    with pytest.raises(kinetic.JobFailedError, match="ended before a debugger attached"):
        job.debug_attach(local_port=0, timeout=30)
    job.cleanup()


def test_debug_attach_refuses_what_it_cannot_debug(kinetic_env: Path) -> None:
    job = plain.run_async(3)
    with pytest.raises(kinetic.ConfigError, match="not submitted with debug=True"):
        job.debug_attach()
    assert job.result(timeout=60) == 3

    # Waiting for readiness is bounded; the job is left as it is.
    waiting = doubled.run_async(2)
    with pytest.raises(kinetic.JobTimeoutError, match="did not start its debugger within"):
        waiting.debug_attach(local_port=0, timeout=0.05)
    assert waiting.status() is not kinetic.JobStatus.FAILED
    waiting.cancel()
    with pytest.raises(kinetic.JobCancelledError):
        waiting.result(timeout=60)


def test_bad_wait_setting_is_refused_before_anything_is_written(
    kinetic_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_DEBUG_WAIT_TIMEOUT", "soon")
    with pytest.raises(kinetic.ConfigError, match="KINETIC_DEBUG_WAIT_TIMEOUT"):
        doubled.run_async(1)
    assert job_dirs(kinetic_env) == []


@pytest.mark.anyio
async def test_async_debug_attach_and_a_taken_port() -> None:
    job = await doubled.aio.run_async(5)
    async with await job.debug_attach(local_port=0) as forward:
        # The same port again is refused clearly (the job is untouched).
        with pytest.raises(kinetic.ConfigError, match="in use"):
            await job.debug_attach(local_port=forward.local_port)
        mappings = forward.launch_config["pathMappings"]
        assert mappings[0]["localRoot"] == REPO  # default: the project as submitted
        line, _ = await anyio.to_thread.run_sync(_debug_to_value, forward.local_port, mappings)
        assert line == _break_line()
        assert await job.result(timeout=60) == 11
    assert forward.closed
    again = await aio.attach(job.job_id)
    await again.cleanup()


def _server_that_talks_first(ended: list[threading.Event]) -> socket.socket:
    """A loopback server standing in for a job's debugpy: each connection gets 64 KiB at
    once (replies a client may leave unread); ``ended`` gets an event per connection,
    set when the forward closed that connection."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # the test closed the server
            done = threading.Event()
            ended.append(done)
            with conn:
                conn.sendall(b"x" * 65536)
                with contextlib.suppress(OSError):
                    while conn.recv(65536):
                        pass
            done.set()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_a_client_that_resets_its_connection_is_no_forward_error() -> None:
    """A debugger stopped while the job's last events are unread resets its connection
    (VS Code stopping a session, the test client closing): the forward ends that
    connection quietly, reports nothing, and keeps serving."""
    ended: list[threading.Event] = []
    server = _server_that_talks_first(ended)
    loop = ForwardLoop(LocalUpstream(server.getsockname()[1]), 0)
    loop.start()
    try:
        client = socket.create_connection(("127.0.0.1", loop.port), timeout=10)
        client.sendall(b"hello")
        assert client.recv(1) == b"x"  # the server's bytes arrived; most stay unread
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # with data unread and no linger: a reset, as such a client does
        assert ended[0].wait(10), "the forward kept the job's side open"
        assert loop.errors == []
        with socket.create_connection(("127.0.0.1", loop.port), timeout=10) as again:
            assert again.recv(1) == b"x"  # still serving
    finally:
        loop.stop()
        server.close()
