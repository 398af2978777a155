"""The layout map of README.md and docs/architecture.md: one source, the tree's own names.

``docs/gen/layout.py`` holds the map and renders both copies (run it after editing an
entry). These checks fail when a top-level module or package of ``kinetic/`` or
``runner/`` has no entry, when an entry names one that is gone, and when either copy
differs from what the generator writes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _layout() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_layout", REPO / "docs/gen/layout.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layout = _layout()


def test_every_top_level_module_and_package_has_an_entry() -> None:
    assert layout.drift() == [], "edit the entries in docs/gen/layout.py"


@pytest.mark.parametrize("copy", layout.COPIES)
def test_each_copy_is_what_the_generator_writes(copy: str) -> None:
    text = (REPO / copy).read_text(encoding="utf-8")
    assert layout.rewrite(text, layout.render()) == text, (
        f"{copy}: run `python docs/gen/layout.py` (and edit the map there, not in {copy})"
    )


def test_the_check_command_agrees() -> None:
    assert layout.main(["--check"]) == 0


POOL_ROOM_LINES = 500
"""Issue 38's limit for a module of ``runner/pool/``: a room a newcomer reads whole."""


def test_no_pool_module_outgrows_its_room() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in (REPO / "runner/pool").glob("*.py")}
    assert len(sizes) > 10
    over = {name: n for name, n in sizes.items() if n > POOL_ROOM_LINES}
    assert over == {}, f"split these (over {POOL_ROOM_LINES} lines): {over}"


# ----------------------------------------------------------------- the generator itself


def test_a_new_module_without_an_entry_is_named(tmp_path: Path) -> None:
    for package in layout.PACKAGES:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "__init__.py").write_text("")
        (tmp_path / package / "__pycache__").mkdir()  # not a package: no __init__.py
        (tmp_path / package / "py.typed").write_text("")
        for names in layout.named()[package]:
            if names.endswith(".py"):
                (tmp_path / package / names).write_text("")
    (tmp_path / "kinetic" / "_new.py").write_text("")
    (tmp_path / "runner" / "new_folder").mkdir()
    (tmp_path / "runner" / "new_folder" / "__init__.py").write_text("")
    problems = layout.drift(tmp_path)
    assert "kinetic/_new.py has no entry in docs/gen/layout.py" in problems
    assert "runner/new_folder/ has no entry in docs/gen/layout.py" in problems
    # Folders listed in the map but absent from this tree are named as gone.
    assert "docs/gen/layout.py lists kinetic/_core/, which is gone" in problems
    assert not [p for p in problems if "sub/" in p and "no entry" not in p]


def test_a_hand_edit_of_a_copy_is_stale(tmp_path: Path) -> None:
    for copy in layout.COPIES:
        (tmp_path / copy).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / copy).write_text("# Title\n\n" + layout.render() + "\nafter\n")
    assert layout.stale(tmp_path) == []
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("_core/", "_kore/"))
    assert layout.stale(tmp_path) == ["README.md"]
    rewritten = layout.rewrite(readme.read_text(), layout.render())
    assert rewritten == "# Title\n\n" + layout.render() + "\nafter\n"


@pytest.mark.parametrize(
    "text",
    [
        "no markers\n",
        f"{layout.BEGIN}\nonly the beginning\n",
        f"{layout.END}\n{layout.BEGIN}\n",
        f"{layout.BEGIN}\n{layout.BEGIN}\n{layout.END}\n",
    ],
)
def test_missing_or_misplaced_markers_are_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="marker|needs one"):
        layout.rewrite(text, layout.render())


def test_long_names_and_purposes_wrap_within_the_width() -> None:
    rendered = layout.render(
        (("pkg/", "", (("a_rather_long_name.py, another.py", "word " * 40),)),)
    )
    lines = rendered.splitlines()
    assert all(len(line) <= layout.WIDTH for line in lines)
    assert "  a_rather_long_name.py, another.py" in lines  # alone: the purpose starts below
