"""The accelerator runtime every image Kinetic builds carries: which lines, which versions. Pure.

Every image holds JAX for its accelerator category and Keras, in a layer of its own
(see :mod:`kinetic._images.runner_image`):

======== ==================================================
category runtime lines (defaults: :data:`DEFAULTS`)
======== ==================================================
cpu      ``jax==J``, ``keras==K``
gpu      ``jax[cuda12]==J`` (CUDA plugin, NVIDIA wheels), ``keras==K``
tpu      ``jax[tpu]==J`` (its matching ``libtpu``), ``keras==K``
======== ==================================================

:func:`runtime_request` splits a project's requirements into the runtime's lines and
the project's own. The user's pins win where they can: a ``jax`` line picks the
runtime's JAX version (``jax==X`` on TPU becomes ``jax[tpu]==X``, on GPU
``jax[cuda12]==X``; a note says so once, naming the line), a ``keras`` line its Keras
version, and ``jaxlib``/``libtpu``/CUDA plugin pins join the runtime's set, where the
resolver holds them to JAX's. A specifier the default satisfies (``jax>=0.4``) keeps the
default, so that one runtime is shared by every project that accepts it. Whether the set
can be installed is decided by a resolver (:mod:`kinetic._images.runtime_resolve`) for
:data:`PLATFORM` and the image's Python, at submission.

A line marked ``# kn:keep`` is the user's explicit override: it is neither rewritten nor
held to the runtime's pins, but installed as written in a step of its own after the
runtime and the project's other lines (:attr:`RuntimeRequest.kept`), where it may replace
the runtime's JAX, Keras or their dependencies. A note says so, naming the line: the
runtime's guarantee no longer holds for that job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import MappingProxyType

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as PackagingRequirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from kinetic._core.requirements import Requirement

__all__ = [
    "CATEGORIES",
    "DEFAULTS",
    "JAX_EXTRA",
    "KERAS_BACKEND",
    "PLATFORM",
    "RuntimeLine",
    "RuntimeRequest",
    "image_python",
    "runtime_request",
]

CATEGORIES = ("cpu", "gpu", "tpu")

DEFAULTS: dict[str, str] = {"jax": "0.10.2", "keras": "3.15.1"}
"""The runtime's versions in this release of Kinetic (one table: ``docs/dependencies.md``).
Changing one changes every runtime image's tag."""

JAX_EXTRA: dict[str, str | None] = {"cpu": None, "gpu": "cuda12", "tpu": "tpu"}
"""The ``jax`` extra that brings each category's backend (None: the CPU backend in jaxlib)."""

KERAS_BACKEND = "jax"
"""``KERAS_BACKEND`` in every job's environment unless the user sets it."""

PLATFORM = "linux x86_64"
"""The platform every image is resolved and built for, as messages name it."""

DEFAULT_PYTHON = "3.11"

# Distributions whose versions are the runtime's: a user's line for one joins the runtime
# set (and is resolved together with JAX) instead of the project's layer.
_ACCELERATOR_EXTRAS = frozenset({"cpu", "tpu", "cuda", "cuda12", "cuda12-local", "cuda13", "k8s"})
_CATEGORY_ONLY = {
    "libtpu": "tpu",
    "libtpu-nightly": "tpu",
    "jax-cuda12-plugin": "gpu",
    "jax-cuda12-pjrt": "gpu",
}
_RUNTIME_NAMES = frozenset({"jax", "jaxlib", "keras", *_CATEGORY_ONLY})
_PYTHON_TAG = re.compile(r"(?:^|[^0-9.])(3\.1[0-9]|3\.[89])(?:[^0-9]|$)")
DEBIAN_PYTHONS = MappingProxyType({"bookworm": "3.11", "trixie": "3.13"})
"""The ``python3`` of Debian releases, for base images tagged by codename
(``debian:trixie-slim``, or an image built from Debian's packages)."""
_CODENAME = re.compile(r"(?:^|[^a-z])(" + "|".join(DEBIAN_PYTHONS) + r")(?:[^a-z]|$)")


@dataclass(frozen=True)
class RuntimeLine:
    """One line of the runtime set, and the user's line it came from (None: a default)."""

    line: str
    origin: Requirement | None = None


@dataclass(frozen=True)
class RuntimeRequest:
    """What an image of ``category`` installs: its runtime, then the project's lines.

    :ivar runtime: the runtime's lines (JAX for the category, Keras, and the user's pins
        of their companions), in a fixed order.
    :ivar project: the rest of the user's lines, in their order, installed under the
        runtime's pins (they never change it).
    :ivar notes: what was changed or left out of the user's lines, one sentence each,
        naming the line; said once to the user.
    :ivar kept: the lines marked ``# kn:keep``, in their order: installed as written
        after everything else, not held to the runtime's pins.
    """

    category: str
    runtime: tuple[RuntimeLine, ...]
    project: tuple[Requirement, ...]
    notes: tuple[str, ...] = field(default=())
    kept: tuple[Requirement, ...] = field(default=())

    @property
    def runtime_lines(self) -> tuple[str, ...]:
        return tuple(r.line for r in self.runtime)

    @property
    def user_runtime(self) -> tuple[RuntimeLine, ...]:
        """The runtime lines that come from the user's requirements."""
        return tuple(r for r in self.runtime if r.origin is not None)

    @property
    def is_default(self) -> bool:
        """Whether the runtime is the category's default one (no user pin changed it)."""
        return self.runtime_lines == default_lines(self.category)


