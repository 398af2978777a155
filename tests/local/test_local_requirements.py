"""The local backend runs jobs with this interpreter: it says once, naming them, which of
the project's requirements the interpreter lacks, and runs the job anyway."""

from __future__ import annotations

import importlib.util
import logging
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import kinetic

pytestmark = pytest.mark.local


def _project_function(root: Path, requirements: str) -> Any:
    root.mkdir()
    (root / "requirements.txt").write_text(requirements)
    name = f"kt_local_{uuid.uuid4().hex[:8]}"
    (root / f"{name}.py").write_text("def triple(x):\n    return 3 * x\n")
    spec = importlib.util.spec_from_file_location(name, root / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.triple


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What Kinetic's loggers warned of the project's requirements; forgets what was
    logged."""
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("kinetic.")
        and r.levelno == logging.WARNING
        and "lacks requirements of" in r.getMessage()
    ]
    caplog.clear()
    return said


def test_missing_requirements_are_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fn = _project_function(
        tmp_path / "proj", "kinetic-test-absent-dist-xyz>=1\npytest<1\ncloudpickle\n"
    )
    remote = kinetic.run()(fn)
    assert remote(2) == 6
    warning = _warnings(caplog)
    assert len(warning) == 1
    assert "kinetic-test-absent-dist-xyz" in warning[0]
    assert "pytest<1 (installed " in warning[0]
    assert "cloudpickle" not in warning[0]  # installed: not worth a word
    assert str(tmp_path / "proj") in warning[0]
    # The same project again in this process: nothing more to say.
    assert remote(3) == 9
    assert _warnings(caplog) == []


def test_satisfied_requirements_say_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fn = _project_function(tmp_path / "proj", "cloudpickle>=1\n")
    assert kinetic.run()(fn)(1) == 3
    assert _warnings(caplog) == []
