"""A fresh process's first jobs import nothing on the caller's event loop.

An application imports Kinetic at start-up, then submits its first job from inside its
running loop. Whatever Kinetic imports lazily at that point holds the loop for the whole
import (the local backend's requirements check alone took 27 ms, the GKE backend's
modules 0.4 s of CPU), so each backend's code is imported in the worker thread that
reads the settings (:mod:`kinetic._engine.preload`). ``tests/first_use_probe.py`` runs
the first job, its result, status, logs, attach, list_jobs and a batch in a fresh
interpreter and reports every module imported on the loop's thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
PROBE_JOBS = "def square(x):\n    print('squaring', x)\n    return x * x\n"


def loop_thread_imports(project: Path, options: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The modules a fresh interpreter's first jobs (``options`` for ``kinetic.aio.run``)
    imported on its event loop's thread; ``project`` is made a one-module project."""
    project.mkdir(exist_ok=True)
    (project / "pyproject.toml").write_text('[project]\nname = "probe"\nversion = "0"\n')
    (project / "probe_jobs.py").write_text(PROBE_JOBS)
    out = subprocess.run(
        [sys.executable, str(REPO / "tests" / "first_use_probe.py"), json.dumps(options)],
        cwd=project,
        env={**env, "PYTHONPATH": os.pathsep.join([str(project), str(REPO)])},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    seen: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return seen


def test_a_first_local_job_imports_nothing_on_the_loop(tmp_path: Path) -> None:
    env = {**os.environ, "KINETIC_LOCAL_ROOT": str(tmp_path / "root")}
    env.pop("KINETIC_BACKEND", None)
    seen = loop_thread_imports(tmp_path / "project", {"backend": "local"}, env)
    assert seen == [], f"imported on the caller's loop: {seen}"
