"""The jobs bucket's own calls (look, create, delete) on a real fake-gcs-server, and the
emptying that ``kinetic down`` does through the storage layer."""

from __future__ import annotations

import uuid

import pytest

from kinetic._exceptions import ConfigError, StorageError
from kinetic._infra.bucket import BucketAdmin, emulator_url
from kinetic._infra.ops import check_bucket_owner, empty_bucket
from kinetic._infra.plan import SetupSpec
from kinetic._storage.gcs import GCSStorage
from tests.fix_gcs import GCSEmulator

pytestmark = pytest.mark.storage


def test_the_emulator_url_gets_a_scheme() -> None:
    assert emulator_url({"STORAGE_EMULATOR_HOST": "127.0.0.1:9/"}) == "http://127.0.0.1:9"
    assert emulator_url({"STORAGE_EMULATOR_HOST": "https://h"}) == "https://h"
    assert emulator_url({}) is None


async def test_create_look_empty_and_delete_a_bucket(gcs_emulator: GCSEmulator) -> None:
    name = f"kt-kn-{uuid.uuid4().hex[:12]}-jobs"
    async with BucketAdmin(None, base_url=gcs_emulator.url) as admin:
        assert not await admin.exists(name)
        assert await admin.create(name, project="kt", location="us-central1")
        assert await admin.exists(name)
        assert not await admin.create(name, project="kt", location="us-central1")  # idempotent
        async with GCSStorage(name) as store:
            for i in range(3):
                await store.write(f"job-{i}/handle.json", b"{}")
        with pytest.raises(StorageError, match=f"delete gs://{name} failed: HTTP 4"):
            await admin.delete(name)  # not empty
        await empty_bucket(name, 30.0)
        assert await admin.delete(name)
        assert not await admin.exists(name)
        assert not await admin.delete(name)


async def test_up_refuses_an_existing_bucket_another_project_owns(
    gcs_emulator: GCSEmulator,
) -> None:
    """The bucket's name is predictable: another project may hold it. ``up`` uses an
    existing one only when its project number is the project's (fake-gcs-server says
    ``0`` for every bucket: here, the number of the project that owns them all)."""
    name = f"kt-kn-{uuid.uuid4().hex[:12]}-jobs"
    async with BucketAdmin(None, base_url=gcs_emulator.url) as admin:
        assert await admin.project_number(name) is None
        assert await admin.create(name, project="kt", location="us-central1")
        owner = await admin.project_number(name)
        assert owner == "0"
        ours = SetupSpec(namespace="jobs", bucket=name, project="kt", project_number=owner)
        await check_bucket_owner(admin, ours)
        theirs = SetupSpec(namespace="jobs", bucket=name, project="kt", project_number="4242")
        with pytest.raises(ConfigError, match=f"gs://{name} belongs to project number 0"):
            await check_bucket_owner(admin, theirs)
        await check_bucket_owner(admin, SetupSpec(namespace="jobs", bucket=name))  # unknown
        assert await admin.delete(name)


async def test_an_unreachable_api_is_a_storage_error() -> None:
    async with BucketAdmin(None, base_url="http://127.0.0.1:9", attempts=2, backoff=0.01) as a:
        with pytest.raises(StorageError, match="look up gs://b failed"):
            await a.exists("b", timeout=5)
