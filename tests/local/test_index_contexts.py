"""The index path's build contexts, made for real at submission (nothing is built here).

Real resolutions against the package index (uv from the test extra): the GPU runtime's
environment image goes to its build as a hashed requirements file of kilobytes, not as
gigabytes of CUDA wheels; a project's context holds its own set only, under the
runtime's pins; and an index a build cannot use sends the build down the wheels path,
saying why.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from kinetic._core import index_install
from kinetic._core.accel_runtime import runtime_request
from kinetic._images import runner_image, runtime_resolve

pytestmark = [pytest.mark.local, pytest.mark.timeout(600)]

BASE = "python:3.11-slim"


def members(context: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(context)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def runtime_plan(category: str) -> runner_image.BuildPlan:
    request = runtime_request((), category)
    runtime = runtime_resolve.resolve_runtime(request, "3.11", runner_image.runtime_inputs())
    return runner_image.runtime_plan("registry.test/kt", BASE, runtime)


def test_the_gpu_environment_image_goes_to_its_build_as_kilobytes() -> None:
    runtime = runtime_plan("gpu")
    env = runtime.parent
    assert env is not None
    context, note = runner_image._context(env, "index", {})
    assert note is None
    files = members(context)
    assert set(files) == {"Dockerfile", "requirements.txt"}
    assert len(context) < 1_000_000  # the wheels path's context is gigabytes
    assert b"--require-hashes" in files["Dockerfile"]
    pins = index_install.parse_hashed(files["requirements.txt"].decode())
    # Exactly the resolved set, each with the hash of every file of its version.
    assert tuple(sorted(p.pin for p in pins)) == env.requirements
    by_name = {p.name: p for p in pins}
    assert len(by_name["jaxlib"].hashes) > 1  # a wheel per platform and Python
    assert len(by_name["nvidia-cublas-cu12"].hashes) >= 1
    # The same plan, the same tag, whichever path builds it.
    assert env.tag == runtime_plan("gpu").parent.tag  # type: ignore[union-attr]


def test_a_project_context_holds_its_own_set_under_the_runtimes_pins() -> None:
    runtime = runtime_plan("cpu")
    project = runner_image.project_plan(
        runtime, ("tabulate==0.8.10", "numpy"), kept=("six==1.16.0",)
    )
    context, note = runner_image._context(project, "index", {})
    assert note is None
    files = members(context)
    assert set(files) == {
        "Dockerfile",
        "user-requirements.txt",
        "runtime-constraints.txt",
        "kept-requirements.txt",
    }
    own = {p.pin for p in index_install.parse_hashed(files["user-requirements.txt"].decode())}
    # numpy is the runtime's (its pin is a constraint, installed already): not again.
    assert own == {"tabulate==0.8.10"}
    assert files["runtime-constraints.txt"].decode().split() == list(runtime.requirements)
    kept = index_install.parse_hashed(files["kept-requirements.txt"].decode())
    assert [p.pin for p in kept] == ["six==1.16.0"]


def test_an_index_the_build_cannot_use_falls_back_to_wheels_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_WHEEL_CACHE", str(tmp_path / "wheels"))
    runtime = runtime_plan("cpu")
    project = runner_image.project_plan(runtime, ("tabulate==0.9.0",))
    env = {"PIP_INDEX_URL": "https://me:s3cret@private.example/simple"}
    context, note = runner_image._context(project, "index", env)
    assert note is not None
    assert "carries credentials" in note
    assert project.uri in note
    files = members(context)
    assert "user-wheels/tabulate-0.9.0-py3-none-any.whl" in files


def test_kept_lines_keep_the_versions_installed_before_them_where_they_allow() -> None:
    # A runtime holding older releases than a lone resolution of the kept line takes.
    older = ("numpy==2.0.2", "rich==13.9.0")
    env = runner_image.env_plan("registry.test/kt", BASE, older)
    runtime = runner_image.runner_plan(env)
    project = runner_image.project_plan(runtime, (), kept=("keras==3.8.0",))
    context, _ = runner_image._context(project, "index", {})
    kept = {
        p.name: p.version
        for p in index_install.parse_hashed(members(context)["kept-requirements.txt"].decode())
    }
    assert kept["keras"] == "3.8.0"  # the override, as written
    # Its dependencies stay at the versions installed before it (keras 3.8 accepts them),
    # as pip keeps what is installed on the wheels path.
    assert kept["numpy"] == "2.0.2"
    assert kept["rich"] == "13.9.0"
    lone = dict(pin.split("==") for pin in runtime_resolve.resolve(["keras==3.8.0"], "3.11"))
    assert (lone["numpy"], lone["rich"]) != ("2.0.2", "13.9.0")  # what the test tells apart
