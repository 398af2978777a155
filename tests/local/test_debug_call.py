"""Calling a ``debug=True`` function (blocking or awaited) forwards the job's debugger
itself, on 5678 or a free port when 5678 is taken, and says how to attach;
``debug_attach()`` returns the original's shape (``terminate``, ``wait``, ``poll``;
``kinetic.debug.cleanup_port_forward``). A real job, debugpy and DAP client."""

from __future__ import annotations

import contextlib
import errno
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import kinetic
import kinetic.debug
from kinetic._debug.call import DEFAULT_PORT
from tests.fix_dap import DapClient
from tests.local.test_debug import REPO, _break_line, doubled

pytestmark = pytest.mark.local

_WAITING = re.compile(r"waits for your debugger on 127\.0\.0\.1:(\d+)")


def _attach_and_continue(printed: str) -> int:
    """Check what a debug call printed (the instructions and the IDE configuration, both
    naming the forwarded port), attach through that port as VS Code would with a
    breakpoint in ``doubled``, see the job stop there and continue it. Returns the port."""
    found = _WAITING.search(printed)
    assert found, printed
    port = int(found.group(1))
    assert "VS Code launch configuration" in printed
    assert f'"port": {port}' in printed  # the IDE configuration names the forwarded port
    remote_root = re.search(r'"remoteRoot": "([^"]+)"', printed)
    assert remote_root
    with DapClient(port, timeout=60) as client:
        client.attach(
            {__file__.replace("test_debug_call", "test_debug"): [_break_line()]},
            path_mappings=[{"localRoot": REPO, "remoteRoot": remote_root.group(1)}],
        )
        stopped = client.stopped(timeout=60)
        assert client.top_frame(stopped["threadId"])["line"] == _break_line()
        client.resume(stopped["threadId"])
    return port


def _blocking_debug_call(capsys: pytest.CaptureFixture[str]) -> int:
    """Call ``doubled(20)`` (blocking) in a thread, attach as its printout says, and check
    that the value comes back. Returns the port it forwarded."""
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = doubled(20)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    caller = threading.Thread(target=call)
    caller.start()
    printed = ""
    deadline = time.monotonic() + 120  # a bound on a hang, not a timing claim
    while not _WAITING.search(printed) and caller.is_alive() and time.monotonic() < deadline:
        printed += capsys.readouterr().out
        time.sleep(0.05)
    assert _WAITING.search(printed), (printed, outcome)
    port = _attach_and_continue(printed)
    caller.join(timeout=120)
    assert outcome == {"value": 41}
    return port


def test_a_blocking_debug_call_forwards_and_says_how_to_attach(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _blocking_debug_call(capsys)


@pytest.mark.anyio
async def test_an_awaited_debug_call_forwards_and_says_how_to_attach(
    capsys: pytest.CaptureFixture[str],
) -> None:
    outcome: dict[str, Any] = {}

    async def call() -> None:
        outcome["value"] = await doubled.aio(20)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        printed = ""
        with anyio.fail_after(120):  # a bound on a hang, not a timing claim
            while not _WAITING.search(printed):
                printed += capsys.readouterr().out
                await anyio.sleep(0.05)
        # The DAP client blocks: in a thread, so the awaited call's forward keeps relaying.
        await anyio.to_thread.run_sync(_attach_and_continue, printed)
    assert outcome == {"value": 41}


def test_a_debug_call_forwards_a_free_port_when_5678_is_taken(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with contextlib.ExitStack() as stack:
        holder = stack.enter_context(socket.socket())
        try:
            holder.bind(("127.0.0.1", DEFAULT_PORT))
            holder.listen()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            # Held by another process already: the same case.
        port = _blocking_debug_call(capsys)
    assert port != DEFAULT_PORT


def test_debug_attach_has_the_original_port_forward_shape() -> None:
    job = doubled.run_async(3)
    forward = job.debug_attach(local_port=0)
    assert forward.poll() is None
    assert forward.returncode is None
    with pytest.raises(subprocess.TimeoutExpired):
        forward.wait(timeout=0.01)
    kinetic.debug.cleanup_port_forward(forward)
    assert forward.wait() == 0
    assert forward.poll() == 0
    assert forward.closed
    kinetic.debug.cleanup_port_forward(forward)  # idempotent
    forward.terminate()
    job.cancel()
    # A port-forward process of one's own, as the original returned, ends the same way.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    kinetic.debug.cleanup_port_forward(proc)
    assert proc.poll() is not None


def test_the_debug_module_is_public() -> None:
    assert Path(kinetic.debug.__file__).name == "debug.py"
    assert kinetic.debug.__all__ == ["cleanup_port_forward"]
