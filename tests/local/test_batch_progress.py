"""The progress display of blocking batch waits: shown on a terminal, silent otherwise."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.local

_SCRIPT = textwrap.dedent(
    """
    import time, kinetic

    @kinetic.run()
    def nap(x):
        time.sleep(0.05)
        return x

    assert nap.run_async_map(range(40), max_concurrent=2).results() == list(range(40))
    print("ok", flush=True)
    """
)


def _run(stderr_is_tty: bool) -> tuple[str, str]:
    if not stderr_is_tty:
        out = subprocess.run(
            [sys.executable, "-c", _SCRIPT],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout, out.stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT], stdout=subprocess.PIPE, stderr=follower
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.stdout is not None
    stdout = proc.stdout.read().decode()
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    return stdout, b"".join(chunks).decode(errors="replace")


def test_progress_is_shown_on_a_terminal() -> None:
    stdout, terminal = _run(stderr_is_tty=True)
    assert stdout.strip() == "ok"
    for word in ("done", "failed", "running", "queued"):
        assert word in terminal


def test_progress_is_silent_when_not_a_terminal() -> None:
    stdout, stderr = _run(stderr_is_tty=False)
    assert stdout.strip() == "ok"
    assert "queued" not in stderr
    assert "running" not in stderr
