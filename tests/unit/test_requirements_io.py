"""Reading the package root's dependency files and checking them against this interpreter."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from kinetic._core.requirements import Requirement, parse_requirements_txt
from kinetic._engine.requirements_io import missing_distributions, read_project_requirements
from kinetic._exceptions import RequirementsError

PYPROJECT = '[project]\nname = "demo"\ndependencies = ["pandas>=2"]\n'


def names(reqs: list[Requirement]) -> list[str | None]:
    return [r.name for r in reqs]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param({"requirements.txt": "numpy\n", "pyproject.toml": PYPROJECT}, ["numpy"]),
        pytest.param({"pyproject.toml": PYPROJECT}, ["pandas"]),
        pytest.param({"pyproject.toml": "[tool.x]\n"}, []),
        pytest.param({}, []),
    ],
)
def test_read_project_requirements(
    tmp_path: Path, files: dict[str, str], expected: list[str]
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert names(read_project_requirements(tmp_path)) == expected


def test_file_above_the_root_is_not_adopted(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("numpy\n")
    root = tmp_path / "project"
    root.mkdir()
    (root / "main.py").write_text("")
    assert read_project_requirements(root) == []
    (root / "pyproject.toml").write_text("[project]\ndependencies = ['rich']\n")
    assert names(read_project_requirements(root)) == ["rich"]


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").mkdir()  # exists, but cannot be read as text
    with pytest.raises(RequirementsError, match="requirements.txt"):
        read_project_requirements(tmp_path)


def test_undecodable_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(RequirementsError, match="pyproject.toml"):
        read_project_requirements(tmp_path)


PYTEST_VERSION = importlib.metadata.version("pytest")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "kinetic-test-absent-dist-xyz\n", ["kinetic-test-absent-dist-xyz"], id="absent"
        ),
        pytest.param("pytest<1\n", [f"pytest<1 (installed {PYTEST_VERSION})"], id="wrong-version"),
        pytest.param("pytest\nPyTest>=1\n", [], id="installed"),
        pytest.param('pytest; python_version < "3.0"\n', [], id="false-marker"),
        pytest.param(
            'kinetic-test-absent-dist-xyz; python_version < "3.0"\n', [], id="absent-false-marker"
        ),
        pytest.param(
            "https://example.invalid/x.whl\n./pkg\n--pre\n-r other.txt\n", [], id="no-names"
        ),
        pytest.param(
            "zz-absent-kinetic-dist\n-e git+https://e.invalid/r.git#egg=kinetic-test-absent-dist-xyz\n",
            ["kinetic-test-absent-dist-xyz", "zz-absent-kinetic-dist"],
            id="sorted-and-egg-names",
        ),
    ],
)
def test_missing_distributions(text: str, expected: list[str]) -> None:
    assert missing_distributions(parse_requirements_txt(text)) == expected
