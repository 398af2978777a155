"""The index install path's contexts: the resolved set with the hashes of its files.

:func:`hashed_set` resolves requirement lines with ``uv pip compile --generate-hashes``
for the image's platform (as :mod:`kinetic._images.runtime_resolve` does), which gives
the SHA-256 of **every** file of each pinned version: whichever wheel the build's
platform picks, pip can check it. pip's own resolver reports the hash of the one file it
chose for the platform tags given here, which the build may not pick, so without uv
the index path is unavailable (:class:`IndexUnavailable`) and the caller takes the
wheels path. :func:`env_files` and :func:`project_files` assemble the contexts
(:mod:`kinetic._core.index_install`): requirement files, constraints and a Dockerfile,
kilobytes. Blocking functions: call them from a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from kinetic._core import index_install
from kinetic._core.index_install import HashedPin
from kinetic._exceptions import ConfigError, ImageBuildError
from kinetic._images import runtime_resolve


class IndexUnavailable(Exception):
    """The index path cannot build this image here; the message says why."""


def _uv() -> str:
    uv = runtime_resolve.find_uv()
    if uv is None:
        raise IndexUnavailable(
            "uv is not installed: pip's resolver gives the hash of one wheel per "
            "distribution, not of every file the build might pick (pip install uv)"
        )
    return uv


def hashed_set(
    lines: Sequence[str],
    python: str,
    constraints: Sequence[str] = (),
    preferences: Sequence[str] = (),
) -> tuple[HashedPin, ...]:
    """The exact set that installs ``lines`` (index options included) under
    ``constraints`` on Linux x86-64 with CPython ``python``, each pin with the hashes
    of all its files. Cached under the resolver's cache when every line is an exact pin.

    :param preferences: ``name==version`` pins kept wherever ``lines`` allow them (uv
        keeps the versions of an existing output file), as pip keeps what is installed.

    :raises IndexUnavailable: uv is not installed.
    :raises ImageBuildError: the resolution failed (the message ends with uv's reason).
    """
    uv = _uv()
    key_text = json.dumps(
        ["hashes", runtime_resolve.MANYLINUX, python, [*lines], [*constraints], [*preferences]]
    )
    path = (
        runtime_resolve.cache_dir() / f"h{hashlib.sha256(key_text.encode()).hexdigest()[:24]}.txt"
    )
    exact = all(runtime_resolve.is_exact(line) for line in lines if not line.startswith("-"))
    if exact and path.exists():
        return index_install.parse_hashed(path.read_text())
    with runtime_resolve.requirement_files(lines, constraints) as (req, cons):
        cmd = [*runtime_resolve.uv_command(uv, python, req, cons), "--generate-hashes"]
        out = req.parent / "resolved.txt"
        if preferences:
            out.write_text("".join(f"{pin}\n" for pin in preferences))
            cmd += ["-o", str(out)]
        try:
            stdout = runtime_resolve.run_resolver(cmd)
        except runtime_resolve.ResolutionFailed as exc:
            raise ImageBuildError(
                f"resolving the hashes of the image's requirements failed:\n{exc}"
            ) from None
        pins = index_install.parse_hashed(out.read_text() if preferences else stdout)
    if exact:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
            tmp_path.write_text(index_install.hashed_requirements_text(pins))
            tmp_path.replace(path)
        except OSError:
            pass  # only costs the next build a resolution
    return pins


def _from_an_index(line: str) -> bool:
    try:
        req = Requirement(line.split(" #", 1)[0].strip())
    except InvalidRequirement:
        return False
    return req.url is None


def _options(env: Mapping[str, str], project_lines: Sequence[str]) -> tuple[str, ...]:
    options = index_install.build_index_options(env, project_lines)
    refusal = index_install.index_refusal(options)
    if refusal is not None:
        raise IndexUnavailable(refusal)
    return options


CA_BUNDLE_VARIABLE = "KINETIC_BUILD_CA_BUNDLE"


def ca_bundle(env: Mapping[str, str]) -> bytes | None:
    """The CA bundle a build's pip trusts for the index (``KINETIC_BUILD_CA_BUNDLE``: a
    PEM file, for an index behind a TLS-intercepting proxy or a private CA), or None.

    :raises ConfigError: the variable names a file that cannot be read.
    """
    path = env.get(CA_BUNDLE_VARIABLE)
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{CA_BUNDLE_VARIABLE}={path}: cannot read it: {exc}") from exc


def env_files(
    base_image: str, requirements: Sequence[str], python: str, env: Mapping[str, str]
) -> dict[str, bytes]:
    """The environment image's index-path context for ``requirements`` on ``base_image``.

    :raises IndexUnavailable: uv is missing, or the configured index cannot be used.
    :raises ImageBuildError: the hashes could not be resolved.
    :raises ConfigError: ``KINETIC_BUILD_CA_BUNDLE`` cannot be read.
    """
    options = _options(env, ())
    pins = hashed_set((*options, *requirements), python)
    text = index_install.hashed_requirements_text(pins, options)
    return index_install.env_context_files(base_image, text, ca_bundle(env))


def project_files(
    runtime_image: str,
    user_requirements: Sequence[str],
    constraints: Sequence[str],
    kept: Sequence[str],
    python: str,
    env: Mapping[str, str],
) -> dict[str, bytes]:
    """A project image's index-path context: the set of ``user_requirements`` under the
    runtime's pins ``constraints`` less those pins (the runtime image has them), and
    the set of the ``kept`` lines on their own, keeping the versions installed before
    them wherever the kept lines allow (as the wheels path's pip does).

    :raises IndexUnavailable: uv is missing, or an index cannot be used.
    :raises ImageBuildError: the hashes could not be resolved.
    :raises ConfigError: ``KINETIC_BUILD_CA_BUNDLE`` cannot be read.
    """
    options = _options(env, user_requirements)
    own = [line for line in user_requirements if not line.startswith("-")]
    for line in (*own, *kept):
        if not _from_an_index(line):
            raise IndexUnavailable(f"{line!r} is not a distribution on a package index")
    installed = {canonicalize_name(c.partition("==")[0]) for c in constraints}
    pins = hashed_set((*options, *own), python, constraints) if own else ()
    pins = tuple(p for p in pins if canonicalize_name(p.name) not in installed)
    text = index_install.hashed_requirements_text(pins, options)
    kept_text = None
    if kept:
        before = (*constraints, *(p.pin for p in pins))
        kept_pins = hashed_set((*options, *kept), python, preferences=before)
        kept_text = index_install.hashed_requirements_text(kept_pins, options)
    return index_install.project_context_files(
        runtime_image, text, constraints, kept_text, ca_bundle(env)
    )
