"""``kinetic.testing``: the pytest plugin users test their own jobs with.

The plugin is exercised the way users run it: a test module of theirs, in a fresh
``pytest`` process, from a shell whose settings point elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import kinetic
import kinetic.testing
from tests.doc_examples import REPO

pytestmark = [pytest.mark.local, pytest.mark.timeout(240)]

_USER_TESTS = textwrap.dedent(
    """
    import json, os, time
    from pathlib import Path

    import kinetic

    @kinetic.run()
    def where(x):
        return x * 2, os.environ["KINETIC_OUTPUT_DIR"]

    @kinetic.run()
    def sleeper():
        time.sleep(120)

    def test_runs_locally_under_a_temporary_root(kinetic_local, tmp_path):
        assert os.environ["KINETIC_BACKEND"] == "local"
        assert "KINETIC_PROJECT" not in os.environ
        assert "GOOGLE_CLOUD_PROJECT" not in os.environ
        assert kinetic_local.root.is_relative_to(tmp_path)
        job = where.run_async(21)
        value, out = job.result()
        assert value == 42
        assert out == str(kinetic_local.output_dir(job.job_id))
        assert job.backend == "local"

    def test_leaves_a_running_job_and_batch(kinetic_local):
        job = sleeper.run_async()
        batch = where.run_async_map(range(3))
        batch.results(cleanup=False)
        busy = sleeper.run_async_map([()] * 4, max_concurrent=2)
        Path(os.environ["REPORT"]).write_text(
            json.dumps(
                {
                    "root": str(kinetic_local.root),
                    "job_id": job.job_id,
                    "done": batch.group_id,
                    "busy": busy.group_id,
                }
            )
        )

    def test_without_the_fixture_the_shell_settings_apply():
        assert os.environ["KINETIC_PROJECT"] == "somebody-elses-project"
    """
)


def _run_user_tests(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_user.py").write_text(_USER_TESTS, encoding="utf-8")
    env = {
        **os.environ,
        # A developer's shell that would send jobs to a cluster, and a root not to touch.
        "KINETIC_PROJECT": "somebody-elses-project",
        "KINETIC_BACKEND": "gke",
        "GOOGLE_CLOUD_PROJECT": "another-project",
        "KINETIC_LOCAL_ROOT": str(tmp_path / "shell-root"),
        "REPORT": str(tmp_path / "report.json"),
    }
    return subprocess.run(
        # pytest-asyncio (the test extra has it) is tried in test_testing_plugins.py.
        [sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:asyncio",
         "-c", os.devnull,
         "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "basetemp"),
         *args, "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )  # fmt: skip


def test_fixture_isolates_user_tests_and_cancels_leftover_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = _run_user_tests(tmp_path, "-p", "kinetic.testing")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout, proc.stdout
    assert not (tmp_path / "shell-root").exists()

    report = json.loads((tmp_path / "report.json").read_text())
    # Look at the job the user's test left behind, from here, under that test's root.
    monkeypatch.setenv("KINETIC_LOCAL_ROOT", report["root"])
    job = kinetic.attach(report["job_id"], backend="local")
    status = job.status_report()
    assert status.status is kinetic.JobStatus.FAILED
    assert status.cancelled
    # The finished batch is left as it was; the busy one was stopped.
    assert kinetic.attach_batch(report["done"], backend="local").status_counts() == {"SUCCEEDED": 3}
    busy = kinetic.attach_batch(report["busy"], backend="local").status_counts()
    assert set(busy) == {"FAILED"}, busy


def test_without_the_plugin_the_fixture_does_not_exist(tmp_path: Path) -> None:
    proc = _run_user_tests(tmp_path, "-p", "no:kinetic.testing")
    assert proc.returncode != 0
    assert "fixture 'kinetic_local' not found" in proc.stdout


def test_entry_point_is_declared() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["pytest11"] == {"kinetic.testing": "kinetic_pytest"}
    installed = {
        ep.name: ep.value
        for ep in metadata.entry_points(group="pytest11")
        if ep.value.startswith("kinetic")
    }
    # An install made before the entry point existed lacks it; any install has no other.
    assert installed in ({}, {"kinetic.testing": "kinetic_pytest"})


def test_public_surface_is_curated() -> None:
    names = kinetic.testing.__all__
    assert names == sorted(names)
    public = {
        name
        for name, value in vars(kinetic.testing).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "kinetic.testing") == "kinetic.testing"
        and not isinstance(value, type(os))
        and name != "annotations"
    }
    assert set(names) == public
    assert kinetic.testing.__doc__


def test_local_environment_is_pure_and_complete(tmp_path: Path) -> None:
    env = kinetic.testing.local_environment(tmp_path)
    assert env["KINETIC_BACKEND"] == "local"
    for name in ("KINETIC_LOCAL_ROOT", "KINETIC_CACHE_DIR", "KINETIC_PROFILES_FILE"):
        assert Path(env[name]).is_relative_to(tmp_path)
    assert all(k.startswith(kinetic.testing.CLEARED_PREFIXES) for k in env)


_UNRELATED_TESTS = textwrap.dedent(
    """
    import sys

    def test_a_session_that_uses_no_kinetic_fixture_imports_no_kinetic():
        assert "kinetic_pytest" in sys.modules  # the installed plugin is loaded
        assert not [m for m in sys.modules if m == "kinetic" or m.startswith("kinetic.")]
    """
)


def test_the_installed_plugin_imports_kinetic_only_for_a_test_that_asks(tmp_path: Path) -> None:
    """Every pytest session of an environment with kinetic-aio loads the plugin: one that
    never asks for its fixture must not pay for importing Kinetic."""
    (tmp_path / "test_unrelated.py").write_text(_UNRELATED_TESTS, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:asyncio", "-c", os.devnull,
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "test_unrelated.py"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The installed plugin's fixture runs Kinetic's own (the user's tests use it).
    proc = _run_user_tests(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout, proc.stdout
