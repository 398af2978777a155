"""Batches on the GKE backend with ``pod_per_input=True``, on the real testbed: one
Kubernetes Job per input (the default, a worker pool, is tested in test_gke_pool.py).

Submitted through the public API (``run_async_map(..., backend="gke")``); pods run
the runner's member mode and write their outcomes to fake-gcs-server.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import Counter
from typing import Any

import anyio
import pytest

import kinetic
from kinetic import JobStatus
from kinetic._engine import runtime
from tests.fix_cluster import GKETarget, run_python

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def square(x: int) -> int:
    print(f"squaring {x}", flush=True)
    return x * x


def flaky(x: int) -> int:
    """Input 1 fails on its first attempt only; input 3 always fails."""
    if x == 3 or (x == 1 and os.environ.get("KINETIC_ATTEMPT") == "0"):
        raise ValueError(f"bad input {x}")
    return x * 10


def sleeper(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def batch_jobs(gke: GKETarget, group_id: str) -> list[str]:
    out = subprocess.run(
        ["kubectl", "get", "jobs", "-n", gke.namespace, "-l", f"group-id={group_id}", "-o", "name"],
        capture_output=True,
        text=True,
        env={**os.environ},
        check=True,
    )
    return out.stdout.split()


def batch_pods(gke: GKETarget, group_id: str, phase: str) -> list[str]:
    out = subprocess.run(
        ["kubectl", "get", "pods", "-n", gke.namespace, "-l", f"group-id={group_id}"]
        + ["--field-selector", f"status.phase={phase}", "-o", "name"],
        capture_output=True,
        text=True,
        env={**os.environ},
        check=True,
    )
    return out.stdout.split()


def test_results_in_input_order_within_the_request_and_write_budget(gke: GKETarget) -> None:
    n, limit = 6, 3
    fn = kinetic.run(**gke.run_args())(square)
    counts: dict[str, Any] = {}

    async def main() -> None:
        backend = gke.backend()
        client = backend.client
        k8s: Counter[str] = Counter()
        opened = client._open
        writes: list[str] = []
        store_write = backend.storage.write

        async def counting_open(method: str, path: str, **kw: Any) -> Any:
            k8s[method] += 1
            return await opened(method, path, **kw)

        async def counting_write(key: str, data: bytes, **kw: Any) -> None:
            writes.append(key)
            await store_write(key, data, **kw)

        client._open = counting_open  # type: ignore[method-assign]
        backend.storage.write = counting_write  # type: ignore[method-assign]
        try:
            batch = await fn.aio.run_async_map(range(n), max_concurrent=limit, pod_per_input=True)
            seen_running = 0
            async for _ in batch.as_completed(timeout=180):
                seen_running = max(seen_running, batch.progress()["running"])
            pod_objects = gke.object_names(f"_groups/{batch.group_id}/")
            counts["submit_writes"] = list(writes)
            values = await batch.results(timeout=60)  # cleanup: one delete for all Jobs
            counts.update(values=values, k8s=dict(k8s), pods=pod_objects, running=seen_running)
            counts["group_id"] = batch.group_id
        finally:
            await runtime.aclose_backends()

    anyio.run(main)
    assert counts["values"] == [i * i for i in range(n)]
    assert counts["running"] <= limit
    # Kubernetes: one write per input (creating its Job), plus one per batch (cleanup).
    assert counts["k8s"].get("POST") == n
    assert counts["k8s"].get("DELETE") == 1
    assert set(counts["k8s"]) <= {"GET", "POST", "DELETE"}
    # Storage: the submitter writes nothing per input ...
    group = f"_groups/{counts['group_id']}/"
    per_input = [
        k for k in counts["submit_writes"] if k.startswith((group + "results/", group + "logs/"))
    ]
    assert per_input == []
    # Per batch: recording, fn.pkl, context (unless stored already), manifest, and the
    # inputs in chunks of up to 64 (here one).
    chunks = [k for k in counts["submit_writes"] if k.startswith(group + "inputs/")]
    assert len(chunks) == 1
    assert len(counts["submit_writes"]) <= 5
    # ... and each input's pod wrote exactly two objects: its outcome and its logs.
    by_pod = [k for k in counts["pods"] if k.startswith((group + "results/", group + "logs/"))]
    assert len(by_pod) == 2 * n
    assert batch_jobs(gke, counts["group_id"]) == []


def test_failing_input_is_a_batch_error_and_retries_rerun(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args())(flaky)
    batch = fn.run_async_map([0, 1, 2, 3], retries=1, max_concurrent=4, pod_per_input=True)
    with pytest.raises(kinetic.BatchError) as info:
        batch.results(timeout=180, cleanup=False)
    err = info.value
    assert err.partial_results == [0, 10, 20, None]  # input 1 succeeded on its retry
    assert [j.group_index for j in err.failures] == [3]
    failed = batch.jobs[3]
    assert failed is not None
    with pytest.raises(ValueError, match="bad input 3"):
        failed.result(cleanup=False)
    assert "bad input 3" in failed.logs()
    # Input 1 ran twice (a second Job, attempt suffix); input 3 twice and failed.
    names = batch_jobs(gke, batch.group_id)
    assert len(names) == 6
    batch.cleanup()


def test_cancel_stops_queued_inputs(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args())(sleeper)
    batch = fn.run_async_map([60.0] * 6, max_concurrent=2, pod_per_input=True)

    def two_running() -> bool:
        running = Counter(s for _, s in batch.statuses())[JobStatus.RUNNING] == 2
        return running and len(batch_pods(gke, batch.group_id, "Running")) == 2

    deadline = time.monotonic() + 90
    while not two_running():
        assert time.monotonic() < deadline, batch.statuses()
        time.sleep(0.5)
    started = time.monotonic()
    batch.cancel()
    out = batch.results(timeout=60, return_exceptions=True, cleanup=False)
    assert time.monotonic() - started < 30
    assert all(isinstance(v, kinetic.JobCancelledError | kinetic.JobFailedError) for v in out)
    assert all(s is JobStatus.FAILED for _, s in batch.statuses())
    assert len(batch.failures()) == 6
    assert batch_jobs(gke, batch.group_id) == []  # the two running ones deleted, no others
    deadline = time.monotonic() + 60
    while batch_pods(gke, batch.group_id, "Running"):
        assert time.monotonic() < deadline, "the cancelled inputs' pods still run"
        time.sleep(0.5)
    batch.cleanup()


def test_attach_batch_from_another_process_finishes_it(gke: GKETarget) -> None:
    # The submitting process records the batch, starts its first Jobs and exits at once.
    code = f"""
