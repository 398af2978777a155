"""The status rules of batch inputs and of jobs that cannot start: pure, no event loop.

Both backends (local, GKE: per-input and pool) answer an input's status with these
rules; these tests pin what each record means.
"""

from __future__ import annotations

import pytest

from kinetic._core.status import (
    GPU_WAIT_REASON,
    NO_BATCH_REASON,
    START_PHASE,
    JobStatus,
    StatusReport,
    could_not_start,
    input_report,
    settled_input_report,
    start_failure,
    start_grace_left,
    stopped_report,
    summarized_input_report,
    unsettled_input_report,
)
from runner import protocol


def test_a_success_header_is_succeeded() -> None:
    header = protocol.outcome_header(
        3, {"state": "succeeded", "phase": None, "error": None, "error_type": None}
    )
    assert header == {"attempt": 3, "state": "succeeded"}
    # The header counts retries (0 first); the report counts attempts (1 first), as a
    # single job's does, and only for an input that was retried.
    assert input_report(header) == StatusReport(JobStatus.SUCCEEDED, attempt=4)
    assert input_report({"state": "succeeded", "attempt": 0}) == StatusReport(JobStatus.SUCCEEDED)


def test_a_failure_header_carries_its_reason_and_phase() -> None:
    header = protocol.outcome_header(
        0,
        {
            "state": "failed",
            "phase": "execute",
            "error": "ValueError: boom",
            "error_type": "ValueError",
        },
    )
    report = input_report(header)
    assert report == StatusReport(JobStatus.FAILED, reason="ValueError: boom", phase="execute")
    assert not report.cancelled
    # A header that names no error still fails with a reason.
    assert input_report({"state": "failed"}).reason == "failed"


def test_a_cancelled_header_is_failed_and_marked_cancelled() -> None:
    report = input_report(protocol.cancelled_header())
    assert report == StatusReport(JobStatus.FAILED, reason="cancelled", cancelled=True)


def test_a_batch_that_could_not_run_fails_its_inputs_with_its_phase() -> None:
    stop = protocol.stop_record("failed", "ModuleNotFoundError: no module named x", "deserialize")
    report = stopped_report(stop)
    assert report.status is JobStatus.FAILED
    assert report.reason == "ModuleNotFoundError: no module named x"
    assert report.phase == "deserialize"
    assert not report.cancelled


@pytest.mark.parametrize("reason", ["cancelled", "fail_fast"])
def test_a_stopped_batch_cancels_the_inputs_that_never_ran(reason: protocol.StopReason) -> None:
    report = stopped_report(protocol.stop_record(reason, "input 4 failed"))
    assert report.status is JobStatus.FAILED
    assert report.cancelled
    assert report.reason == f"not run: the batch stopped ({reason}: input 4 failed)"
    assert report.phase is None


def test_the_outcome_settles_before_the_stop_record() -> None:
    stop = protocol.stop_record("cancelled", "the batch was cancelled")
    ok: protocol.OutcomeHeader = {"state": "succeeded", "attempt": 0}
    # An input that finished before its batch stopped keeps its outcome.
    assert settled_input_report(ok, stop) == StatusReport(JobStatus.SUCCEEDED)
    assert settled_input_report(None, stop) == stopped_report(stop)
    assert settled_input_report(None, None) is None


def test_unsettled_inputs_are_pending_running_or_not_found() -> None:
    assert unsettled_input_report(recorded=False, running=True) == StatusReport(
        JobStatus.NOT_FOUND, reason=NO_BATCH_REASON
    )
    assert unsettled_input_report(recorded=True, running=False) == StatusReport(JobStatus.PENDING)
    assert unsettled_input_report(recorded=True, running=True) == StatusReport(JobStatus.RUNNING)
    waiting = unsettled_input_report(recorded=True, running=True, waiting=GPU_WAIT_REASON)
    assert waiting == StatusReport(JobStatus.PENDING, reason=GPU_WAIT_REASON)
    # A batch nobody drives is not waiting for anything: merely pending.
    idle = unsettled_input_report(recorded=True, running=False, waiting=GPU_WAIT_REASON)
    assert idle == StatusReport(JobStatus.PENDING)


def test_start_grace_counts_down_from_when_the_job_got_stuck() -> None:
    assert start_grace_left(stuck_since=100.0, now=100.0, grace=300.0) == 300.0
    assert start_grace_left(stuck_since=100.0, now=350.0, grace=300.0) == 50.0
    assert start_grace_left(stuck_since=100.0, now=400.0, grace=300.0) == 0.0
    assert start_grace_left(stuck_since=100.0, now=401.0, grace=300.0) < 0
    assert start_grace_left(stuck_since=5.0, now=5.0, grace=0.0) == 0.0  # no grace at all


def test_one_wording_for_a_job_that_could_not_start() -> None:
    why = "0/1 nodes are available: unschedulable"
    assert could_not_start(why, 300.0) == f"the job could not start within 300s: {why}"
    assert could_not_start(why, 2.5, subject="the worker pool") == (
        f"the worker pool could not start within 2.5s: {why}"
    )
    failed = start_failure(why, 300.0)
    assert failed == StatusReport(
        JobStatus.FAILED, reason=could_not_start(why, 300.0), phase=START_PHASE
    )
    assert failed.status.is_terminal


def test_a_cleaned_up_batch_summary_keeps_each_inputs_state() -> None:
    summary = {"states": {"1": "failed", "2": "cancelled"}, "others": "succeeded"}
    assert summarized_input_report(summary, 0) == StatusReport(JobStatus.SUCCEEDED)
    failed = summarized_input_report(summary, 1)
    assert failed is not None
    assert (failed.status, failed.cancelled) == (JobStatus.FAILED, False)
    cancelled = summarized_input_report(summary, 2)
    assert cancelled is not None
    assert cancelled.cancelled
    # A summary written before every input was accounted for has no "others".
    assert summarized_input_report({"states": {"1": "failed"}}, 0) is None
    assert summarized_input_report(None, 0) is None


def test_an_input_whose_pod_was_lost_with_no_retry_left_is_preempted() -> None:
    header = protocol.ended_header("failed", 0, "pod p was deleted", "preempted")
    report = input_report(header)
    assert (report.status, report.phase, report.preempted) == (JobStatus.FAILED, "preempted", True)
    assert not input_report(protocol.ended_header("failed", 0, "E", "execute")).preempted
