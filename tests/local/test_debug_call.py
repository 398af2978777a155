"""Calling a ``debug=True`` function forwards the job's debugger itself and says how
to attach; ``debug_attach()`` returns the original's shape (``terminate``, ``wait``,
``poll``; ``kinetic.debug.cleanup_port_forward``). A real job, debugpy and DAP client."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import kinetic
import kinetic.debug
from tests.fix_dap import DapClient
from tests.local.test_debug import REPO, _break_line, doubled

pytestmark = pytest.mark.local

_WAITING = re.compile(r"waits for your debugger on 127\.0\.0\.1:(\d+)")


def test_a_blocking_debug_call_forwards_and_says_how_to_attach(
    capsys: pytest.CaptureFixture[str],
) -> None:
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
    found = _WAITING.search(printed)
    assert found, (printed, outcome)
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
    caller.join(timeout=120)
    assert outcome == {"value": 41}


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