import os, kinetic
from tests.cluster.test_gke_batch import square
fn = kinetic.run(**{gke.run_args()!r})(square)
batch = fn.run_async_map(range(5), max_concurrent=2, pod_per_input=True)
print(batch.group_id, flush=True)
os._exit(0)
"""
    out = run_python(code)
    group_id = out.stdout.strip().splitlines()[-1]
    batch = kinetic.attach_batch(group_id, project=gke.project, cluster=gke.cluster, backend="gke")
    assert batch.results(timeout=180) == [i * i for i in range(5)]
    assert json.dumps(batch.status_counts()) == json.dumps({"SUCCEEDED": 5})


def fail_on_zero(x: float) -> float:
    if x == 0:
        raise RuntimeError("zero")
    time.sleep(x)
    return x


def test_fail_fast_cancels_running_siblings_and_queued_inputs(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args())(fail_on_zero)
    batch = fn.run_async_map(
        [60.0, 0, 60.0, 60.0, 60.0],
        max_concurrent=3,
        fail_fast=True,
        cancel_running_on_fail=True,
        pod_per_input=True,
    )
    out = batch.results(timeout=120, return_exceptions=True, cleanup=False)
    assert isinstance(out[1], RuntimeError)
    assert all(isinstance(v, kinetic.JobCancelledError) for i, v in enumerate(out) if i != 1)
    assert len(batch_jobs(gke, batch.group_id)) == 0  # never more than the first three
    batch.cleanup()


def test_pod_deleted_mid_run_fails_that_input_with_the_reason(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args())(sleeper)
    batch = fn.run_async_map([0.1, 60.0], max_concurrent=2, pod_per_input=True)
    victim = batch.jobs[1]
    assert victim is not None

    def kill_when_running() -> None:
        selector = ["-l", f"job-id={victim.job_id}", "--field-selector", "status.phase=Running"]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["kubectl", "get", "pods", "-n", gke.namespace, *selector, "-o", "name"],
                capture_output=True,
                text=True,
                env={**os.environ},
                check=True,
            )
            if out.stdout.strip():
                subprocess.run(
                    ["kubectl", "delete", "-n", gke.namespace, *out.stdout.split()]
                    + ["--grace-period=0", "--force", "--wait=false"],
                    capture_output=True,
                    env={**os.environ},
                    check=True,
                )
                return
            time.sleep(0.3)

    # The batch is being driven (results() awaits it) when the pod disappears.
    killer = threading.Thread(target=kill_when_running)
    killer.start()
    out = batch.results(timeout=120, return_exceptions=True)
    killer.join()
    assert out[0] == 0.1
    assert isinstance(out[1], kinetic.JobFailedError)
    assert "deleted" in str(out[1])


def test_inputs_that_cannot_start_fail_after_the_grace(gke: GKETarget) -> None:
    image = gke.image.rsplit(":", 1)[0] + ":no-such-tag"
    fn = kinetic.run(**gke.run_args(container_image=image))(square)
    batch = fn.run_async_map([1, 2], retries=2, pod_per_input=True)
    out = batch.results(timeout=90, return_exceptions=True, cleanup=False)
    assert all(isinstance(v, kinetic.JobFailedError) and v.phase == "start" for v in out), out
    deadline = time.monotonic() + 30
    while batch_jobs(gke, batch.group_id):  # stuck Jobs are deleted, never retried
        assert time.monotonic() < deadline
        time.sleep(0.5)
    batch.cleanup()


def test_missing_namespace_is_a_config_error_and_leaves_no_batch(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args(namespace="no-such-namespace"))(square)
    with pytest.raises(kinetic.ConfigError, match="no-such-namespace"):
        fn.run_async_map([1, 2], pod_per_input=True)
    assert [k for k in gke.object_names() if k.startswith("_groups/")] == []
