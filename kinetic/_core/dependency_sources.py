"""Which of the package root's files declares the project's dependencies, and which lines. Pure.

Texts in, lines out (the IO side is :mod:`kinetic._engine.requirements_io`). In order of
precedence, the first source present is the project's:

1. ``requirements.txt`` (even empty);
2. ``uv.lock`` next to a ``pyproject.toml`` with a ``[project]`` table: the locked
   closure of ``[project].dependencies`` and the selected dependency groups
   (:mod:`kinetic._core.uv_lock`);
3. ``pyproject.toml``: ``[project].dependencies`` and the entries of the selected
   ``[dependency-groups]`` (PEP 735, ``{include-group = "..."}`` followed);
4. nothing.

**Which dependency groups.** ``KINETIC_DEPENDENCY_GROUPS`` (names separated by commas;
empty selects none) when it is set, else ``[tool.kinetic].dependency-groups`` of
``pyproject.toml``, else none. uv's own default, the ``dev`` group, is not implied: a
job's image is not a development environment. A selected group that ``pyproject.toml``
does not define is a :class:`~kinetic.RequirementsError` naming the groups it defines.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as PackagingRequirement
from packaging.utils import canonicalize_name

from kinetic._core.requirements import (
    Requirement,
    parse_pyproject_dependencies,
    parse_requirements_txt,
)
from kinetic._core.uv_lock import locked_requirements
from kinetic._exceptions import RequirementsError

__all__ = [
    "GROUPS_VARIABLE",
    "group_requirements",
    "parse_group_names",
    "project_requirements",
    "selected_groups",
]

GROUPS_VARIABLE = "KINETIC_DEPENDENCY_GROUPS"
"""The environment variable that selects the dependency groups a job's image holds."""


def parse_group_names(text: str) -> tuple[str, ...]:
    """``"train, eval"`` -> ``("train", "eval")``; an empty text selects no group."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _groups_table(pyproject: Mapping[str, Any]) -> dict[str, Any]:
    groups = pyproject.get("dependency-groups", {})
    if not isinstance(groups, dict):
        raise RequirementsError("pyproject.toml: [dependency-groups] must be a table")
    return groups


def _normalized(groups: Mapping[str, Any]) -> dict[str, str]:
    """Each group's PEP 735 normalized name -> its name as written."""
    return {canonicalize_name(name): name for name in groups}


def selected_groups(
    pyproject: Mapping[str, Any], override: Sequence[str] | None
) -> tuple[str, ...]:
    """The dependency groups (as ``pyproject.toml`` spells them) a job's image holds.

    :param override: the names ``KINETIC_DEPENDENCY_GROUPS`` gives, or None where it is
        unset (then ``[tool.kinetic].dependency-groups``, else none).

    :raises RequirementsError: a selected group ``pyproject.toml`` does not define, or a
        ``[tool.kinetic].dependency-groups`` that is not a list of names.
    """
    if override is None:
        tool = pyproject.get("tool", {})
        kinetic = tool.get("kinetic", {}) if isinstance(tool, dict) else {}
        chosen = kinetic.get("dependency-groups", []) if isinstance(kinetic, dict) else []
        if not isinstance(chosen, list) or not all(isinstance(g, str) for g in chosen):
            raise RequirementsError(
                "pyproject.toml: [tool.kinetic].dependency-groups must be a list of group names"
            )
        where = "[tool.kinetic].dependency-groups"
    else:
        chosen, where = list(override), GROUPS_VARIABLE
    defined = _normalized(_groups_table(pyproject))
    unknown = [g for g in chosen if canonicalize_name(g) not in defined]
    if unknown:
        known = ", ".join(sorted(defined.values())) or "none"
        raise RequirementsError(
            f"{where} selects the dependency group(s) {', '.join(unknown)}, which "
            f"pyproject.toml's [dependency-groups] does not define (it defines: {known})"
        )
    return tuple(dict.fromkeys(defined[canonicalize_name(g)] for g in chosen))


def group_requirements(pyproject: Mapping[str, Any], groups: Sequence[str]) -> list[Requirement]:
    """The entries of ``groups`` (defined, as :func:`selected_groups` returns them), with
    their ``include-group`` entries followed, in order, each once.

    :raises RequirementsError: an entry that is neither a PEP 508 string nor an
        ``{include-group = ...}`` table, an include of an undefined group, or a cycle.
    """
    table = _groups_table(pyproject)
    defined = _normalized(table)
    out: dict[str, Requirement] = {}

    def expand(group: str, chain: tuple[str, ...]) -> None:
        entries = table[group]
        if not isinstance(entries, list):
            raise RequirementsError(f"pyproject.toml: [dependency-groups].{group} must be a list")
        for index, entry in enumerate(entries):
            source = f"pyproject.toml [dependency-groups].{group}[{index}]"
            if isinstance(entry, dict) and set(entry) == {"include-group"}:
                included = defined.get(canonicalize_name(str(entry["include-group"])))
                if included is None:
                    raise RequirementsError(
                        f"{source} includes the group {entry['include-group']!r}, which "
                        "[dependency-groups] does not define"
                    )
                if included in chain:
                    cycle = " -> ".join([*chain, group, included][chain.index(included) :])
                    raise RequirementsError(
                        f"pyproject.toml: dependency groups include each other: {cycle}"
                    )
                expand(included, (*chain, group))
                continue
            if not isinstance(entry, str):
                raise RequirementsError(
                    f"{source} must be a string or {{include-group = ...}}, not {entry!r}"
                )
            line = entry.strip()
            try:
                parsed = PackagingRequirement(line)
            except InvalidRequirement as exc:
                raise RequirementsError(f"{source}: cannot parse {line!r}: {exc}") from None
            out.setdefault(line, Requirement(line, canonicalize_name(parsed.name), source))

    for group in groups:
        expand(group, ())
    return list(out.values())


def project_requirements(
    requirements_txt: str | None,
    pyproject_toml: str | None,
    uv_lock: str | None,
    groups: Sequence[str] | None,
) -> list[Requirement]:
    """The project's dependencies from the texts of its root's files (None: no such file),
    by the precedence of this module's docstring.

    :param groups: the names ``KINETIC_DEPENDENCY_GROUPS`` gives, or None where it is unset.

    :raises RequirementsError: from the parser of the file that is used, a malformed or
        out-of-date ``uv.lock``, or an unknown dependency group.
    """
    if requirements_txt is not None:
        return parse_requirements_txt(requirements_txt)
    if pyproject_toml is None:
        return []
    declared = parse_pyproject_dependencies(pyproject_toml)  # validates the TOML and entries
    document = tomllib.loads(pyproject_toml)
    chosen = selected_groups(document, groups)
    project = document.get("project")
    if uv_lock is not None:
        name = project.get("name") if isinstance(project, dict) else None
        if not isinstance(name, str):
            raise RequirementsError(
                "uv.lock locks a project, but pyproject.toml names none ([project].name): "
                "add the [project] table, or a requirements.txt (which wins over the lock)"
            )
        names = [r.name for r in declared or [] if r.name]
        return locked_requirements(uv_lock, name, names, chosen)
    return [*(declared or []), *group_requirements(document, chosen)]
