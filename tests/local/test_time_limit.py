"""``kinetic.run(timeout=)``: a job's run-time limit, enforced by its runner on real
local processes (:mod:`runner.time_limit`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kinetic

pytestmark = pytest.mark.local


@kinetic.run(timeout=2)
def sleeps_with_a_child(seconds: float) -> str:
    """Starts a child process (in the job's process group), then sleeps."""
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    print(f"child {child.pid}", flush=True)
    time.sleep(seconds)
    return "woke"


@kinetic.run(timeout=2)
def swallows(seconds: float) -> str:
    """Catches everything, the limit included, and goes on sleeping."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(deadline - time.monotonic())
        except BaseException:  # noqa: BLE001, S112 - the point of the test
            continue
    return "woke"


@kinetic.run(timeout=30)
def quick(x: int) -> int:
    return x + 1


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_group_gone(pgid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return True
        time.sleep(0.05)
    return False


def test_a_job_past_its_limit_fails_in_phase_execute_and_its_group_is_gone(
    kinetic_env: Path,
) -> None:
    job = sleeps_with_a_child.run_async(60)
    launch = json.loads((kinetic_env / "storage" / job.job_id / "launch.json").read_text())
    with pytest.raises(kinetic.JobFailedError) as info:
        job.result(timeout=60)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert not isinstance(err, kinetic.JobTimeoutError)  # the wait's own bound is another error
    assert err.phase == "execute"
    assert "time limit of 2 s (timeout=2)" in str(err)
    assert "time.sleep" in "".join(getattr(err, "__notes__", []))  # where it was stuck
    # The job's processes, the child it started included, are gone.
    assert _wait_group_gone(launch["pgid"])
    report = job.status_report()
    assert report.status is kinetic.JobStatus.FAILED
    assert report.phase == "execute"
    assert report.reason is not None
    assert "timeout=2" in report.reason


def test_the_cli_says_the_limit_and_the_phase(kinetic_env: Path) -> None:
    job = sleeps_with_a_child.run_async(60)
    with pytest.raises(kinetic.JobFailedError):
        job.result(timeout=60)
    out = subprocess.run(
        [sys.executable, "-m", "kinetic", "jobs", "status", job.job_id],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 1
    assert "FAILED" in out.stdout
    assert "phase execute" in out.stdout
    assert "time limit of 2 s (timeout=2)" in out.stdout


def test_a_job_that_swallows_the_limit_is_killed_all_the_same(kinetic_env: Path) -> None:
    job = swallows.run_async(120)
    launch = json.loads((kinetic_env / "storage" / job.job_id / "launch.json").read_text())
    with pytest.raises(kinetic.JobFailedError, match=r"timeout=2") as info:
        job.result(timeout=90)
    assert info.value.phase == "execute"
    assert _wait_group_gone(launch["pgid"])


def test_a_job_within_its_limit_returns_its_value() -> None:
    assert quick(1) == 2


def test_the_limit_is_checked_at_decoration() -> None:
    for bad in (0, -1, "10", True):
        with pytest.raises(kinetic.ConfigError, match="timeout"):
            kinetic.run(timeout=bad)  # type: ignore[arg-type]


@kinetic.run(timeout=2)
def naps(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_each_input_of_a_local_batch_has_the_limit() -> None:
    batch = naps.run_async_map([0.1, 60, 0.2], retries=2, max_concurrent=1)
    results = batch.results(timeout=90, return_exceptions=True, cleanup=False)
    assert results[0] == 0.1
    assert results[2] == 0.2  # the worker went on after the input past its limit
    err = results[1]
    assert isinstance(err, kinetic.JobFailedError)
    assert err.phase == "execute"
    assert "time limit of 2 s (timeout=2)" in str(err)
    member = batch.jobs[1]
    assert member is not None
    assert member.status_report().phase == "execute"
    batch.cleanup()


def test_an_input_that_swallows_the_limit_ends_its_worker() -> None:
    batch = swallows.run_async_map([120, 0], max_concurrent=1)
    results = batch.results(timeout=90, return_exceptions=True)
    assert isinstance(results[0], kinetic.JobFailedError)
    assert "killed by signal 9" in str(results[0])
    assert results[1] == "woke"
