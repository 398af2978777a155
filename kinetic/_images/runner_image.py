"""Build (once) and push Kinetic's images: content-addressed, cached.

Three kinds of plan stack (see :mod:`kinetic._core.image_spec`): :func:`env_plan` for
the environment image (the venv with the runtime set, the heavy one), :func:`runner_plan`
for Kinetic's source on it (with a resolved runtime set, :func:`runtime_plan`, the
**runtime image** of a category, shared by every project and the same image as the
prebuilt base), and :func:`project_plan` for a project's requirements ``FROM`` a runtime
image.

:func:`ensure_image` computes an image's tag from exactly its inputs
(:mod:`kinetic._core.image_spec`): the accelerator category, the base image and the
pinned set (environment images); the environment image and the source of the
``kinetic`` and ``runner`` packages (runner images); the runtime image and the user's
lines (project images). If the registry already has that tag, it is returned at once
(one registry request; none for a tag this process already saw). Otherwise the images
it is built ``FROM`` are ensured first, the build context is assembled for the builder's
install path, one builder (the Docker Engine or Cloud Build) builds and pushes it, and
the registry must then list the tag. On the **index** path (Cloud Build's default) the
context holds the resolved set with the hashes of its files and the build installs it
from the package index (:mod:`kinetic._images.index_build`); on the **wheels** path (the
Docker builder's default) the wheels are downloaded on this host (``pip download``,
cached under ``~/.cache/kinetic/wheels/``) so the build needs no network. The tag is the
same on both (:mod:`kinetic._core.index_install`). One build per tag runs at a time: in
this process (a lock per tag) and across processes sharing a store
(:mod:`kinetic._images.build_lock`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
from packaging.specifiers import InvalidSpecifier, SpecifierSet

import runner
from kinetic._core import image_spec
from kinetic._exceptions import ImageBuildError
from kinetic._images import build_lock, index_build
from kinetic._images.builder import ImageBuilder, Progress
from kinetic._images.docker import DockerBuilder, Registry
from kinetic._images.gauth import google_registry_credentials, is_google_registry
from kinetic._images.runtime_resolve import PIP_PLATFORMS, ResolvedRuntime
from kinetic._storage.base import Storage

DISTRIBUTION = "kinetic-aio"
PLATFORMS = PIP_PLATFORMS
RUNTIME_REPOSITORY = image_spec.RUNTIME_REPOSITORY
ENV_REPOSITORY = image_spec.ENV_REPOSITORY
log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")
_LOCKS: dict[str, anyio.Lock] = {}
_KNOWN: set[str] = set()
"""Image URIs this process has seen in their registry (tags are never rewritten)."""


@dataclass(frozen=True)
class BuildPlan:
    """What an image is made of, and where it goes.

    ``kind`` is one of (see :mod:`kinetic._core.image_spec`):

    - ``env``: ``requirements`` installed on ``base_image``;
    - ``runner``: ``sources`` on ``base_image`` (its ``parent``, an ``env`` image);
    - ``project``: ``user_requirements`` on ``base_image`` (its ``parent``, a runner
      image) under the ``requirements`` (the runner's pins) as constraints, then
      ``kept_requirements`` (``# kn:keep`` lines) as written, without them.

    ``parent`` is the plan of the image this one is built ``FROM`` (None for ``env``):
    :func:`ensure_image` makes sure it exists first.
    """

    uri: str
    registry: str
    repository: str
    tag: str
    base_image: str
    category: str
    requirements: tuple[str, ...]
    sources: dict[str, bytes]
    user_requirements: tuple[str, ...] = ()
    python: str = "3.11"
    kept_requirements: tuple[str, ...] = ()
    kind: str = "runner"
    parent: BuildPlan | None = None


def _pin(name: str, declared: str, python: str) -> str:
    """``name==V`` for the version installed here, when it installs on every patch
    release of Python ``python`` (an image's exact patch is its base's: the newest for
    ``python:3.11-slim``, 3.11.2 for Debian's own); else the ``declared`` requirement, for
    the resolver to pick a release that does."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return declared
    for requires_python in dist.metadata.get_all("Requires-Python") or ():
        try:
            if not SpecifierSet(requires_python).contains(image_spec.resolver_python(python)):
                return declared
        except InvalidSpecifier:
            pass
    return f"{name}=={dist.version}"


def pinned_requirements(distribution: str = DISTRIBUTION, python: str = "3.11") -> list[str]:
    """Kinetic's runtime dependencies, pinned to the versions installed here (see
    :func:`_pin` for those that need a later patch release of ``python``)."""
    out = []
    for req in importlib.metadata.requires(distribution) or []:
        if "extra ==" in req or "extra==" in req:
            continue
        m = _NAME.match(req)
        if m is None:
            continue
        out.append(_pin(m.group(0), req.split(";")[0].strip(), python))
    return sorted(out)


RUNNER_TOOLS = ("debugpy",)
"""Installed in every image Kinetic builds besides its own dependencies: debugpy, so that
any job can run with ``debug=True`` (see ``runner/debug.py``). Pinned to the version
installed here when there is one."""


def tool_requirements(python: str = "3.11") -> list[str]:
    """:data:`RUNNER_TOOLS` as requirement lines."""
    return [_pin(name, name, python) for name in RUNNER_TOOLS]


KINETIC_ROOT = Path(__file__).parents[1]
"""The ``kinetic`` package's folder, found from this file (``kinetic/_images/``) rather
than by importing ``kinetic``, which sits above the images."""


def package_sources() -> dict[str, bytes]:
    """The ``kinetic`` and ``runner`` packages' files (``.py``, ``py.typed``). Blocking."""
    files: dict[str, bytes] = {}
    for root in (KINETIC_ROOT, Path(str(runner.__file__)).parent):
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix == ".py" or path.name == "py.typed":
                files[f"{root.name}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return files


@functools.cache
def runner_inputs(
    python: str = "3.11",
) -> tuple[tuple[str, ...], dict[str, bytes], dict[str, str]]:
    """(pinned requirements, source files, their SHA-256s): read once per process, since
    the code running here is what goes into the image. Blocking the first time."""
    sources = package_sources()
    digests = {p: hashlib.sha256(d).hexdigest() for p, d in sources.items()}
    return (*pinned_requirements(python=python), *tool_requirements(python)), sources, digests


def plan(
    registry: str,
    base_image: str,
    repository: str = image_spec.DEFAULT_REPOSITORY,
    *,
    category: str = "cpu",
    extra_requirements: tuple[str, ...] = (),
    python: str = "3.11",
) -> BuildPlan:
    """The runner image for this code: Kinetic's pinned dependencies and
    ``extra_requirements`` on ``base_image``. Blocking the first time in a process (reads
    the sources), then pure.
    """
    pinned, _, _ = runner_inputs(python)
    env = env_plan(registry, base_image, (*pinned, *extra_requirements), category, python)
    return runner_plan(env, repository)


def env_plan(
    registry: str,
    base_image: str,
    requirements: tuple[str, ...],
    category: str = "cpu",
    python: str = "3.11",
) -> BuildPlan:
    """The environment image of ``requirements`` (exact pins) on ``base_image``, in
    ``{registry}/kinetic-env``. Pure."""
    tag = image_spec.env_tag(base_image, requirements, category=category)
    return BuildPlan(
        uri=image_spec.image_uri(registry, tag, ENV_REPOSITORY),
        registry=registry,
        repository=ENV_REPOSITORY,
        tag=tag,
        base_image=base_image,
        category=category,
        requirements=requirements,
        sources={},
        python=python,
        kind="env",
    )


def runner_plan(env: BuildPlan, repository: str = image_spec.DEFAULT_REPOSITORY) -> BuildPlan:
    """Kinetic's source on the environment image ``env``, in ``{registry}/{repository}``.
    Blocking the first time in a process (reads the sources), then pure."""
    _, sources, digests = runner_inputs()
    tag = image_spec.runner_tag(env.uri, digests)
    return BuildPlan(
        uri=image_spec.image_uri(env.registry, tag, repository),
        registry=env.registry,
        repository=repository,
        tag=tag,
        base_image=env.uri,
        category=env.category,
        requirements=env.requirements,
        sources=sources,
        python=env.python,
        kind="runner",
        parent=env,
    )


def runtime_inputs(python: str = "3.11") -> tuple[str, ...]:
    """Kinetic's own lines of a runtime image: its pinned dependencies, the runner's
    tools and ``uv`` (prebuilt mode installs with it). Blocking the first time."""
    pinned, _, _ = runner_inputs(python)
    return (*pinned, image_spec.UV_REQUIREMENT)


def runtime_plan(registry: str, base_image: str, runtime: ResolvedRuntime) -> BuildPlan:
    """The runtime image of ``runtime`` (resolved with :func:`runtime_inputs`): Kinetic's
    source, in ``{registry}/kinetic-runtime``, on the environment image of its exact set
    on ``base_image``. Blocking the first time in a process."""
    env = env_plan(registry, base_image, runtime.pins, runtime.category, runtime.python)
    return runner_plan(env, RUNTIME_REPOSITORY)


def project_plan(
    runtime: BuildPlan,
    user_requirements: tuple[str, ...],
    registry: str | None = None,
    *,
    kept: tuple[str, ...] = (),
) -> BuildPlan:
    """A project image: ``user_requirements`` on the runtime image ``runtime``, under its
    pins, then the ``kept`` (``# kn:keep``) lines as written, in
    ``{registry}/kinetic-runner`` (the runtime's registry by default). Pure."""
    registry = registry or runtime.registry
    tag = image_spec.project_tag(runtime.uri, user_requirements, kept)
    return BuildPlan(
        uri=image_spec.image_uri(registry, tag, image_spec.DEFAULT_REPOSITORY),
        registry=registry,
        repository=image_spec.DEFAULT_REPOSITORY,
        tag=tag,
        base_image=runtime.uri,
        category=runtime.category,
        requirements=runtime.requirements,
        sources={},
        user_requirements=user_requirements,
        python=runtime.python,
        kept_requirements=kept,
        kind="project",
        parent=runtime,
    )


def wheel_cache() -> Path:
    """Where downloaded wheels are kept (``KINETIC_WHEEL_CACHE``)."""
    env = os.environ.get("KINETIC_WHEEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kinetic" / "wheels"


def download_wheels(
    requirements: tuple[str, ...],
    python_version: str = "3.11",
    *,
    with_installer: bool = True,
    constraints: tuple[str, ...] = (),
) -> dict[str, bytes]:
    """Wheels for ``requirements`` (requirement lines, options such as ``--index-url``
    included) and their dependencies, for CPython ``python_version`` on x86-64 Linux,
    from the package index this host uses (cached). Blocking.

    :param with_installer: also fetch ``pip`` and ``setuptools`` (the venv's own).
    :param constraints: pins the download must keep (a runtime image's set).
    :raises ImageBuildError: pip could not download them; the message names pip's reason.
    """
    lines = (*requirements, *(("pip", "setuptools") if with_installer else ()))
    key_text = "\n".join((*lines, "-c", *constraints, *PLATFORMS)) + python_version
    key = hashlib.sha256(key_text.encode()).hexdigest()[:16]
    dest = wheel_cache() / key
    done = dest / ".complete"
    if not done.exists():
        dest.mkdir(parents=True, exist_ok=True)
        abi = "cp" + python_version.replace(".", "")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--dest",
            str(dest),
            "--only-binary=:all:",
            "--python-version",
            image_spec.resolver_python(python_version),
            "--implementation",
            "cp",
            "--abi",
            abi,
            "--abi",
            "abi3",
            "--abi",
            "none",
        ]
        for platform in PLATFORMS:
            cmd += ["--platform", platform]
        with tempfile.TemporaryDirectory() as tmp:
            req_file = Path(tmp) / "requirements.txt"
            req_file.write_text("".join(f"{line}\n" for line in lines))
            if constraints:
                cons_file = Path(tmp) / "constraints.txt"
                cons_file.write_text("".join(f"{line}\n" for line in constraints))
                cmd += ["-c", str(cons_file)]
            proc = subprocess.run(
                [*cmd, "-r", str(req_file)],
                check=False,
                capture_output=True,
                text=True,
                timeout=900,
            )
        if proc.returncode != 0:
            raise ImageBuildError(
                f"pip download of {', '.join(requirements) or 'the runner'}'s wheels "
                f"(for Python {python_version} on Linux x86-64) failed; every requirement "
                f"needs a wheel on the package index:\n{proc.stderr[-3000:]}"
            )
        done.write_text("ok\n")
    return {p.name: p.read_bytes() for p in sorted(dest.glob("*.whl"))}


def registry_of(uri: str) -> Registry:
    """A registry client for ``uri``'s host, with Google credentials for Google's."""
    host, _, _ = image_spec.parse_image_uri(uri)
    creds = google_registry_credentials if is_google_registry(host) else None
    return Registry(host, credentials=creds)


async def image_exists(uri: str) -> bool:
    """Whether the registry lists ``uri`` (one request, none once seen by this process).

    :raises BackendError: the registry failed.
    """
    if uri in _KNOWN:
        return True
    _, name, tag = image_spec.parse_image_uri(uri)
    if await registry_of(uri).has_tag(name, tag):
        _KNOWN.add(uri)
        return True
    return False


def _index_files(the_plan: BuildPlan, env: Mapping[str, str]) -> dict[str, bytes]:
    """The index path's context files of an ``env`` or ``project`` plan.

    :raises IndexUnavailable: the index path cannot build it here (the reason said).
    :raises ImageBuildError: the hashes could not be resolved.
    """
    if the_plan.kind == "project":
        return index_build.project_files(
            the_plan.base_image,
            the_plan.user_requirements,
            the_plan.requirements,
            the_plan.kept_requirements,
            the_plan.python,
            env,
        )
    return index_build.env_files(the_plan.base_image, the_plan.requirements, the_plan.python, env)


def _context(
    the_plan: BuildPlan, install: str = "wheels", env: Mapping[str, str] | None = None
) -> tuple[bytes, str | None]:
    """``the_plan``'s build context for the ``install`` path (``index`` or ``wheels``;
    a runner image's context, Kinetic's sources, is the same on both), and why the
    index path fell back to the wheels path (None when it did not). Blocking.

    :raises ImageBuildError: the wheels or the hashes could not be had.
    """
    if install == "index" and the_plan.kind != "runner":
        try:
            files = _index_files(the_plan, os.environ if env is None else env)
        except index_build.IndexUnavailable as exc:
            note = f"{the_plan.uri}: installing from wheels prepared here: {exc}"
            return image_spec.build_context(_wheels_files(the_plan)), note
        return image_spec.build_context(files), None
    return image_spec.build_context(_wheels_files(the_plan)), None


def _wheels_files(the_plan: BuildPlan) -> dict[str, bytes]:
    """The wheels path's context files: every wheel downloaded here. Blocking."""
    if the_plan.kind == "project":
        user_wheels = (
            download_wheels(
                the_plan.user_requirements,
                the_plan.python,
                with_installer=False,
                constraints=the_plan.requirements,
            )
            if the_plan.user_requirements
            else {}  # only kept lines
        )
        kept = the_plan.kept_requirements
        # Kept lines are the user's override: their wheels are not held to the runtime's
        # pins (the project's index options still say where to find them).
        kept_wheels = (
            download_wheels(
                (*image_spec.index_options(the_plan.user_requirements), *kept),
                the_plan.python,
                with_installer=False,
            )
            if kept
            else {}
        )
        files = image_spec.project_context_files(
            the_plan.base_image,
            the_plan.user_requirements,
            user_wheels,
            the_plan.requirements,
            kept,
            kept_wheels,
        )
    elif the_plan.kind == "runner":
        files = image_spec.runner_context_files(the_plan.base_image, the_plan.sources)
    else:
        wheels = download_wheels(the_plan.requirements, the_plan.python)
        files = image_spec.env_context_files(the_plan.base_image, the_plan.requirements, wheels)
    return files


async def ensure_image(
    the_plan: BuildPlan,
    make_builder: Callable[[], ImageBuilder],
    *,
    lock_storage: Storage | None = None,
    progress: Progress | None = None,
) -> str:
    """The URI of ``the_plan``'s image, building and pushing it first if the registry
    does not list it, after the images it is built ``FROM`` (its ``parent`` chain; an
    image is only pushed after its parent, so a listed image needs no further request).
    With ``lock_storage``, processes sharing that store build a tag once between them.
    The builder is made only when a build is needed (a warm call never fails on a
    builder it does not use).

    :raises ImageBuildError: pip, the build or the push failed; nothing is tagged.
    :raises BackendError: the registry failed.
    """
    uri = the_plan.uri
    if await image_exists(uri):
        return uri
    if the_plan.parent is not None:
        await ensure_image(
            the_plan.parent, make_builder, lock_storage=lock_storage, progress=progress
        )

    async def build_it() -> None:
        await build(the_plan, make_builder(), progress=progress)

    async with _LOCKS.setdefault(uri, anyio.Lock()):
        if lock_storage is None:
            if not await image_exists(uri):
                await build_it()
        else:
            await build_lock.build_once(
                lock_storage, the_plan.tag, is_built=lambda: image_exists(uri), build=build_it
            )
    return uri


async def build(
    the_plan: BuildPlan, builder: ImageBuilder, *, progress: Progress | None = None
) -> None:
    """Assemble the context for ``builder``'s install path (the hashed requirements on
    the index path, the wheels fetched here on the wheels path), build and push
    ``the_plan``'s image, and check that the registry lists it. Unconditional: callers
    decide whether to build. A fall-back from the index path is said to ``progress``.

    :raises ImageBuildError: pip, the build or the push failed.
    :raises BackendError: the registry failed.
    """
    uri = the_plan.uri
    if progress is not None:
        progress(f"building {uri} with {builder.name}")
    context, note = await anyio.to_thread.run_sync(_context, the_plan, builder.install)
    if note is not None:
        log.warning("%s", note)
        if progress is not None:
            progress(f"note: {note}")
    await builder.build_and_push(context, uri, progress=progress)
    _KNOWN.discard(uri)
    if not await image_exists(uri):
        raise ImageBuildError(f"pushed {uri}, but the registry does not list it")


async def ensure_runner_image(
    registry: str,
    base_image: str,
    *,
    docker_host: str | None = None,
    repository: str = image_spec.DEFAULT_REPOSITORY,
) -> str:
    """The URI of a plain runner image (Kinetic's dependencies and code, no accelerator
    runtime), built with the local Docker daemon if needed. Jobs never get it on their
    own (their images carry the runtime: :func:`runtime_plan`); the test tiers and
    benchmarks use it as a small custom image.

    :raises ImageBuildError, BackendError: see :func:`ensure_image`.
    """
    the_plan = await anyio.to_thread.run_sync(plan, registry, base_image, repository)
    return await ensure_image(the_plan, lambda: DockerBuilder(docker_host))
