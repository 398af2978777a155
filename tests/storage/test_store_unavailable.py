"""A storage failure that may pass is told apart from one that will not, from GCS's
answer to the pool worker's patience: ``StorageError.transient``, the runner's
``StoreUnavailable``, and a worker's store that waits out a run of 503s longer than the
client's own retries. fake-gcs-server behind the fault proxy."""

from __future__ import annotations

import anyio
import pytest

from kinetic import ObjectNotFoundError, StorageError
from kinetic._storage.gcs import GCSStorage
from kinetic._storage.runner_gcs import GCSStore
from runner.pool.patient_store import PatientStore
from runner.store import StoreUnavailable
from tests.fix_gcs import FaultProxy

pytestmark = [pytest.mark.storage, pytest.mark.anyio]


async def test_gcs_errors_say_whether_they_may_pass(
    gcs_fault_proxy: FaultProxy, gcs_bucket: str
) -> None:
    async with GCSStorage(gcs_bucket, backoff=0.01, attempts=2, slow_down=0.0) as store:
        await store.write("k", b"v")
        gcs_fault_proxy.faults[:] = [503, 503]
        with pytest.raises(StorageError) as unavailable:
            await store.read("k")
        assert unavailable.value.transient
        gcs_fault_proxy.faults[:] = [403]
        with pytest.raises(StorageError) as refused:
            await store.read("k")
        assert not refused.value.transient
        with pytest.raises(ObjectNotFoundError) as missing:
            await store.read("absent")
        assert not missing.value.transient


async def test_a_pool_workers_store_waits_out_more_503s_than_its_client_retries(
    gcs_fault_proxy: FaultProxy, gcs_bucket: str
) -> None:
    async with GCSStorage(gcs_bucket) as seed:
        await seed.write("_groups/g/manifest.json", b"{}")
    # The runner's blocking store runs its own loop: in a thread, while this loop serves
    # the proxy. Its client tries 4 times; storage fails 6 times in a row.
    store = GCSStore(gcs_bucket)
    try:
        gcs_fault_proxy.faults[:] = [503] * 4
        with pytest.raises(StoreUnavailable, match="HTTP 503"):
            await anyio.to_thread.run_sync(store.read, "_groups/g/manifest.json")
        gcs_fault_proxy.faults[:] = [403]
        with pytest.raises(OSError, match="HTTP 403") as refused:
            await anyio.to_thread.run_sync(store.read, "_groups/g/manifest.json")
        assert not isinstance(refused.value, StoreUnavailable)

        patient = PatientStore(store, patience=60.0)
        gcs_fault_proxy.faults[:] = [503] * 6
        data = await anyio.to_thread.run_sync(patient.read, "_groups/g/manifest.json")
        assert data == b"{}"
        assert patient.retried == 1  # the client's 4 tries failed once, then 2 were enough
        assert gcs_fault_proxy.faults == []
    finally:
        await anyio.to_thread.run_sync(store.close)
