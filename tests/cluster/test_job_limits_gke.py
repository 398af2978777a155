"""``kinetic.run(timeout=)`` and ``retries=`` on the testbed: the runner ends a job past its
limit, a Job that Kubernetes ends at its deadline (``DeadlineExceeded``) fails naming the
limit, and a job retried in its pod says its attempts."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

import kinetic
from kinetic import JobStatus
from tests.fix_cluster import GKETarget

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def sleeper(seconds: float) -> str:
    print("sleeping", flush=True)
    time.sleep(seconds)
    return "slept"


def kubectl(gke: GKETarget, *args: str) -> str:
    out = subprocess.run(
        ["kubectl", "--namespace", gke.namespace, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": gke.testbed.env["KUBECONFIG"]},
    )
    return out.stdout


def wait_running(job: kinetic.JobHandle) -> None:
    deadline = time.monotonic() + 120
    while job.status() is not JobStatus.RUNNING:
        assert time.monotonic() < deadline, "the job never ran"
        time.sleep(0.2)


def test_a_job_past_its_limit_fails_in_phase_execute_naming_it(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args(timeout=3))(sleeper).run_async(120)
    manifest = json.loads(kubectl(gke, "get", "job", job.k8s_name, "-o", "json"))
    assert manifest["spec"]["activeDeadlineSeconds"] == 603  # the backstop, past the limit
    assert manifest["metadata"]["annotations"]["kinetic/timeout"] == "3"
    with pytest.raises(kinetic.JobFailedError) as info:
        job.result(timeout=120, cleanup=False)
    assert info.value.phase == "execute"
    assert "time limit of 3 s (timeout=3)" in str(info.value)
    report = job.status_report()
    assert (report.status, report.phase) == (JobStatus.FAILED, "execute")
    assert "sleeping" in (job.logs() or "")  # the logs were uploaded before the kill
    job.cleanup()


def test_a_job_kubernetes_ends_at_its_deadline_fails_naming_the_limit(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args(timeout=300))(sleeper).run_async(200)
    wait_running(job)
    # The runner's limit is minutes away: Kubernetes' deadline comes first.
    kubectl(gke, "patch", "job", job.k8s_name, "-p", '{"spec":{"activeDeadlineSeconds":2}}')
    with pytest.raises(kinetic.JobFailedError) as info:
        job.result(timeout=120, cleanup=False)
    assert info.value.phase == "execute"
    assert "time limit of 300 s (timeout=300)" in str(info.value)
    assert "activeDeadlineSeconds=2" in str(info.value)
    report = job.status_report()
    assert (report.status, report.phase) == (JobStatus.FAILED, "execute")
    job.cleanup()


def flaky(calls: dict[str, int] = {}) -> int:  # noqa: B006 - the state shared by attempts
    """Fails on its first two calls in the same process, then returns the call count."""
    calls["n"] = calls.get("n", 0) + 1
    if calls["n"] < 3:
        raise ConnectionError(f"call {calls['n']} failed")
    return calls["n"]


def test_a_job_retried_in_its_pod_succeeds_and_says_its_attempts(gke: GKETarget) -> None:
    retries = kinetic.Retries(2, initial_delay=0.1, on=(ConnectionError,))
    job = kinetic.run(**gke.run_args(retries=retries))(flaky).run_async()
    assert job.result(timeout=120, cleanup=False) == 3
    report = job.status_report()
    assert report.attempt == 3
    assert [a.error for a in report.attempts] == [
        "ConnectionError: call 1 failed",
        "ConnectionError: call 2 failed",
    ]
    job.cleanup()


def fails(message: str) -> None:
    raise ConnectionError(message)


def test_a_running_job_says_its_attempt(gke: GKETarget) -> None:
    retries = kinetic.Retries(1, initial_delay=120)
    job = kinetic.run(**gke.run_args(retries=retries))(fails).run_async("lost it")
    deadline = time.monotonic() + 120
    while (report := job.status_report()).attempt is None:
        assert time.monotonic() < deadline, "the first attempt was never recorded"
        time.sleep(0.2)
    assert report.status is JobStatus.RUNNING
    assert report.attempt == 2
    assert [a.error for a in report.attempts] == ["ConnectionError: lost it"]
    job.cancel()
    job.cleanup()


def test_each_input_of_a_pod_per_input_batch_has_the_limit(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args(timeout=3))(sleeper)
    batch = fn.run_async_map([0.1, 120], pod_per_input=True)
    member = json.loads(
        kubectl(gke, "get", "jobs", "-l", f"group-id={batch.group_id}", "-o", "json")
    )["items"][0]
    assert member["spec"]["activeDeadlineSeconds"] == 603
    results = batch.results(timeout=180, return_exceptions=True)
    assert results[0] == "slept"
    assert isinstance(results[1], kinetic.JobFailedError)
    assert results[1].phase == "execute"
    assert "time limit of 3 s (timeout=3)" in str(results[1])


def fails_first(x: int) -> int:
    if os.environ["KINETIC_ATTEMPT"] == "0":
        raise ConnectionError(f"input {x} failed")
    return x


def test_a_pool_batch_limits_and_retries_its_inputs(gke: GKETarget) -> None:
    retries = kinetic.Retries(1, initial_delay=0.2, on=(ConnectionError,))
    fn = kinetic.run(**gke.run_args(timeout=3, retries=retries))(sleeper)
    results = fn.run_async_map([0.1, 120]).results(timeout=180, return_exceptions=True)
    assert results[0] == "slept"
    assert isinstance(results[1], kinetic.JobFailedError)  # not retried: a time limit
    assert results[1].phase == "execute"
    assert "time limit of 3 s (timeout=3)" in str(results[1])
    # The decorator's Retries is its batches' too: a failure on names, retried after 0.2 s,
    # by the pool's worker as by the pods of a batch with a pod per input.
    flaky = kinetic.run(**gke.run_args(retries=retries))(fails_first)
    for pod_per_input in (False, True):
        batch = flaky.run_async_map([1, 2], pod_per_input=pod_per_input)
        assert batch.results(timeout=180, cleanup=False) == [1, 2]
        assert [h.status_report().attempt for h in batch.jobs if h is not None] == [2, 2]
        batch.cleanup()


def evict(gke: GKETarget, job: kinetic.JobHandle) -> str:
    """Evict the job's pod through the Eviction API, once its function runs, as a node
    drain or a preemption would; the pod's name."""
    deadline = time.monotonic() + 120
    while "sleeping" not in (job.logs() or ""):
        assert time.monotonic() < deadline, "the function never started"
        time.sleep(0.2)
    (pod,) = kubectl(gke, "get", "pods", "-l", f"job-id={job.job_id}", "-o", "name").split()
    name = pod.removeprefix("pod/")
    eviction = {
        "apiVersion": "policy/v1beta1",  # the testbed's Kubernetes (1.20)
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": gke.namespace},
        "deleteOptions": {"gracePeriodSeconds": 1},
    }
    path = f"/api/v1/namespaces/{gke.namespace}/pods/{name}/eviction"
    subprocess.run(
        ["kubectl", "create", "--raw", path, "-f", "-"],
        input=json.dumps(eviction),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": gke.testbed.env["KUBECONFIG"]},
    )
    return name


