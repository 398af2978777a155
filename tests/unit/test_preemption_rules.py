"""A GKE job's pod lost mid-attempt, as its replacement's runner counts it
(runner/preemption.py), and what the caller then gets. Files in a temporary folder
stand for the bucket (the runner's own file store)."""

from __future__ import annotations

import json
from pathlib import Path

import cloudpickle
import pytest

from kinetic import JobFailedError, JobPreemptedError
from kinetic._engine.results import unwrap
from runner import preemption, protocol
from runner.job import build_failure
from runner.store import FileStore

JOB = "job-0123abcd"


def store(tmp_path: Path) -> FileStore:
    (tmp_path / JOB).mkdir()
    return FileStore(tmp_path)


def test_outside_a_replaceable_pod_nothing_is_read_or_written(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert preemption.pod_name({}) is None
    assert preemption.resume(s, JOB, None) == (1, [])
    preemption.mark(s, JOB, None, 1)
    assert list((tmp_path / JOB).iterdir()) == []


def test_a_replacement_counts_the_lost_attempt_and_keeps_the_earlier_ones(tmp_path: Path) -> None:
    s = store(tmp_path)
    pod = preemption.pod_name({protocol.POD_ENV: "kinetic-j-abcde"})
    assert preemption.resume(s, JOB, pod) == (1, [])  # the first pod
    preemption.mark(s, JOB, pod, 1)
    failed: protocol.AttemptRecord = {
        "attempt": 1,
        "started": 1.0,
        "ended": 2.0,
        "phase": "execute",
        "error": "OSError: flaky",
        "error_type": "builtins.OSError",
    }
    s.write(protocol.attempts_key(JOB), protocol.dump_json([failed]))
    preemption.mark(s, JOB, pod, 2)  # attempt 2 starts, then the pod is lost
    attempt, attempts = preemption.resume(s, JOB, "kinetic-j-fghij")
    assert attempt == 3
    assert attempts[0] == failed
    lost = attempts[1]
    assert (lost["attempt"], lost["phase"]) == (2, protocol.PREEMPTED_PHASE)
    assert lost["error_type"] == protocol.PREEMPTED_ERROR_TYPE
    assert "kinetic-j-abcde" in lost["error"]
    # Recorded at once: the replacement may be lost as well before anything of its own.
    assert json.loads(s.read(protocol.attempts_key(JOB))) == attempts


def test_a_lost_attempt_is_retried_within_the_count_whatever_on_names() -> None:
    only_io: protocol.RetriesRecord = {
        "count": 2,
        "backoff": 2.0,
        "initial_delay": 1.0,
        "on": ["builtins.OSError"],
    }
    assert preemption.allowed(only_io, 2)
    assert preemption.allowed(only_io, 3)
    assert not preemption.allowed(only_io, 4)
    assert not preemption.allowed(None, 2)  # no retries=: a lost pod ends the job


def test_the_error_type_names_the_exception_the_runner_records() -> None:
    kind = preemption.Preempted
    assert f"{kind.__module__}.{kind.__qualname__}" == protocol.PREEMPTED_ERROR_TYPE


def test_a_job_lost_with_no_retry_left_raises_job_preempted_error() -> None:
    lost = preemption.Preempted("attempt 1's pod p was lost before it finished")
    data, record = build_failure(protocol.PREEMPTED_PHASE, lost, user=False)
    with pytest.raises(JobPreemptedError) as caught:
        unwrap(cloudpickle.loads(data), JOB)
    assert isinstance(caught.value, JobFailedError)  # and so a RuntimeError
    assert caught.value.phase == "preempted"
    assert record["phase"] == "preempted"


def test_a_replacement_finds_a_job_that_ended_already_settled(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert not preemption.settled(s, JOB, "kinetic-j-fghij")
    s.write(protocol.final_key(JOB), protocol.dump_json({"state": "succeeded"}))
    assert preemption.settled(s, JOB, "kinetic-j-fghij")  # its outcome stands: no rerun
    assert not preemption.settled(s, JOB, None)  # outside a replaceable pod: not asked
