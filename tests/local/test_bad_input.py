"""Bad input: each case is a clear KineticError subclass, and nothing is left behind."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import pytest

import kinetic
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local


def plain(x: int) -> int:
    return x


def test_unknown_backend_at_decoration() -> None:
    with pytest.raises(kinetic.ConfigError, match="unknown backend 'moon'.*'local', 'gke'"):
        kinetic.run(backend="moon")


def test_unknown_backend_from_environment(
    monkeypatch: pytest.MonkeyPatch, kinetic_env: Path
) -> None:
    monkeypatch.setenv("KINETIC_BACKEND", "moon")
    with pytest.raises(kinetic.ConfigError, match="unknown backend 'moon'"):
        kinetic.run()(plain).run_async(1)
    assert job_dirs(kinetic_env) == []


@pytest.mark.parametrize(
    ("accelerator", "match"),
    [
        ("tpu-v5litepod-4", "has no TPU"),
        ("v5e-2x4", "has no TPU"),
        ("gpu-l4", "needs 1 GPU.*has 0: none"),
        ("l4x4:spot", "needs 4 GPU.*has 0: none"),
    ],
)
def test_local_backend_refuses_accelerators_it_cannot_provide(
    accelerator: str, match: str, kinetic_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_LOCAL_GPUS", "")  # a machine without GPUs, even with NVML
    fn = kinetic.run(accelerator=accelerator)(plain)
    with pytest.raises(kinetic.AcceleratorError, match=match):
        fn.run_async(1)
    assert job_dirs(kinetic_env) == []


def test_unparseable_accelerator_lists_valid_forms() -> None:
    with pytest.raises(kinetic.AcceleratorError) as info:
        kinetic.run(accelerator="tpu-v99-3")
    message = str(info.value)
    assert "tpu-v99-3" in message
    assert "gpu-l4" in message or "l4" in message
    assert "cpu" in message
    assert isinstance(info.value, ValueError)


def test_non_callable_is_refused() -> None:
    with pytest.raises(kinetic.InvalidFunctionError, match="needs a callable"):
        kinetic.run()(42)  # type: ignore[arg-type]


def test_classmethod_object_is_refused() -> None:
    with pytest.raises(kinetic.InvalidFunctionError, match="classmethod"):
        kinetic.run()(classmethod(plain))  # type: ignore[arg-type]


def test_lru_cache_wrapper_is_refused() -> None:
    with pytest.raises(kinetic.InvalidFunctionError, match="lru_cache"):
        kinetic.run()(functools.lru_cache(plain))


def test_unpicklable_argument_is_named_and_nothing_is_written(kinetic_env: Path) -> None:
    fn = kinetic.run()(plain)
    with pytest.raises(kinetic.SerializationError, match="argument 'x'.*cannot be pickled"):
        fn.run_async(threading.Lock())  # type: ignore[arg-type]
    assert job_dirs(kinetic_env) == []


def test_relative_volume_mount_path() -> None:
    with pytest.raises(kinetic.ConfigError, match="absolute"):
        kinetic.run(volumes={"data": object()})


@pytest.mark.parametrize("job_id", ["job-00000000", "job-deadbeef"])
def test_attach_unknown_job(job_id: str) -> None:
    with pytest.raises(kinetic.JobNotFoundError, match=job_id):
        kinetic.attach(job_id)


@pytest.mark.parametrize(
    "job_id", ["../x", "job-1234/../../etc", "/etc/passwd", "", "job-XYZ", "job-deadbeef\n"]
)
def test_attach_refuses_ids_shaped_like_paths(job_id: str) -> None:
    with pytest.raises(kinetic.ConfigError, match="invalid job id"):
        kinetic.attach(job_id)


def test_malformed_profiles_file_is_named(tmp_path: Path, kinetic_env: Path) -> None:
    profiles = tmp_path / "profiles.json"
    profiles.write_text("{not json")
    with pytest.raises(kinetic.ProfileError, match=str(profiles)):
        kinetic.run()(plain).run_async(1)
    profiles.write_text('{"current": "a", "profiles": {"a": ["not", "an", "object"]}}')
    with pytest.raises(kinetic.ProfileError, match=str(profiles)):
        kinetic.run()(plain).run_async(1)
    assert job_dirs(kinetic_env) == []


def test_capture_env_vars_must_be_a_list() -> None:
    with pytest.raises(kinetic.ConfigError, match="capture_env_vars"):
        kinetic.run(capture_env_vars=[1, 2])  # type: ignore[list-item]


def test_errors_share_one_base() -> None:
    for name in kinetic.__all__:
        obj = getattr(kinetic, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning):
            assert issubclass(obj, kinetic.KineticError), name
