"""CI runs the README's set-up section verbatim: the extraction finds what a user reads."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _extractor() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "readme_commands", REPO / ".ci/readme_commands.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_setup_is_venv_then_quickstart_then_tests() -> None:
    commands = _extractor().setup_commands((REPO / "README.md").read_text(encoding="utf-8"))
    venv, *rest = commands
    assert venv.startswith("python3 -m venv .venv")
    assert any("examples/quickstart.py" in c for c in rest)
    # The test command is last and is the one .ci/run must reach: tox.
    assert rest[-1].split("&&")[-1].strip() == "tox"
    assert (REPO / "examples/quickstart.py").is_file()


def test_no_tracked_file_blocks_the_venv_directory() -> None:
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--", ".venv"],
        capture_output=True,
        text=True,
        check=False,
    )
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    assert tracked.stdout.strip() == "", "a tracked .venv breaks `python3 -m venv .venv`"


@pytest.mark.parametrize(
    ("readme", "reason"),
    [
        ("# K\n\nno set-up here\n", "no '## Set-up' section"),
        ("## Set-up\n\n```sh\ntox\n```\n", "no `python3 -m venv"),
        ("## Set-up\n\n(`python3 -m venv .venv`)\n", "no ```sh block"),
    ],
)
def test_a_readme_without_its_commands_fails_ci(readme: str, reason: str, tmp_path: Path) -> None:
    path = tmp_path / "README.md"
    path.write_text(readme, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(REPO / ".ci/readme_commands.py"), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert reason in proc.stderr


def test_readme_layout_map_names_every_package_folder() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("```\nkinetic/\n") :]
    layout = layout[: layout.index("```", 4)]
    folders = [
        p.name
        for top in ("kinetic", "tests")
        for p in sorted((REPO / top).iterdir())
        if p.is_dir() and p.name != "__pycache__"
    ]
    missing = [name for name in folders if f"{name}/" not in layout]
    assert missing == [], f"README's layout map does not name {missing}"


def test_tox_never_writes_a_venv_redirect_file() -> None:
    # tox >= 4.6x writes `.venv` (a file naming a tox env) unless told not to; the README's
    # `python3 -m venv .venv` then fails in that checkout.
    import configparser

    config = configparser.ConfigParser()
    config.read(REPO / "tox.ini")
    assert config.get("tox", "venv_redirect", fallback=None) == "false"
