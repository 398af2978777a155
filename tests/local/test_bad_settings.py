"""Settings that name something that does not exist are clear errors, not silently
the defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

import kinetic
from kinetic._cli import main
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local


def plain(x: int) -> int:
    return x


def test_a_missing_profile_is_an_error_with_no_profiles_file(
    monkeypatch: pytest.MonkeyPatch,
    kinetic_env: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KINETIC_PROFILE", "ghost")
    with pytest.raises(kinetic.ProfileError, match=r"'ghost' \(KINETIC_PROFILE\) does not"):
        kinetic.run()(plain).run_async(1)
    assert job_dirs(kinetic_env) == []
    assert main(["config", "show"]) == 2
    assert "'ghost'" in capsys.readouterr().err
    # Creating it is how the user gets out of this.
    assert main(["profile", "create", "ghost", "--project", "p"]) == 0
    monkeypatch.delenv("KINETIC_PROFILE")
    assert main(["profile", "ls"]) == 0
