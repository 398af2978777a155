"""Who a change of the shared watch wakes (:mod:`kinetic._backends.gke.watch`): a change
of one job's Job or pod wakes that job's waiters, not every waiter of the namespace
(with many jobs awaited at once, each event would otherwise run every waiter's step in
one turn of the loop). The cached copies leave out the API server's record of field
ownership (three quarters of each object, read by nothing). The events are applied as
the API server's watch stream sends them; no stream runs."""

from __future__ import annotations

from typing import Any

from kinetic._backends.gke.watch import SharedWatch


def pod(job_id: str, name: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"job-id": job_id}, "resourceVersion": "7"},
        "status": {"phase": phase},
    }


def new_watch() -> SharedWatch:
    no_client: Any = None  # no stream runs, so the API server is never asked
    return SharedWatch(client=no_client, namespace="default", selector="app=kinetic")


async def test_a_change_wakes_the_waiters_of_its_own_job_only() -> None:
    watch = new_watch()
    a, b = watch.job_changes("job-a"), watch.job_changes("job-b")
    assert watch.job_changes("job-a") is a  # two waiters of one job share it
    version = watch.version

    watch._apply("pods", {"type": "ADDED", "object": pod("job-a", "a-1")})
    assert a.is_set()
    assert not b.is_set()
    assert watch.version == version + 1  # the whole copy's waiters (a batch) hear of it
    assert watch.pods("job-a")[0]["metadata"]["name"] == "a-1"

    again = watch.job_changes("job-a")
    assert again is not a
    assert not again.is_set()
    watch._apply("pods", {"type": "DELETED", "object": pod("job-b", "b-1")})
    assert b.is_set()
    assert not again.is_set()


async def test_an_object_of_no_job_and_bookmarks_wake_no_job() -> None:
    watch = new_watch()
    a = watch.job_changes("job-a")
    other = {"metadata": {"name": "x", "labels": {}, "resourceVersion": "8"}}
    watch._apply("pods", {"type": "ADDED", "object": other})
    watch._apply("pods", {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    assert not a.is_set()


async def test_a_change_of_the_whole_copy_wakes_every_job() -> None:
    watch = new_watch()
    a, b = watch.job_changes("job-a"), watch.job_changes("job-b")
    watch._notify()  # what a re-list or a stream's error does
    assert a.is_set()
    assert b.is_set()


async def test_the_cached_copy_keeps_what_status_needs_without_field_ownership() -> None:
    watch = new_watch()
    sent = pod("job-a", "a-1", phase="Succeeded")
    sent["metadata"]["managedFields"] = [
        {"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}
    ]
    watch._apply("pods", {"type": "MODIFIED", "object": sent})
    (cached,) = watch.pods("job-a")
    assert "managedFields" not in cached["metadata"]
    assert cached["status"] == {"phase": "Succeeded"}
    assert cached["metadata"]["labels"] == {"job-id": "job-a"}
