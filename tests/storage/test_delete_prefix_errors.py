"""``delete_prefix`` deletes concurrently; a deletion the server refuses stops the sweep
and reaches the caller as one StorageError saying how far it got, never as an
``ExceptionGroup`` of the deletions in flight. fake-gcs-server behind the fault proxy."""

from __future__ import annotations

import re

import pytest

from kinetic import StorageError
from kinetic._storage.gcs import GCSStorage
from tests.fix_gcs import PASS, FaultProxy

pytestmark = pytest.mark.storage

OBJECTS = 12


@pytest.mark.anyio
async def test_a_refused_deletion_stops_the_sweep_with_one_storage_error(
    gcs_fault_proxy: FaultProxy, gcs_bucket: str
) -> None:
    async with GCSStorage(gcs_bucket, backoff=0.01, max_concurrency=4) as store:
        for i in range(OBJECTS):
            await store.write(f"p/{i:02d}", b"x")
        # The listing (one page) passes; the first deletion sent is refused (403 is
        # permanent: not retried), while up to three others are in flight.
        gcs_fault_proxy.faults[:] = [PASS, 403]
        with pytest.raises(StorageError) as caught:
            await store.delete_prefix("p/")
        assert type(caught.value) is StorageError  # one error, not a group of them
        message = str(caught.value)
        assert "HTTP 403" in message
        stopped = re.search(r"stopped after (\d+) deletion", message)
        assert stopped, message
        deleted = int(stopped.group(1))
        assert deleted < OBJECTS
        left = [key async for key in store.list("p/")]
        # Deletions counted stayed done; one cancelled once sent may be done without
        # being counted (now or a moment later: the server still acts on it). The refused
        # object is still there.
        assert 1 <= len(left) <= OBJECTS - deleted
        assert 1 <= await store.delete_prefix("p/") <= len(left)
        assert [key async for key in store.list("p/")] == []
