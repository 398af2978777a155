"""Pytest plugin: every test runs with a private, clean Kinetic environment.

``KINETIC_*`` and GCP variables of the developer's shell are removed, the
profiles file, the local backend's root and the hashing stat cache point into
the test's temporary directory, and the local-backend notice is silenced. Tests that need other
values set them with ``monkeypatch``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_CLEARED_PREFIXES = ("KINETIC_", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_")


@pytest.fixture(autouse=True)
def kinetic_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Isolate the test; yields the local backend root (``KINETIC_LOCAL_ROOT``)."""
    for name in list(os.environ):
        # The testbed's own settings (KINETIC_TESTBED_*) describe the machine, not Kinetic.
        if name.startswith(_CLEARED_PREFIXES) and not name.startswith("KINETIC_TESTBED_"):
            monkeypatch.delenv(name)
    root = tmp_path / "kinetic-root"
    monkeypatch.setenv("KINETIC_LOCAL_ROOT", str(root))
    monkeypatch.setenv("KINETIC_PROFILES_FILE", str(tmp_path / "profiles.json"))
    monkeypatch.setenv("KINETIC_QUIET", "1")
    monkeypatch.setenv("KINETIC_CACHE_DIR", str(tmp_path / "kinetic-cache"))
    # Each test has its own root, so its own job launcher: let it go soon after the test.
    monkeypatch.setenv("KINETIC_LOCAL_LAUNCHER_IDLE", "10")
    return root


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def job_dirs(root: Path) -> list[str]:
    """Names of the job directories in a local root's storage."""
    storage = root / "storage"
    if not storage.is_dir():
        return []
    return sorted(p.name for p in storage.iterdir() if p.name.startswith("job-"))


def module_project(where: Path, module: str, source: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A one-module project at ``where`` (a ``pyproject.toml`` and ``{module}.py``),
    importable and the working directory for the rest of the test: what a user's jobs
    live in."""
    where.mkdir()
    name = module.replace("_", "-")
    (where / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0"\n')
    (where / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(where))
    monkeypatch.chdir(where)
    return where
