"""``kinetic accelerators``, ``config show`` and ``profile``: the commands, run for real.

Profiles live in a real file under a temporary ``$HOME`` (``KINETIC_PROFILES_FILE``
unset), and jobs read what ``profile use`` wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinetic._cli import main
from kinetic._settings import load_settings

pytestmark = pytest.mark.local


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh $HOME, with the profiles file at its default place."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KINETIC_PROFILES_FILE")
    return home


def test_accelerators(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "accelerators")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "NAME", "CATEGORY", "CHIPS", "HOSTS", "TOPOLOGY", "MACHINE_TYPE", "GKE_LABEL", "SPOT"
    ]  # fmt: skip
    assert any(line.split()[:3] == ["gpu-l4x4", "gpu", "4"] for line in lines)
    code, out, _ = run(capsys, "accelerators", "--json")
    assert {"tpu-v6e-8", "gpu-a100-80gb", "cpu"} <= {r["name"] for r in json.loads(out)}
    code, out, _ = run(capsys, "accelerators", "resolve", "v6e-8:spot", "--json")
    info = json.loads(out)
    assert (code, info["name"], info["spot"], info["machine_type"]) == (
        0,
        "tpu-v6e-8",
        True,
        "ct6e-standard-4t",
    )
    code, out, err = run(capsys, "accelerators", "resolve", "gpu-k80")
    assert code == 2
    assert out == ""
    assert "Invalid accelerator 'gpu-k80'" in err
    assert "Valid forms" in err


def test_profiles_under_home_drive_settings(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    path = home / ".kinetic" / "profiles.json"
    code, out, _ = run(capsys, "profile", "create", "dev", "--project", "p1", "--zone", "z1")
    assert code == 0
    assert "kinetic profile use dev" in out
    assert json.loads(path.read_text()) == {"profiles": {"dev": {"project": "p1", "zone": "z1"}}}
    assert path.stat().st_mode & 0o777 == 0o600
    assert (home / ".kinetic").stat().st_mode & 0o777 == 0o700
    assert load_settings().project is None  # created, not active
    assert run(capsys, "profile", "create", "dev")[0] == 2  # exists already
    assert run(capsys, "profile", "create", "prod", "--cluster", "big", "--use")[0] == 0
    assert load_settings().cluster == "big"
    assert run(capsys, "profile", "use", "dev")[0] == 0
    s = load_settings()
    assert (s.project, s.zone, s.cluster) == ("p1", "z1", "kinetic-cluster")
    code, out, _ = run(capsys, "profile", "ls", "--json")
    listed = json.loads(out)
    assert (listed["active"], sorted(listed["profiles"])) == ("dev", ["dev", "prod"])
    code, out, _ = run(capsys, "profile", "ls")
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [["*", "dev"], ["prod", "-"]]
    code, out, _ = run(capsys, "profile", "show", "--json")
    assert json.loads(out) == {"name": "dev", "active": True, "project": "p1", "zone": "z1"}
    assert run(capsys, "profile", "show", "nope")[0] == 3
    assert run(capsys, "profile", "use", "nope")[0] == 3
    assert run(capsys, "profile", "rm", "dev")[0] == 0
    assert run(capsys, "profile", "rm", "dev")[0] == 3
    assert json.loads(path.read_text()) == {"profiles": {"prod": {"cluster": "big"}}}
    assert load_settings().project is None  # the removed profile was current


def test_profile_edits_keep_what_they_do_not_know(
    capsys: pytest.CaptureFixture[str], home: Path
) -> None:
    path = home / ".kinetic" / "profiles.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"note": "mine", "profiles": {"a": {"project": "x", "k": 1}}}))
    assert run(capsys, "profile", "use", "a")[0] == 0
    assert json.loads(path.read_text()) == {
        "current": "a",
        "note": "mine",
        "profiles": {"a": {"project": "x", "k": 1}},
    }
    path.write_text("{not json")
    code, _, err = run(capsys, "profile", "ls")
    assert code == 2
    assert str(path) in err
    assert path.read_text() == "{not json"  # a malformed file is reported, never replaced


def test_config_show_names_every_source(
    capsys: pytest.CaptureFixture[str], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        run(capsys, "profile", "create", "dev", "--project", "pp", "--zone", "pz", "--use")[0] == 0
    )
    monkeypatch.setenv("KINETIC_ZONE", "ez")
    monkeypatch.setenv("KINETIC_GKE_START_GRACE", "42")
    code, out, _ = run(capsys, "--cluster", "ac", "config", "show", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert (rows["cluster"]["value"], rows["cluster"]["source"]) == ("ac", "argument")
    assert (rows["zone"]["value"], rows["zone"]["source"]) == ("ez", "environment")
    assert rows["zone"]["detail"] == "KINETIC_ZONE"
    assert (rows["project"]["value"], rows["project"]["source"]) == ("pp", "profile")
    assert rows["project"]["detail"] == "profile 'dev'"
    assert (rows["namespace"]["value"], rows["namespace"]["source"]) == ("default", "default")
    assert (rows["backend"]["value"], rows["backend"]["source"]) == ("gke", "default")
    assert rows["bucket"]["value"] == "pp-kn-ac-jobs"
    assert rows["gke_start_grace"]["value"] == "42"
    assert rows["profile"]["value"] == "dev"
    assert rows["profiles_file"]["value"] == str(home / ".kinetic" / "profiles.json")
    code, out, _ = run(capsys, "config", "show")
    assert any(line.split()[:3] == ["zone", "ez", "environment"] for line in out.splitlines())


def test_config_show_reports_a_broken_profiles_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "profiles.json").write_text(json.dumps({"profiles": {"a": {"zone": "z"}}}))
    monkeypatch.setenv("KINETIC_PROFILE", "missing")
    code, _, err = run(capsys, "config", "show")
    assert code == 2
    assert "'missing'" in err


def test_the_installed_command_runs_as_a_subprocess(home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kinetic", "profile", "create", "sub", "--project", "sp", "--use"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((home / ".kinetic" / "profiles.json").read_text())["current"] == "sub"
    bad = subprocess.run(
        [sys.executable, "-m", "kinetic", "profile", "create", "x", "--builder", "podman"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert "invalid choice" in bad.stderr


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    from kinetic import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"kinetic {__version__}"
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("jobs", "batch", "accelerators", "config", "profile", "doctor", "context"):
        assert command in out
