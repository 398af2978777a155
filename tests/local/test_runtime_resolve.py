"""An image's runtime and the project's lines, resolved for Linux x86-64 at submission.

Real resolutions against the package index (uv from the test extra, and pip's
``--dry-run --report`` where uv is absent): the set each category's image promises, a
user's ``jax`` pin carried to the platform's JAX, and impossible combinations named by
line and platform. The GPU set is resolved here, never built (its CUDA wheels are
gigabytes).
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from kinetic import RequirementsError, RuntimeConflictError
from kinetic._core.accel_runtime import DEFAULTS, RuntimeRequest, runtime_request
from kinetic._core.requirements import parse_requirements_txt
from kinetic._images import modes, prebuilt, runner_image, runtime_resolve
from kinetic._images.runtime_resolve import ResolvedRuntime

pytestmark = [pytest.mark.local, pytest.mark.timeout(600)]

PINNED_JAX = "0.7.0"
"""An older JAX whose jax[tpu] and jax[cuda12] wheels are on the index."""


def resolved(text: str, category: str, python: str = "3.11") -> ResolvedRuntime:
    request = runtime_request(parse_requirements_txt(text), category)
    runtime = runtime_resolve.resolve_runtime(request, python, runner_image.runtime_inputs())
    runtime_resolve.check_project(runtime, request.project)
    runtime_resolve.check_kept(runtime, request.kept, request.project)
    return runtime


def submitted(text: str, category: str) -> tuple[RuntimeRequest, ResolvedRuntime]:
    """What a submission resolves (and says) for a project with these requirements."""
    reqs = parse_requirements_txt(text)
    return anyio.run(modes.resolve_runtime, reqs, category, "python:3.11-slim")


def test_each_category_resolves_the_runtime_its_image_promises() -> None:
    cpu = resolved("tabulate\n", "cpu")
    tpu = resolved("", "tpu")
    gpu = resolved("", "gpu")
    for runtime in (cpu, tpu, gpu):
        assert runtime.version("jax") == DEFAULTS["jax"]
        assert runtime.version("jaxlib") == DEFAULTS["jax"]
        assert runtime.version("keras") == DEFAULTS["keras"]
        assert runtime.version("cloudpickle") is not None  # Kinetic's runner is in the set
        assert runtime.version("uv") is not None  # prebuilt mode installs with it
    assert tpu.version("libtpu") is not None
    assert cpu.version("libtpu") is None
    assert gpu.version("libtpu") is None
    # The CUDA plugin and NVIDIA's wheels: every one found for linux x86_64.
    assert gpu.version("jax-cuda12-plugin") == DEFAULTS["jax"]
    assert gpu.version("jax-cuda12-pjrt") == DEFAULTS["jax"]
    assert gpu.version("nvidia-cudnn-cu12") is not None
    assert gpu.version("nvidia-cublas-cu12") is not None
    assert cpu.version("jax-cuda12-plugin") is None
    assert cpu.version("tabulate") is None  # the project's lines are not the runtime's


@pytest.mark.parametrize("category", ["cpu", "tpu"])
def test_the_prebuilt_base_carries_the_set_a_bundled_job_without_pins_gets(category: str) -> None:
    base = prebuilt.default_runtime(category, "python:3.11-slim")
    _, bundled = anyio.run(modes.resolve_runtime, (), category, "python:3.11-slim")
    assert base == bundled  # so their images are one (tests/unit/test_images.py)


def test_a_users_jax_pin_gets_that_jax_for_the_platform() -> None:
    tpu = resolved(f"jax=={PINNED_JAX}\n", "tpu")
    assert tpu.version("jax") == PINNED_JAX
    assert tpu.version("jaxlib") == PINNED_JAX
    assert tpu.version("libtpu") is not None  # the one that release needs
    gpu = resolved(f"jax=={PINNED_JAX}\n", "gpu")
    assert gpu.version("jax-cuda12-plugin") == PINNED_JAX


def test_a_conflicting_pin_names_the_line_and_the_platform() -> None:
    text = f"numpy\njax=={PINNED_JAX}\njaxlib==0.6.2\n"
    with pytest.raises(RuntimeConflictError) as info:
        resolved(text, "gpu")
    message = str(info.value)
    assert "requirements.txt:2" in message
    assert f"'jax=={PINNED_JAX}'" in message
    assert f"jax[cuda12]=={PINNED_JAX}" in message  # what it was installed as
    assert "requirements.txt:3: 'jaxlib==0.6.2'" in message
    assert "linux x86_64, Python 3.11" in message
    assert "requirements.txt:1" not in message  # numpy is not part of it
    assert isinstance(info.value, RequirementsError)


def test_a_jax_without_wheels_for_the_images_python_is_named() -> None:
    with pytest.raises(RuntimeConflictError, match=r"requirements.txt:1: 'jax==0.4.1'.*TPU"):
        resolved("jax==0.4.1\n", "tpu")


def test_a_project_line_that_would_change_the_runtime_is_named() -> None:
    with pytest.raises(RuntimeConflictError) as info:
        resolved("tabulate\nnumpy<1.20\n", "cpu")
    message = str(info.value)
    assert "requirements.txt:2: 'numpy<1.20'" in message
    assert "tabulate" not in message.split("\n")[0]


def test_a_project_line_without_a_wheel_is_named_at_submission() -> None:
    with pytest.raises(RuntimeConflictError, match="requirements.txt:1: 'kinetic-test-absent"):
        resolved("kinetic-test-absent-dist-xyz==1.0\n", "cpu")


def test_the_default_runtime_on_a_python_it_does_not_support_is_named() -> None:
    with pytest.raises(RuntimeConflictError, match=r"default TPU runtime.*Python 3\.8"):
        resolved("", "tpu", python="3.8")


def test_pip_resolves_the_same_set_where_uv_is_absent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    by_uv = resolved("", "cpu")
    monkeypatch.setattr(runtime_resolve, "find_uv", lambda: None)
    monkeypatch.setenv("KINETIC_RESOLVE_CACHE", str(tmp_path))
    by_pip = resolved("", "cpu")
    assert by_pip.version("jax") == by_uv.version("jax")
    assert by_pip.version("keras") == by_uv.version("keras")
    assert by_pip.version("jaxlib") == by_uv.version("jaxlib")
    with pytest.raises(RuntimeConflictError, match="requirements.txt:2: 'jaxlib==0.6.2'"):
        resolved(f"jax=={PINNED_JAX}\njaxlib==0.6.2\n", "cpu")


def test_resolutions_are_cached_across_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KINETIC_RESOLVE_CACHE", str(tmp_path))
    monkeypatch.setattr(runtime_resolve, "_MEMO", {})  # a new process
    first = resolved("", "cpu")
    assert list(tmp_path.glob("*.json"))
    monkeypatch.setattr(runtime_resolve, "_MEMO", {})  # another: only the disk cache is left
    monkeypatch.setattr(runtime_resolve, "_run", _no_resolver)
    assert resolved("", "cpu") == first


def _no_resolver(*args: object) -> tuple[str, ...]:
    raise AssertionError("resolved again")


@pytest.mark.parametrize("kept", ["jaxlib==0.4.30", f"jax=={PINNED_JAX}"])
def test_a_kept_line_is_the_users_override_not_a_conflict(
    kept: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(modes, "_said", set())
    caplog.set_level(logging.INFO, logger="kinetic")  # notes are INFO records
    request, runtime = submitted(f"numpy\n{kept}  # kn:keep\n", "tpu")
    # The runtime is the default one, and the kept line is left as written for its step.
    assert runtime.version("jax") == DEFAULTS["jax"]
    assert [r.line for r in request.kept] == [kept]
    [note] = [r.getMessage() for r in caplog.records if "kn:keep" in r.getMessage()]
    assert f"requirements.txt:2: {kept!r} is marked `# kn:keep`" in note
    assert "no longer guaranteed" in note


def test_a_kept_line_without_a_wheel_for_the_platform_is_named_at_submission() -> None:
    text = "tabulate\nkinetic-test-absent-dist-xyz==1.0  # kn:keep\n"
    with pytest.raises(RuntimeConflictError) as info:
        submitted(text, "cpu")
    message = str(info.value)
    assert "requirements.txt:2: 'kinetic-test-absent-dist-xyz==1.0' (marked `# kn:keep`)" in message
    assert "linux x86_64, Python 3.11" in message


def test_a_rewritten_line_is_said_once_however_often_it_is_submitted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(modes, "_said", set())  # a new process
    caplog.set_level(logging.INFO, logger="kinetic")  # notes are INFO records
    for _ in range(2):
        request, _ = submitted(f"jax=={PINNED_JAX}\n", "tpu")
        assert request.runtime_lines[0] == f"jax[tpu]=={PINNED_JAX}"
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("note: ")]
    assert len(notes) == 1
    assert (
        f"requirements.txt:1: 'jax=={PINNED_JAX}' is installed as 'jax[tpu]=={PINNED_JAX}'"
        in (notes[0])
    )
