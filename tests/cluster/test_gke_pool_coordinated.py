"""Batches on the GKE backend run by a coordinated pool (``KINETIC_GKE_POOL_ENGINE=
coordinated``), on the real testbed: a Job of workers, a Job of one coordinator, the
batch's token in a Secret; outcomes in group commits in fake-gcs-server."""

from __future__ import annotations

import os
import time

import pytest

import kinetic
from kinetic import JobStatus
from runner.pool.coordinator import commits
from tests.cluster.test_gke import wait_for
from tests.cluster.test_gke_batch import batch_jobs, batch_pods
from tests.cluster.test_gke_pool import kubectl, marked_pool, runs_of, triple
from tests.fix_cluster import GKETarget

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def slow_pid(x: int) -> int:
    time.sleep(1.0)
    return os.getpid()


@pytest.fixture(autouse=True)
def _coordinated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINETIC_GKE_POOL_ENGINE", "coordinated")  # the default, said


def _secrets(gke: GKETarget, group_id: str) -> list[str]:
    return kubectl(gke, "get", "secrets", "-l", f"group-id={group_id}", "-o", "name").split()


def _commits(gke: GKETarget, group_id: str) -> int:
    return len(gke.object_names(commits.commits_prefix(group_id)))


def test_a_coordinated_pool_runs_the_batch_and_leaves_nothing_behind(gke: GKETarget) -> None:
    n, workers = 300, 3
    fn = kinetic.run(**gke.run_args())(triple)
    batch = fn.run_async_map(range(n), max_concurrent=workers)
    assert batch.results(timeout=240, cleanup=False) == [3 * i for i in range(n)]
    gid = batch.group_id
    group = f"_groups/{gid}/"
    objects = gke.object_names(group)
    written = [k for k in objects if k.startswith(commits.commits_prefix(gid))]
    assert 0 < len(written) <= 0.2 * n, len(written)
    assert not [k for k in objects if k.startswith((group + "claims/", group + "bursts/"))]
    assert commits.done_key(gid) in objects
    assert sorted(batch_jobs(gke, gid)) == [
        f"job.batch/kinetic-{gid}",
        f"job.batch/kinetic-{gid}-coordinator",
    ]
    assert _secrets(gke, gid) == [f"secret/kinetic-{gid}-token"]
    batch.cleanup()
    assert batch_jobs(gke, gid) == []
    assert _secrets(gke, gid) == []
    areas = (commits.commits_prefix(gid), commits.coordinator_prefix(gid))
    assert not [k for k in gke.object_names(group) if k.startswith(areas)]


def test_a_coordinated_pool_tells_what_runs_and_reuses_its_processes(gke: GKETarget) -> None:
    n, workers = 30, 3
    fn = kinetic.run(**gke.run_args())(slow_pid)
    batch = fn.run_async_map(range(n), max_concurrent=workers, reuse_process=True)
    # The coordinator writes which inputs its workers run; readers report them running.
    wait_for(lambda: JobStatus.RUNNING in dict(batch.statuses()).values(), timeout=120)
    pids = batch.results(timeout=240)
    assert len(set(pids)) <= workers  # every input in its worker's own process


def test_a_deleted_coordinator_is_replaced_and_nothing_runs_twice(gke: GKETarget) -> None:
    n, workers = 600, 3
    with marked_pool(gke, n, workers, progress=_commits, at=5) as (batch, prefix):
        kubectl(gke, "delete", "pod", "-l", f"job-name=kinetic-{batch.group_id}-coordinator")
        assert batch.results(timeout=240, cleanup=False) == list(range(n))
        records = gke.object_names(commits.coordinator_prefix(batch.group_id))
        assert commits.coordinator_key(batch.group_id, 1) in records  # its successor
        twice = sorted(i for i, count in runs_of(gke, prefix).items() if count > 1)
        assert len(twice) <= workers, twice  # at most an input each worker was running


def test_cancel_lets_the_pool_end_and_keeps_what_finished(gke: GKETarget) -> None:
    n, workers = 1500, 3
    with marked_pool(gke, n, workers, progress=_commits, at=5) as (batch, prefix):
        batch.cancel()
        out = batch.results(timeout=120, return_exceptions=True, cleanup=False)
        kept = {v for v in out if isinstance(v, int)}
        ran = set(runs_of(gke, prefix))
        assert kept <= ran
        assert 0 < len(kept) < n, "the batch ended before the cancel"
        assert len(ran - kept) <= workers, sorted(ran - kept)
        cancelled = [v for v in out if not isinstance(v, int)]
        assert all(isinstance(v, kinetic.JobCancelledError) for v in cancelled), cancelled[:3]
        assert batch_pods(gke, batch.group_id, "Running") == []