def _check_category(category: str) -> None:
    if category not in CATEGORIES:
        raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, not {category!r}")


def _jax_name(category: str) -> str:
    extra = JAX_EXTRA[category]
    return f"jax[{extra}]" if extra else "jax"


def default_lines(category: str) -> tuple[str, ...]:
    """The default runtime lines of ``category``.

    :raises ValueError: for an unknown category.
    """
    _check_category(category)
    return (f"{_jax_name(category)}=={DEFAULTS['jax']}", f"keras=={DEFAULTS['keras']}")


def _parsed(req: Requirement) -> PackagingRequirement | None:
    """The PEP 508 form of a plain requirement line (no URL, no per-line options)."""
    if req.name not in _RUNTIME_NAMES or req.line.startswith("-"):
        return None
    try:
        parsed = PackagingRequirement(req.line)
    except InvalidRequirement:
        return None  # per-requirement options (--hash=...) or an unusual form: keep as is
    return None if parsed.url else parsed


def _with_marker(text: str, parsed: PackagingRequirement) -> str:
    return f"{text}; {parsed.marker}" if parsed.marker is not None else text


def _versioned(name: str, parsed: PackagingRequirement, default: str) -> str:
    """``name`` with the user's specifier, or pinned to ``default`` when that satisfies it."""
    spec = parsed.specifier
    if not spec or spec.contains(Version(default), prereleases=True):
        return _with_marker(f"{name}=={default}", parsed)
    return _with_marker(f"{name}{spec}", parsed)


def runtime_request(reqs: Iterable[Requirement], category: str) -> RuntimeRequest:
    """Split ``reqs`` into the runtime of an image of ``category`` and the project's lines.

    The last ``jax`` (``keras``) line wins, as with pip. ``libtpu`` on a CPU/GPU job and
    the CUDA plugin on a CPU/TPU job are left out, with a note. ``# kn:keep`` lines go to
    :attr:`RuntimeRequest.kept`, with a note each.

    :raises ValueError: for an unknown category.
    """
    _check_category(category)
    jax_name = _jax_name(category)
    jax_line = RuntimeLine(f"{jax_name}=={DEFAULTS['jax']}")
    keras_line = RuntimeLine(f"keras=={DEFAULTS['keras']}")
    companions: list[RuntimeLine] = []
    project: list[Requirement] = []
    kept: list[Requirement] = []
    notes: list[str] = []
    for req in reqs:
        if req.keep:
            kept.append(req)
            notes.append(
                f"{req.source}: {req.line!r} is marked `# kn:keep`: it is installed as "
                f"written after the runtime, not held to its pins, so the {category.upper()} "
                f"runtime's versions (JAX, Keras, Kinetic's runner) are no longer guaranteed "
                f"for this job"
            )
            continue
        parsed = _parsed(req)
        if parsed is None:
            project.append(req)
            continue
        name = canonicalize_name(parsed.name)
        only = _CATEGORY_ONLY.get(name)
        if only is not None and only != category:
            notes.append(
                f"{req.source}: {req.line!r} is left out: a {category.upper()} job has no use "
                f"for it (mark the line `# kn:keep` to install it anyway)"
            )
            continue
        if name == "jax":
            text = _versioned(jax_name, parsed, DEFAULTS["jax"])
            jax_line = RuntimeLine(text, req)
            others = sorted(set(parsed.extras) - _ACCELERATOR_EXTRAS)
            if others:
                notes.append(
                    f"{req.source}: {req.line!r}: the extras {', '.join(others)} are not "
                    f"installed with the runtime (list what they bring on lines of their own)"
                )
            requested = sorted(set(parsed.extras) & _ACCELERATOR_EXTRAS)
            if requested != sorted(filter(None, [JAX_EXTRA[category]])) or not parsed.specifier:
                notes.append(
                    f"{req.source}: {req.line!r} is installed as {text!r} on this "
                    f"{category.upper()} job (mark the line `# kn:keep` to install it verbatim)"
                )
        elif name == "keras":
            keras_line = RuntimeLine(_versioned("keras", parsed, DEFAULTS["keras"]), req)
        else:
            companions.append(RuntimeLine(req.line, req))
    return RuntimeRequest(
        category=category,
        runtime=(jax_line, keras_line, *companions),
        project=tuple(project),
        notes=tuple(notes),
        kept=tuple(kept),
    )


def image_python(base_image: str) -> str:
    """The Python ``major.minor`` of a base image, from its tag (``python:3.12-slim`` ->
    ``3.12``; a Debian codename, ``debian:trixie-slim`` -> ``3.13``);
    :data:`DEFAULT_PYTHON` where the tag does not say."""
    _, _, tag = base_image.rpartition("/")[2].partition(":")
    match = _PYTHON_TAG.search(tag)
    if match:
        return match.group(1)
    codename = _CODENAME.search(tag)
    return DEBIAN_PYTHONS[codename.group(1)] if codename else DEFAULT_PYTHON
