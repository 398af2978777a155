"""A batch supervisor survives what its own user's clients send, and keeps its log.

A malformed command (``c abc``, bytes that are not UTF-8) crashed the supervisor, and the
relaunch truncated its log, so the traceback was lost; a client that never sent a
newline grew the supervisor's buffer without bound. Real supervisor, real workers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

import kinetic
from runner.batch import socket_address

pytestmark = pytest.mark.local


@kinetic.run()
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _connect(kinetic_env: Path, group_id: str) -> socket.socket:
    """A connection to the batch's supervisor, once it listens."""
    gdir = kinetic_env / "storage" / "_groups" / group_id
    url = (kinetic_env / "storage").absolute().as_uri()
    deadline = time.monotonic() + 60
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(socket_address(gdir, url, group_id))
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            assert time.monotonic() < deadline, "the supervisor did not listen within 60 s"
            time.sleep(0.02)
            continue
        sock.settimeout(30)
        return sock


def test_malformed_commands_and_endless_lines_leave_the_supervisor_running(
    kinetic_env: Path,
) -> None:
    batch = nap.run_async_map([0.05] * 60, max_concurrent=2)
    gdir = kinetic_env / "storage" / "_groups" / batch.group_id
    log = gdir / "supervisor.log"
    with _connect(kinetic_env, batch.group_id) as client:
        client.sendall(b"c abc\n\xff\xfe\nc 99999999999999999999\np\n")
        answers = client.makefile("rb")
        while (line := answers.readline()) != b"P\n":  # the commands before "p" were seen
            assert line, "the supervisor hung up"
    with _connect(kinetic_env, batch.group_id) as endless:
        endless.sendall(b"c " + b"1" * 5000)  # a line that never ends
        try:
            while endless.recv(1 << 16):  # the snapshot, then the end: dropped
                pass
        except ConnectionResetError:  # dropped with our line unread
            pass
    said = log.read_text(errors="replace")
    assert said.count("ignored a malformed command") == 2, said
    # A supervisor killed (and relaunched by the next reader) keeps what it said before.
    record = json.loads((gdir / "supervisor.json").read_text())
    os.kill(record["pid"], signal.SIGKILL)
    assert batch.results(timeout=120) == [0.05] * 60
    assert log.read_text(errors="replace").count("ignored a malformed command") == 2
