"""The ``kinetic`` command line against real local jobs."""

from __future__ import annotations

import subprocess
import sys

import pytest

import kinetic

pytestmark = pytest.mark.local


@kinetic.run()
def shout(word: str) -> str:
    print(f"saying {word}")
    return word.upper()


@kinetic.run()
def broken() -> None:
    raise ValueError("no good")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetic._cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_jobs_commands() -> None:
    job = shout.run_async("hi")
    job.result(cleanup=False)
    listed = cli("jobs", "list")
    assert listed.returncode == 0
    assert job.job_id in listed.stdout
    assert cli("jobs", "status", job.job_id).stdout.strip() == "SUCCEEDED"
    assert "saying hi" in cli("jobs", "logs", job.job_id).stdout
    assert cli("jobs", "result", job.job_id).stdout.strip() == "'HI'"
    assert cli("jobs", "cleanup", job.job_id).returncode == 0
    assert job.status() is kinetic.JobStatus.NOT_FOUND


def test_failures_and_bad_ids_exit_non_zero() -> None:
    job = broken.run_async()
    with pytest.raises(ValueError, match="no good"):
        job.result(cleanup=False)
    status = cli("jobs", "status", job.job_id)
    assert status.returncode == 1
    assert "FAILED" in status.stdout
    assert "no good" in status.stdout
    result = cli("jobs", "result", job.job_id)
    assert result.returncode == 1
    assert "ValueError: no good" in result.stderr
    bad = cli("jobs", "status", "../etc")
    assert bad.returncode == 1
    assert "invalid job id" in bad.stderr
    assert cli("nonsense").returncode == 2


def test_batch_commands() -> None:
    batch = shout.run_async_map(["a", "b", "c"])
    batch.wait()
    out = cli("batch", "status", batch.group_id)
    assert out.returncode == 0
    assert out.stdout.split() == ["SUCCEEDED", "3"]
