"""The locked versions of a project's dependencies, read from its ``uv.lock``. Pure.

A ``uv.lock`` (format version 1) is the closure of a project's dependencies: one
``[[package]]`` table per locked distribution, each with its ``source`` and its edges
(``dependencies``, ``optional-dependencies`` per extra, ``dev-dependencies`` per
dependency group), each edge with an optional environment ``marker``. The project itself
is the package named like ``[project].name`` whose source is the root (``editable`` or
``virtual`` ``"."``).

:func:`locked_requirements` walks the edges from the project (its dependencies and the
selected groups) and gives one exact line per locked distribution reached, in the image's
terms:

* the walk is for the image's platform, Linux x86-64 with CPython: an edge whose marker
  is false there for every Python is not followed (``colorama ; sys_platform ==
  'win32'``), a marker true there for every Python is dropped, and what remains (a
  Python bound) stays on the line as pip's marker, combined along the paths that reach
  the distribution, so that the image's Python picks its version;
* a registry distribution is ``name==version``; a git source ``name @ git+URL@commit``;
  a URL source ``name @ URL``; a local source (a path, a folder, an editable workspace
  member) the path itself, as a ``requirements.txt`` would say it (then judged like one:
  a pod cannot install a file of this machine);
* the lock's file hashes are not copied: an image build hash-pins the files it installs
  itself (:mod:`kinetic._core.index_install`), and a line with per-line options would
  leave the submission's check against the image's runtime.

A lock that is not TOML, is of another format version, has no package for the project,
or predates a dependency or group of ``pyproject.toml`` is a
:class:`~kinetic.RequirementsError` that says so and how to fix it (``uv lock``).
"""

from __future__ import annotations

import tomllib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from packaging.markers import InvalidMarker, Marker
from packaging.utils import canonicalize_name

from kinetic._core.requirements import Requirement
from kinetic._exceptions import RequirementsError

__all__ = ["LOCK_FILE", "locked_requirements"]

LOCK_FILE = "uv.lock"
_FORMAT = 1
_FIX = "run `uv lock` (or add a requirements.txt, which wins over the lock)"
_PYTHONS = tuple(f"3.{minor}" for minor in range(8, 16))
"""The CPython releases an image may have, to judge a marker for every one of them."""


def _environments() -> tuple[dict[str, str], ...]:
    envs = []
    for python in _PYTHONS:
        for patch in ("0", "99"):
            full = f"{python}.{patch}"
            envs.append(
                {
                    "implementation_name": "cpython",
                    "implementation_version": full,
                    "os_name": "posix",
                    "platform_machine": "x86_64",
                    "platform_python_implementation": "CPython",
                    "platform_system": "Linux",
                    "python_full_version": full,
                    "python_version": python,
                    "sys_platform": "linux",
                }
            )
    return tuple(envs)


_ENVIRONMENTS = _environments()


class _Lock:
    """The lock's packages, and the marker text's truth on the image's platform."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        packages = document.get("package", [])
        if not isinstance(packages, list) or not all(isinstance(p, dict) for p in packages):
            raise _malformed("[[package]] must be an array of tables")
        self.packages: list[dict[str, Any]] = packages
        self.by_name: dict[str, list[int]] = {}
        for index, package in enumerate(packages):
            name = package.get("name")
            if not isinstance(name, str):
                raise _malformed(f"package #{index + 1} has no name")
            self.by_name.setdefault(canonicalize_name(name), []).append(index)
        self._truth: dict[str, tuple[bool, ...]] = {}

    def truth(self, marker: str) -> tuple[bool, ...]:
        """The marker's value in each of :data:`_ENVIRONMENTS`."""
        if marker not in self._truth:
            try:
                parsed = Marker(marker)
            except InvalidMarker as exc:
                raise _malformed(f"invalid marker {marker!r}: {exc}") from None
            self._truth[marker] = tuple(parsed.evaluate(env) for env in _ENVIRONMENTS)
        return self._truth[marker]

    def target(self, edge: object, where: str) -> int:
        """The index of the package ``edge`` leads to."""
        if not isinstance(edge, dict) or not isinstance(edge.get("name"), str):
            raise _malformed(f"{where}: a dependency must be a table with a name")
        candidates = self.by_name.get(canonicalize_name(edge["name"]), [])
        if "version" in edge:
            candidates = [
                i for i in candidates if self.packages[i].get("version") == edge["version"]
            ]
        if "source" in edge:
            candidates = [i for i in candidates if self.packages[i].get("source") == edge["source"]]
        if len(candidates) != 1:
            what = "no" if not candidates else "more than one"
            raise _malformed(f"{where}: {what} locked package matches {edge['name']!r}")
        return candidates[0]


