"""The project's declared dependencies: parsing, choosing, filtering and judging. Pure.

Strings in, values out: no file IO and no environment reads (the IO side is
:mod:`kinetic._engine.requirements_io`).

* :func:`choose_requirements` picks the package root's ``requirements.txt`` if there is
  one, else ``pyproject.toml`` ``[project].dependencies``, else nothing.
* Which lines the image's accelerator runtime takes over (JAX, Keras, libtpu) is
  :mod:`kinetic._core.accel_runtime`'s business.
* :func:`check_installable_remotely` rejects lines that only make sense on this machine
  (local paths, local editables, ``-r``/``-c`` includes) before a prebuilt-mode job
  tries to ``uv pip install`` them in a pod.
* :func:`requirements_lines` and :func:`requirements_digest_text` give the lines for
  pip/uv and a comment-insensitive text to hash into an image tag.
"""

from __future__ import annotations

import enum
import functools
import re
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as PackagingRequirement
from packaging.utils import canonicalize_name

from kinetic._exceptions import RequirementsError

__all__ = [
    "Requirement",
    "check_installable_remotely",
    "choose_requirements",
    "packaging_requirement",
    "parse_pyproject_dependencies",
    "parse_requirements_txt",
    "requirements_digest_text",
    "requirements_lines",
]

_KEEP = re.compile(r"\bkn:keep\b")


@dataclass(frozen=True)
class Requirement:
    """One dependency line as declared by the user.

    ``line`` is the logical line (continuations joined) without its comment, stripped:
    exactly what is handed to pip/uv. ``name`` is the PEP 503 canonical distribution
    name, or None where the line names none (a bare URL or path, most options).
    ``source`` says where the line came from, for messages: ``"requirements.txt:7"``
    (1-based line number of the line's first physical line) or
    ``"pyproject.toml [project].dependencies[3]"`` (0-based index in the array).
    ``keep`` is whether the line's comment contained ``kn:keep``.
    """

    line: str
    name: str | None
    source: str
    keep: bool = False


# --- classifying one line ---------------------------------------------------------------


class _Kind(enum.Enum):
    SPEC = "spec"  # a PEP 508 requirement without URL: numpy>=2; python_version>"3"
    DIRECT = "direct"  # a PEP 508 direct reference: name @ url
    URL = "url"  # a bare URL: https://host/x.whl, git+https://host/r.git#egg=r
    PATH = "path"  # a bare local path: ./pkg, /abs/x.whl, x-1.0.tar.gz
    OPTION = "option"  # -r file, -e target, --index-url url, --pre, ...


@dataclass(frozen=True)
class _Line:
    kind: _Kind
    name: str | None = None
    option: str | None = None  # the long spelling, e.g. "--editable"
    value: str | None = None  # the option's argument, the URL or the path
    parsed: PackagingRequirement | None = None


class _LineError(Exception):
    """A line cannot be understood; the message is the reason."""


_SHORT_OPTIONS = {
    "-r": "--requirement",
    "-c": "--constraint",
    "-e": "--editable",
    "-i": "--index-url",
    "-f": "--find-links",
}
# Long options that take an argument (the rest of pip's requirements-file options are
# flags); an option missing its argument is an error pip would report too.
_OPTIONS_WITH_VALUE = frozenset(
    {
        "--requirement",
        "--constraint",
        "--editable",
        "--index-url",
        "--extra-index-url",
        "--find-links",
        "--no-binary",
        "--only-binary",
        "--trusted-host",
        "--use-feature",
    }
)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DIRECT_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[^\]]*\])?\s*@")
_EGG = re.compile(r"[#&]egg=([A-Za-z0-9][A-Za-z0-9._-]*)")
_ARCHIVE_SUFFIXES = (
    ".whl",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".tar",
    ".zip",
)
# pip's per-requirement options (--hash, --config-settings, ...) follow the requirement
# after whitespace; they are passed on to uv untouched but are not PEP 508.
_PER_REQUIREMENT_OPTIONS = re.compile(r"\s--")


def _egg_name(target: str) -> str | None:
    match = _EGG.search(target)
    return canonicalize_name(match.group(1)) if match else None


def _is_remote_url(target: str) -> bool:
    """A URL a pod can fetch: any ``scheme://`` except ``file://``."""
    return bool(_SCHEME.match(target)) and not target.lower().startswith("file:")


def _looks_like_path(token: str) -> bool:
    # Mirrors pip: a separator or a leading dot/tilde means a path, and so does an
    # archive file name even without a directory (pip installs "x-1.0.tar.gz" as a file).
    return (
        token.startswith((".", "~"))
        or "/" in token
        or "\\" in token
        or token.lower().endswith(_ARCHIVE_SUFFIXES)
    )


def _classify_option(line: str) -> _Line:
    if line.startswith("--"):
        head, sep, rest = line.partition("=")
        if not sep:
            head, _, rest = line.partition(" ")
        option = head.strip()
    else:
        option = _SHORT_OPTIONS.get(line[:2], line[:2])
        rest = line[2:]
    value = rest.strip()
    if option in _OPTIONS_WITH_VALUE and not value:
        raise _LineError(f"option {option} needs an argument")
    name = _egg_name(value) if option == "--editable" else None
    return _Line(_Kind.OPTION, name=name, option=option, value=value or None)


