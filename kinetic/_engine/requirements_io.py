"""Reading the project's dependency files and checking them against this interpreter.

Blocking functions; async callers run them in a worker thread. The rules live in
:mod:`kinetic._core.requirements`.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kinetic._core.dependency_sources import (
    GROUPS_VARIABLE,
    parse_group_names,
    project_requirements,
)
from kinetic._core.requirements import Requirement, packaging_requirement
from kinetic._core.uv_lock import LOCK_FILE
from kinetic._exceptions import RequirementsError

__all__ = ["missing_distributions", "read_project_requirements"]


def _read_optional(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise RequirementsError(f"cannot read {path}: {exc}") from exc


def read_project_requirements(
    package_root: Path, env: Mapping[str, str] | None = None
) -> list[Requirement]:
    """The dependencies declared at ``package_root`` (see
    :mod:`kinetic._core.dependency_sources`: ``requirements.txt``, else ``uv.lock``,
    else ``pyproject.toml``'s dependencies and selected groups).

    Reads only files of ``package_root`` (``requirements.txt``; when it does not exist,
    ``pyproject.toml`` and ``uv.lock``): never a file above the root, which belongs to
    some other project. Missing files mean no dependencies. ``KINETIC_DEPENDENCY_GROUPS``
    of ``env`` (default: this process's environment) selects dependency groups. Blocking.

    :raises RequirementsError: if a file exists but cannot be read or parsed, a lock is
        out of date, or a selected group is not defined; the message names the file.
    """
    env = os.environ if env is None else env
    requirements_txt = _read_optional(package_root / "requirements.txt")
    pyproject_toml = uv_lock = None
    if requirements_txt is None:
        pyproject_toml = _read_optional(package_root / "pyproject.toml")
        if pyproject_toml is not None:
            uv_lock = _read_optional(package_root / LOCK_FILE)
    setting = env.get(GROUPS_VARIABLE)
    groups = None if setting is None else parse_group_names(setting)
    return project_requirements(requirements_txt, pyproject_toml, uv_lock, groups)


def missing_distributions(reqs: Iterable[Requirement]) -> list[str]:
    """What the current interpreter lacks of ``reqs``, sorted, for a message.

    ``"numpy"`` for a distribution that is not installed, ``"numpy>=2 (installed
    1.26.4)"`` for one whose version is outside the specifier (pre-releases count as
    satisfying, as in ``pip check``). Requirements whose environment marker is false
    here, and lines that name no distribution (bare URLs, paths, options), are not
    reported; neither are extras (``requests[socks]`` checks only ``requests``) nor
    installed versions that are not PEP 440. No subprocesses: one metadata lookup per
    requirement. Blocking.
    """
    missing: set[str] = set()
    for req in reqs:
        spec = packaging_requirement(req)
        if spec is None:
            continue
        if spec.marker is not None and not spec.marker.evaluate():
            continue
        try:
            installed = importlib.metadata.distribution(spec.name).version
        except importlib.metadata.PackageNotFoundError:
            missing.add(spec.name)
            continue
        if not spec.specifier:
            continue
        try:
            version = Version(installed)
        except InvalidVersion:
            continue
        if not spec.specifier.contains(version, prereleases=True):
            missing.add(f"{spec.name}{spec.specifier} (installed {installed})")
    return sorted(missing)
