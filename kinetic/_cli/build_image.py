"""``kinetic build-image``: build and push the prebuilt base images.

    kinetic build-image --repo REPO [--category cpu --category tpu] [--tag T] [--yes]

Builds ``{REPO}/base-{category}:{tag}`` (every category by default; the tag defaults
to Kinetic's version and the base image's Python, ``0.3.0-py3.12``, which is what prebuilt
mode looks for from a client of that Python; ``--python 3.12 --python 3.13`` builds on
``python:X.Y-slim`` for each): each the category's
runtime image, JAX for its accelerator and Keras at this release's defaults (the GPU
one holds the CUDA wheels: gigabytes), with the selected builder
(``--builder``, else ``KINETIC_BUILDER``, the profile, then ``cloudbuild`` when a GCP
project is configured and no ``DOCKER_HOST`` is set, else ``docker``), streams the
build's output to stderr, and prints each pushed URI on stdout. An image the registry
already lists is kept unless ``--rebuild``. It asks before building unless ``--yes``
(required when stdin is not a terminal).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from kinetic._core import image_spec
from kinetic._exceptions import ConfigError, KineticError

SUPPORTED_PYTHONS = ("3.11", "3.12", "3.13")
"""The Pythons Kinetic supports, hence those a client may submit from."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``build-image`` command."""
    p = sub.add_parser(
        "build-image",
        help="build and push the prebuilt base images (prebuilt mode)",
        description="Build and push {repo}/base-{category}:{tag} for prebuilt mode.",
    )
    p.add_argument("--repo", help="image repository (default: base_image_repo setting)")
    p.add_argument(
        "--category",
        action="append",
        choices=image_spec.CATEGORIES,
        help="cpu, gpu or tpu; repeat for several (default: all)",
    )
    p.add_argument(
        "--tag", help="image tag (default: Kinetic's version and the base's Python, 0.3.0-py3.12)"
    )
    p.add_argument("--builder", choices=("docker", "cloudbuild"))
    p.add_argument("--base-image", help="the image to build on (default: KINETIC_IMAGE_BASE)")
    p.add_argument(
        "--python",
        action="append",
        choices=SUPPORTED_PYTHONS,
        help=(
            "build on python:X.Y-slim for clients of that Python; repeat for several "
            "(default: the base image, whose Python is this one's unless KINETIC_IMAGE_BASE "
            "says otherwise)"
        ),
    )
    p.add_argument("--rebuild", action="store_true", help="replace images that exist")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask before building")


def run(ns: argparse.Namespace) -> int:
    """Run ``build-image``; return the exit status."""
    import dataclasses

    import anyio

    from kinetic._core.gke_config import options_from_env
    from kinetic._images.modes import make_builder
    from kinetic._images.prebuilt import build_base_images
    from kinetic._settings import load_settings
    from kinetic._version import __version__

    try:
        settings = load_settings(project=ns.project, cluster=ns.cluster, base_image_repo=ns.repo)
        if ns.builder:
            settings = dataclasses.replace(settings, builder=ns.builder)
        categories = list(dict.fromkeys(ns.category or image_spec.CATEGORIES))
        repo = settings.base_image_repo
        base_image = ns.base_image or options_from_env(os.environ).base_image
        builds = plan_builds(
            __version__, base_image, ns.python or [], ns.tag, explicit=bool(ns.base_image)
        )
        targets = [image_spec.prebuilt_uri(repo, c, tag) for _, tag in builds for c in categories]
        if not ns.yes and not _confirm(targets, ", ".join(base for base, _ in builds)):
            print("kinetic: nothing built", file=sys.stderr)
            return 1

        async def main() -> list[str]:
            storage = None
            if settings.project:
                from kinetic._storage.gcs import GCSStorage

                storage = GCSStorage(settings.bucket_name)
            try:
                builder = make_builder(settings, storage, os.environ)
                uris: list[str] = []
                for base, tag in builds:
                    uris += await build_base_images(
                        repo,
                        categories,
                        tag=tag,
                        base_image=base,
                        builder=builder,
                        rebuild=ns.rebuild,
                        progress=_progress,
                    )
                return uris
            finally:
                if storage is not None:
                    await storage.aclose()

        for uri in anyio.run(main):
            print(uri)
        return 0
    except KineticError as exc:
        print(f"kinetic: {exc}", file=sys.stderr)
        return 1


def plan_builds(
    version: str, base_image: str, pythons: Sequence[str], tag: str | None, *, explicit: bool
) -> list[tuple[str, str]]:
    """``(base image, tag)`` of each build: one per ``--python`` (on ``python:X.Y-slim``),
    else one on ``base_image``; each tagged for its base's Python (``0.3.0-py3.12``),
    which jobs of that Python look for, unless ``tag`` names it. Pure.

    :raises ConfigError: ``--python`` with ``--base-image``, or ``--tag`` for several.
    """
    from kinetic._core.accel_runtime import image_python
    from kinetic._core.gke_config import default_base_image

    if pythons and explicit:
        raise ConfigError("--python builds on python:X.Y-slim: give --base-image or --python")
    bases = [default_base_image(p) for p in dict.fromkeys(pythons)] or [base_image]
    if tag is not None and len(bases) > 1:
        raise ConfigError("--tag names one image per category: build one Python at a time")
    return [(base, tag or image_spec.prebuilt_tag(version, image_python(base))) for base in bases]


def _confirm(targets: list[str], base_image: str) -> bool:
    if not sys.stdin.isatty():
        print("kinetic: build-image asks before building; pass --yes", file=sys.stderr)
        return False
    print(f"Build on {base_image} and push:", *(f"  {t}" for t in targets), sep="\n")
    print("(each holds JAX for its accelerator and Keras; the GPU one is gigabytes)")
    return input("Proceed? [y/N] ").strip().lower() in ("y", "yes")


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)
