"""The run-time limit's pure parts: the Job's deadline, what a Job past it reports, how
the client reads a runner's time-limit record, and what ``jobs status`` prints."""

from __future__ import annotations

from typing import Any

import cloudpickle
import pytest

from kinetic._core import accelerators, k8s_spec, k8s_status
from kinetic._core.arg_checks import check_run_time_limit
from kinetic._core.status import JobStatus, StatusReport
from kinetic._engine.results import unwrap
from kinetic._exceptions import ConfigError, JobFailedError, JobTimeoutError, RemoteError
from runner import protocol
from runner.job import build_failure
from runner.time_limit import TimeLimitExceeded


def manifest(timeout: float | None) -> dict[str, Any]:
    template = k8s_spec.JobTemplate(
        namespace="ns",
        image="reg/img:t",
        bucket="p-kn-c-jobs",
        accelerator=accelerators.parse_accelerator("cpu"),
        output_dir="gs://p-kn-c-jobs/outputs/job-1234abcd",
        timeout=timeout,
    )
    return k8s_spec.job_manifest(template, "job-1234abcd")


def test_a_limited_job_has_a_deadline_past_its_limit_and_names_the_limit() -> None:
    m = manifest(90.5)
    assert m["spec"]["activeDeadlineSeconds"] == 91 + k8s_spec.DEADLINE_GRACE_S
    assert m["metadata"]["annotations"][k8s_spec.TIMEOUT_ANNOTATION] == "90.5"


def test_a_job_without_a_limit_has_no_deadline() -> None:
    m = manifest(None)
    assert "activeDeadlineSeconds" not in m["spec"]
    assert k8s_spec.TIMEOUT_ANNOTATION not in m["metadata"]["annotations"]


def job_past_deadline(annotations: dict[str, str], kind: str = "Failed") -> dict[str, Any]:
    return {
        "metadata": {"name": "kinetic-j", "annotations": annotations},
        "spec": {"activeDeadlineSeconds": 610},
        "status": {
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                }
            ]
        },
    }


def killed_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "kinetic-j-x", "creationTimestamp": "2026-11-28T00:00:00Z"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"state": {"terminated": {"reason": "Error", "exitCode": 137}}}],
        },
    }


@pytest.mark.parametrize("kind", ["Failed", "FailureTarget"])
def test_a_job_past_its_deadline_fails_in_phase_execute_naming_the_limit(kind: str) -> None:
    job = job_past_deadline({k8s_spec.TIMEOUT_ANNOTATION: "10"}, kind)
    for pods, lost in (([killed_pod()], None), ([], None), ([], "kinetic-j-x")):
        report = k8s_status.status_from_k8s(
            final=None, cancelled=False, job=job, pods=pods, lost_pod=lost
        )
        assert report.status is JobStatus.FAILED
        assert report.phase == "execute"
        assert report.reason is not None
        assert "time limit of 10 s (timeout=10)" in report.reason
        assert "activeDeadlineSeconds=610" in report.reason


def test_a_deadline_kinetic_did_not_set_is_still_named() -> None:
    report = k8s_status.status_from_k8s(
        final=None, cancelled=False, job=job_past_deadline({}), pods=[]
    )
    assert report.status is JobStatus.FAILED
    assert report.phase == "execute"
    assert report.reason == (
        "Kubernetes ended its Job at the Job's deadline (activeDeadlineSeconds=610)"
    )


def test_the_runners_record_wins_over_the_deadline() -> None:
    final = {"state": "failed", "phase": "install", "error": "no such package", "error_type": None}
    report = k8s_status.status_from_k8s(
        final=final, cancelled=False, job=job_past_deadline({}), pods=[]
    )
    assert (report.phase, report.reason) == ("install", "no such package")


def time_limit_payload() -> dict[str, Any]:
    try:
        raise TimeLimitExceeded(protocol.time_limit_message(2))
    except TimeLimitExceeded as exc:
        data, final = build_failure("execute", exc, user=False)
    assert final["error_type"] == protocol.TIME_LIMIT_ERROR_TYPE
    payload: dict[str, Any] = cloudpickle.loads(data)
    return payload


def test_the_client_raises_a_job_failure_naming_phase_and_limit() -> None:
    with pytest.raises(JobFailedError) as info:
        unwrap(time_limit_payload(), "job-1234abcd")
    err = info.value
    assert not isinstance(err, (RemoteError, JobTimeoutError))
    assert isinstance(err, RuntimeError)
    assert err.phase == "execute"
    assert "phase 'execute'" in str(err)
    assert "timeout=2" in str(err)


def test_the_runner_error_type_names_the_exception_class() -> None:
    cls = TimeLimitExceeded
    assert f"{cls.__module__}.{cls.__qualname__}" == protocol.TIME_LIMIT_ERROR_TYPE


@pytest.mark.parametrize("bad", [0, -1, "10", True, float("nan")])
def test_a_limit_must_be_a_positive_number(bad: object) -> None:
    with pytest.raises(ConfigError, match="timeout"):
        check_run_time_limit(bad)


def test_a_limit_is_seconds_as_a_float() -> None:
    assert check_run_time_limit(None) is None
    assert check_run_time_limit(3) == 3.0


def test_jobs_status_line_names_the_phase() -> None:
    from kinetic._cli.jobs import status_line

    assert status_line(StatusReport(JobStatus.SUCCEEDED)) == "SUCCEEDED"
    failed = StatusReport(JobStatus.FAILED, reason="it ran too long", phase="execute")
    assert status_line(failed) == "FAILED  (in phase execute: it ran too long)"
    assert status_line(StatusReport(JobStatus.FAILED, reason="gone")) == "FAILED  (gone)"
