"""The runner image: what Kinetic's runner is delivered from into a custom image's pods.

A custom image need not carry Kinetic (:mod:`kinetic._core.runner_delivery`): its pods
copy the runner and its dependencies from this image, Kinetic's plain runner image
(:func:`kinetic._images.runner_image.plan`: Kinetic's pinned dependencies and source,
no accelerator runtime) on the **client's** Python, since the payload and the
dependencies' compiled parts load only there. It is built like a bundled image, once
per (Kinetic's source and dependencies, Python), in the bundled images' registry.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio.to_thread

from kinetic._core import accel_runtime, image_spec
from kinetic._core.config import Settings
from kinetic._core.gke_config import GKEOptions, default_base_image
from kinetic._images import runner_image
from kinetic._images.builder import ImageBuilder, Progress
from kinetic._storage.base import Storage
from runner.protocol import python_version


def base_image_for(options: GKEOptions, python: str) -> str:
    """The base of the runner image for a client on Python ``python``: the configured
    base image when it has that Python, else ``python:X.Y-slim``. Pure."""
    if accel_runtime.image_python(options.base_image) == python:
        return options.base_image
    return default_base_image(python)


async def ensure_delivery_image(
    settings: Settings,
    options: GKEOptions,
    storage: Storage,
    make_builder: Callable[[], ImageBuilder],
    *,
    progress: Progress | None = None,
) -> str:
    """The URI of the runner image for this interpreter's Python, built and pushed first
    if its registry does not list it (one registry request when it does; none after
    this process saw it).

    :raises ConfigError: no registry for built images; unknown builder.
    :raises ImageBuildError: it could not be built or pushed.
    :raises BackendError: the registry failed.
    """
    python = python_version()
    registry = options.image_registry or settings.default_registry
    base = base_image_for(options, python)
    the_plan = await anyio.to_thread.run_sync(
        lambda: runner_image.plan(registry, base, image_spec.DEFAULT_REPOSITORY, python=python)
    )
    return await runner_image.ensure_image(
        the_plan, make_builder, lock_storage=storage, progress=progress
    )
