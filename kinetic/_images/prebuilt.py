"""Prebuilt base images: ``{repo}/base-{cpu,gpu,tpu}:{version}`` for prebuilt mode.

Each is the category's runtime image (:func:`kinetic._images.runner_image.runtime_plan`:
JAX for the category and Keras at this release's default versions, Kinetic's runner,
``uv`` so that a pod installs the job's requirements at start, :mod:`runner.install`),
pushed under this name, on its environment image (``kinetic-env``, shared with bundled
images of the same runtime). Its content is the bundled runtime image's, so a registry
holding both stores its layers once. ``kinetic build-image`` builds and pushes them with
the selected builder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import anyio.to_thread

from kinetic._core import accel_runtime, image_spec
from kinetic._images import runner_image, runtime_resolve
from kinetic._images.builder import ImageBuilder, Progress
from kinetic._images.runtime_resolve import ResolvedRuntime


def base_plan(
    repo: str, category: str, tag: str, base_image: str, runtime: ResolvedRuntime
) -> runner_image.BuildPlan:
    """What ``base-{category}:{tag}`` is made of: ``runtime``'s image. Blocking the
    first time per process.

    :raises ValueError: for an unknown category.
    """
    uri = image_spec.prebuilt_uri(repo, category, tag)
    the_plan = runner_image.runtime_plan(repo, base_image, runtime)
    return dataclasses.replace(the_plan, uri=uri, repository=f"base-{category}", tag=tag)


def default_runtime(category: str, base_image: str) -> ResolvedRuntime:
    """The default runtime of ``category`` for ``base_image``'s Python, resolved. Blocking.

    :raises RuntimeConflictError: it cannot be installed there (e.g. an old Python).
    """
    request = accel_runtime.runtime_request((), category)
    python = accel_runtime.image_python(base_image)
    return runtime_resolve.resolve_runtime(request, python, runner_image.runtime_inputs(python))


async def build_base_images(
    repo: str,
    categories: Sequence[str],
    *,
    tag: str,
    base_image: str,
    builder: ImageBuilder,
    rebuild: bool = False,
    progress: Progress | None = None,
) -> list[str]:
    """Build and push ``base-{category}:{tag}`` for each category; return their URIs.

    An image the registry already lists is kept unless ``rebuild``.

    :raises ImageBuildError: a build or push failed (the images before it stay pushed).
    :raises BackendError: the registry failed.
    """
    uris = []
    for category in categories:
        runtime = await anyio.to_thread.run_sync(default_runtime, category, base_image)
        the_plan = await anyio.to_thread.run_sync(
            base_plan, repo, category, tag, base_image, runtime
        )
        if rebuild or not await runner_image.image_exists(the_plan.uri):
            if the_plan.parent is not None:  # the environment image: built once, kept
                await runner_image.ensure_image(the_plan.parent, lambda: builder, progress=progress)
            await runner_image.build(the_plan, builder, progress=progress)
        elif progress is not None:
            progress(f"{the_plan.uri} is already in its registry (--rebuild to replace it)")
        uris.append(the_plan.uri)
    return uris
