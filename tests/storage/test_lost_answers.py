"""Storage writes whose answer is lost after the server acted (the fault proxy resets the
connection once the emulator served the request): the retry must see the truth."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kinetic._storage.gcs import GCSStorage
from tests.faultproxy import FaultProxy, Faults
from tests.fix_gcs import GCSEmulator

pytestmark = pytest.mark.storage


@pytest.fixture
def proxy(
    gcs_emulator: GCSEmulator, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_emulator.url, lifetime=120) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        yield proxy


@pytest.mark.anyio
async def test_create_if_absent_whose_answer_was_lost_still_reads_as_created(
    proxy: FaultProxy, gcs_bucket: str
) -> None:
    async with GCSStorage(gcs_bucket, backoff=0.01) as store:
        proxy.set_faults(Faults(script=("reset-after",)))
        assert await store.create_if_absent("claims/0", b"mine") is True
        assert proxy.counts["reset-after"] == 1
        assert await store.read("claims/0") == b"mine"
        # Someone else's object is still someone else's, retried or not.
        proxy.set_faults(Faults(script=("reset-before",)))
        assert await store.create_if_absent("claims/0", b"mine too") is False
        assert await store.create_if_absent("claims/0", b"mine too") is False
        proxy.set_faults(Faults(script=("reset-after",)))
        assert await store.create_if_absent("claims/0", b"mine too") is False
        assert await store.read("claims/0") == b"mine"


@pytest.mark.anyio
async def test_a_replace_whose_answer_was_lost_still_reads_as_replaced(
    proxy: FaultProxy, gcs_bucket: str
) -> None:
    async with GCSStorage(gcs_bucket, backoff=0.01) as store:
        made = await store.create_versioned("claims/1", b"lease to 10")
        assert made is not None
        proxy.set_faults(Faults(script=("reset-after",)))
        renewed = await store.replace_if("claims/1", b"lease to 20", made)
        assert proxy.counts["reset-after"] == 1
        assert renewed is not None
        assert await store.read_versioned("claims/1") == (b"lease to 20", renewed)
        # A replacer that lost to another is told so, whatever happened to its answer.
        proxy.set_faults(Faults(script=("reset-after",)))
        assert await store.replace_if("claims/1", b"taken over", made) is None
        assert (await store.read("claims/1")) == b"lease to 20"
