"""What travels with a job, and how jobs share it, on the local backend: real jobs.

Each test builds a project (a git work tree) in a temporary directory, with the job
functions in its own module, so that the project is the jobs' package root.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import kinetic
from kinetic._engine.context_files import list_context_files
from runner import protocol

pytestmark = pytest.mark.local

JOBS = '''
import os
import time
from pathlib import Path


def look():
    """What the job sees: its cwd and the project's code."""
    import helper

    return {
        "cwd": os.getcwd(),
        "entries": sorted(os.listdir(".")),
        "tree": os.path.dirname(helper.__file__),
        "value": helper.VALUE,
        "config": Path("config.txt").read_text(),
        "pkg": sorted(os.listdir("pkg")),
    }


def scribble():
    """Write into the cwd every way a job might."""
    done = {}
    Path("out.txt").write_text("mine")
    os.makedirs("newdir/deeper")
    Path("newdir/deeper/f").write_text("mine")
    Path("tmp-config").write_text("replaced")
    os.replace("tmp-config", "README.md")  # replaces the link, not the project's file
    os.remove("notes.txt")
    for what, path, mode in (("in place", "config.txt", "w"), ("in a folder", "pkg/new.txt", "w")):
        try:
            with open(path, mode) as f:
                f.write("changed")
            done[what] = "written"
        except PermissionError:
            done[what] = "refused"
    return done


def wait_for(started, go):
    Path(started).write_text("")
    deadline = time.monotonic() + 120
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("never told to go")
        time.sleep(0.02)
    import helper  # imported only now: the tree must still be there

    return helper.VALUE, Path("config.txt").read_text()