@functools.lru_cache(maxsize=4096)
def _classify(line: str) -> _Line:
    """What kind of requirements-file line ``line`` is (stripped, comment removed).

    Memoized: validating a line is most of the cost of reading a file (packaging's
    parser), and a file is read at every submission; a changed line is a new key.

    :raises _LineError: if an ordinary requirement line is not valid PEP 508.
    """
    if line.startswith("-"):
        return _classify_option(line)
    if _SCHEME.match(line) or line.lower().startswith("file:"):
        target = line.split()[0]
        return _Line(_Kind.URL, name=_egg_name(target), value=target)
    if not _DIRECT_REF.match(line):
        first = re.split(r"[\s;]", line, maxsplit=1)[0]
        if _looks_like_path(first):
            return _Line(_Kind.PATH, value=first)
    spec = _PER_REQUIREMENT_OPTIONS.split(line, maxsplit=1)[0].strip()
    try:
        parsed = PackagingRequirement(spec)
    except InvalidRequirement as exc:
        raise _LineError(str(exc)) from None
    kind = _Kind.DIRECT if parsed.url else _Kind.SPEC
    return _Line(kind, name=canonicalize_name(parsed.name), value=parsed.url, parsed=parsed)


# --- parsing files ------------------------------------------------------------------------


_COMMENT = re.compile(r"(^|\s+)#.*$")


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(first physical line number, joined line)``, continuations joined as pip does.

    A line ending in a backslash continues on the next one, unless it is itself a
    comment; a comment line ends a continuation (its comment is dropped later).
    """
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        is_comment = _COMMENT.match(raw) is not None
        if raw.endswith("\\") and not is_comment:
            if not pending:
                start = number
            pending.append(raw[:-1])
            continue
        if pending:
            # The leading space keeps a trailing comment line recognisable as a comment.
            pending.append(" " + raw if is_comment else raw)
            yield start, "".join(pending)
            pending = []
        else:
            yield number, raw
    if pending:
        yield start, "".join(pending)


def parse_requirements_txt(text: str, source_name: str = "requirements.txt") -> list[Requirement]:
    """Parse a pip requirements file into its requirement and option lines, in order.

    Blank lines and comments are dropped; a comment starts at ``#`` at the start of a
    line or after whitespace (so a URL's ``#egg=`` fragment is not one), and a comment
    containing ``kn:keep`` sets :attr:`Requirement.keep`. Lines ending in a backslash
    are joined with the next. Option lines (``-r``, ``-e``, ``--index-url``, ...), bare
    URLs and local paths are kept as they are, named only where the line says the name
    (``#egg=``); whether they are usable is judged later (:func:`check_installable_remotely`).

    :raises RequirementsError: naming ``source_name``, the line number, the line and the
        reason, for a line that is not a valid PEP 508 requirement (nor an option, URL
        or path), or an option missing its argument.
    """
    result: list[Requirement] = []
    for number, logical in _logical_lines(text):
        match = _COMMENT.search(logical)
        comment = match.group(0) if match else ""
        line = logical[: match.start()].strip() if match else logical.strip()
        if not line:
            continue
        source = f"{source_name}:{number}"
        try:
            parsed = _classify(line)
        except _LineError as exc:
            raise RequirementsError(
                f"{source_name} line {number}: cannot parse {line!r}: {exc}"
            ) from None
        keep = _KEEP.search(comment) is not None
        result.append(Requirement(line=line, name=parsed.name, source=source, keep=keep))
    return result


def parse_pyproject_dependencies(text: str) -> list[Requirement] | None:
    """``[project].dependencies`` of a ``pyproject.toml``, or None where it declares none.

    None (not ``[]``) when the file has no ``[project]`` table or the table has no
    ``dependencies`` key (e.g. they are ``dynamic``), so that the caller can tell "not
    declared here" from "declared empty". Each entry must be a PEP 508 string.

    :raises RequirementsError: naming ``pyproject.toml`` for malformed TOML, a
        non-table ``[project]``, a non-list ``dependencies`` or a bad entry.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RequirementsError(f"pyproject.toml is not valid TOML: {exc}") from None
    project = document.get("project")
    if project is None:
        return None
    if not isinstance(project, dict):
        raise RequirementsError("pyproject.toml: [project] must be a table")
    dependencies = project.get("dependencies")
    if dependencies is None:
        return None
    if not isinstance(dependencies, list):
        raise RequirementsError(
            f"pyproject.toml: [project].dependencies must be a list of strings, "
            f"not {type(dependencies).__name__}"
        )
    result: list[Requirement] = []
    for index, entry in enumerate(dependencies):
        source = f"pyproject.toml [project].dependencies[{index}]"
        if not isinstance(entry, str):
            raise RequirementsError(f"{source} must be a string, not {entry!r}")
        line = entry.strip()
        try:
            parsed = PackagingRequirement(line)
        except InvalidRequirement as exc:
            raise RequirementsError(f"{source}: cannot parse {line!r}: {exc}") from None
        result.append(Requirement(line=line, name=canonicalize_name(parsed.name), source=source))
    return result


def choose_requirements(
    requirements_txt: str | None, pyproject_toml: str | None
) -> list[Requirement]:
    """The project's dependencies from the texts of its root's files (None: no such file).

    ``requirements.txt`` wins whenever it exists, even if it lists nothing (an empty
    file is a way to say "install nothing"); ``pyproject.toml`` is then not parsed at
    all. Otherwise ``[project].dependencies``; otherwise ``[]``.

    :raises RequirementsError: from the parser of the file that is used.
    """
    if requirements_txt is not None:
        return parse_requirements_txt(requirements_txt)
    if pyproject_toml is not None:
        from_pyproject = parse_pyproject_dependencies(pyproject_toml)
        if from_pyproject is not None:
            return from_pyproject
    return []


# --- judging ------------------------------------------------------------------------------


_PREBUILT_CONTEXT = (
    "prebuilt images install the dependencies with `uv pip install` from a package "
    "index when the job's pod starts, where files on this machine do not exist"
)
_SHIPPED_HINT = (
    "if the code lives inside the project, it is shipped with every job: import it from "
    "there instead of installing it; otherwise publish it to a package index or "
    "refer to it by a remote URL (https://... or git+https://...)"
)


def _remote_problem(parsed: _Line) -> tuple[str, str] | None:
    """``(why, what to do instead)`` if a pod cannot install this line, else None."""
    if parsed.kind is _Kind.OPTION:
        value = parsed.value or ""
        if parsed.option == "--editable":
            if _is_remote_url(value):
                return None
            return "it is a local editable install", _SHIPPED_HINT
        if parsed.option == "--requirement":
            return (
                "includes of other requirement files are not followed",
                "list those requirements in this file directly",
            )
        if parsed.option == "--constraint":
            return (
                "constraint files are not followed",
                "pin the versions in this file directly",
            )
        if parsed.option in ("--find-links", "--index-url", "--extra-index-url"):
            if _is_remote_url(value):
                return None
            return (
                f"{parsed.option} points at a local directory or file",
                "serve the packages from a package index reachable from the cluster",
            )
        return None
    if parsed.kind is _Kind.PATH:
        return "it is a local path", _SHIPPED_HINT
    if parsed.kind in (_Kind.URL, _Kind.DIRECT):
        if _is_remote_url(parsed.value or ""):
            return None
        return "it refers to a local file or directory", _SHIPPED_HINT
    return None


def check_installable_remotely(reqs: Iterable[Requirement]) -> None:
    """Check that a pod can ``uv pip install`` every line from a package index.

    Rejects local editable installs (``-e .``; ``-e git+https://...`` is fine),
    ``-r``/``-c`` includes, ``file://`` URLs, local paths and archive file names, direct
    references to local paths (``pkg @ ./x``) and local ``--find-links``/index paths.

    :raises RequirementsError: naming the first offending line (source, text, why and
        what to do instead) and listing all the others.
    """
    problems: list[tuple[Requirement, str, str]] = []
    for req in reqs:
        try:
            parsed = _classify(req.line)
        except _LineError as exc:
            raise RequirementsError(f"{req.source}: cannot parse {req.line!r}: {exc}") from None
        problem = _remote_problem(parsed)
        if problem is not None:
            problems.append((req, *problem))
    if not problems:
        return
    first, why, instead = problems[0]
    message = (
        f"{first.source}: {first.line!r} cannot be installed in the job's container: "
        f"{why} ({_PREBUILT_CONTEXT}); {instead}"
    )
    if len(problems) > 1:
        others = "\n".join(f"  {r.source}: {r.line!r}: {w}" for r, w, _ in problems[1:])
        message += f"\nThese lines cannot be installed there either:\n{others}"
    raise RequirementsError(message)


def packaging_requirement(req: Requirement) -> PackagingRequirement | None:
    """The PEP 508 requirement the local environment must satisfy for ``req``.

    None for lines that name no distribution (bare URLs and paths, most options). A line
    that names one without a specifier (``-e git+...#egg=r``) requires it installed.
    """
    if req.name is None:
        return None
    try:
        parsed = _classify(req.line)
    except _LineError:
        return None
    if parsed.parsed is not None:
        return parsed.parsed
    return PackagingRequirement(req.name)


def requirements_lines(reqs: Iterable[Requirement]) -> list[str]:
    """The lines to hand to pip/uv, in order, without comments."""
    return [r.line for r in reqs]


def requirements_digest_text(reqs: Iterable[Requirement]) -> str:
    """A canonical text of ``reqs`` for hashing into an image tag.

    The lines in their order (pip/uv resolve options and duplicates in order, so it is
    not sorted), each with runs of whitespace collapsed, joined by newlines: editing
    comments, blank lines or spacing leaves it unchanged; changing a requirement
    changes it.
    """
    return "\n".join(" ".join(r.line.split()) for r in reqs)
