"""Prebuilt mode's install step, with the real uv: failures end in phase ``install``
carrying uv's own message, and never hang."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.install import find_uv, install_requirements
from runner.protocol import PhaseError

pytestmark = pytest.mark.local


def test_uv_is_found_beside_the_interpreter() -> None:
    uv = find_uv()
    assert uv is not None
    assert Path(uv).name == "uv"


def test_a_requirement_that_cannot_install_fails_in_phase_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_OFFLINE", "1")  # no index here: uv answers from its own resolver
    with pytest.raises(PhaseError) as info:
        install_requirements(["kinetic-test-absent-dist-xyz==1.0"], tmp_path)
    assert info.value.phase == "install"
    message = str(info.value)
    assert message.startswith("uv pip install failed (exit ")
    assert "kinetic-test-absent-dist-xyz" in message  # uv's reason, not ours
    assert (tmp_path / "kinetic-requirements.txt").read_text() == (
        "kinetic-test-absent-dist-xyz==1.0\n"
    )


def test_an_install_past_its_time_limit_fails_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_INSTALL_TIMEOUT", "0.001")
    with pytest.raises(PhaseError, match="did not finish within") as info:
        install_requirements(["anything==1"], tmp_path)
    assert info.value.phase == "install"


def test_kept_lines_are_a_run_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("UV_OFFLINE", "1")
    with pytest.raises(PhaseError, match="kinetic-test-absent-dist-xyz") as info:
        install_requirements(["kinetic-test-absent-dist-xyz==1.0"], tmp_path, kept=True)
    assert info.value.phase == "install"
    # Its own file: the run before it (the project's lines) is not read again.
    assert (tmp_path / "kinetic-kept.txt").read_text() == "kinetic-test-absent-dist-xyz==1.0\n"
    assert not (tmp_path / "kinetic-requirements.txt").exists()
    assert "1 line(s) marked kn:keep, as written, with uv" in capfd.readouterr().err
