"""``volumes=`` on the local backend: the job sees its data at the mount paths, and the
user's machine never does (a private mount namespace; ``runner/mounts.py``)."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import kinetic
from kinetic import Data
from runner.scratch import sweep_orphans
from tests import threads_at_import
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local


def look(paths: list[str]) -> dict[str, object]:
    """What the job sees at each path (file text or sorted listing), and where its
    temporary files go."""
    seen: dict[str, object] = {}
    for path in paths:
        if os.path.isdir(path):
            seen[path] = sorted(os.listdir(path))
        elif os.path.isfile(path):
            with open(path) as f:
                seen[path] = f.read()
        else:
            seen[path] = None
    seen["tmp"] = tempfile.gettempdir()
    return seen


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "dataset"
    root.mkdir()
    (root / "a.txt").write_text("alpha")
    (root / "b.txt").write_text("beta")
    return root


def no_scratch_left(tmp: str, prefix: str = "kinetic-mounts-") -> bool:
    """The job's mount scratch (or with ``prefix="kinetic-"``, any scratch of the job's)
    is removed once its processes are gone (shortly after)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [n for n in os.listdir(tmp) if n.startswith(prefix) and not n.endswith(".swept")]
        if not left:
            return True
        time.sleep(0.05)
    return False


def test_a_missing_mount_path_is_never_created_on_this_machine(dataset: Path) -> None:
    top = f"/kinetic-test-{uuid.uuid4().hex[:12]}"  # under "/": the user's machine's root
    mount = f"{top}/data"
    fn = kinetic.run(volumes={mount: Data(dataset)})(look)
    first = fn([mount, f"{mount}/a.txt"])
    assert first[mount] == ["a.txt", "b.txt"]
    assert first[f"{mount}/a.txt"] == "alpha"
    assert not os.path.lexists(top)
    # The same volume again: the first job left nothing in its way.
    assert fn([mount])[mount] == ["a.txt", "b.txt"]
    assert not os.path.lexists(top)
    assert no_scratch_left(str(first["tmp"]))


def test_an_existing_directory_is_covered_for_the_job_only(dataset: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep")
    fn = kinetic.run(volumes={str(mine): Data(dataset)})(look)
    assert fn([str(mine)])[str(mine)] == ["a.txt", "b.txt"]
    assert sorted(os.listdir(mine)) == ["precious.txt"]
    assert (mine / "precious.txt").read_text() == "keep"


def test_file_and_nested_volumes(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    base = tmp_path / "mnt"  # does not exist: made inside the job's namespace only
    volumes = {
        str(base / "all"): Data(dataset),
        str(base / "all" / "extra" / "one.txt"): Data(dataset / "b.txt"),
        str(tmp_path / "single.txt"): Data(dataset / "a.txt"),
    }
    seen = kinetic.run(volumes=volumes)(look)(
        [str(base / "all" / "extra" / "one.txt"), str(tmp_path / "single.txt")]
    )
    assert seen[str(base / "all" / "extra" / "one.txt")] == "beta"
    assert seen[str(tmp_path / "single.txt")] == "alpha"
    assert not base.exists()
    assert not (tmp_path / "single.txt").exists()
    assert sorted(os.listdir(dataset)) == ["a.txt", "b.txt"]  # nothing made in the source
    # The job's copy holds the nested volume's mount point, busy until the job's
    # namespace ends: the next sweep (a later job's start) removes what it left.
    deadline = time.monotonic() + 10
    while list(temp.glob("kinetic-scratch-*")) and time.monotonic() < deadline:
        sweep_orphans(temp, min_age=0)  # takes it once the job's process is gone
        time.sleep(0.05)
    assert no_scratch_left(str(temp), prefix="kinetic-"), os.listdir(temp)


def test_a_file_volume_over_a_directory_fails_in_resolve(dataset: Path, tmp_path: Path) -> None:
    there = tmp_path / "there"
    there.mkdir()
    fn = kinetic.run(volumes={str(there): Data(dataset / "a.txt")})(look)
    with pytest.raises(kinetic.JobFailedError, match="directory on this machine") as info:
        fn([str(there)])
    assert info.value.phase == "resolve"
    assert sorted(os.listdir(there)) == []


def test_a_batch_with_volumes_is_refused_before_anything_is_written(
    dataset: Path, kinetic_env: Path
) -> None:
    fn = kinetic.run(volumes={"/data": Data(dataset)})(look)
    with pytest.raises(kinetic.DataError, match="run_async_map"):
        fn.run_async_map([["/data"], ["/data"]])
    assert job_dirs(kinetic_env) == []


def look_after_threads(path: str) -> dict[str, object]:
    """:func:`look` of a job whose payload imports a module that starts a thread (this
    module travels by value; ``threads_at_import`` is imported where it is unpickled)."""
    return threads_at_import.listing(path)


def test_volumes_of_a_job_whose_imports_start_threads(dataset: Path, tmp_path: Path) -> None:
    """A function whose module starts a thread at import (numpy's BLAS pool does) gets
    its volumes: the runner enters its user namespace before the payload is unpickled
    (runner.isolation), while the job has one thread."""
    mine = tmp_path / "mine"
    mine.mkdir()
    seen = kinetic.run(volumes={str(mine): Data(dataset)})(look_after_threads)(str(mine))
    assert seen["threads"] >= 2  # the import's thread ran before the volumes were placed
    assert seen["entries"] == ["a.txt", "b.txt"]
    assert os.listdir(mine) == []
