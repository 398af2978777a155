"""Without Application Default Credentials, up/status/down/pool say which API they
needed them for (the Container API, not Cloud Build), before doing anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic._cli import main


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["up"],
        ["down", "--yes"],
        ["pool", "add", "--accelerator", "cpu"],
        ["pool", "list"],
    ],
)
def test_missing_credentials_name_the_container_api(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-adc.json"))
    assert main(["--project", "p", "--cluster", "c", *command]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kinetic: no usable Google credentials for the Container API"), err
    assert "Cloud Build" not in err
    assert "creating" not in err  # pool add checks before it says it creates
    assert len(err.splitlines()) == 1
