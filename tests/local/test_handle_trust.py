"""A handle names its own storage, and reading its result unpickles what lies there: a
handle is used only where this process trusts its storage (kinetic._storage.trust).

The attack the tests replay: another local user (uid 65534, :mod:`tests.other_user`)
writes a store of their own with a job whose ``status.json`` says it succeeded and whose
``result.pkl`` runs a command when unpickled, and hands the victim the job's handle as a
dict. ``JobHandle.from_dict(d).result()`` ran the command as the victim.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

import kinetic
from kinetic import aio
from runner import protocol
from tests.other_user import OTHER_UID, need_root

pytestmark = pytest.mark.local


@kinetic.run()
def square(x: int) -> int:
    return x * x


class _Planted:
    """A pickle whose loading creates ``path``: code run by whoever unpickles it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


def copy_job(job: kinetic.JobHandle, root: Path, planted: Path) -> dict[str, Any]:
    """A copy of ``job``'s finished store under ``root``, its result replaced by one that
    creates ``planted`` when unpickled; the handle dict that names it."""
    source = Path(job.bucket_name) / job.job_id
    storage = root / "storage"
    shutil.copytree(source, storage / job.job_id)
    result = storage / job.job_id / "result.pkl"
    result.write_bytes(protocol.seal(pickle.dumps(_Planted(planted))))
    return {**job.to_dict(), "bucket_name": str(storage)}


def give_to_other_user(path: Path) -> None:
    for where, dirs, files in os.walk(path):
        for name in [where, *(os.path.join(where, n) for n in dirs + files)]:
            os.chown(name, OTHER_UID, OTHER_UID)


def test_a_handle_naming_another_users_store_is_refused_before_anything_is_read(
    kinetic_env: Path, tmp_path: Path
) -> None:
    need_root()
    job = square.run_async(3)
    assert job.result(cleanup=False) == 9
    attackers = Path(f"/tmp/kinetic-test-attacker-{os.getpid()}-{tmp_path.name}")
    planted = tmp_path / "planted"
    try:
        d = copy_job(job, attackers, planted)
        give_to_other_user(attackers)
        handle = kinetic.JobHandle.from_dict(d)
        for read in (handle.result, handle.status, handle.logs):
            with pytest.raises(kinetic.UntrustedStorageError) as refused:
                read()
            assert f"belongs to uid {OTHER_UID}" in str(refused.value)
            assert "trust_storage=True" in str(refused.value)
        assert not planted.exists()  # nothing was unpickled
        with pytest.raises(kinetic.UntrustedStorageError):
            handle.cleanup()
        assert (attackers / "storage" / job.job_id / "result.pkl").exists()
    finally:
        shutil.rmtree(attackers, ignore_errors=True)


def test_a_store_reached_through_another_users_link_is_refused(
    kinetic_env: Path, tmp_path: Path
) -> None:
    """The root is the victim's own, but the path to it goes through a link the other
    user owns, and could point elsewhere between a check and a read."""
    need_root()
    job = square.run_async(4)
    assert job.result(cleanup=False) == 16
    link = Path(f"/tmp/kinetic-test-link-{os.getpid()}-{tmp_path.name}")
    try:
        link.symlink_to(kinetic_env)
        os.lchown(link, OTHER_UID, OTHER_UID)
        d = {**job.to_dict(), "bucket_name": str(link / "storage")}
        with pytest.raises(kinetic.UntrustedStorageError, match=f"{link} belongs to uid"):
            kinetic.JobHandle.from_dict(d).status()
        os.lchown(link, 0, 0)  # the same link, ours: the same store
        assert kinetic.JobHandle.from_dict(d).result() == 16
    finally:
        link.unlink(missing_ok=True)


def test_a_root_others_may_write_is_refused_on_every_read_unless_trusted(
    kinetic_env: Path,
) -> None:
    """The check is made on every use of a handle, not only at submission: a root that
    became writable by others since is refused, until the caller trusts it."""
    job = square.run_async(5)
    assert job.result(cleanup=False) == 25
    d = json.loads(json.dumps(job.to_dict()))
    kinetic_env.chmod(0o777)
    try:
        with pytest.raises(kinetic.UntrustedStorageError, match="writable by other users"):
            job.status()
        with pytest.raises(kinetic.UntrustedStorageError, match="writable by other users"):
            kinetic.JobHandle.from_dict(d).result()
        trusted = kinetic.JobHandle.from_dict(d, trust_storage=True)
        assert trusted.result() == 25
    finally:
        kinetic_env.chmod(0o700)


async def test_a_handle_naming_another_bucket_is_refused(kinetic_env: Path) -> None:
    """A GKE handle whose bucket is not this process's jobs bucket (none is configured
    here) is refused before any request, in the async API too."""
    d = {
        "job_id": "job-0badc0de",
        "backend": "gke",
        "project": "someone-else",
        "cluster_name": "theirs",
        "zone": "us-central1-a",
        "namespace": "default",
        "bucket_name": "someone-else-kn-theirs-jobs",
        "k8s_name": "kinetic-job-0badc0de",
        "image_uri": "",
        "accelerator": "cpu",
        "func_name": "f",
        "display_name": "kinetic-f-job-0badc0de",
        "created_at": "2026-01-01T00:00:00Z",
    }
    handle = aio.JobHandle.from_dict(d)
    with pytest.raises(kinetic.UntrustedStorageError) as refused:
        await handle.result()
    assert "'someone-else-kn-theirs-jobs'" in str(refused.value)
    assert "none configured" in str(refused.value)
    with pytest.raises(kinetic.UntrustedStorageError):
        await handle.status()


def test_a_handle_whose_local_root_is_gone_names_no_job(kinetic_env: Path, tmp_path: Path) -> None:
    job = square.run_async(6)
    assert job.result(cleanup=False) == 36
    gone = {**job.to_dict(), "bucket_name": str(tmp_path / "gone" / "storage")}
    with pytest.raises(kinetic.JobNotFoundError, match="does not exist"):
        kinetic.JobHandle.from_dict(gone).status()
