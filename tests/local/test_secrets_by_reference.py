"""``secrets=`` on the local backend: real runner processes read the secrets on this
machine, and no value ever lands in the local root (spec, manifest, handle, logs)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets as token
import time
from pathlib import Path

import pytest

import kinetic
from runner.batch import SUPERVISOR_LOCK
from runner.fs import lock_held
from runner.secrets import DIR_ENV
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local


def digest(value: str | None) -> str:
    return "" if value is None else hashlib.sha256(value.encode()).hexdigest()


@kinetic.run(secrets=["api", kinetic.Secret("db", keys={"password": "DB_PASSWORD"})])
def sees() -> dict[str, str]:
    # Digests only: a value in the result would rest in storage (result.pkl).
    import hashlib
    import os

    def d(name: str) -> str:
        value = os.environ.get(name)
        return "" if value is None else hashlib.sha256(value.encode()).hexdigest()

    return {name: d(name) for name in ("API_TOKEN", "API_URL", "DB_PASSWORD")}


@kinetic.run(secrets=[kinetic.Secret("ci", keys={"token": "CI_TOKEN"})])
def sees_ci(_: int = 0) -> str:
    import hashlib
    import os

    return hashlib.sha256(os.environ["CI_TOKEN"].encode()).hexdigest()


@kinetic.run(secrets=[kinetic.Secret("certs", mount="/etc/certs")])
def mounts() -> None:
    raise AssertionError("never runs")


@pytest.fixture
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv(DIR_ENV, str(folder))
    return folder


def write(folder: Path, name: str, data: dict[str, str], mode: int = 0o600) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    path.chmod(mode)
    return path


def assert_nowhere(root: Path, *values: str) -> None:
    """No file under the local root holds any of ``values``."""
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert files  # the root holds the job's objects: the search looked at something
    for path in files:
        data = path.read_bytes()
        for value in values:
            assert value.encode() not in data, f"{value[:4]}… rests in {path}"


def test_secrets_reach_the_job_and_never_its_storage(
    secrets_dir: Path, kinetic_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api_token, api_url, password = (token.token_hex(16) for _ in range(3))
    write(secrets_dir, "api", {"API_TOKEN": api_token, "API_URL": api_url})
    write(secrets_dir, "db", {"password": password, "user": "me"})
    monkeypatch.setenv("DB_PASSWORD", "the file wins over the environment")
    job = sees.run_async()
    assert job.result(timeout=120, cleanup=False) == {
        "API_TOKEN": digest(api_token),
        "API_URL": digest(api_url),
        "DB_PASSWORD": digest(password),
    }
    spec = json.loads((kinetic_env / "storage" / job.job_id / "spec.json").read_text())
    assert spec["secrets"] == [
        {"name": "api"},
        {"name": "db", "keys": {"password": "DB_PASSWORD"}},
    ]
    assert_nowhere(kinetic_env, api_token, api_url, password)


def test_a_mapped_key_falls_back_to_the_submitting_environment(
    secrets_dir: Path, kinetic_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = token.token_hex(16)
    monkeypatch.setenv("CI_TOKEN", value)
    assert sees_ci() == digest(value)
    assert_nowhere(kinetic_env, value)


def test_a_batch_resolves_them_in_its_workers(
    secrets_dir: Path, kinetic_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = token.token_hex(16)
    write(secrets_dir, "ci", {"token": value})
    batch = sees_ci.run_async_map([1, 2, 3])
    assert batch.results(timeout=120, cleanup=False) == [digest(value)] * 3
    manifest = next((kinetic_env / "storage" / "_groups").glob("*/manifest.json"))
    assert json.loads(manifest.read_text())["spec"]["secrets"] == [
        {"name": "ci", "keys": {"token": "CI_TOKEN"}}
    ]
    # The outcomes are durable before the supervisor has removed its work directory;
    # walk the root once it has ended (its lock, held for its life, is let go).
    lock = manifest.parent / SUPERVISOR_LOCK
    deadline = time.monotonic() + 60
    while lock_held(lock):
        assert time.monotonic() < deadline, "the batch's supervisor ends within 60 s"
        time.sleep(0.02)
    assert_nowhere(kinetic_env, value)


@pytest.mark.parametrize("mode", [0o640, 0o644, 0o606])
def test_a_secret_file_others_can_read_or_write_is_refused_before_anything_is_written(
    secrets_dir: Path, kinetic_env: Path, mode: int
) -> None:
    path = write(secrets_dir, "ci", {"token": "x"}, mode=mode)
    with pytest.raises(kinetic.ConfigError, match=f"chmod 600 {path}"):
        sees_ci.run_async()
    with pytest.raises(kinetic.ConfigError, match=f"chmod 600 {path}"):
        sees_ci.run_async_map([1])
    assert job_dirs(kinetic_env) == []
    assert not list((kinetic_env / "storage" / "_groups").glob("*/manifest.json"))


def test_a_missing_secret_or_a_local_mount_fails_the_submission(
    secrets_dir: Path, kinetic_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI_TOKEN", raising=False)
    with pytest.raises(kinetic.ConfigError, match=r"set CI_TOKEN .* or write .*ci\.json"):
        sees_ci.run_async()
    with pytest.raises(kinetic.ConfigError, match="cannot mount secrets as files"):
        mounts.run_async()
    assert job_dirs(kinetic_env) == []


def test_the_runner_fails_in_phase_secrets_when_one_is_gone(
    secrets_dir: Path, kinetic_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Submitted with the variable set, run without it: the runner resolves for itself.
    monkeypatch.setenv("CI_TOKEN", "here at submission")
    from kinetic._backends import local as local_backend

    real = local_backend.job_environment

    def without(*args: object, **kw: object) -> dict[str, str]:
        env = real(*args, **kw)  # type: ignore[arg-type]
        env.pop("CI_TOKEN", None)
        return env

    monkeypatch.setattr(local_backend, "job_environment", without)
    job = sees_ci.run_async()
    with pytest.raises(kinetic.JobFailedError) as failed:
        job.result(timeout=120)
    assert failed.value.phase == "secrets"
    assert "set CI_TOKEN in the submitting environment" in str(failed.value)
    assert os.environ["CI_TOKEN"] == "here at submission"
