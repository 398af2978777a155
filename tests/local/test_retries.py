"""``kinetic.run(retries=...)``: a single job's runner runs the function again after a
matching exception, on real local processes (:mod:`kinetic._core.retries`)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kinetic

pytestmark = pytest.mark.local


class Flaky(Exception):
    pass


def _calls(ledger: str) -> int:
    """Count this call in ``ledger`` (a file: attempts share no memory with the test)."""
    with open(ledger, "a") as f:
        f.write("call\n")
    return len(Path(ledger).read_text().splitlines())


@kinetic.run(retries=2)
def fails_twice(ledger: str) -> str:
    n = _calls(ledger)
    if n < 3:
        raise Flaky(f"call {n} failed")
    return f"ok after {n}"


@kinetic.run(retries=kinetic.Retries(3, initial_delay=0.01, on=(ConnectionError,)))
def raises_value_error(ledger: str) -> None:
    _calls(ledger)
    raise ValueError("not a connection problem")


@kinetic.run(retries=kinetic.Retries(3, initial_delay=0.01, on=(OSError,)))
def raises_a_subclass(ledger: str) -> str:
    if _calls(ledger) < 2:
        raise FileNotFoundError("not yet")
    return "found"


@kinetic.run(retries=kinetic.Retries(3, initial_delay=0.2, backoff=3.0))
def always_fails(ledger: str) -> None:
    raise Flaky(f"call {_calls(ledger)} failed")


@kinetic.run(retries=kinetic.Retries(1, initial_delay=60))
def fails_then_waits(ledger: str) -> None:
    raise Flaky(f"call {_calls(ledger)} failed")


@kinetic.run(retries=3, timeout=1)
def too_slow(ledger: str) -> None:
    _calls(ledger)
    time.sleep(30)


def test_a_job_that_fails_twice_succeeds_on_its_third_attempt(tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger")
    job = fails_twice.run_async(ledger)
    job_id = job.job_id
    assert job.result(timeout=60, cleanup=False) == "ok after 3"
    assert job.job_id == job_id  # one job, one handle, across its attempts
    report = job.status_report()
    assert report.status is kinetic.JobStatus.SUCCEEDED
    assert report.attempt == 3
    assert [a.number for a in report.attempts] == [1, 2]
    assert [a.error for a in report.attempts] == ["Flaky: call 1 failed", "Flaky: call 2 failed"]
    assert all(a.error_type.endswith(".Flaky") and a.phase == "execute" for a in report.attempts)
    logs = job.logs() or ""
    assert "attempt 1 of job" in logs
    assert "attempt 2 of 3" in logs


def test_an_exception_not_named_in_on_is_not_retried(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    job = raises_value_error.run_async(str(ledger))
    with pytest.raises(ValueError, match="not a connection problem"):
        job.result(timeout=60, cleanup=False)
    assert ledger.read_text().splitlines() == ["call"]
    report = job.status_report()
    assert report.attempt == 1
    assert report.attempts == ()


def test_a_subclass_of_a_type_in_on_is_retried(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    assert raises_a_subclass(str(ledger)) == "found"
    assert len(ledger.read_text().splitlines()) == 2


def test_the_last_failure_is_raised_and_the_delays_grow(tmp_path: Path) -> None:
    job = always_fails.run_async(str(tmp_path / "ledger"))
    with pytest.raises(Flaky, match="call 4 failed"):
        job.result(timeout=60, cleanup=False)
    report = job.status_report()
    assert report.attempt == 4
    attempts = report.attempts
    assert [a.number for a in attempts] == [1, 2, 3]
    # The recorded times show the back-off: each wait at least its delay (0.2, 0.6 s).
    gaps = [later.started - earlier.ended for earlier, later in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.2
    assert gaps[1] >= 0.6


def test_a_running_job_says_its_attempt_and_earlier_failures(tmp_path: Path) -> None:
    job = fails_then_waits.run_async(str(tmp_path / "ledger"))
    deadline = time.monotonic() + 60
    while (report := job.status_report()).attempt is None:
        assert time.monotonic() < deadline, "the first attempt was never recorded"
        time.sleep(0.1)
    assert report.status is kinetic.JobStatus.RUNNING
    assert report.attempt == 2
    assert [a.error for a in report.attempts] == ["Flaky: call 1 failed"]
    job.cancel()


def test_a_run_time_limit_is_not_retried(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    job = too_slow.run_async(str(ledger))
    with pytest.raises(kinetic.JobFailedError, match="timeout=1"):
        job.result(timeout=60, cleanup=False)
    assert ledger.read_text().splitlines() == ["call"]


def test_the_cli_shows_the_attempts(tmp_path: Path) -> None:
    job = fails_twice.run_async(str(tmp_path / "ledger"))
    job.result(timeout=60, cleanup=False)
    text = subprocess.run(
        [sys.executable, "-m", "kinetic", "jobs", "status", job.job_id],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = text.splitlines()
    assert lines[0] == "SUCCEEDED  attempt 3"
    assert "attempt 1 failed at " in lines[1]
    assert lines[1].endswith("in phase execute: Flaky: call 1 failed")
    assert lines[2].endswith("in phase execute: Flaky: call 2 failed")
    document = json.loads(
        subprocess.run(
            [sys.executable, "-m", "kinetic", "jobs", "status", job.job_id, "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert document["attempt"] == 3
    assert [a["number"] for a in document["attempts"]] == [1, 2]
