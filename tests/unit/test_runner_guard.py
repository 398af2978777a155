"""The top-level ``runner`` package and its namesake on the package index: another
``runner`` that shadows or overwrites Kinetic's is refused with a clear message, by
``import kinetic`` and by ``python -m runner`` (a job's entry point)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import runner

REPO = Path(__file__).resolve().parents[2]
FOREIGN = '"""Some other project called runner."""\n\ndef run():\n    return "not kinetic"\n'


def _python(*args: str, path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(path)}
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_kinetics_runner_carries_the_mark() -> None:
    assert runner.KINETIC_RUNNER == 1
    assert Path(runner.__file__).parent == REPO / "runner"


def test_import_kinetic_names_a_runner_that_shadows_ours(tmp_path: Path) -> None:
    (tmp_path / "runner").mkdir()
    (tmp_path / "runner" / "__init__.py").write_text(FOREIGN)
    proc = _python("-c", "import kinetic", path=tmp_path, cwd=tmp_path)
    assert proc.returncode != 0
    where = str(tmp_path / "runner" / "__init__.py")
    assert f"the `runner` package at {where} is not Kinetic's job runner" in proc.stderr
    assert "pip uninstall runner" in proc.stderr


def test_a_job_whose_runner_init_was_overwritten_says_so(tmp_path: Path) -> None:
    # pip installing the other `runner` over Kinetic's replaces runner/__init__.py and
    # leaves Kinetic's other modules: the job's `python -m runner` names the clash.
    copy = tmp_path / "site" / "runner"
    shutil.copytree(REPO / "runner", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "__init__.py").write_text(FOREIGN)
    proc = _python("-m", "runner", "--help", path=tmp_path / "site", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"kinetic: the `runner` package at {copy / '__init__.py'}")


def test_with_kinetics_runner_both_start(tmp_path: Path) -> None:
    proc = _python("-c", "import kinetic, runner; print(runner.__file__)", path=REPO, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(REPO / "runner" / "__init__.py")