def _malformed(reason: str) -> RequirementsError:
    return RequirementsError(f"{LOCK_FILE} is malformed: {reason}; {_FIX}")


def _edges(table: object, where: str) -> list[object]:
    if table is None:
        return []
    if not isinstance(table, list):
        raise _malformed(f"{where} must be an array")
    return table


@dataclass(frozen=True)
class _Visit:
    package: int
    extra: str | None
    path: frozenset[str]  # the markers of the edges that led here, all of which hold


def _absorbed(path: frozenset[str], seen: list[frozenset[str]]) -> bool:
    """Whether a path already reached (a subset of ``path``'s conditions) covers it."""
    return any(known <= path for known in seen)


def locked_requirements(
    lock_text: str,
    project_name: str,
    dependency_names: Iterable[str],
    groups: Sequence[str],
) -> list[Requirement]:
    """The lines of the distributions ``uv.lock`` pins for the project ``project_name``:
    its dependencies and those of ``groups``, with everything they need, in name order.

    :param dependency_names: the names ``[project].dependencies`` declares; each must be
        among the lock's (else the lock is older than the file).
    :param groups: the selected dependency groups, known to exist in ``pyproject.toml``;
        each must be in the lock.

    :raises RequirementsError: a malformed or out-of-date lock (the message says which
        and how to fix it).
    """
    try:
        document = tomllib.loads(lock_text)
    except tomllib.TOMLDecodeError as exc:
        raise _malformed(f"not valid TOML ({exc})") from None
    version = document.get("version")
    if version != _FORMAT:
        raise RequirementsError(
            f"{LOCK_FILE} has format version {version!r}; Kinetic reads version {_FORMAT}: "
            f"upgrade uv and {_FIX}"
        )
    lock = _Lock(document)
    root = _root(lock, project_name)
    _check_fresh(lock.packages[root], dependency_names, groups)

    queue: deque[_Visit] = deque()
    reached: dict[tuple[int, str | None], list[frozenset[str]]] = {}

    def follow(edges: list[object], path: frozenset[str], where: str) -> None:
        for edge in edges:
            package = lock.target(edge, where)
            assert isinstance(edge, dict)  # target() checked it
            marker = edge.get("marker")
            step = path
            if marker is not None:
                if not isinstance(marker, str):
                    raise _malformed(f"{where}: a marker must be a string")
                truth = lock.truth(marker)
                if all(truth):
                    pass  # holds on every image: no condition
                else:
                    step = path | {marker}
            if not any(_holds(lock, step)):
                continue  # never on Linux x86-64
            extras = edge.get("extra", [])
            if not isinstance(extras, list):
                raise _malformed(f"{where}: extra must be an array")
            for extra in [None, *extras]:
                queue.append(_Visit(package, extra, step))

    root_package = lock.packages[root]
    follow(_edges(root_package.get("dependencies"), "the project's dependencies"), frozenset(), "")
    dev = root_package.get("dev-dependencies", {})
    for group in groups:
        follow(_edges(dev.get(group), f"group {group}"), frozenset(), f"group {group}")

    while queue:
        visit = queue.popleft()
        key = (visit.package, visit.extra)
        seen = reached.setdefault(key, [])
        if _absorbed(visit.path, seen):
            continue
        seen.append(visit.path)
        package = lock.packages[visit.package]
        name = package["name"]
        if visit.extra is None:
            edges = _edges(package.get("dependencies"), f"{name}'s dependencies")
        else:
            optional = package.get("optional-dependencies", {})
            if not isinstance(optional, dict) or visit.extra not in optional:
                raise _malformed(f"{name} has no extra {visit.extra!r}")
            edges = _edges(optional[visit.extra], f"{name}[{visit.extra}]")
        follow(edges, visit.path, name)

    lines = []
    for (index, extra), paths in reached.items():
        if extra is not None or index == root:
            continue
        requirement = _line(lock.packages[index], _marker(paths))
        if requirement is not None:
            lines.append(requirement)
    return sorted(lines, key=lambda r: (r.name or "", r.source))


