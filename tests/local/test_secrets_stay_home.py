"""Secrets never ship with your code: what the issue that found it tried, with real jobs.

Run from HOME with no project marker, the package root was HOME, and the job's copy of
the code held ``~/.ssh/id_rsa``, ``~/.netrc``, ``~/.aws/credentials`` and more, with no
warning; a dotfiles repository (``.git`` at HOME) did the same for every marker-less
script below HOME. Now such a root is refused, and a project's own copies of credential
files stay behind, named in one line, unless ``.kineticignore`` ships one on purpose.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

import kinetic
from runner import protocol
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local

JOBS = '''
import os


def tree():
    """Every path of the job's copy of the project."""
    found = []
    for where, dirs, files in os.walk("."):
        for name in dirs + files:
            found.append(os.path.relpath(os.path.join(where, name), "."))
    return sorted(found)
'''

# What the issue found in the job's copy of HOME, as paths relative to HOME.
HOME_SECRETS = (
    ".ssh/id_rsa",
    ".netrc",
    ".aws/credentials",
    ".config/gcloud/application_default_credentials.json",
    ".kube/config",
    ".docker/config.json",
    ".env",
    "credentials.json",
    "server.pem",
    ".git-credentials",
)
# And what the issue adds, as a project's own files.
PROJECT_SECRETS = (
    *HOME_SECRETS,
    "deploy.key",
    ".ssh2/id_ed25519",
    ".pypirc",
    ".npmrc",
    ".env.production",
    "nested/.aws/credentials",
)


def load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"secretjobs_{abs(hash(path))}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plant(root: Path, paths: tuple[str, ...]) -> None:
    for rel in paths:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"secret of {rel}\n")


@pytest.fixture
def home(tmp_path: Path, kinetic_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME holding the keys the issue found, as a dotfiles repository."""
    home = tmp_path / "home"
    home.mkdir()
    plant(home, HOME_SECRETS)
    subprocess.run(["git", "init", "-q", str(home)], check=True)
    monkeypatch.setenv("HOME", str(home))
    return home


def test_a_script_at_home_or_below_it_without_a_marker_is_refused(
    home: Path, kinetic_env: Path
) -> None:
    for where in (home, home / "scripts"):  # HOME itself; a marker-less script below it
        where.mkdir(exist_ok=True)
        (where / "jobs.py").write_text(JOBS)
        fn = kinetic.run(backend="local")(load(where / "jobs.py").tree)
        with pytest.raises(kinetic.ConfigError) as refused:
            fn.run_async()
        message = str(refused.value)
        assert f"would be {home}, your home directory" in message
        assert "pyproject.toml" in message
        assert "KINETIC_PACKAGE_ROOT" in message
    assert job_dirs(kinetic_env) == []  # nothing was submitted


def test_a_projects_secrets_stay_behind_and_are_named(
    home: Path, kinetic_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    project = home / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\nversion = '0'\n")
    (project / "jobs.py").write_text(JOBS)
    (project / "app.key.txt").write_text("not a key: a text file\n")
    plant(project, PROJECT_SECRETS)
    # git cannot re-include a secret; .kineticignore can, on purpose.
    (project / ".gitignore").write_text("!.env\n")
    (project / ".kineticignore").write_text("!credentials.json\n")
    fn = kinetic.run(backend="local")(load(project / "jobs.py").tree)
    with caplog.at_level(logging.WARNING, logger="kinetic"):
        job = fn.run_async()
        seen = job.result(cleanup=False)
    kept = {p for p in PROJECT_SECRETS if p in seen}
    assert kept == {"credentials.json"}
    assert {"jobs.py", "pyproject.toml", "app.key.txt"} <= set(seen)
    spec = protocol.load_json(
        (kinetic_env / "storage" / protocol.spec_key(job.job_id)).read_bytes()
    )
    archive = (kinetic_env / "storage" / protocol.context_key(spec["context_sha256"])).read_bytes()
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        shipped = set(zf.namelist())
    assert not any(p in shipped for p in PROJECT_SECRETS if p != "credentials.json")
    lines = [r.getMessage() for r in caplog.records if "like secrets" in r.getMessage()]
    left_out, on_purpose = lines
    assert left_out.startswith(f"left out what looks like secrets in {project}: ")
    for named in (".env", ".ssh/", "server.pem", "deploy.key", ".aws/", "nested/.aws/"):
        assert named in left_out
    assert "credentials.json" not in left_out.split(": ", 1)[1].split(" (")[0].split(", ")
    assert "shipping what looks like secrets" in on_purpose
    assert on_purpose.endswith(": credentials.json")
