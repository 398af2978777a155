"""The context's watch (inotify): an unchanged tree is not walked again, and every change
to what travels is seen, including those a stat walk is fooled by."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kinetic._engine import packaging
from kinetic._engine.context_files import Scan
from kinetic._engine.packaging import context_archive
from kinetic._engine.tree_watch import TreeWatch

pytestmark = pytest.mark.skipif(TreeWatch.open() is None, reason="inotify is Linux only")


@pytest.fixture(autouse=True)
def fresh_watches() -> Iterator[None]:
    packaging._forget_watches()
    yield
    packaging._forget_watches()


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The roots walked by :func:`context_archive` (the real walk, counted)."""
    seen: list[Path] = []
    real = packaging.scan

    def counted(root: Path, **kwargs: object) -> Scan:
        seen.append(root)
        return real(root, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(packaging, "scan", counted)
    return seen


def project(tmp_path: Path, files: dict[str, str], git: bool = True) -> Path:
    root = tmp_path / "p"
    root.mkdir(parents=True)
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_an_unchanged_tree_is_walked_once(tmp_path: Path, walks: list[Path]) -> None:
    root = project(tmp_path, {"a.py": "x = 1", "pkg/b.py": "y = 2"})
    first = context_archive(root)
    assert [context_archive(root).sha256 for _ in range(5)] == [first.sha256] * 5
    assert len(walks) == 1


@pytest.mark.parametrize(
    "change",
    ["edit-same-size-mtime-back", "add", "remove", "rename", "chmod", "mkdir-add",
     "gitignore-edit", "info-exclude", "gitignore-above", "replace"],
)  # fmt: skip
def test_every_change_is_seen(tmp_path: Path, change: str) -> None:
    """Edits right after the walk (same second, same size): a stat key cannot tell, the
    watch must."""
    # "gitignore-above": the package root is a folder of a bigger work tree.
    above = change == "gitignore-above"
    files = {"a.py": "x = 1", "pkg/b.py": "y = 2", "pkg/c.txt": "c"}
    root = project(tmp_path / "outer", files, git=not above)
    if above:
        subprocess.run(["git", "init", "-q", str(tmp_path / "outer")], check=True)
        (tmp_path / "outer" / ".gitignore").write_text("nothing\n")
    before = context_archive(root).sha256
    target = root / "pkg/b.py"
    st = target.stat()
    if change == "edit-same-size-mtime-back":
        target.write_text("y = 3")
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "add":
        (root / "pkg/d.py").write_text("")
    elif change == "remove":
        (root / "pkg/c.txt").unlink()
    elif change == "rename":
        (root / "pkg/c.txt").rename(root / "pkg/e.txt")
    elif change == "chmod":
        target.chmod(0o755)
    elif change == "mkdir-add":
        (root / "pkg/new").mkdir()
        assert context_archive(root).sha256 == before  # an empty folder does not travel
        (root / "pkg/new/f.py").write_text("")  # in a folder the first walk never saw
    elif change == "gitignore-edit":
        (root / "pkg/.gitignore").write_text("d.txt\n")
        before = context_archive(root).sha256
        (root / "pkg/.gitignore").write_text("c.txt\n")
    elif change == "info-exclude":
        (root / ".git/info/exclude").write_text("c.txt\n")
    elif change == "gitignore-above":
        (tmp_path / "outer" / ".gitignore").write_text("p/pkg/c.txt\n")
    elif change == "replace":
        tmp = root / "pkg/b.new"
        tmp.write_text("y = 4")
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        tmp.rename(target)
    assert context_archive(root).sha256 != before


def test_files_that_do_not_travel_change_freely(tmp_path: Path, walks: list[Path]) -> None:
    root = project(tmp_path, {".gitignore": "*.log\ndata/\n", "a.py": "", "run.log": ""})
    (root / "data").mkdir()
    before = context_archive(root).sha256
    (root / "run.log").write_text("epoch 1\n")  # a log the user's script keeps writing
    (root / "data" / "shard0").write_text("x" * 100)  # inside an ignored folder
    assert context_archive(root).sha256 == before
    assert len(walks) == 1
    (root / "new.log").write_text("")  # a new name is decided again: walked, same address
    assert context_archive(root).sha256 == before
    assert len(walks) == 2


def test_a_hard_linked_file_is_walked_every_time(tmp_path: Path) -> None:
    root = project(tmp_path, {"a.py": "x = 1"})
    os.link(root / "a.py", tmp_path / "elsewhere.py")
    before = context_archive(root).sha256
    with open(tmp_path / "elsewhere.py", "r+") as f:  # the same inode, written elsewhere
        f.write("x = 2")
    assert context_archive(root).sha256 != before


def test_a_symlinked_file_is_walked_every_time(tmp_path: Path) -> None:
    root = project(tmp_path, {"a.py": "x = 1"}, git=False)
    (tmp_path / "shared.py").write_text("s = 1")
    (root / "shared.py").symlink_to(tmp_path / "shared.py")
    before = context_archive(root).sha256
    (tmp_path / "shared.py").write_text("s = 2")  # outside the watched tree
    assert context_archive(root).sha256 != before


def test_excludes_are_remembered_apart(tmp_path: Path) -> None:
    root = project(tmp_path, {"a.py": "", "d/x.bin": "1"})
    whole = context_archive(root)
    part = context_archive(root, exclude=(root / "d",))
    assert whole.sha256 != part.sha256
    assert context_archive(root).sha256 == whole.sha256
    assert context_archive(root, exclude=(root / "d",)).sha256 == part.sha256


def test_a_forked_child_starts_without_the_parents_watches(tmp_path: Path) -> None:
    root = project(tmp_path, {"a.py": ""})
    context_archive(root)
    assert packaging._WATCHED_ROOTS
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if not packaging._WATCHED_ROOTS else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_kinetic_no_watch_walks_every_time(
    tmp_path: Path, walks: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path, {"a.py": ""})
    context_archive(root)  # watched from here on
    monkeypatch.setenv("KINETIC_NO_WATCH", "1")  # set later in the process: still obeyed
    context_archive(root)
    context_archive(root)
    assert len(walks) == 3


def test_platform_without_inotify_is_not_an_error() -> None:
    assert (TreeWatch.open() is None) == (not sys.platform.startswith("linux"))


def test_a_closed_watch_vouches_for_nothing(tmp_path: Path) -> None:
    watch = TreeWatch.open()
    assert watch is not None
    before = watch.generation()
    assert watch.generation() == before  # nothing watched, nothing changed
    watch.close()
    assert watch.generation() != watch.generation()
