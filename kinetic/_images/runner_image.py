"""Build (once) and push the runner image: content-addressed, offline, cached.

:func:`ensure_runner_image` computes the image's tag from its inputs
(:func:`kinetic._core.image_spec.image_tag`): the base image, Kinetic's own
dependencies pinned to the versions installed here, and the source of the
``kinetic`` and ``runner`` packages. If the registry already has that tag, it is
returned at once (one registry request). Otherwise the dependency wheels are
downloaded on this host (``pip download``, cached under
``~/.cache/kinetic/wheels/``), the build context is assembled, the Docker daemon
(``DOCKER_HOST``) builds it with the network off, and the image is pushed.
Concurrent callers in one process share one build.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

import kinetic
import runner
from kinetic._core import image_spec
from kinetic._exceptions import BackendError
from kinetic._images.docker import DockerEngine, Registry

DISTRIBUTION = "kinetic-aio"
PLATFORMS = (
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_34_x86_64",
    "linux_x86_64",
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")
_LOCK = anyio.Lock()


@dataclass(frozen=True)
class BuildPlan:
    """What :func:`ensure_runner_image` would build, and where it goes."""

    uri: str
    registry: str
    repository: str
    tag: str
    base_image: str
    requirements: tuple[str, ...]
    sources: dict[str, bytes]


def pinned_requirements(distribution: str = DISTRIBUTION) -> list[str]:
    """Kinetic's runtime dependencies, pinned to the versions installed here."""
    out = []
    for req in importlib.metadata.requires(distribution) or []:
        if "extra ==" in req or "extra==" in req:
            continue
        m = _NAME.match(req)
        if m is None:
            continue
        name = m.group(0)
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(req.split(";")[0].strip())
    return sorted(out)


def package_sources() -> dict[str, bytes]:
    """The ``kinetic`` and ``runner`` packages' files (``.py``, ``py.typed``). Blocking."""
    files: dict[str, bytes] = {}
    for pkg in (kinetic, runner):
        root = Path(str(pkg.__file__)).parent
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix == ".py" or path.name == "py.typed":
                files[f"{root.name}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return files


def plan(
    registry: str,
    base_image: str,
    repository: str = image_spec.DEFAULT_REPOSITORY,
) -> BuildPlan:
    """The image to use for this project's code. Blocking (reads the sources)."""
    requirements = tuple(pinned_requirements())
    sources = package_sources()
    digests = {p: hashlib.sha256(d).hexdigest() for p, d in sources.items()}
    tag = image_spec.image_tag(base_image, requirements, digests)
    return BuildPlan(
        uri=image_spec.image_uri(registry, tag, repository),
        registry=registry,
        repository=repository,
        tag=tag,
        base_image=base_image,
        requirements=requirements,
        sources=sources,
    )


def wheel_cache() -> Path:
    """Where downloaded wheels are kept (``KINETIC_WHEEL_CACHE``)."""
    env = os.environ.get("KINETIC_WHEEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kinetic" / "wheels"


def download_wheels(
    requirements: tuple[str, ...], python_version: str = "3.11"
) -> dict[str, bytes]:
    """Wheels for ``requirements`` and their dependencies, for CPython ``python_version``
    on x86-64 Linux, from the package index (cached). Blocking.

    :raises BackendError: pip could not download them.
    """
    key = hashlib.sha256(("\n".join(requirements) + python_version).encode()).hexdigest()[:16]
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
            python_version,
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
        proc = subprocess.run(
            [*cmd, *requirements, "pip", "setuptools"],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise BackendError(
                f"pip download of the runner's wheels failed:\n{proc.stderr[-3000:]}"
            )
        done.write_text("ok\n")
    return {p.name: p.read_bytes() for p in sorted(dest.glob("*.whl"))}


async def ensure_runner_image(
    registry: str,
    base_image: str,
    *,
    docker_host: str | None = None,
    repository: str = image_spec.DEFAULT_REPOSITORY,
) -> str:
    """The URI of the runner image for this code, building and pushing it if needed.

    :raises BackendError: the registry, pip, the build or the push failed.
    """
    the_plan = await anyio.to_thread.run_sync(plan, registry, base_image, repository)
    reg = Registry(registry.split("/", 1)[0])
    name = f"{registry.split('/', 1)[1]}/{repository}" if "/" in registry else repository
    if await reg.has_tag(name, the_plan.tag):
        return the_plan.uri
    async with _LOCK:
        if await reg.has_tag(name, the_plan.tag):
            return the_plan.uri
        wheels = await anyio.to_thread.run_sync(download_wheels, the_plan.requirements)
        files = image_spec.context_files(
            base_image, the_plan.requirements, the_plan.sources, wheels
        )
        context = await anyio.to_thread.run_sync(image_spec.build_context, files)
        engine = DockerEngine(docker_host)
        await engine.build(context, the_plan.uri)
        await engine.push(the_plan.uri)
        if not await reg.has_tag(name, the_plan.tag):
            raise BackendError(f"pushed {the_plan.uri}, but the registry does not list it")
    return the_plan.uri
