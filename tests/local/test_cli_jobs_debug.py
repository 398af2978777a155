"""``kinetic jobs debug JOB_ID`` as a user runs it: a real process holding the forward
to a real debug job's debugpy, a real DAP client (tests/fix_dap.py) attaching through
the address it printed; the process ends when the job does, or on Ctrl-C (the job
keeps running)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

import kinetic
from tests.fix_dap import DapClient

pytestmark = pytest.mark.local

REPO = str(Path(__file__).resolve().parents[2])


@kinetic.run(debug=True)
def tripled(x: int) -> int:
    y = x * 3  # BREAK HERE
    return y


@kinetic.run()
def plain() -> int:
    return 1


def _break_line() -> int:
    lines = Path(__file__).read_text().splitlines()
    return 1 + next(i for i, line in enumerate(lines) if line.endswith("x * 3  # BREAK HERE"))


def debug(job_id: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kinetic", "jobs", "debug", job_id, "--port", "0", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def read_until(stream: IO[str], predicate: object, timeout: float = 120) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if callable(predicate) and predicate(lines):
            return lines
    raise AssertionError(f"not found in {lines!r}")


def test_debug_prints_the_address_and_holds_it_until_the_job_ends() -> None:
    job = tripled.run_async(14)
    proc = debug(job.job_id)
    try:
        assert proc.stdout is not None
        out = read_until(proc.stdout, lambda lines: lines[-1].startswith("address: "))
        address = out[-1].split()[-1]
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert int(port) > 0
        assert "VS Code launch configuration" in "".join(out)
        time.sleep(1.0)
        assert proc.poll() is None  # held while the job waits
        assert job.status() is kinetic.JobStatus.RUNNING
        with DapClient(int(port), timeout=60) as client:
            mapping = {"localRoot": REPO, "remoteRoot": json.loads("".join(out[1:-1]))[
                "pathMappings"][0]["remoteRoot"]}  # fmt: skip
            client.attach({__file__: [_break_line()]}, path_mappings=[mapping])
            stopped = client.stopped(timeout=60)
            assert client.top_frame(stopped["threadId"])["line"] == _break_line()
            client.resume(stopped["threadId"])
            assert job.result(timeout=60) == 42
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert f"point the debugger at {address}" in err
        assert f"job {job.job_id} ended: SUCCEEDED" in err
    finally:
        end(proc)
        job.cleanup()


def test_ctrl_c_ends_the_forward_and_the_job_keeps_running() -> None:
    job = tripled.run_async(1)
    proc = debug(job.job_id, "--json")
    try:
        assert proc.stdout is not None

        def complete(lines: list[str]) -> bool:
            try:
                json.loads("".join(lines))
            except ValueError:
                return False
            return True

        doc = json.loads("".join(read_until(proc.stdout, complete)))
        assert doc["job_id"] == job.job_id
        assert doc["address"] == f"127.0.0.1:{doc['port']}"
        assert doc["launch_config"]["connect"] == {"host": "127.0.0.1", "port": doc["port"]}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert proc.stdout.read() == ""  # one JSON document, nothing else
        assert job.status() is kinetic.JobStatus.RUNNING
    finally:
        end(proc)
        job.cancel()
        job.cleanup()


def test_not_a_debug_job_and_no_such_job() -> None:
    job = plain.run_async()
    job.result(timeout=120, cleanup=False)
    done = subprocess.run(
        [sys.executable, "-m", "kinetic", "jobs", "debug", job.job_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "was not submitted with debug=True" in done.stderr
    job.cleanup()
    gone = subprocess.run(
        [sys.executable, "-m", "kinetic", "jobs", "debug", "job-00000000"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gone.returncode == 3, gone.stderr
