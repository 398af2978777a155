"""Reading a GKE batch's outcomes reads many objects at once (the inputs' outcome
objects of a batch of one Job per input, the bursts of a pool's); a read the storage
refuses reaches the caller as one StorageError, never as an ``ExceptionGroup`` of the
concurrent reads. The testbed's fake-gcs-server behind a fault proxy that refuses those
object reads (403: permanent, not retried) and forwards the rest (the listings, the
manifest)."""

from __future__ import annotations

import anyio
import pytest

import kinetic
from kinetic import aio
from tests.cluster.test_gke_batch import square
from tests.fix_cluster import GKETarget
from tests.fix_gcs import fault_proxy

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def _leaderless(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leaderless pool (not the default engine): these tests look at its bursts."""
    monkeypatch.setenv("KINETIC_GKE_POOL_ENGINE", "pool")


@pytest.mark.parametrize(
    ("pod_per_input", "objects"), [(True, "/results/"), (False, "/bursts/")], ids=["jobs", "pool"]
)
def test_a_refused_read_of_a_batchs_outcomes_is_one_storage_error(
    gke: GKETarget, pod_per_input: bool, objects: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fn = kinetic.run(**gke.run_args())(square)
    batch = fn.run_async_map([1, 2, 3, 4], pod_per_input=pod_per_input)
    assert batch.results(timeout=180, cleanup=False) == [1, 4, 9, 16]

    async def read_refused() -> BaseException:
        async with fault_proxy(gke.emulator) as proxy:
            proxy.only, proxy.faults[:] = objects, [403] * 100
            # A fresh loop builds a fresh storage client, which reads this at its first call.
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
            again = await aio.attach_batch(
                batch.group_id, project=gke.project, cluster=gke.cluster, backend="gke"
            )
            try:
                await again.results(timeout=60, cleanup=False)
            except BaseException as exc:  # noqa: BLE001 - what it raised is the point
                return exc
            finally:
                monkeypatch.setenv("STORAGE_EMULATOR_HOST", gke.emulator)
            raise AssertionError(f"its {objects} reads were refused, yet results came back")

    caught = anyio.run(read_refused)
    assert type(caught) is kinetic.StorageError, repr(caught)
    assert "HTTP 403" in str(caught)
    batch.cleanup()
