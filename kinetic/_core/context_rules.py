"""Which files travel with a job: package-root markers and exclusion rules. Pure."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ExcludeRules:
    """Glob patterns matched against each path's name and its relative path.

    A pattern ending in ``/`` matches directories only. ``.kineticignore`` holds
    one pattern per line; blank lines and ``#`` comments are ignored.
    """

    patterns: tuple[str, ...] = DEFAULT_EXCLUDES

    @classmethod
    def with_ignore_file(cls, lines: Iterable[str]) -> ExcludeRules:
        extra = []
        for raw in lines:
            line = raw.strip()
            if line and not line.startswith("#"):
                extra.append(line.lstrip("/"))
        return cls((*DEFAULT_EXCLUDES, *extra))

    def excludes(self, relpath: str, *, is_dir: bool) -> bool:
        """Whether ``relpath`` (posix, relative to the root) is left out."""
        name = relpath.rsplit("/", 1)[-1]
        for pattern in self.patterns:
            dir_only = pattern.endswith("/")
            pat = pattern.rstrip("/")
            if dir_only and not is_dir:
                continue
            if fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(relpath, pat):
                return True
        return False