'''


class Project:
    def __init__(self, root: Path, storage: Path) -> None:
        self.root = root
        self.storage = storage
        self.module = self._load()

    def _load(self) -> ModuleType:
        name = f"ktjobs_{self.root.parent.name.replace('-', '_')}"
        spec = importlib.util.spec_from_file_location(name, self.root / "ktjobs.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    def job(self, name: str) -> Any:
        return kinetic.run(backend="local")(getattr(self.module, name))

    def write(self, rel: str, text: str) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def context_of(self, job: kinetic.JobHandle) -> str:
        spec = json.loads((self.storage / protocol.spec_key(job.job_id)).read_text())
        return str(spec["context_sha256"])

    def archive_names(self, sha: str) -> list[str]:
        data = (self.storage / protocol.context_key(sha)).read_bytes()
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return zf.namelist()


@pytest.fixture
def project(tmp_path: Path, kinetic_env: Path) -> Project:
    root = tmp_path / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    files = {
        "ktjobs.py": JOBS,
        "helper.py": "VALUE = 1\n",
        "config.txt": "original\n",
        "README.md": "readme\n",
        "notes.txt": "notes\n",
        "pkg/__init__.py": "",
        "pkg/mod.py": "",
        ".gitignore": "data/\n*.ckpt\n",
        ".kineticignore": "!small.ckpt\n",
        "data/big.bin": "x" * 100_000,
        "model.ckpt": "x" * 1000,
        "small.ckpt": "x",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return Project(root, kinetic_env / "storage")


def generations(kinetic_env: Path) -> list[str]:
    cache = kinetic_env / "contexts"
    return sorted(
        p.name
        for p in cache.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    )


def test_git_ignored_folder_does_not_travel(project: Project) -> None:
    job = project.job("look").run_async()
    seen = job.result(cleanup=False)
    assert "data" not in seen["entries"]
    assert "model.ckpt" not in seen["entries"]
    assert "small.ckpt" in seen["entries"]  # re-included by .kineticignore
    assert {"config.txt", "helper.py", "ktjobs.py", "pkg"} <= set(seen["entries"])
    names = project.archive_names(project.context_of(job))
    assert not any(n.startswith("data/") or n == "model.ckpt" for n in names)


def test_an_edit_changes_the_address_and_the_job_sees_it(project: Project) -> None:
    look = project.job("look")
    first = look.run_async()
    assert first.result(cleanup=False)["value"] == 1
    helper = project.root / "helper.py"
    st = helper.stat()
    helper.write_text("VALUE = 2\n")  # same size, same second...
    os.utime(helper, ns=(st.st_atime_ns, st.st_mtime_ns))  # ...and the very same mtime
    second = look.run_async()
    assert second.result(cleanup=False)["value"] == 2
    assert project.context_of(second) != project.context_of(first)
    third = look.run_async()  # unchanged since: the same address, from the stat cache
    assert third.result(cleanup=False)["value"] == 2
    assert project.context_of(third) == project.context_of(second)


def test_writing_into_the_cwd_never_reaches_the_next_job(
    project: Project, kinetic_env: Path
) -> None:
    look, scribble = project.job("look"), project.job("scribble")
    before = look()
    done = scribble()
    # Not root: the shared tree is read-only. Root: the write lands, and is caught.
    expected = "written" if os.geteuid() == 0 else "refused"
    assert done == {"in place": expected, "in a folder": expected}
    after = look()
    assert after["entries"] == before["entries"]
    assert "out.txt" not in after["entries"]
    assert "newdir" not in after["entries"]
    assert after["config"] == "original\n"
    assert after["pkg"] == before["pkg"]
    assert (project.root / "README.md").read_text() == "readme\n"
    assert after["cwd"] != before["cwd"]


def test_twenty_concurrent_jobs_extract_once(project: Project, kinetic_env: Path) -> None:
    look = project.job("look")
    jobs = [look.run_async() for _ in range(20)]
    seen = [job.result() for job in jobs]
    assert len({s["tree"] for s in seen}) == 1  # one generation: extracted once
    assert len({s["cwd"] for s in seen}) == 20  # each with its own cwd
    assert len(generations(kinetic_env)) == 1


def test_eviction_while_a_job_runs_does_not_break_it(
    project: Project, kinetic_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_CONTEXT_CACHE_MB", "0")  # evict all that is not in use
    started, go = tmp_path / "started", tmp_path / "go"
    running = project.job("wait_for").run_async(str(started), str(go))
    deadline = time.monotonic() + 120
    while not started.exists():
        assert time.monotonic() < deadline, running.logs()
        time.sleep(0.05)
    [in_use] = generations(kinetic_env)
    project.write("helper.py", "VALUE = 2\n")
    assert project.job("look")()["value"] == 2  # extracted a new one, tried to evict
    assert in_use in generations(kinetic_env)
    go.write_text("")
    assert running.result() == (1, "original\n")
    project.write("helper.py", "VALUE = 3\n")
    assert project.job("look")()["value"] == 3
    remaining = generations(kinetic_env)
    assert in_use not in remaining
    assert len(remaining) == 1


def test_listing_matches_git(tmp_path: Path) -> None:
    """Our listing equals what git itself does not ignore, on a tree of tricky rules."""
    root = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".git/info/exclude").write_text("*.excluded\n")
    files = {
        ".gitignore": textwrap.dedent(
            """\
            # comment
            *.log
            !keep.log
            /anchored
            build/
            foo/**
            !foo/bar
            logs/
            !logs/keep.txt
            cache/*
            !cache/keep
            a/**/z
            doc/*.md
            """
        ),
        "x.log": "",
        "keep.log": "",
        "anchored": "",
        "sub/anchored": "",
        "build/out": "",
        "sub/build/out": "",
        "build.py": "",
        "foo/bar": "",
        "foo/baz": "",
        "foo/deep/bar": "",
        "logs/keep.txt": "",
        "cache/keep": "",
        "cache/other": "",
        "a/z": "",
        "a/b/c/z": "",
        "doc/a.md": "",
        "doc/sub/b.md": "",
        "w.excluded": "",
        "nested/.gitignore": "!x.log\n/only\n*.tmp\n",
        "nested/x.log": "",
        "nested/only": "",
        "nested/deeper/only": "",
        "nested/deeper/t.tmp": "",
        "t.tmp": "",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git = subprocess.run(
        ["git", "ls-files", "--others", "--cached", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(f.relpath for f in list_context_files(root)) == sorted(git)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetic._cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_kinetic_context_lists_what_travels(project: Project) -> None:
    out = cli("context", str(project.root / "pkg"), "--json")
    assert out.returncode == 0, out.stderr
    listing = json.loads(out.stdout)
    assert listing["root"] == str(project.root.resolve())
    assert listing["git_work_tree"] == str(project.root.resolve())
    paths = [f["path"] for f in listing["files"]]
    assert "helper.py" in paths
    assert "small.ckpt" in paths
    assert not any(p.startswith("data/") or p == "model.ckpt" for p in paths)
    assert listing["file_count"] == len(paths)
    assert listing["total_bytes"] == sum(f["bytes"] for f in listing["files"])
    assert listing["largest_dirs"][0]["path"] == "pkg/"
    text = cli("context", str(project.root))
    assert text.returncode == 0, text.stderr
    assert "helper.py" in text.stdout
    assert f"{len(paths)} files" in text.stdout
