"""The one async interface every image builder implements, and how one is chosen.

A builder takes a build context (an uncompressed tar with a ``Dockerfile`` at its
root, made by :func:`kinetic._core.image_spec.build_context`) and leaves the image
pushed under the given URI, or raises. Implementations:

- :class:`kinetic._images.docker.DockerBuilder`: the Docker Engine API over
  ``DOCKER_HOST`` (build with the network off on the wheels path, on the host's
  network on the index path, then push).
- :class:`kinetic._images.cloudbuild.CloudBuildBuilder`: Google Cloud Build over its
  REST API (the context is uploaded to the jobs bucket, the build submitted, its
  operation followed and its log streamed).

Each builder has an **install path** (:attr:`ImageBuilder.install`, chosen by
:func:`kinetic._core.index_install.choose_install`): ``index``, whose contexts hold hashed
requirement files and whose builds reach the package index, or ``wheels``, whose
contexts carry the wheels and whose builds need no network.

Contract shared by all: every failure is :class:`~kinetic.ImageBuildError` (foreign
exceptions never escape) whose message ends with the failing step's log tail; a
failed build or push leaves no tag behind that a later ``has_tag`` would trust
(registries publish a tag only with its manifest, which is pushed last); each call is
bounded by ``timeout`` seconds; cancelling the call stops following the build.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from kinetic._exceptions import ConfigError, format_choices

BUILD_TIMEOUT = 1800.0
"""Seconds one build-and-push may take."""

BUILDERS = ("docker", "cloudbuild")

Progress = Callable[[str], None]
"""Called with each line of build output, as it arrives (never from another thread)."""


class ImageBuilder(Protocol):
    """Builds a context and pushes the result."""

    @property
    def name(self) -> str:
        """``docker`` or ``cloudbuild``."""
        ...

    @property
    def install(self) -> str:
        """The install path its contexts are made for: ``index`` or ``wheels``."""
        ...

    async def build_and_push(
        self,
        context: bytes,
        image: str,
        *,
        progress: Progress | None = None,
        timeout: float = BUILD_TIMEOUT,
    ) -> None:
        """Build ``context`` and push it as ``image`` (``host/path/name:tag``).

        :raises ImageBuildError: the build or the push failed, or ran out of ``timeout``.
        """
        ...


def choose_builder(explicit: str | None, *, project: str | None, env: Mapping[str, str]) -> str:
    """Which builder to use: ``explicit`` (an argument, or the settings' ``KINETIC_BUILDER``
    > profile value) > ``cloudbuild`` when a GCP project is configured and no
    ``DOCKER_HOST`` is set > ``docker``. Pure.

    :raises ConfigError: for an unknown builder name.
    """
    chosen = explicit
    if chosen is None:
        chosen = "cloudbuild" if project and not env.get("DOCKER_HOST") else "docker"
    if chosen not in BUILDERS:
        raise ConfigError(f"unknown image builder {chosen!r}; valid: {format_choices(BUILDERS)}")
    return chosen
