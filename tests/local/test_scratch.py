"""A job's scratch directory under ``$TMPDIR`` (:mod:`runner.scratch`) is gone however
the job ends: returned, cancelled (``SIGTERM``), or killed outright (swept by a later
job). Real jobs and real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import kinetic
from runner.scratch import SWEEP_EVERY, sweep_orphans
from tests.fix_env import module_project
from tests.other_user import OTHER_UID, need_root

pytestmark = pytest.mark.local

JOBS = '''\
"""Jobs for test_scratch."""
import multiprocessing
import os
import time


def report_and_wait(path):
    """Write where the job works, then wait to be cancelled."""
    with open(path + ".tmp", "w") as f:
        f.write(os.getcwd())
    os.replace(path + ".tmp", path)
    time.sleep(120)


def terminate_children(n):
    """Forked children that the job terminates (SIGTERM) at once: each dies of it, and
    the job's directory stays."""
    here = os.getcwd()
    codes = []
    for _ in range(n):
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
        child.start()
        child.terminate()
        child.join(timeout=10)
        codes.append(child.exitcode)
        if child.exitcode is None:
            child.kill()
            child.join()
    return here, codes, os.path.isdir(here), sorted(os.listdir(os.path.dirname(here)))


def where():
    return os.getcwd()
'''

HOLDER = """\
import sys, time
from runner.scratch import scratch_dir
with scratch_dir(sys.argv[1]) as path:
    print(path, flush=True)
    time.sleep(120)
"""


@pytest.fixture
def temp(kinetic_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``$TMPDIR`` for the test's jobs, and a one-file project."""
    module_project(tmp_path / "project", "scratch_jobs", JOBS, monkeypatch)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    return temp


def scratch_dirs(temp: Path) -> list[str]:
    return sorted(p.name for p in temp.glob("kinetic-*") if p.is_dir())


def none_left(temp: Path) -> bool:
    """No scratch directory in ``temp`` once the job's process ends (a job's result is
    recorded before its runner removes its directory and exits; a cancel returns once
    the job's leader is gone, and the runner, signalled beside it, may still be removing
    its directory)."""
    deadline = time.monotonic() + 10
    while scratch_dirs(temp):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_for_file(path: Path, job: kinetic.JobHandle) -> str:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, job.logs()
        time.sleep(0.02)
    return path.read_text()


@pytest.fixture
def holders(temp: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes that each hold a scratch directory in ``temp``; killed afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.communicate()


def hold(holders: list[subprocess.Popen[str]], kind: str) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    holders.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, proc.communicate()[1]
    return proc, Path(line)


def left_by_a_killed_owner(holders: list[subprocess.Popen[str]], kind: str = "job") -> Path:
    """A scratch directory whose owner was killed outright (no handler, no finally)."""
    proc, path = hold(holders, kind)
    proc.kill()
    proc.wait()
    assert path.is_dir()
    return path


def age(path: Path, seconds: float = 2 * SWEEP_EVERY) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.mark.parametrize("launcher", ["1", "0"], ids=["launcher", "spawn"])
def test_a_cancelled_job_leaves_no_scratch_directory(
    temp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str
) -> None:
    import scratch_jobs  # type: ignore[import-not-found]

    monkeypatch.setenv("KINETIC_LOCAL_LAUNCHER", launcher)
    report = tmp_path / "cwd"
    job = kinetic.run()(scratch_jobs.report_and_wait).run_async(str(report))
    workspace = Path(wait_for_file(report, job))
    assert workspace.is_relative_to(temp), workspace
    assert scratch_dirs(temp) == [workspace.relative_to(temp).parts[0]]
    job.cancel()  # returns once the job's leader is gone; the job itself ends beside it
    assert job.status_report().cancelled
    assert none_left(temp)


def test_children_terminated_inside_a_job_die_and_leave_its_directory(temp: Path) -> None:
    import scratch_jobs

    here, codes, still_there, beside = kinetic.run()(scratch_jobs.terminate_children)(20)
    assert codes == [-signal.SIGTERM] * 20  # none missed its signal
    assert still_there
    assert Path(here).name in beside
    assert none_left(temp)  # and removed when the job returned


def test_sweep_removes_only_the_directories_of_dead_owners(
    temp: Path, holders: list[subprocess.Popen[str]]
) -> None:
    live, live_dir = hold(holders, "job")
    dead_dir = left_by_a_killed_owner(holders, "worker")
    legacy = temp / "kinetic-run-0123456789abcdef"  # an older version's: never locked
    legacy.mkdir()
    age(legacy)
    assert sweep_orphans(temp, min_age=0) == 1
    assert not dead_dir.exists()
    assert live_dir.is_dir()
    assert legacy.is_dir()
    live.terminate()  # SIGTERM: the holder removes its own directory
    live.wait()
    assert not live_dir.exists()


def test_sweep_waits_a_minute_between_passes_and_spares_young_directories(
    temp: Path, holders: list[subprocess.Popen[str]]
) -> None:
    dead_dir = left_by_a_killed_owner(holders)
    stamp = next(temp.glob("kinetic-*.swept"))  # the holder's own start swept
    assert sweep_orphans(temp) == 0  # swept less than a minute ago
    age(stamp)
    assert sweep_orphans(temp) == 0  # the directory is younger than a minute
    assert dead_dir.is_dir()
    age(stamp)
    age(dead_dir)
    assert sweep_orphans(temp) == 1
    assert not dead_dir.exists()


def test_the_next_job_sweeps_what_a_killed_one_left(
    temp: Path, holders: list[subprocess.Popen[str]]
) -> None:
    import scratch_jobs

    dead_dir = left_by_a_killed_owner(holders)
    age(dead_dir)
    for stamp in temp.glob("kinetic-*.swept"):
        age(stamp)
    workspace = kinetic.run()(scratch_jobs.where)()
    assert Path(workspace).is_relative_to(temp)
    assert none_left(temp)


def test_a_stamp_planted_by_another_user_neither_redirects_nor_stops_the_sweep(
    temp: Path, holders: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """The stamp's name is predictable in a shared ``$TMPDIR``. A link planted there made
    the sweep create the file it pointed to (an empty ``~/.kinetic/profiles.json``,
    after which every Kinetic call failed); a fresh stamp of another user's stopped the
    sweep for good. Neither does now."""
    need_root()
    dead_dir = left_by_a_killed_owner(holders)
    age(dead_dir)
    stamp = next(temp.glob("kinetic-*.swept"))
    stamp.unlink()
    victim_file = tmp_path / "home" / ".kinetic" / "profiles.json"
    victim_file.parent.mkdir(parents=True)
    stamp.symlink_to(victim_file)
    os.lchown(stamp, OTHER_UID, OTHER_UID)
    assert sweep_orphans(temp) == 1  # a link is no stamp: the sweep is due
    assert not dead_dir.exists()
    assert not victim_file.exists()  # nothing was created through it
    assert stamp.is_symlink()  # and the impostor is left alone
    stamp.unlink()
    stamp.write_text("")  # another user's fresh stamp
    os.chown(stamp, OTHER_UID, OTHER_UID)
    dead_dir = left_by_a_killed_owner(holders)
    age(dead_dir)
    assert sweep_orphans(temp) == 1
    assert not dead_dir.exists()
