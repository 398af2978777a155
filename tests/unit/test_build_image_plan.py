"""``kinetic build-image``'s plan: one prebuilt base per Python a client submits from,
each tagged for its Python (a payload's code loads only in the Python that pickled it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kinetic._cli import main
from kinetic._cli.build_image import SUPPORTED_PYTHONS, plan_builds
from kinetic._exceptions import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_one_build_per_python_each_tagged_for_it() -> None:
    assert plan_builds(
        "0.3.0", "python:3.11-slim", ["3.12", "3.13", "3.12"], None, explicit=False
    ) == [
        ("python:3.12-slim", "0.3.0-py3.12"),
        ("python:3.13-slim", "0.3.0-py3.13"),
    ]


def test_without_python_the_base_image_decides() -> None:
    assert plan_builds("0.3.0", "python:3.13-slim", [], None, explicit=False) == [
        ("python:3.13-slim", "0.3.0-py3.13")
    ]
    assert plan_builds("0.3.0", "python:3.13-slim", [], "t", explicit=True) == [
        ("python:3.13-slim", "t")
    ]


def test_conflicting_choices_are_refused() -> None:
    with pytest.raises(ConfigError, match="--base-image or --python"):
        plan_builds("0.3.0", "my/base:1", ["3.12"], None, explicit=True)
    with pytest.raises(ConfigError, match="one Python at a time"):
        plan_builds("0.3.0", "python:3.11-slim", ["3.12", "3.13"], "t", explicit=False)


def test_the_cli_says_so_before_building(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["build-image", "--repo", "r", "--python", "3.12", "--base-image", "b", "--yes"])
    assert code == 1
    assert "--base-image or --python" in capsys.readouterr().err


def test_the_supported_pythons_are_the_packages() -> None:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [
        c.rsplit(" ", 1)[-1]
        for c in meta["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    ]
    assert list(SUPPORTED_PYTHONS) == declared
