"""Test your own Kinetic jobs with pytest, on the local backend.

A pytest plugin, enabled automatically once ``kinetic-aio`` is installed (the
``pytest11`` entry point ``kinetic.testing``, a tiny module, :mod:`kinetic_pytest`, that
imports Kinetic only when a test asks for the fixture; ``-p no:kinetic.testing`` turns it off;
without the entry point, ``pytest_plugins = ["kinetic.testing"]`` in a ``conftest.py``
or ``-p kinetic.testing`` loads it). It provides the fixture :func:`kinetic_local`::

    import kinetic

    @kinetic.run()
    def square(x):
        return x * x

    def test_square(kinetic_local):
        assert square(3) == 9                      # a real job, in a real process
        assert square.run_async_map([1, 2]).results() == [1, 4]

Inside the test, Kinetic runs every job on the local backend under a temporary root
that the test owns: no cloud account, no profile, no variable of the developer's shell
can send a job elsewhere, and nothing is left in ``~/.kinetic``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "CLEARED_PREFIXES",
    "LocalKinetic",
    "kinetic_local",
    "local_environment",
    "local_kinetic",
]

CLEARED_PREFIXES = ("KINETIC_", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_")
"""Prefixes of the variables removed for the test: every one of them can choose a
project, a backend or a profile, so a test would depend on the shell it runs in."""

# A job launcher serves one local root; each test has its own root, so its launcher
# should go soon after the test rather than idling for the default two minutes.
_LAUNCHER_IDLE_SECONDS = "10"


@dataclass(frozen=True)
class LocalKinetic:
    """Where the test's jobs live (what :func:`kinetic_local` gives the test).

    :ivar root: the local backend's root (``KINETIC_LOCAL_ROOT``): the jobs' records,
        results and logs are under ``root / "storage"``.
    :ivar cache_dir: Kinetic's caches (``KINETIC_CACHE_DIR``).
    :ivar profiles_file: the profiles file Kinetic reads (``KINETIC_PROFILES_FILE``);
        it does not exist unless the test writes it.
    """

    root: Path
    cache_dir: Path
    profiles_file: Path

    @property
    def output_root(self) -> Path:
        """The folder holding each job's default ``KINETIC_OUTPUT_DIR``."""
        return self.root / "outputs"

    def output_dir(self, job_id: str) -> Path:
        """The ``KINETIC_OUTPUT_DIR`` of job ``job_id`` (artifacts it wrote)."""
        return self.output_root / job_id


def local_environment(base: Path) -> dict[str, str]:
    """The variables :func:`kinetic_local` sets, for a test directory ``base``. Pure."""
    return {
        "KINETIC_BACKEND": "local",
        "KINETIC_LOCAL_ROOT": str(base / "kinetic-root"),
        "KINETIC_CACHE_DIR": str(base / "kinetic-cache"),
        "KINETIC_PROFILES_FILE": str(base / "kinetic-profiles.json"),
        # The "running on the local backend" notice is for people, not for test logs.
        "KINETIC_QUIET": "1",
        "KINETIC_LOCAL_LAUNCHER_IDLE": _LAUNCHER_IDLE_SECONDS,
    }


@pytest.fixture
def kinetic_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalKinetic]:
    """Run this test's Kinetic jobs on the local backend, under a temporary root
    (:func:`local_kinetic`: what the installed plugin's fixture runs too)."""
    yield from local_kinetic(tmp_path, monkeypatch)


def local_kinetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalKinetic]:
    """The body of :func:`kinetic_local`: run a test's Kinetic jobs on the local backend,
    under a temporary root.

    Removes every ``KINETIC_*``, ``GOOGLE_CLOUD_PROJECT`` and ``CLOUDSDK_*`` variable,
    then sets ``KINETIC_BACKEND=local``, ``KINETIC_LOCAL_ROOT``, ``KINETIC_CACHE_DIR``
    and ``KINETIC_PROFILES_FILE`` into the test's ``tmp_path`` (all restored after the
    test). Jobs and batches still running when the test ends are cancelled, so none
    outlives it.
    A test that needs more settings sets them with ``monkeypatch.setenv`` after
    requesting this fixture.
    """
    for name in list(os.environ):
        if name.startswith(CLEARED_PREFIXES):
            monkeypatch.delenv(name)
    env = local_environment(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield LocalKinetic(
        root=Path(env["KINETIC_LOCAL_ROOT"]),
        cache_dir=Path(env["KINETIC_CACHE_DIR"]),
        profiles_file=Path(env["KINETIC_PROFILES_FILE"]),
    )
    _cancel_running_jobs(Path(env["KINETIC_LOCAL_ROOT"]))


def _cancel_running_jobs(root: Path) -> None:
    """Cancel the jobs and batches under ``root`` that have not ended (a test that did
    not wait for them)."""
    storage = root / "storage"
    if not storage.is_dir():
        return  # the test started no job: nothing to look at, no loop thread to start
    import kinetic  # here, not at import: the plugin loads in every pytest run

    for job in kinetic.list_jobs(backend="local"):
        if not job.status().is_terminal:
            job.cancel()
    groups = storage / "_groups"
    for group_id in sorted(p.name for p in groups.iterdir()) if groups.is_dir() else []:
        batch = kinetic.attach_batch(group_id, backend="local")
        counts = batch.status_counts()
        if counts.get("PENDING") or counts.get("RUNNING"):
            batch.cancel()