def _holds(lock: _Lock, path: frozenset[str]) -> tuple[bool, ...]:
    """Where every marker of ``path`` holds, environment by environment."""
    truth = [True] * len(_ENVIRONMENTS)
    for marker in path:
        truth = [a and b for a, b in zip(truth, lock.truth(marker), strict=True)]
    return tuple(truth)


def _root(lock: _Lock, project_name: str) -> int:
    for index in lock.by_name.get(canonicalize_name(project_name), []):
        source = lock.packages[index].get("source", {})
        if isinstance(source, dict) and "." in (source.get("editable"), source.get("virtual")):
            return index
    raise RequirementsError(
        f"{LOCK_FILE} holds no package for the project {project_name!r} at the root: "
        f"it is out of date with pyproject.toml; {_FIX}"
    )


def _check_fresh(
    root: Mapping[str, Any], dependency_names: Iterable[str], groups: Sequence[str]
) -> None:
    metadata = root.get("metadata", {})
    requires = metadata.get("requires-dist", []) if isinstance(metadata, dict) else []
    locked = {canonicalize_name(str(r.get("name"))) for r in requires if isinstance(r, dict)}
    missing = sorted({canonicalize_name(n) for n in dependency_names} - locked)
    if missing:
        raise RequirementsError(
            f"{LOCK_FILE} is out of date with pyproject.toml: it does not lock "
            f"{', '.join(missing)}; {_FIX}"
        )
    dev = root.get("dev-dependencies", {})
    requires_dev = metadata.get("requires-dev", {}) if isinstance(metadata, dict) else {}
    known = {*(dev if isinstance(dev, dict) else {}), *(requires_dev or {})}
    absent = [g for g in groups if g not in known]
    if absent:
        raise RequirementsError(
            f"{LOCK_FILE} is out of date with pyproject.toml: it has no dependency group "
            f"{', '.join(absent)}; {_FIX}"
        )


def _marker(paths: list[frozenset[str]]) -> str:
    """The condition under which one of ``paths`` holds, as a PEP 508 marker ('' always)."""
    if any(not path for path in paths):
        return ""
    clauses = sorted({next(iter(path)) if len(path) == 1 else _conjunction(path) for path in paths})
    if len(clauses) == 1:
        return clauses[0]
    return " or ".join(f"({clause})" for clause in clauses)


def _conjunction(path: frozenset[str]) -> str:
    return " and ".join(f"({m})" for m in sorted(path))


def _line(package: Mapping[str, Any], marker: str) -> Requirement | None:
    """The requirements-file line that installs ``package`` (None: nothing to install)."""
    name = str(package["name"])
    version = package.get("version")
    source = package.get("source", {})
    where = f"{LOCK_FILE} {name}" + (f" {version}" if version else "")
    if not isinstance(source, dict) or len(source) != 1:
        raise _malformed(f"{name}: a package needs one source")
    ((kind, value),) = source.items()
    if not isinstance(value, str):
        raise _malformed(f"{name}: its {kind} source must be a string")
    canonical = canonicalize_name(name)
    when = f" ; {marker}" if marker else ""
    if kind == "registry":
        if not isinstance(version, str):
            raise _malformed(f"{name}: a registry package needs a version")
        return Requirement(f"{canonical}=={version}{when}", canonical, where)
    if kind == "git":
        return Requirement(f"{canonical} @ {_git_url(value)}{when}", canonical, where)
    if kind == "url":
        return Requirement(f"{canonical} @ {value}{when}", canonical, where)
    if kind == "virtual":
        return None  # a workspace member that is not built: only its dependencies count
    if kind in ("editable", "path", "directory"):
        path = value if value.startswith(("/", ".")) else f"./{value}"
        line = f"-e {path}" if kind == "editable" else path
        return Requirement(line, None, where)
    raise _malformed(f"{name}: unknown source kind {kind!r}")


def _git_url(value: str) -> str:
    """``git+URL@commit[#subdirectory=...]`` from a lock's ``URL?rev=...#commit``."""
    parts = urlsplit(value)
    query = parse_qs(parts.query)
    base = parts._replace(query="", fragment="").geturl()
    commit = parts.fragment or next(
        (query[k][0] for k in ("rev", "tag", "branch") if k in query), ""
    )
    url = f"git+{base}" + (f"@{commit}" if commit else "")
    if "subdirectory" in query:
        url += f"#subdirectory={query['subdirectory'][0]}"
    return url
