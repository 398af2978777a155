"""Batches on the GKE backend run by a worker pool (the default), on the real testbed.

One Kubernetes Job per batch; its pods run ``python -m runner.pool``, claim inputs in
fake-gcs-server with create-if-absent preconditions and write their outcomes there.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

import kinetic
from kinetic import JobStatus
from kinetic._engine import runtime
from runner import protocol
from runner.pool.coordinator import commits
from tests.cluster.test_gke_batch import batch_jobs, batch_pods
from tests.fix_cluster import GKETarget, run_python

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def _leaderless(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leaderless pool (not the default engine), unless a test names its engine:
    these tests look at its claims, bursts and leases."""
    monkeypatch.setenv("KINETIC_GKE_POOL_ENGINE", "pool")


def triple(x: int) -> int:
    return 3 * x


def pause(x: int) -> int:
    print(f"pausing on {x}", flush=True)
    time.sleep(0.5)  # a worker holds a claim almost all the time: the kill lands in one
    return x


def marked(x: int, bucket: str, prefix: str) -> int:
    """An input with a side effect: each run of it leaves an object in the bucket (one
    request to the storage emulator, which the pods reach as the runner does)."""
    import urllib.parse
    import urllib.request
    import uuid

    time.sleep(0.1)
    name = urllib.parse.quote(f"{prefix}{x:05d}.{uuid.uuid4().hex[:8]}", safe="")
    url = f"{os.environ['STORAGE_EMULATOR_HOST']}/upload/storage/v1/b/{bucket}/o"
    request = urllib.request.Request(f"{url}?uploadType=media&name={name}", b"", method="POST")
    urllib.request.urlopen(request, timeout=30).close()
    return x


@contextlib.contextmanager
def marked_pool(
    gke: GKETarget,
    n: int,
    workers: int,
    progress: Callable[[GKETarget, str], int] | None = None,
    at: int = 60,
) -> Iterator[tuple[Any, str]]:
    """A pool batch of ``n`` :func:`marked` inputs (and the prefix of their marks) once
    ``progress`` reaches ``at`` (by default, 60 outcomes are in: :func:`covered`);
    cleaned up after, so that a failed test leaves no pool running on the testbed."""
    prefix = f"ran/{uuid.uuid4().hex}/"
    fn = kinetic.run(**gke.run_args())(marked)
    batch = fn.run_async_map([(i, gke.bucket, prefix) for i in range(n)], max_concurrent=workers)
    try:
        deadline = time.monotonic() + 120
        while (progress or covered)(gke, batch.group_id) < at:
            assert time.monotonic() < deadline, "the pool made no progress"
            time.sleep(0.3)
        yield batch, prefix
    finally:
        batch.cleanup()


def runs_of(gke: GKETarget, prefix: str) -> Counter[int]:
    """How many times each input of :func:`marked` ran (side effects done)."""
    return Counter(
        int(name.removeprefix(prefix).split(".")[0]) for name in gke.object_names(prefix)
    )


