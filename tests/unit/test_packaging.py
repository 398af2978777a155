"""Package-root detection, exclusion rules and the deterministic context archive."""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path

import pytest

from kinetic._core.context_rules import ExcludeRules
from kinetic._engine import packaging
from kinetic._engine.context_files import list_context_files
from kinetic._engine.packaging import build_context_archive, context_archive, find_package_root
from kinetic._exceptions import ConfigError


def make_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_root_escapes_packages_then_finds_the_nearest_marker(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            "proj/pyproject.toml": "",
            "proj/src/pkg/__init__.py": "",
            "proj/src/pkg/sub/__init__.py": "",
            "proj/src/pkg/sub/mod.py": "",
        },
    )
    assert find_package_root(tmp_path / "proj/src/pkg/sub", {}) == (tmp_path / "proj").resolve()


@pytest.mark.parametrize("marker", ["requirements.txt", "setup.py", "setup.cfg", ".git"])
def test_each_marker_counts(tmp_path: Path, marker: str) -> None:
    (tmp_path / "p" / "a" / "b").mkdir(parents=True)
    (tmp_path / "p" / marker).mkdir() if marker == ".git" else (tmp_path / "p" / marker).write_text(
        ""
    )
    assert find_package_root(tmp_path / "p/a/b", {}) == (tmp_path / "p").resolve()


def test_without_markers_the_escaped_directory(tmp_path: Path) -> None:
    make_tree(tmp_path, {"x/pkg/__init__.py": ""})
    assert find_package_root(tmp_path / "x/pkg", {}) == (tmp_path / "x").resolve()


def test_env_override(tmp_path: Path) -> None:
    assert find_package_root(Path("/"), {"KINETIC_PACKAGE_ROOT": str(tmp_path)}) == tmp_path
    with pytest.raises(ConfigError, match="KINETIC_PACKAGE_ROOT"):
        find_package_root(Path("/"), {"KINETIC_PACKAGE_ROOT": str(tmp_path / "nope")})


def test_default_exclusions_and_kineticignore(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            "main.py": "",
            "pkg/mod.py": "",
            ".git/config": "",
            "pkg/__pycache__/mod.cpython-311.pyc": "",
            ".venv/lib/x.py": "",
            "venv/lib/x.py": "",
            "node_modules/a.js": "",
            ".tox/x": "",
            ".pytest_cache/x": "",
            "env-ci/pyvenv.cfg": "",
            "env-ci/lib/site.py": "",
            "data/big.bin": "",
            "notes.log": "",
            ".kineticignore": "# comment\n\ndata/\n*.log\n",
        },
    )
    rels = [f.relpath for f in list_context_files(tmp_path)]
    assert rels == [".kineticignore", "main.py", "pkg/mod.py"]


def test_explicit_exclusions(tmp_path: Path) -> None:
    make_tree(tmp_path, {"a.py": "", "store/x": ""})
    rels = [f.relpath for f in list_context_files(tmp_path, exclude=(tmp_path / "store",))]
    assert rels == ["a.py"]


def test_rules_match_names_and_paths() -> None:
    rules = ExcludeRules.with_ignore_file(["build/", "docs/*.md"])
    assert rules.excludes("build", is_dir=True)
    assert not rules.excludes("build", is_dir=False)
    assert rules.excludes("docs/a.md", is_dir=False)
    assert not rules.excludes("a.md", is_dir=False)


def test_archive_is_deterministic_and_content_addressed(tmp_path: Path) -> None:
    make_tree(tmp_path, {"a.py": "print(1)", "b/c.txt": "hello"})
    (tmp_path / "a.py").chmod(0o755)
    first = build_context_archive(tmp_path, list_context_files(tmp_path))
    (tmp_path / "b/c.txt").touch()  # new mtime, same content
    second = build_context_archive(tmp_path, list_context_files(tmp_path))
    assert first.sha256 == second.sha256
    assert first.data == second.data
    with zipfile.ZipFile(io.BytesIO(first.data)) as zf:
        assert zf.namelist() == ["a.py", "b/c.txt"]
        assert zf.read("b/c.txt") == b"hello"
        assert (zf.getinfo("a.py").external_attr >> 16) & 0o777 == 0o755
    (tmp_path / "b/c.txt").write_text("changed")
    assert build_context_archive(tmp_path, list_context_files(tmp_path)).sha256 != first.sha256


def test_unchanged_tree_is_not_rezipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree(tmp_path, {"a.py": "x"})
    time.sleep(0.05)  # past the racy window: the stat proves the content
    built = []
    real_build = packaging._build
    monkeypatch.setattr(packaging, "_build", lambda *a: built.append(1) or real_build(*a))
    first = context_archive(tmp_path)
    assert context_archive(tmp_path).sha256 == first.sha256
    assert len(built) == 1
    (tmp_path / "a.py").write_text("y")
    assert context_archive(tmp_path).sha256 != first.sha256
    assert len(built) == 2
