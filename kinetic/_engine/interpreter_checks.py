"""What a job that runs with this interpreter (the local backend) would lack, said once.

A local job has no image: it runs with the submitting interpreter, so the project's
requirements and the accelerator runtime its pod would carry are looked up here
instead, and what is missing is said as a WARNING record on this module's logger (not a
failure: the job may not import it). A log record, not :func:`warnings.warn`: the fix is
in the environment, not in the calling code, and the check runs on the event loop's
thread, where no line of the caller's could be named (docs/logging.md).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path

import anyio.to_thread

from kinetic._exceptions import ConfigError

log = logging.getLogger(__name__)
_warned_roots: set[Path] = set()


async def warn_missing_requirements(package_root: Path) -> None:
    """Say once per project and process which of its requirements this interpreter
    lacks: the local backend runs jobs with it, so they would fail on import."""
    if package_root in _warned_roots:
        return
    _warned_roots.add(package_root)
    from kinetic._engine.requirements_io import missing_distributions, read_project_requirements

    def check() -> list[str]:
        try:
            return missing_distributions(read_project_requirements(package_root))
        except ConfigError as exc:  # an unreadable file is worth a line, not a failure
            return [f"(cannot read the requirements: {exc})"]

    missing = await anyio.to_thread.run_sync(check)
    if missing:
        log.warning(
            "the local backend runs jobs with this interpreter (%s), which lacks "
            "requirements of %s: %s. Install them here (pip install ...) or jobs that "
            "import them will fail.",
            sys.executable,
            package_root,
            ", ".join(missing),
        )


_warned_categories: set[str] = set()

#: What a job's pod would have that the local interpreter must have too: (distribution,
#: what it is for). CPU jobs run on jaxlib's own CPU backend.
_RUNTIME_NEEDS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "gpu": (("jax", "JAX"), ("jax-cuda12-plugin", "JAX's CUDA plugin"), ("keras", "Keras")),
    "tpu": (("jax", "JAX"), ("libtpu", "JAX's TPU backend"), ("keras", "Keras")),
}


def missing_runtime(category: str) -> list[str]:
    """What of a ``category`` job's pod runtime this interpreter lacks: ``"jax-cuda12-plugin
    (JAX's CUDA plugin)"``, ... Blocking (one metadata lookup per distribution)."""
    import importlib.metadata

    missing = []
    for dist, what in _RUNTIME_NEEDS.get(category, ()):
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{dist} ({what})")
    return missing


async def warn_missing_runtime(category: str) -> None:
    """Say once per category and process what a GPU or TPU job's pod would have (its
    image's runtime) that this interpreter lacks: the local backend runs jobs with it."""
    if category in _warned_categories or category not in _RUNTIME_NEEDS:
        return
    _warned_categories.add(category)
    missing = await anyio.to_thread.run_sync(missing_runtime, category)
    if missing:
        extra = "cuda12" if category == "gpu" else "tpu"
        log.warning(
            "a %s job's image carries jax[%s] and keras, but the local backend runs jobs "
            "with this interpreter (%s), which lacks %s. Install them here "
            '(pip install "jax[%s]" keras) or jobs that use them will fail or fall back '
            "to the CPU.",
            category.upper(),
            extra,
            sys.executable,
            ", ".join(missing),
            extra,
        )