def sleeper(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def kubectl(gke: GKETarget, *args: str) -> str:
    out = subprocess.run(
        ["kubectl", "-n", gke.namespace, *args],
        capture_output=True,
        text=True,
        env={**os.environ},
        check=True,
    )
    return out.stdout


def covered(gke: GKETarget, group_id: str) -> int:
    """How many inputs have outcomes in the batch's bursts (by their names)."""
    prefix = protocol.group_bursts_prefix(group_id)
    spans = [protocol.parse_burst_name(k.removeprefix(prefix)) for k in gke.object_names(prefix)]
    return len({i for s in spans if s is not None for i in range(s[0], s[1])})


def test_500_inputs_on_4_workers_within_the_request_and_write_budget(gke: GKETarget) -> None:
    n, workers = 500, 4
    fn = kinetic.run(**gke.run_args())(triple)
    seen: dict[str, Any] = {}

    async def main() -> None:
        backend = gke.backend()
        k8s: Counter[str] = Counter()
        opened = backend.client._open

        async def counting_open(method: str, path: str, **kw: Any) -> Any:
            k8s[method] += 1
            return await opened(method, path, **kw)

        backend.client._open = counting_open  # type: ignore[method-assign]
        try:
            batch = await fn.aio.run_async_map(range(n), max_concurrent=workers)
            seen["group_id"] = batch.group_id
            await batch.wait(timeout=240)
            seen["objects"] = gke.object_names(f"_groups/{batch.group_id}/")
            seen["jobs"] = batch_jobs(gke, batch.group_id)
            seen["values"] = await batch.results(timeout=60)  # cleanup: deletes the Job
            seen["k8s"] = dict(k8s)
        finally:
            await runtime.aclose_backends()

    anyio.run(main)
    assert seen["values"] == [3 * i for i in range(n)]
    group = f"_groups/{seen['group_id']}/"
    objects = seen["objects"]
    # Claims by span and outcomes in bursts: far fewer objects than inputs.
    claims = [k for k in objects if k.startswith(group + "claims/")]
    bursts = [k for k in objects if k.startswith(group + "bursts/")]
    assert 0 < len(claims) <= 0.1 * n, len(claims)
    assert 0 < len(bursts) <= 0.1 * n, len(bursts)
    assert not [k for k in objects if k.startswith(group + "results/")]
    assert not [k for k in objects if k.startswith(group + "logs/")]
    # Kubernetes: one Job for the batch; a few reads; two deletes at cleanup.
    assert seen["jobs"] == [f"job.batch/kinetic-{seen['group_id']}"]
    k8s = seen["k8s"]
    assert k8s.get("POST") == 1
    assert k8s.get("DELETE") == 2
    assert sum(k8s.values()) <= 0.02 * n, k8s
    assert batch_jobs(gke, seen["group_id"]) == []


def test_a_killed_worker_pods_inputs_run_again_nothing_lost_or_doubled(gke: GKETarget) -> None:
    n = 60
    fn = kinetic.run(**gke.run_args())(pause)
    batch = fn.run_async_map(range(n), max_concurrent=3)
    group = f"_groups/{batch.group_id}/"
    deadline = time.monotonic() + 120
    while covered(gke, batch.group_id) < 10:
        assert time.monotonic() < deadline, "the pool made no progress"
        time.sleep(0.3)
    victim = batch_pods(gke, batch.group_id, "Running")[0]
    kubectl(gke, "delete", victim, "--grace-period=0", "--force", "--wait=false")
    values = batch.results(timeout=240, cleanup=False)
    assert values == list(range(n))
    member = batch.jobs[7]
    assert member is not None
    assert "pausing on 7" in member.logs()
    names = gke.object_names(group)
    claims = [k.rsplit("/", 1)[1] for k in names if k.startswith(group + "claims/")]
    taken_over = [c for c in claims if not c.endswith(".000")]
    assert taken_over, "the killed worker's span was never taken over"
    assert batch.status_counts() == {"SUCCEEDED": n}
    batch.cleanup()
    # Nothing of the run is left but the record of it: claims and bursts went too.
    left = {k.removeprefix(group).split("/")[0] for k in gke.object_names(group)}
    assert left <= {"manifest.json", "recording.json", "summary.json", "stop.json"}, left


@pytest.mark.parametrize("engine", ["pool", "coordinated"])
def test_the_batch_runs_with_no_client_and_attach_collects_it(
    gke: GKETarget, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_GKE_POOL_ENGINE", engine)
    code = f"""
import os, kinetic
from tests.cluster.test_gke_pool import triple
fn = kinetic.run(**{gke.run_args()!r})(triple)
batch = fn.run_async_map(range(30), max_concurrent=2)
print(batch.group_id, flush=True)
os._exit(0)
"""
    out = run_python(code)
    group_id = out.stdout.strip().splitlines()[-1]
    # Nobody follows the batch: the pool finishes it alone (its Job completes).
    done_key = commits.done_key(group_id)
    deadline = time.monotonic() + 180
    while (
        covered(gke, group_id) < 30
        if engine == "pool"
        else done_key not in gke.object_names(commits.coordinator_prefix(group_id))
    ):
        assert time.monotonic() < deadline, "the pool did not finish on its own"
        time.sleep(1)
    batch = kinetic.attach_batch(group_id, project=gke.project, cluster=gke.cluster, backend="gke")
    assert batch.results(timeout=60) == [3 * i for i in range(30)]
    assert batch.status_counts() == {"SUCCEEDED": 30}


def test_cancel_stops_the_pool(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args())(sleeper)
    batch = fn.run_async_map([60.0] * 6, max_concurrent=2)
    deadline = time.monotonic() + 120
    while Counter(s for _, s in batch.statuses())[JobStatus.RUNNING] < 2:
        assert time.monotonic() < deadline, batch.statuses()
        time.sleep(0.5)
    started = time.monotonic()
    batch.cancel()
    out = batch.results(timeout=60, return_exceptions=True, cleanup=False)
    assert time.monotonic() - started < 30
    assert all(isinstance(v, kinetic.JobCancelledError) for v in out), out
    assert all(s is JobStatus.FAILED for _, s in batch.statuses())
    assert batch_jobs(gke, batch.group_id) == []
    deadline = time.monotonic() + 60
    while batch_pods(gke, batch.group_id, "Running"):
        assert time.monotonic() < deadline, "the cancelled pool's pods still run"
        time.sleep(0.5)
    batch.cleanup()


def test_cancel_keeps_the_outcome_of_every_input_that_ran(gke: GKETarget) -> None:
    """cancel() deletes the pods with a grace: each worker (SIGTERM) cuts its running
    input and writes the outcomes it had buffered for its next burst (up to a second's
    worth here), and the stop is reported once the pods ended. An input whose side
    effect is done has its outcome — but for the one each worker was cut in, if the cut
    came after its side effect (a few milliseconds before it returned)."""
    workers, n = 3, 1500
    with marked_pool(gke, n, workers) as (batch, prefix):
        batch.cancel()
        out = batch.results(timeout=120, return_exceptions=True, cleanup=False)
        kept = {v for v in out if isinstance(v, int)}
        ran = set(runs_of(gke, prefix))
        assert kept <= ran
        assert len(kept) < n, "the batch ended before the cancel"
        assert len(ran - kept) <= workers, sorted(ran - kept)
        cancelled = [v for v in out if not isinstance(v, int)]
        assert all(isinstance(v, kinetic.JobCancelledError) for v in cancelled), cancelled[:3]


def test_a_deleted_worker_writes_what_it_ran_before_it_exits(gke: GKETarget) -> None:
    """A worker pod deleted while the batch runs (a drained node, ``kubectl delete``)
    gets SIGTERM: it cuts its input, writes the outcomes it had buffered and exits
    non-zero, and Kubernetes replaces it. Only the input it was cut in runs again once
    its lease ended; the inputs it finished do not. (Had it ignored the signal, as
    PID 1 does by default, it would have been killed at the end of the grace with a
    burst's worth of outcomes unwritten, each input of them to run again.)"""
    n = 1500  # a minute of work: more than the old 30 s grace
    with marked_pool(gke, n, 3) as (batch, prefix):
        victim = batch_pods(gke, batch.group_id, "Running")[0]
        kubectl(gke, "delete", victim, "--wait=false")  # with the pod's grace
        assert batch.results(timeout=240, cleanup=False) == list(range(n))
        twice = sorted(i for i, count in runs_of(gke, prefix).items() if count > 1)
        assert len(twice) <= 1, twice  # the input it was cut in, if after its side effect


def test_a_pool_whose_image_cannot_start_fails_with_the_reason(gke: GKETarget) -> None:
    image = gke.image.rsplit(":", 1)[0] + ":no-such-tag"
    fn = kinetic.run(**gke.run_args(container_image=image))(triple)
    batch = fn.run_async_map(range(5), max_concurrent=2)
    started = time.monotonic()
    out = batch.results(timeout=120, return_exceptions=True, cleanup=False)
    assert time.monotonic() - started < 60
    assert all(isinstance(v, kinetic.JobFailedError) and v.phase == "start" for v in out), out
    assert "no-such-tag" in str(out[0])
    assert batch_jobs(gke, batch.group_id) == []  # the stuck Job is deleted
    batch.cleanup()


def flaky(x: int) -> int:
    if x == 3 or (x == 1 and os.environ.get("KINETIC_ATTEMPT") == "0"):
        print(f"failing {x}", flush=True)
        raise ValueError(f"bad input {x}")
    return x * 10


@pytest.mark.parametrize("engine", ["pool", "coordinated"])
def test_retries_and_failures_keep_their_meaning(
    gke: GKETarget, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_GKE_POOL_ENGINE", engine)
    fn = kinetic.run(**gke.run_args())(flaky)
    batch = fn.run_async_map([0, 1, 2, 3], retries=1, max_concurrent=2)
    with pytest.raises(kinetic.BatchError) as info:
        batch.results(timeout=180, cleanup=False)
    assert info.value.partial_results == [0, 10, 20, None]
    failed = batch.jobs[3]
    assert failed is not None
    with pytest.raises(ValueError, match="bad input 3"):
        failed.result(cleanup=False)
    assert "failing 3" in failed.logs()
    assert failed.status() is JobStatus.FAILED
    batch.cleanup()


def fail_on_zero(x: float) -> float:
    if x == 0:
        raise RuntimeError("zero")
    time.sleep(x)
    return x


def test_fail_fast_with_cancel_running_on_fail_ends_the_running_inputs(gke: GKETarget) -> None:
    fn = kinetic.run(**gke.run_args())(fail_on_zero)
    batch = fn.run_async_map(
        [0, 90.0, 90.0], max_concurrent=3, fail_fast=True, cancel_running_on_fail=True
    )
    started = time.monotonic()
    out = batch.results(timeout=150, return_exceptions=True, cleanup=False)
    assert time.monotonic() - started < 80  # the 90 s inputs were ended, not waited for
    assert isinstance(out[0], RuntimeError)
    assert all(isinstance(v, kinetic.JobCancelledError) for v in out[1:]), out
    batch.cleanup()
