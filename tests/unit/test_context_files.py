"""The context walk and its stat cache: what travels, and when the cache may be trusted."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from kinetic._engine import packaging
from kinetic._engine.context_files import largest_dirs, list_context_files, scan
from kinetic._engine.packaging import context_archive

LATER = 10**10  # ten seconds: every stat taken now is settled by then


def make_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def git_init(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)


def rels(root: Path) -> list[str]:
    return [f.relpath for f in list_context_files(root)]


def settled_clock() -> Callable[[], int]:
    return lambda: time.time_ns() + LATER


def address(root: Path, clock: Callable[[], int]) -> tuple[str | None, str]:
    """(the cached address before building, the built address); saves the walk."""
    walk = scan(root, clock=clock)
    cached = walk.cached_result
    archive, unproven = packaging._build(walk.root, walk.files())
    walk.save((archive.sha256, archive.size), unproven)
    return (cached[0] if cached else None), archive.sha256


def test_gitignore_applies_only_in_a_git_work_tree(tmp_path: Path) -> None:
    files = {".gitignore": "data/\n*.log\n", "a.py": "", "data/x.bin": "", "b.log": ""}
    plain = tmp_path / "plain"
    make_tree(plain, files)
    assert rels(plain) == [".gitignore", "a.py", "b.log", "data/x.bin"]
    repo = tmp_path / "repo"
    git_init(repo)
    make_tree(repo, files)
    assert rels(repo) == [".gitignore", "a.py"]


def test_info_exclude_ancestors_nested_and_kineticignore(tmp_path: Path) -> None:
    top = tmp_path / "top"
    git_init(top)
    (top / ".git/info").mkdir(exist_ok=True)
    (top / ".git/info/exclude").write_text("*.secret\n")
    make_tree(
        top,
        {
            ".gitignore": "proj/generated/\n*.o\n",
            "proj/pyproject.toml": "",
            "proj/main.py": "",
            "proj/key.secret": "",
            "proj/generated/x.py": "",
            "proj/lib/a.o": "",
            "proj/lib/.gitignore": "!a.o\ncache/\n",
            "proj/lib/cache/c": "",
            "proj/ckpt/model.bin": "",
            "proj/ckpt/keep.bin": "",
            "proj/.kineticignore": "ckpt/*\n!ckpt/keep.bin\n!*.secret\n",
        },
    )
    assert rels(top / "proj") == [
        ".kineticignore",
        "key.secret",  # .kineticignore re-includes what .git/info/exclude leaves out
        "main.py",
        "pyproject.toml",
        "ckpt/keep.bin",
        "lib/.gitignore",
        "lib/a.o",  # the deeper .gitignore wins
    ]


def test_project_inside_an_ignored_folder_of_a_bigger_repo(tmp_path: Path) -> None:
    # e.g. a dotfiles repository at $HOME ignoring `*`, or an ignored `experiments/`.
    home = tmp_path / "home"
    git_init(home)
    make_tree(
        home,
        {
            ".gitignore": "*\n",
            "proj/requirements.txt": "",
            "proj/main.py": "",
            "proj/.gitignore": "out/\n",
            "proj/out/x": "",
        },
    )
    assert rels(home / "proj") == [".gitignore", "main.py", "requirements.txt"]


def test_excluded_folders_are_not_entered(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    git_init(repo)
    make_tree(repo, {".gitignore": "data/\n", "a.py": "", "data/x": ""})
    (repo / "data/locked").mkdir()
    (repo / "data/locked/y").write_text("")
    (repo / "venvish").mkdir()
    (repo / "venvish/pyvenv.cfg").write_text("")
    (repo / "venvish/lib.py").write_text("")
    (repo / "linked").symlink_to(repo / "data", target_is_directory=True)
    (repo / "link.py").symlink_to(repo / "a.py")
    (repo / "dangling.py").symlink_to(repo / "nowhere.py")
    real_scandir = os.scandir
    entered: list[str] = []

    def spy(fd: int) -> object:
        entered.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_scandir(fd)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "scandir", spy)
        assert rels(repo) == [".gitignore", "a.py", "link.py"]
    assert not any("data" in p for p in entered)


def test_unchanged_tree_hits_the_cache_without_reading(tmp_path: Path) -> None:
    make_tree(tmp_path / "p", {"a.py": "x = 1", "pkg/b.py": "y = 2"})
    root = tmp_path / "p"
    clock = settled_clock()
    cached, built = address(root, clock)
    assert cached is None
    walk = scan(root, clock=clock)
    assert walk.cached_result is not None
    assert walk.cached_result[0] == built
    assert (walk.file_count, walk.total_bytes) == (2, 10)


@pytest.mark.parametrize(
    "change",
    [
        "edit",
        "add",
        "add-dir-mtime-restored",
        "remove",
        "rename",
        "chmod",
        "ignore-rule",
        "gitignore-edit",
        "touch-back",
        "replace",
    ],
)
def test_any_change_changes_the_address(tmp_path: Path, change: str) -> None:
    root = tmp_path / "p"
    git_init(root)
    make_tree(root, {"a.py": "x = 1", "pkg/b.py": "y = 2", "pkg/c.txt": "c"})
    clock = settled_clock()
    _, before = address(root, clock)
    target = root / "pkg/b.py"
    st = target.stat()
    if change == "edit":  # same size, same second, and the old mtime put back
        target.write_text("y = 3")
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "add":
        (root / "pkg/d.py").write_text("")
    elif change == "add-dir-mtime-restored":  # the folder's listing is not trusted blindly
        folder = (root / "pkg").stat()
        (root / "pkg/d.py").write_text("")
        os.utime(root / "pkg", ns=(folder.st_atime_ns, folder.st_mtime_ns))
    elif change == "remove":
        (root / "pkg/c.txt").unlink()
    elif change == "rename":
        (root / "pkg/c.txt").rename(root / "pkg/e.txt")
    elif change == "chmod":
        target.chmod(0o755)
    elif change == "ignore-rule":
        (root / ".git/info/exclude").write_text("c.txt\n")
    elif change == "gitignore-edit":  # rewritten in place: its folder's mtime is unchanged
        (root / "pkg/.gitignore").write_text("d.txt\n")
        _, before = address(root, clock)
        (root / "pkg/.gitignore").write_text("c.txt\n")
    elif change == "touch-back":  # content back to a previous state: same address again
        target.write_text("y = 3")
        _, mid = address(root, clock)
        assert mid != before
        target.write_text("y = 2")
    elif change == "replace":  # a new inode with the same bytes, size and mtime
        tmp = root / "pkg/b.new"
        tmp.write_text("y = 4")
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        tmp.rename(target)
    cached, after = address(root, clock)
    assert cached is None, "a change must never be a cache hit"
    if change == "touch-back":
        assert after == before
    else:
        assert after != before


def test_racy_file_is_never_trusted(tmp_path: Path) -> None:
    """A file changed in the same timestamp tick as the walk that cached it is read again."""
    root = tmp_path / "p"
    make_tree(root, {"a.py": "v = 1"})
    mtime = (root / "a.py").stat().st_mtime_ns
    ctime = (root / "a.py").stat().st_ctime_ns
    racy = lambda: max(mtime, ctime) + 1_000  # the walk happens 1 us after the write
    _, first = address(root, racy)
    # An edit now might land in the same tick and leave the stat equal: simulate exactly
    # that by not changing the file at all. The walk must still not trust its record.
    cached, again = address(root, racy)
    assert cached is None
    assert again == first
    cached, _ = address(root, settled_clock())  # settled now: proven, then trusted
    assert cached is None
    cached, _ = address(root, settled_clock())
    assert cached == first


def test_file_changed_while_zipped_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "p"
    make_tree(root, {"a.py": "v = 1"})
    clock = settled_clock()
    walk = scan(root, clock=clock)
    (root / "a.py").write_text("v = 22")  # after the walk, before the zip
    archive, unproven = packaging._build(walk.root, walk.files())
    assert unproven == ["a.py"]
    walk.save((archive.sha256, archive.size), unproven)
    assert scan(root, clock=clock).cached_result is None


def test_corrupt_cache_file_is_ignored(tmp_path: Path, kinetic_env: Path) -> None:
    root = tmp_path / "p"
    make_tree(root, {"a.py": "v = 1"})
    clock = settled_clock()
    address(root, clock)
    [cache_file] = (tmp_path / "kinetic-cache").rglob("*.bin")
    cache_file.write_bytes(cache_file.read_bytes()[:-7])
    assert scan(root, clock=clock).cached_result is None


def test_excluded_paths_and_kinetic_cache_never_travel(tmp_path: Path) -> None:
    root = tmp_path  # the test's cache dir (KINETIC_CACHE_DIR) sits inside this root
    make_tree(root, {"a.py": "", "store/x": "", "kinetic-cache/y": ""})
    got = [f.relpath for f in list_context_files(root, exclude=(root / "store",))]
    assert got == ["a.py"]


def test_context_archive_uses_the_cache_and_rebuilds_on_request(tmp_path: Path) -> None:
    root = tmp_path / "p"
    make_tree(root, {"a.py": "v = 1", "b/c.txt": "hello"})
    time.sleep(0.05)  # past the racy window
    first = context_archive(root)
    assert first.data is not None
    packaging._ARCHIVES.clear()  # as a new process would be
    packaging._forget_watches()
    warm = context_archive(root)
    assert (warm.sha256, warm.data, warm.size) == (first.sha256, None, first.size)
    rebuilt = context_archive(root, rebuild=True)
    assert rebuilt.data == first.data
    with zipfile.ZipFile(io.BytesIO(first.data)) as zf:
        assert zf.namelist() == ["a.py", "b/c.txt"]


def test_big_context_is_named_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "p"
    git_init(root)
    make_tree(
        root,
        {
            "main.py": "",
            **{f"data/d{i}.bin": "x" * 1000 for i in range(6)},
            **{f"ckpt/c{i}.bin": "x" * 500 for i in range(3)},
            **{f"src/m{i}.py": "" for i in range(4)},
        },
    )
    monkeypatch.setattr(packaging, "NOTICE_FILES", 10)
    with caplog.at_level(logging.WARNING, logger="kinetic"):
        context_archive(root)
        context_archive(root)
    lines = [r.getMessage() for r in caplog.records if "travels with every job" in r.getMessage()]
    assert len(lines) == 1
    line = lines[0]
    assert "14 files" in line
    assert "data/ 5.9 KB in 6 files, ckpt/ 1.5 KB in 3 files, src/ 0 B in 4 files" in line
    assert ".kineticignore" in line
    assert "kinetic context" in line


def test_largest_dirs() -> None:
    sizes = [("a/x", 5), ("a/y", 5), ("b/z", 20), ("top.txt", 100), ("c/d/e", 1)]
    assert largest_dirs(sizes) == [("b/", 20, 1), ("a/", 10, 2), ("c/", 1, 1)]
