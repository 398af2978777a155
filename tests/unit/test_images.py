"""Execution modes and image identity: pure rules, the build lock on a real local store,
and the registry token handshake (Artifact Registry's documented wire shape)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from kinetic._core import image_spec
from kinetic._core.config import resolve_settings
from kinetic._exceptions import BackendError, ConfigError, ImageBuildError
from kinetic._images import build_lock, prebuilt, runner_image
from kinetic._images.builder import choose_builder
from kinetic._images.docker import Registry
from kinetic._images.runtime_resolve import ResolvedRuntime
from kinetic._storage.local import LocalStorage
from tests.loopback_http import Request, reply, serve

# -- modes and tags (pure) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("container_image", "mode"),
    [
        (None, "bundled"),
        ("bundled", "bundled"),
        ("prebuilt", "prebuilt"),
        ("us-docker.pkg.dev/p/r/img:1", "custom"),
        ("python:3.11", "custom"),
    ],
)
def test_execution_mode(container_image: str | None, mode: str) -> None:
    assert image_spec.execution_mode(container_image) == mode


@pytest.mark.parametrize("bad", ["", "  ", " img:1"])
def test_blank_or_padded_image_is_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="container_image"):
        image_spec.execution_mode(bad)


def test_prebuilt_uri() -> None:
    assert image_spec.prebuilt_uri("kinetic", "tpu", "0.3.0") == "kinetic/base-tpu:0.3.0"
    assert image_spec.prebuilt_uri("reg/x/", "cpu", "1") == "reg/x/base-cpu:1"
    with pytest.raises(ValueError, match="category"):
        image_spec.prebuilt_uri("kinetic", "fpga", "1")


def _tag(**kw: object) -> str:
    args: dict[str, object] = {
        "base_image": "base",
        "requirements": ["anyio==4", "jax==0.10.2"],
        "category": "cpu",
    }
    args.update(kw)
    return image_spec.env_tag(**args)  # type: ignore[arg-type]


def test_environment_tag_is_a_digest_of_exactly_its_inputs() -> None:
    tag = _tag()
    assert tag == _tag()
    assert tag == _tag(requirements=["jax==0.10.2", "anyio==4"])  # a set: order is noise
    changed = [
        _tag(category="gpu"),
        _tag(base_image="base2"),
        _tag(requirements=["anyio==5", "jax==0.10.2"]),
        _tag(requirements=["anyio==4", "jax==0.7.0"]),
    ]
    assert tag not in changed
    assert len(set(changed)) == len(changed)


def test_runner_tag_is_a_digest_of_its_environment_and_kinetics_source() -> None:
    tag = image_spec.runner_tag("reg/kinetic-env:e1", {"runner/a.py": "d1"})
    assert tag == image_spec.runner_tag("reg/kinetic-env:e1", {"runner/a.py": "d1"})
    changed = [
        image_spec.runner_tag("reg/kinetic-env:e2", {"runner/a.py": "d1"}),
        image_spec.runner_tag("reg/kinetic-env:e1", {"runner/a.py": "d2"}),
        image_spec.runner_tag("reg/kinetic-env:e1", {"runner/b.py": "d1"}),
    ]
    assert tag not in changed
    assert len(set(changed)) == len(changed)


def test_project_tag_is_a_digest_of_its_runtime_and_its_lines() -> None:
    tag = image_spec.project_tag("reg/kinetic-runtime:k1", ["tabulate==0.9.0"])
    assert tag == image_spec.project_tag("reg/kinetic-runtime:k1", ["tabulate==0.9.0"])
    changed = [
        image_spec.project_tag("reg/kinetic-runtime:k2", ["tabulate==0.9.0"]),
        image_spec.project_tag("reg/kinetic-runtime:k1", ["tabulate==0.9.1"]),
        image_spec.project_tag("reg/kinetic-runtime:k1", ["tabulate==0.9.0", "six"]),
    ]
    assert tag not in changed
    assert len(set(changed)) == len(changed)


def test_a_project_image_builds_from_its_runtime_under_its_pins() -> None:
    env = image_spec.env_dockerfile("b")
    assert "FROM b\n" in env
    assert "KERAS_BACKEND=jax" in env
    runner = image_spec.runner_dockerfile("reg/kinetic-env:e1")
    assert "FROM reg/kinetic-env:e1\n" in runner
    assert "COPY src/" in runner
    project = image_spec.project_dockerfile("reg/kinetic-runtime:k1")
    assert "FROM reg/kinetic-runtime:k1\n" in project
    assert "-c /tmp/runtime-constraints.txt" in project
    files = image_spec.project_context_files(
        "reg/kinetic-runtime:k1", ["tabulate"], {"t.whl": b"w"}, ["jax==0.10.2", "anyio==4"]
    )
    assert files["user-requirements.txt"] == b"tabulate\n"
    assert files["runtime-constraints.txt"] == b"anyio==4\njax==0.10.2\n"
    assert files["user-wheels/t.whl"] == b"w"
    assert not any(name.startswith(("src/", "wheels/", "kept-")) for name in files)
    assert "kept" not in project


def test_kept_lines_are_installed_last_as_written_without_the_runtimes_pins() -> None:
    project = image_spec.project_dockerfile("reg/kinetic-runtime:k1", kept=True)
    constrained = project.index("-c /tmp/runtime-constraints.txt")
    kept_step = project.index("-r /tmp/kept-requirements.txt")
    assert constrained < kept_step  # after the project's lines
    kept_run = project[project.rindex("RUN ", 0, kept_step) :]
    assert "runtime-constraints" not in kept_run.split("&&")[0]  # not held to the pins
    assert "--no-index --find-links /tmp/kept-wheels" in kept_run
    files = image_spec.project_context_files(
        "reg/kinetic-runtime:k1",
        [],
        {},
        ["jax==0.10.2"],
        ["jaxlib==0.4.30", "numpy<2"],
        {"jaxlib.whl": b"j"},
    )
    assert files["kept-requirements.txt"] == b"jaxlib==0.4.30\nnumpy<2\n"  # in their order
    assert files["kept-wheels/jaxlib.whl"] == b"j"
    assert files["Dockerfile"] == project.encode()
    # A line moved between the project's and the kept ones is another image.
    runtime = "reg/kinetic-runtime:k1"
    plain = image_spec.project_tag(runtime, ["numpy", "jaxlib==0.4.30"])
    moved = image_spec.project_tag(runtime, ["numpy"], ["jaxlib==0.4.30"])
    assert plain != moved
    assert image_spec.project_tag(runtime, ["numpy"], []) == image_spec.project_tag(
        runtime, ["numpy"]
    )
    tpu = ResolvedRuntime("tpu", "3.11", ("jax==0.10.2", "keras==3.15.1"))
    plan = runner_image.project_plan(
        runner_image.runtime_plan("reg/kt", "python:3.11-slim", tpu), (), kept=("jax==0.7.0",)
    )
    assert plan.kept_requirements == ("jax==0.7.0",)
    assert plan.tag == image_spec.project_tag(plan.base_image, (), ("jax==0.7.0",))


# -- builder choice and settings (pure) --------------------------------------------------


@pytest.mark.parametrize(
    ("explicit", "project", "env", "chosen"),
    [
        (None, None, {}, "docker"),
        (None, "p", {}, "cloudbuild"),
        (None, "p", {"DOCKER_HOST": "unix:///d.sock"}, "docker"),
        ("docker", "p", {}, "docker"),
        ("cloudbuild", None, {}, "cloudbuild"),
    ],
)
def test_choose_builder(
    explicit: str | None, project: str | None, env: dict[str, str], chosen: str
) -> None:
    assert choose_builder(explicit, project=project, env=env) == chosen


def test_unknown_builder_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="'docker', 'cloudbuild'"):
        choose_builder("kaniko", project=None, env={})


def test_builder_and_base_image_repo_resolve_with_precedence() -> None:
    profile = {"builder": "docker", "base_image_repo": "prof/repo"}

    def settings(env: dict[str, str], arg: str | None = None) -> tuple[str, str | None]:
        s = resolve_settings(env=env, profile=profile, home="/h", base_image_repo=arg)
        return s.base_image_repo, s.builder

    assert settings({}) == ("prof/repo", "docker")
    env = {"KINETIC_BUILDER": "cloudbuild", "KINETIC_BASE_IMAGE_REPO": "env/repo"}
    assert settings(env) == ("env/repo", "cloudbuild")
    assert settings(env, "arg/repo") == ("arg/repo", "cloudbuild")
    none = resolve_settings(env={}, profile=None, home="/h")
    assert (none.base_image_repo, none.builder) == ("kinetic", None)


def test_default_registry_is_the_projects_artifact_registry_in_its_region() -> None:
    s = resolve_settings(env={}, profile=None, home="/h", project="p", zone="europe-west4-b")
    assert s.default_registry == "europe-west4-docker.pkg.dev/p/kinetic"
    with pytest.raises(ConfigError, match="KINETIC_IMAGE_REGISTRY"):
        _ = resolve_settings(env={}, profile=None, home="/h").default_registry


# -- one build per tag across processes (real local store) -------------------------------


async def test_concurrent_builders_of_one_tag_build_once(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "store")
    built = anyio.Event()
    builds: list[int] = []

    async def is_built() -> bool:
        return built.is_set()

    def builder(n: int) -> object:
        async def build() -> None:
            builds.append(n)
            await anyio.sleep(0.2)
            built.set()

        return build

    results: list[bool] = []

    async def one(n: int) -> None:
        results.append(
            await build_lock.build_once(
                store, "k123", is_built=is_built, build=builder(n), poll=0.02
            )
        )

    async with anyio.create_task_group() as tg:
        for n in range(5):
            tg.start_soon(one, n)
    assert len(builds) == 1
    assert sorted(results) == [False, False, False, False, True]
    assert not await store.exists(build_lock.marker_key("k123"))  # released


async def test_a_failed_build_releases_the_tag_for_the_next_builder(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "store")

    async def never() -> bool:
        return False

    async def broken() -> None:
        raise ImageBuildError("no such distribution")

    with pytest.raises(ImageBuildError, match="no such distribution"):
        await build_lock.build_once(store, "k1", is_built=never, build=broken)
    assert not await store.exists(build_lock.marker_key("k1"))


async def test_a_dead_builders_marker_is_taken_over_once_stale(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "store")
    stale = {"owner": "gone", "created_at": time.time() - 7200}
    await store.write(build_lock.marker_key("k2"), json.dumps(stale).encode())
    calls: list[str] = []

    async def never() -> bool:
        return False

    async def build() -> None:
        calls.append("built")

    assert await build_lock.build_once(
        store, "k2", is_built=never, build=build, poll=0.01, stale_after=3600
    )
    assert calls == ["built"]


async def test_waiting_on_a_live_builder_is_bounded(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "store")
    live = {"owner": "other", "created_at": time.time()}
    await store.write(build_lock.marker_key("k3"), json.dumps(live).encode())

    async def never() -> bool:
        return False

    async def build() -> None:
        raise AssertionError("must not build while another process holds the tag")

    with pytest.raises(ImageBuildError, match="another process building image tag k3"):
        await build_lock.build_once(
            store, "k3", is_built=never, build=build, poll=0.01, wait_timeout=0.1
        )


# -- the registry's token handshake (Docker registry v2 / Artifact Registry shape) -------


class FakeRegistry:
    """A registry's v2 API (Artifact Registry's shape) with its token service on the same
    host: a manifest wants ``Bearer reg-token``, else a challenge naming the service;
    the token service wants Basic credentials."""

    def __init__(self, present: set[str]) -> None:
        self.present = present
        self.seen: list[Request] = []
        self.url = ""

    def handle(self, request: Request) -> web.Response:
        self.seen.append(request)
        if request.path == "/v2/token":
            if request.headers.get("authorization", "").startswith("Basic "):
                return reply(200, json={"token": "reg-token"})
            return reply(401)
        if request.headers.get("authorization") != "Bearer reg-token":
            challenge = (
                f'Bearer realm="{self.url}/v2/token",'
                'service="us-docker.pkg.dev",scope="repository:p/r/img:pull"'
            )
            return reply(401, headers={"WWW-Authenticate": challenge})
        name_tag = request.path.removeprefix("/v2/").replace("/manifests/", ":")
        return reply(200 if name_tag in self.present else 404)


@contextlib.asynccontextmanager
async def registry(
    present: set[str], **options: Any
) -> AsyncIterator[tuple[Registry, FakeRegistry]]:
    fake = FakeRegistry(present)
    async with serve(fake.handle) as server:
        fake.url = server.url
        yield Registry(server.url.removeprefix("http://"), **options), fake


async def test_registry_token_handshake_then_one_request_per_query() -> None:
    async def creds() -> tuple[str, str]:
        return "oauth2accesstoken", "google-token"

    async with registry({"p/r/img:k1"}, credentials=creds) as (reg, fake):
        assert await reg.has_tag("p/r/img", "k1") is True
        token_request = next(r for r in fake.seen if r.path == "/v2/token")
        assert token_request.params["scope"] == "repository:p/r/img:pull"
        assert token_request.params["service"] == "us-docker.pkg.dev"
        fake.seen.clear()
        assert await reg.has_tag("p/r/img", "k2") is False
        assert len(fake.seen) == 1  # the token is reused: a warm query is one request


async def test_registry_refusing_credentials_is_a_clear_backend_error() -> None:
    async with registry(set()) as (reg, _):
        with pytest.raises(BackendError, match="token service .* answered HTTP 401"):
            await reg.has_tag("p/r/img", "k1")


async def test_unreachable_registry_is_a_backend_error() -> None:
    reg = Registry("127.0.0.1:1")
    with pytest.raises(
        BackendError, match="registry 127.0.0.1:1: .* cannot connect to 127.0.0.1:1"
    ):
        await reg.has_tag("x", "y")


def test_projects_share_one_runtime_image_and_differ_only_in_their_own() -> None:
    tpu = ResolvedRuntime("tpu", "3.11", ("jax==0.10.2", "keras==3.15.1", "libtpu==0.0.42.1"))
    runtime = runner_image.runtime_plan("reg/kt", "python:3.11-slim", tpu)
    assert runtime == runner_image.runtime_plan("reg/kt", "python:3.11-slim", tpu)
    assert runtime.uri.startswith("reg/kt/kinetic-runtime:k")
    assert "libtpu==0.0.42.1" in runtime.requirements
    env = runtime.parent
    assert env is not None
    assert env.uri.startswith("reg/kt/kinetic-env:e")
    assert runtime.base_image == env.uri  # Kinetic's source on the environment image
    assert env.requirements == tpu.pins
    assert env.sources == {}
    pinned = ResolvedRuntime("tpu", "3.11", ("jax==0.7.0", "keras==3.15.1", "libtpu==0.0.19.1"))
    assert runner_image.runtime_plan("reg/kt", "python:3.11-slim", pinned).uri != runtime.uri
    cpu = ResolvedRuntime("cpu", "3.11", ("jax==0.10.2", "keras==3.15.1"))
    assert runner_image.runtime_plan("reg/kt", "python:3.11-slim", cpu).uri != runtime.uri
    a = runner_image.project_plan(runtime, ("tabulate",))
    b = runner_image.project_plan(runtime, ("tabulate==0.8.10",))
    assert a.base_image == b.base_image == runtime.uri  # FROM the shared runtime
    assert a.parent == runtime
    assert a.uri != b.uri
    assert a.uri.startswith("reg/kt/kinetic-runner:p")
    assert a.requirements == runtime.requirements  # its pins: the project's constraints


@pytest.mark.parametrize("category", ["cpu", "gpu", "tpu"])
def test_the_prebuilt_base_is_the_runtime_image_under_its_own_name(category: str) -> None:
    pins = ("jax==0.10.2", "keras==3.15.1", "uv==0.9.0")
    runtime_set = ResolvedRuntime(category, "3.11", pins)
    base = prebuilt.base_plan("reg/kt", category, "0.1.0", "python:3.11-slim", runtime_set)
    runtime = runner_image.runtime_plan("reg/kt", "python:3.11-slim", runtime_set)
    assert base.uri == f"reg/kt/base-{category}:0.1.0"
    # The same recipe: the same environment image (its layers, by their content address)
    # and the same source layer on it; only the name differs.
    assert base.parent == runtime.parent
    assert base.base_image == runtime.base_image
    assert image_spec.runner_context_files(
        base.base_image, base.sources
    ) == image_spec.runner_context_files(runtime.base_image, runtime.sources)
    same = dataclasses.replace(
        base, uri=runtime.uri, repository=runtime.repository, tag=runtime.tag
    )
    assert same == runtime
    assert image_spec.runner_tag(base.base_image, runner_image.runner_inputs()[2]) == runtime.tag
    # Bases pushed elsewhere than the bundled images: still the same environment image.
    elsewhere = runner_image.runtime_plan("other/reg", "python:3.11-slim", runtime_set)
    assert elsewhere.parent is not None
    assert base.parent is not None
    assert elsewhere.parent.tag == base.parent.tag


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_images_follow_the_clients_python(python: str) -> None:
    """A payload's code loads only in the Python that pickled it: a 3.12 client's built
    images start from python:3.12-slim, resolve for 3.12, and its prebuilt base is the
    3.12 one; each keyed apart from the others'."""
    from kinetic._core.accel_runtime import image_python
    from kinetic._core.gke_config import default_base_image

    base = default_base_image(python)
    assert base == f"python:{python}-slim"
    assert image_python(base) == python
    assert image_spec.resolver_python(image_python(base)) == f"{python}.0"
    assert image_spec.prebuilt_tag("0.3.0", python) == f"0.3.0-py{python}"
    others = {default_base_image(p) for p in ("3.11", "3.12", "3.13")} - {base}
    tags = {image_spec.env_tag(b, ["jax==0.4.30"]) for b in others}
    assert image_spec.env_tag(base, ["jax==0.4.30"]) not in tags


def test_the_default_base_image_is_this_pythons() -> None:
    import sys

    from kinetic._core.gke_config import DEFAULT_BASE_IMAGE, options_from_env

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"python:{here}-slim" == DEFAULT_BASE_IMAGE
    assert options_from_env({}).base_image == DEFAULT_BASE_IMAGE