def sleeps_on_its_first_attempt(seconds: float) -> str:
    attempt = os.environ["KINETIC_ATTEMPT"]
    if attempt == "0":
        sleeper(seconds)
    return attempt


def test_an_evicted_pod_is_replaced_and_its_attempt_counted(gke: GKETarget) -> None:
    # Retried whatever `on` names: a lost pod is no exception of the function.
    retries = kinetic.Retries(1, on=(KeyError,))
    fn = kinetic.run(**gke.run_args(retries=retries))(sleeps_on_its_first_attempt)
    job = fn.run_async(120)
    lost = evict(gke, job)
    assert job.result(timeout=180, cleanup=False) == "1"  # the waiter did not give up
    report = job.status_report()
    assert report.attempt == 2
    (first,) = report.attempts
    assert (first.number, first.phase) == (1, "preempted")
    assert lost in first.error
    job.cleanup()


def test_an_evicted_pod_without_retries_fails_the_job_as_preempted(gke: GKETarget) -> None:
    job = kinetic.run(**gke.run_args())(sleeper).run_async(120)
    evict(gke, job)
    with pytest.raises(kinetic.JobPreemptedError) as info:
        job.result(timeout=180, cleanup=False)
    assert info.value.phase == "preempted"
    report = job.status_report()
    assert (report.status, report.preempted) == (JobStatus.FAILED, True)
    job.cleanup()
