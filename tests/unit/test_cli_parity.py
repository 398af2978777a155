"""Flags scripts written for the original pass: ``profile rm NAME -y``, ``profile
unset``, and ``--yes``/``--preview`` on ``up``, ``pool add`` and ``pool remove``
(``--preview`` prints the plan and changes nothing: no credentials, no cluster needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetic._cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials and no kubeconfig: anything but a preview would fail."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-adc.json"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))


def test_profile_rm_yes_and_unset(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "profiles.json"
    monkeypatch.setenv("KINETIC_PROFILES_FILE", str(path))
    assert run(capsys, "profile", "create", "dev", "--project", "p", "--use")[0] == 0
    assert run(capsys, "profile", "create", "old", "--project", "q")[0] == 0
    code, out, _ = run(capsys, "profile", "unset")
    assert (code, out.strip()) == (0, "no current profile (was: dev)")
    assert "current" not in json.loads(path.read_text())
    assert set(json.loads(path.read_text())["profiles"]) == {"dev", "old"}
    assert run(capsys, "profile", "rm", "old", "-y")[0] == 0
    assert run(capsys, "profile", "rm", "dev", "--yes")[0] == 0
    assert json.loads(path.read_text())["profiles"] == {}
    assert run(capsys, "profile", "rm", "dev", "-y")[0] == 3  # no such profile


@pytest.mark.usefixtures("no_cloud")
def test_up_preview_prints_the_plan_and_changes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(
        capsys, "--project", "p", "--cluster", "c", "up", "--accelerator", "l4x4", "--yes",
        "--preview",
    )  # fmt: skip
    assert code == 0, err
    assert "GKE cluster c in us-central1-a of project p" in out
    assert "node pool kn-gpu-l4x4 in c (g2-standard-48, 4x nvidia-l4, 0-1 nodes)" in out
    assert "bucket gs://p-kn-c-jobs" in out
    assert "ServiceAccount default/kinetic" in out
    assert "nothing was changed" in out
    code, out, err = run(capsys, "up", "--use-kubeconfig", "--preview", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["preview"] is True
    assert "Namespace default" in plan["items"]


@pytest.mark.usefixtures("no_cloud")
@pytest.mark.parametrize(
    "flags",
    [["--spot"], ["--min-nodes", "1"], ["--max-nodes", "4"], ["--spot", "--max-nodes", "2"]],
)
def test_up_refuses_pool_flags_without_an_accelerator(
    capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    """They shape the pool --accelerator adds: alone, they were silently ignored."""
    code, out, err = run(capsys, "--project", "p", "up", *flags, "--yes", "--preview")
    assert code != 0
    assert f"{flags[0]}" in err
    assert "--accelerator" in err
    assert "nothing was changed" not in out


@pytest.mark.usefixtures("no_cloud")
def test_pool_add_and_remove_preview(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "--project", "p", "pool", "add", "--accelerator", "cpu", "--yes", "--preview"
    )
    assert code == 0, err
    assert out.startswith("kinetic pool add would create:\n  node pool kn-cpu in kinetic-cluster")
    code, out, err = run(capsys, "--project", "p", "pool", "remove", "kn-cpu", "--preview")
    assert code == 0, err
    assert "would delete:\n  node pool kn-cpu of kinetic-cluster" in out
    # Without --preview the same commands do reach for credentials: the preview did not.
    assert run(capsys, "--project", "p", "pool", "remove", "kn-cpu", "--yes")[0] == 1
