"""A local root on a full filesystem: a clear error, and no half-written record.

The test mounts a small tmpfs (tests run as root in CI), puts the local root on it,
fills it up to a few sizes of free space, and submits. Whatever write fails
(payload, handle, spec, the launcher's records, the runner's result), the job must
fail clearly (a ``KineticError`` at submission, or a FAILED status and a
``KineticError`` from ``result()``), and once space is back, ``list_jobs``,
``attach`` and ``kinetic jobs list`` must work on everything the root holds.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kinetic
from tests.fix_env import module_project

pytestmark = [pytest.mark.local, pytest.mark.timeout(300)]

JOBS = """
def double(x):
    print("doubling", x, flush=True)
    return 2 * x

def big(n):
    return b"x" * n
"""

SIZE = 6 * 1024 * 1024
LEAVE = (0, 16384, 262144, 2 * 1024 * 1024)
"""Free bytes left on the filesystem when a job is submitted: each makes a different
write the first to fail."""


@pytest.fixture
def small_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ``SIZE`` tmpfs holding the local root; unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs the tests as root)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "kinetic-full", str(mnt)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    monkeypatch.setenv("KINETIC_LOCAL_ROOT", str(mnt / "root"))
    try:
        yield mnt
    finally:
        # The root's launcher may still idle in it: detach the mount lazily.
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True, timeout=30)


def fill(mnt: Path, leave: int) -> Path:
    """Fill the filesystem until ``leave`` bytes are free; return the filler file."""
    filler = mnt / f"filler-{leave}"
    with filler.open("wb") as out:
        chunk = b"\0" * 65536
        while True:
            free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
            if free <= leave:
                break
            try:
                out.write(chunk[: min(len(chunk), free - leave)])
                out.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return filler


def attempt(fn: Any, arg: int) -> tuple[str, Any]:
    """Submit ``fn(arg)`` and wait: (where it ended, its value or its KineticError)."""
    try:
        job = fn.run_async(arg)
    except kinetic.KineticError as exc:
        return "submission", exc
    try:
        return "result", job.result(timeout=120, cleanup=False)
    except kinetic.KineticError as exc:
        assert job.status() is kinetic.JobStatus.FAILED
        return "result", exc


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetic", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_full_local_root_fails_clearly_and_leaves_no_half_written_record(
    small_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module_project(tmp_path / "project", "full_jobs", JOBS, monkeypatch)
    import full_jobs  # type: ignore[import-not-found]

    double = kinetic.run()(full_jobs.double)
    big = kinetic.run()(full_jobs.big)
    first = double.run_async(1)
    assert first.result(timeout=120, cleanup=False) == 2

    outcomes: dict[str, str] = {}
    for leave in LEAVE:
        filler = fill(small_root, leave)
        try:
            for name, fn, arg in (("double", double, 21), ("big", big, 3 * 1024 * 1024)):
                key = f"{name}@{leave}"
                stage, outcome = attempt(fn, arg)
                if isinstance(outcome, BaseException):
                    if stage == "submission":
                        assert isinstance(outcome, kinetic.StorageError), (key, outcome)
                        assert "space" in str(outcome).lower(), (key, outcome)
                    else:  # the job's status and result say why
                        assert isinstance(outcome, kinetic.JobFailedError), (key, outcome)
                        assert outcome.phase == "upload", (key, outcome)
                        assert "No space" in str(outcome), (key, outcome)
                    outcomes[key] = f"failed at {stage}: {type(outcome).__name__}"
                else:  # it fitted after all: then it is right
                    assert outcome == (42 if name == "double" else b"x" * arg), key
                    outcomes[key] = "succeeded"
        finally:
            filler.unlink()

    # Space is back: every record the root holds can be listed, attached and read.
    jobs = kinetic.list_jobs()
    assert first.job_id in {j.job_id for j in jobs}
    for listed in jobs:
        again = kinetic.attach(listed.job_id)
        assert again.status() in (kinetic.JobStatus.SUCCEEDED, kinetic.JobStatus.FAILED)
    listing = cli("jobs", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    assert {j["job_id"] for j in json.loads(listing.stdout)} == {j.job_id for j in jobs}
    assert cli("jobs", "list").returncode == 0
    assert kinetic.attach(first.job_id).result(timeout=60) == 2
    # And the root still works.
    assert double(5) == 10
    print(json.dumps(outcomes, indent=1))
    # Each way of failing happened: refused at submission, failed in the job's status.
    assert outcomes["double@0"].startswith("failed at submission"), outcomes
    assert outcomes[f"big@{LEAVE[-1]}"].startswith("failed at result"), outcomes
