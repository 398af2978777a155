"""Which files travel with a job: package-root markers and ignore rules. Pure.

What travels is the package root's files minus, in rising priority (a later layer
overrides an earlier one wherever it has a matching pattern):

1. the default excludes (:data:`DEFAULT_EXCLUDES`: VCS metadata, caches, virtualenvs);
2. inside a git work tree only: ``.git/info/exclude``, then every ``.gitignore`` from
   the work tree's top down to the deepest directory, a deeper file overriding a
   shallower one (git's own precedence);
3. the secret excludes (:data:`SECRET_EXCLUDES`: keys, credentials, tokens), which no
   ``.gitignore`` can re-include: a job's code travels to storage others may read (a
   jobs bucket every job pod can read);
4. ``.kineticignore`` at the package root, which may re-include with ``!`` what the
   layers below leave out (a secret too, on purpose: the submission says so).

Every layer uses gitignore syntax and semantics (matched by :mod:`pathspec`'s
``GitIgnoreSpec``): ``#`` comments, ``!`` negation, a pattern with a ``/`` before its
end anchored to its file's directory, ``dir/`` for directories only, ``*``, ``?``,
``[...]`` and ``**``. Within a layer the last matching pattern decides. As in git, a
file inside an excluded directory cannot be re-included: the walk does not enter
excluded directories (:mod:`kinetic._engine.context_files` does the IO).

:mod:`pathspec` is imported on first use, not with Kinetic: a warm context walk reuses
its earlier decisions and never needs it.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_EXCLUDES",
    "GITIGNORE",
    "KINETICIGNORE",
    "ROOT_MARKERS",
    "SECRETS",
    "SECRET_EXCLUDES",
    "ExcludeRules",
    "IgnoreFile",
]

ROOT_MARKERS = ("pyproject.toml", "requirements.txt", "setup.py", "setup.cfg", ".git")

DEFAULT_EXCLUDES = (
    ".git",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    ".tox",
    ".nox",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".ipynb_checkpoints",
    ".eggs",
    "*.egg-info",
    "*.pyc",
    ".DS_Store",
)

# Files and folders that hold credentials, wherever they sit in the project (a project
# at HOME is refused, but a project may hold a copy of any of them).
SECRET_EXCLUDES = (
    ".ssh/",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",
    "_netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
    ".aws/",
    ".azure/",
    ".kube/",
    ".gnupg/",
    "**/.config/gcloud/",
    "application_default_credentials.json",
    "**/.docker/config.json",
    "credentials.json",
    "client_secret*.json",
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
)
SECRETS = "secret patterns"
"""The source :meth:`ExcludeRules.decide` names for the secret excludes."""

GITIGNORE = ".gitignore"
KINETICIGNORE = ".kineticignore"


@dataclass(frozen=True)
class IgnoreFile:
    """The patterns of one ignore file (gitignore syntax) and where they apply.

    :ivar source: where the patterns come from, as people read it (``pkg/.gitignore``,
        ``.git/info/exclude``, ``.kineticignore``, ``defaults``).
    :ivar lines: the file's lines.
    :ivar scope: the directory whose contents the patterns apply to, posix and relative
        to the package root (``""``: the root).
    :ivar prefix: the path from the patterns' own directory down to ``scope`` (``""`` or
        ending in ``/``): a ``.gitignore`` above the package root, or
        ``.git/info/exclude``, is relative to a directory above it.
    """

    source: str
    lines: tuple[str, ...]
    scope: str = ""
    prefix: str = ""

    def check(self, path: str, *, is_dir: bool) -> bool | None:
        """Return ``True`` (ignored), ``False`` (re-included by ``!``) or ``None`` (no say).

        :param path: posix, relative to the package root, without a trailing ``/``.
        """
        if self.scope:
            n = len(self.scope)
            if not path.startswith(self.scope) or path[n : n + 1] != "/":
                return None
            path = path[n + 1 :]
        spec = _compile(_dir_forms(self.lines) if is_dir else self.lines)
        result: bool | None = spec.check_file(self.prefix + path).include
        return result


@functools.lru_cache(maxsize=512)
def _compile(lines: tuple[str, ...]) -> Any:
    import pathspec  # a cold walk only: ~10 ms to import

    return pathspec.GitIgnoreSpec.from_lines(lines)


@functools.lru_cache(maxsize=256)
def _dir_forms(lines: tuple[str, ...]) -> tuple[str, ...]:
    """The patterns as they apply to a directory named by its path without a trailing ``/``.

    A file is checked by its path, and GitIgnoreSpec then matches it as git does. A
    directory is checked on its own, before the walk decides whether to enter it: a
    pattern ending in ``/`` is satisfied by being a directory, so that ``/`` is dropped;
    the others match the directory's path as they would a file's. (Checking ``dir/``
    instead would let ``dir/**``, which git applies only to what is inside, exclude the
    directory itself, and then nothing inside could be re-included.)
    """
    return tuple(_dir_form(line) for line in lines)


def _dir_form(line: str) -> str:
    body = line
    while body.endswith(" ") and not body.endswith("\\ "):  # git drops unescaped trailing spaces
        body = body[:-1]
    if body.endswith("/") and body.strip("/") and not body.endswith("\\/"):
        return body[:-1]
    return line


_DEFAULTS = IgnoreFile("defaults", DEFAULT_EXCLUDES)
_SECRETS = IgnoreFile(SECRETS, SECRET_EXCLUDES)


class ExcludeRules:
    """The ignore layers in force for one directory of the walk (module docstring).

    Immutable: :meth:`nested` returns the rules for a subdirectory holding its own
    ``.gitignore``. Equal signatures mean equal decisions for every path.
    """

    __slots__ = ("git", "kinetic", "signature")

    def __init__(self, git: Sequence[IgnoreFile] = (), kinetic: IgnoreFile | None = None) -> None:
        self.git = tuple(git)
        self.kinetic = kinetic
        h = hashlib.sha256(b"kinetic-context-rules-v2\0")
        for layer in (_DEFAULTS, *self.git, _SECRETS, *((kinetic,) if kinetic else ())):
            h.update(repr((layer.scope, layer.prefix, layer.lines)).encode("utf-8", "replace"))
        self.signature = h.digest()

    def __repr__(self) -> str:
        layers = [layer.source for layer in (_DEFAULTS, *self.git, _SECRETS, self.kinetic) if layer]
        return f"ExcludeRules({layers!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExcludeRules) and other.signature == self.signature

    def __hash__(self) -> int:
        return hash(self.signature)

    @classmethod
    def with_ignore_file(cls, lines: Iterable[str]) -> ExcludeRules:
        """The defaults plus a ``.kineticignore`` holding ``lines`` (no git rules)."""
        return cls(kinetic=IgnoreFile(KINETICIGNORE, tuple(lines)))

    def nested(self, layer: IgnoreFile) -> ExcludeRules:
        """These rules plus a deeper ``.gitignore`` (it overrides the ones above it)."""
        return ExcludeRules((*self.git, layer), self.kinetic)

    def decide(self, relpath: str, *, is_dir: bool) -> tuple[bool, str | None]:
        """Whether ``relpath`` is left out, and the source of the layer that decided.

        :param relpath: posix, relative to the package root.
        """
        layers = (
            *((self.kinetic,) if self.kinetic else ()),
            _SECRETS,
            *reversed(self.git),
            _DEFAULTS,
        )
        for layer in layers:
            verdict = layer.check(relpath, is_dir=is_dir)
            if verdict is not None:
                return verdict, layer.source
        return False, None

    def flags_secret(self, relpath: str, *, is_dir: bool) -> tuple[bool, bool]:
        """Whether ``relpath`` is left out, and whether it matches a secret pattern and
        so must be named: left out by that pattern, or kept by ``.kineticignore`` on
        purpose."""
        excluded, source = self.decide(relpath, is_dir=is_dir)
        if source == SECRETS:
            return excluded, True
        if source == KINETICIGNORE and not excluded:
            return False, _SECRETS.check(relpath, is_dir=is_dir) is True
        return excluded, False

    def excludes(self, relpath: str, *, is_dir: bool) -> bool:
        """Whether ``relpath`` (posix, relative to the package root) is left out."""
        return self.decide(relpath, is_dir=is_dir)[0]
