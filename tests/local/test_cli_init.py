"""``kinetic init`` as a user runs it: a real process, on a pipe and on a terminal (a
pseudo-terminal), then a real local job on the profile it saved."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kinetic

pytestmark = pytest.mark.local


@kinetic.run()
def where() -> str:
    return "ran"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No Google credentials, no gcloud project: what a new machine has."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(home / "no-adc.json"))
    monkeypatch.setenv("KUBECONFIG", str(home / "no-kubeconfig"))
    return home


def cli(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetic", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.usefixtures("home")
@pytest.mark.parametrize("stdin", [subprocess.DEVNULL, subprocess.PIPE])
def test_without_a_terminal_it_never_waits_for_input(stdin: int) -> None:
    # PIPE: stdin open, and never written to; a wait for it would run into cli's timeout.
    done = cli("init", stdin=stdin)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "--local, --join CLUSTER, --create or --doctor" in done.stderr


@pytest.mark.usefixtures("home")
def test_init_local_sets_up_a_profile_jobs_run_on() -> None:
    done = cli("init", "--local", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["choice"], report["profile"]) == ("local", "local")
    shown = json.loads(cli("config", "show", "--json").stdout)
    settings = {row["name"]: row for row in shown}
    assert settings["backend"]["value"] == "local"
    assert settings["profile"]["value"] == "local"
    job = where.run_async()
    assert job.backend == "local"
    assert job.result(timeout=120) == "ran"


def test_on_a_terminal_it_asks(home: Path) -> None:
    """A pseudo-terminal as stdin, stdout and stderr: the menu, the default answer."""
    fd, terminal = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "kinetic", "init"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
    )
    os.close(terminal)
    seen = b""
    try:
        seen += _read_until(fd, b"Choice [local]: ")
        os.write(fd, b"\n")  # the default
        seen += _read_until(fd, b"it is the current profile")
        assert child.wait(timeout=60) == 0, seen.decode(errors="replace")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(fd)
    text = seen.decode()
    assert "How do you want to run jobs?" in text
    assert "3) local" in text
    profiles = json.loads(Path(os.environ["KINETIC_PROFILES_FILE"]).read_text())
    assert profiles == {"current": "local", "profiles": {"local": {}}}


def _read_until(fd: int, marker: bytes, timeout: float = 60) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout
    while marker not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} in {got!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            got += chunk
    assert marker in got, got
    return got
