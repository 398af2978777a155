"""The index install path on the testbed: the Docker builder with
``KINETIC_BUILD_INSTALL=index`` builds on the host's network (the testbed's dockerd runs
with ``--bridge=none``), from contexts that hold hashed requirement files and no wheel,
and pip installs the set from the package index inside the build. Jobs then run in the
images. Where this machine reaches the index through a TLS-intercepting proxy (its pip
trusts ``PIP_CERT``), the builds are given the same CAs (``KINETIC_BUILD_CA_BUNDLE``).

- A bundled job's images (environment, runtime, project) are built on the index path,
  each build on the host's network with no wheel in its context; the job imports the
  project's requirement at its pinned version. The images are content-addressed as on
  the wheels path: a later run reuses them.
- A project image built afresh (no layer cache, a registry path of its own) shows pip
  downloading the requirement inside the build, with nothing downloaded here; a job
  runs in that image.
"""

from __future__ import annotations

import functools
import io
import os
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import kinetic
from kinetic._core import index_install
from kinetic._images import modes, runner_image
from kinetic._images.docker import DockerBuilder, DockerEngine
from tests.cluster.test_execution_modes import make_project
from tests.fix_cluster import GKETarget

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

DIST = "tabulate"
PINNED = "0.8.10"


def context_names(context: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(context)) as tar:
        return tar.getnames()


@pytest.fixture
def docker_builds(
    gke: GKETarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    """Index-path builds with the Docker builder on the testbed; records each build the
    daemon is asked for (its tag, network and context's files). Wheels would be
    downloaded into an empty cache of the test's own."""
    env = gke.testbed.env
    monkeypatch.setenv("KINETIC_IMAGE_BASE", env["KINETIC_TESTBED_BASE_IMAGE"])
    monkeypatch.setenv("KINETIC_BUILDER", "docker")
    monkeypatch.setenv("KINETIC_BUILD_INSTALL", "index")
    monkeypatch.setenv("KINETIC_WHEEL_CACHE", str(tmp_path / "wheels"))
    # Where this machine's egress intercepts TLS, its pip trusts the proxy's CA through
    # PIP_CERT (or SSL_CERT_FILE); a build that reaches the index through it must too.
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    if ca:
        monkeypatch.setenv("KINETIC_BUILD_CA_BUNDLE", ca)
    seen: list[dict[str, Any]] = []
    build = DockerEngine.build

    async def recording_build(self: DockerEngine, context: bytes, tag: str, **kw: Any) -> str:
        seen.append({"tag": tag, "network": kw.get("network"), "files": context_names(context)})
        return await build(self, context, tag, **kw)

    monkeypatch.setattr(DockerEngine, "build", recording_build)
    return seen


def test_a_bundled_job_runs_in_images_built_from_the_index(
    gke: GKETarget,
    docker_builds: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = f"{gke.testbed.env['KINETIC_TESTBED_REGISTRY']}/kt-index"
    monkeypatch.setenv("KINETIC_IMAGE_REGISTRY", registry)
    fn = make_project(tmp_path / "proj", f"{DIST}=={PINNED}\n")
    remote = kinetic.run(**gke.run_args(container_image=None))(fn)

    job = remote.run_async(DIST)
    assert job.image_uri.startswith(f"{registry}/kinetic-runner:")
    assert job.result(timeout=300) == PINNED
    for build in docker_builds:  # none when an earlier run pushed the images
        assert build["network"] == "host", build
        assert not [name for name in build["files"] if name.endswith(".whl")], build
    project_builds = [b for b in docker_builds if b["tag"] == job.image_uri]
    for build in project_builds:
        assert set(build["files"]) - {index_install.CA_FILE} == {
            "Dockerfile",
            "user-requirements.txt",
            "runtime-constraints.txt",
        }
    assert not (tmp_path / "wheels").exists()


def test_a_fresh_index_build_downloads_inside_the_build(
    gke: GKETarget, docker_builds: list[dict[str, Any]], tmp_path: Path
) -> None:
    env = gke.testbed.env
    base = env["KINETIC_TESTBED_BASE_IMAGE"]
    registry = f"{env['KINETIC_TESTBED_REGISTRY']}/kt-index"
    _, resolved = anyio.run(modes.resolve_runtime, (), "cpu", base)
    runtime = runner_image.runtime_plan(registry, base, resolved)
    builder = DockerBuilder(env["DOCKER_HOST"], install="index")
    anyio.run(runner_image.ensure_image, runtime, lambda: builder)  # kept from the last test

    # A registry path of its own and no layer cache: the install step really runs.
    fresh = f"{env['KINETIC_TESTBED_REGISTRY']}/kt-index-{uuid.uuid4().hex[:8]}"
    project = runner_image.project_plan(runtime, (f"{DIST}=={PINNED}",), registry=fresh)
    log: list[str] = []
    cold = DockerBuilder(env["DOCKER_HOST"], install="index", no_cache=True)
    build: Callable[[], Any] = functools.partial(
        runner_image.build, project, cold, progress=log.append
    )
    anyio.run(build)

    text = "\n".join(log)
    assert "pip install --require-hashes" in text
    assert f"Downloading {DIST}-{PINNED}-py3-none-any.whl" in text, text[-3000:]
    assert docker_builds[-1]["tag"] == project.uri
    assert docker_builds[-1]["network"] == "host"
    assert not (tmp_path / "wheels").exists()

    fn = make_project(tmp_path / "proj", "")
    got = kinetic.run(**gke.run_args(container_image=project.uri))(fn)(DIST)
    assert got == PINNED
