"""Local jobs forked by the root's launcher (:mod:`runner.launcher`): durable, cancellable,
shared, and replaced when the installed code changes. Real processes throughout."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import kinetic
import runner
from kinetic._backends import local_launcher
from tests.fix_env import module_project

pytestmark = pytest.mark.local

JOBS = '''\
"""Jobs for test_launcher."""
import os
import subprocess
import sys
import time


def wait_for(path, seconds=60.0):
    """Return once ``path`` exists: the test decides when the job may finish."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.02)
    return os.getpid(), os.getppid(), sys.argv[1:3], os.environ.get("LAUNCHER_PROBE")


def die():
    os.kill(os.getpid(), 9)


def with_grandchild(pidfile):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.replace(pidfile + ".tmp", pidfile)
    time.sleep(120)
'''

SUBMIT = """\
import asyncio, json, sys
sys.path.insert(0, {project!r})
import jobs
from kinetic import aio

async def main():
    job = await aio.run()(getattr(jobs, sys.argv[1])).run_async(*sys.argv[2:])
    print(json.dumps(job.to_dict()), flush=True)
    sys.stdin.read()  # held until the test kills us

asyncio.run(main())
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return module_project(tmp_path / "project", "jobs", JOBS, monkeypatch)


def live_launchers(root: Path) -> list[int]:
    """Pids of the launchers serving ``root`` (their records, whose lock is held)."""
    import fcntl

    pids = []
    for record in sorted((root / "launcher").glob("*.json")):
        lock = record.with_suffix(".lock")
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:  # removed: that launcher stops serving
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pids.append(json.loads(record.read_text())["pid"])
        finally:
            os.close(fd)
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def launchers(kinetic_env: Path) -> Iterator[Path]:
    """The local root; every launcher the test started is ended afterwards."""
    seen: set[int] = set()
    yield kinetic_env
    if (kinetic_env / "launcher").is_dir():
        seen.update(live_launchers(kinetic_env))
    for pid in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def submit_from_child(
    project: Path, fn: str, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """Submit ``jobs.fn(*args)`` from a separate process; return it (still alive) and the
    job's handle."""
    script = SUBMIT.format(project=str(project))
    proc = subprocess.Popen(
        [sys.executable, "-c", script, fn, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"the submitter failed: {proc.communicate()[1]}")
    return proc, json.loads(line)


def leader(root: Path, job_id: str) -> dict[str, int]:
    record: dict[str, int] = json.loads((root / "storage" / job_id / "launch.json").read_text())
    return record


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_a_launched_job_survives_its_submitter_and_its_launcher(
    project: Path, launchers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = tmp_path / "go"
    monkeypatch.setenv("LAUNCHER_PROBE", "seen by the job")
    proc, handle = submit_from_child(project, "wait_for", str(go))
    job_id = str(handle["job_id"])
    ref = leader(launchers, job_id)
    [launcher] = live_launchers(launchers)
    assert "runner.launcher" in cmdline(ref["pid"])  # forked by it, not a new interpreter
    assert ref["pgid"] == ref["pid"] != launcher  # a process group of its own
    proc.kill()  # kill -9 of the submitter
    proc.communicate()
    os.kill(launcher, signal.SIGKILL)  # and of the launcher
    assert wait_gone(launcher)
    assert alive(ref["pid"])
    go.touch()
    job = kinetic.attach(job_id)
    pid, ppid, argv, probe = job.result(timeout=60)
    assert argv == ["--storage", (launchers / "storage").as_uri()]  # as `python -m runner`
    assert probe == "seen by the job"  # the submitter's environment
    assert ppid == ref["pid"]
    assert pid != ref["pid"]
    assert job.status() is kinetic.JobStatus.NOT_FOUND  # collected and cleaned up
    # The next job starts a fresh launcher.
    go2 = tmp_path / "go2"
    go2.touch()
    import jobs  # type: ignore[import-not-found]

    again = kinetic.run()(jobs.wait_for)(str(go2))
    assert again[3] == "seen by the job"
    assert live_launchers(launchers) not in ([], [launcher])


def test_cancel_kills_the_whole_process_group(
    project: Path, launchers: Path, tmp_path: Path
) -> None:
    import jobs  # type: ignore[import-not-found]

    pidfile = tmp_path / "grandchild.pid"
    job = kinetic.run()(jobs.with_grandchild).run_async(str(pidfile))
    deadline = time.monotonic() + 30
    while not pidfile.exists():
        assert time.monotonic() < deadline, job.logs()
        time.sleep(0.02)
    grandchild = int(pidfile.read_text())
    ref = leader(launchers, job.job_id)
    assert "runner.launcher" in cmdline(ref["pid"])
    assert os.getpgid(grandchild) == ref["pgid"]
    job.cancel()
    assert wait_gone(grandchild), "the job's own child survived cancel"
    assert wait_gone(ref["pid"])
    report = job.status_report()
    assert report.status is kinetic.JobStatus.FAILED
    assert report.cancelled


def test_the_exit_status_is_written_only_where_the_runner_left_no_record(
    project: Path, launchers: Path, tmp_path: Path
) -> None:
    import jobs

    go = tmp_path / "go"
    go.touch()
    done = kinetic.run()(jobs.wait_for).run_async(str(go))
    done.result(timeout=60, cleanup=False)
    assert wait_gone(leader(launchers, done.job_id)["pid"])
    records = launchers / "storage" / done.job_id
    assert (records / "status.json").is_file()
    assert not (records / "exit_code").exists()  # the final record says more: one file fewer

    killed = kinetic.run()(jobs.die).run_async()
    with pytest.raises(kinetic.JobFailedError, match="signal 9"):
        killed.result(timeout=60, cleanup=False)
    assert wait_gone(leader(launchers, killed.job_id)["pid"])
    assert (launchers / "storage" / killed.job_id / "exit_code").read_text() == "137\n"


def test_two_submitting_processes_share_one_launcher(
    project: Path, launchers: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SUBMIT.format(project=str(project)), "wait_for", str(go)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        handles = []
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, proc.communicate()[1]
            handles.append(json.loads(line))
        [launcher] = live_launchers(launchers)
        for h in handles:
            ref = leader(launchers, str(h["job_id"]))
            status = Path(f"/proc/{ref['pid']}/status").read_text()
            ppid = int(status.split("PPid:")[1].split()[0])
            assert ppid == launcher, "a job was not forked by the shared launcher"
        go.touch()
        for h in handles:
            assert kinetic.attach(str(h["job_id"])).result(timeout=60)[0] > 0
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


def test_changed_code_gets_a_fresh_launcher(project: Path, launchers: Path, tmp_path: Path) -> None:
    # An installed copy of the runner that the test may change, first on the path.
    site = tmp_path / "site"
    shutil.copytree(Path(runner.__file__).parent, site / "runner")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    go = tmp_path / "go"
    go.touch()

    def run_one() -> int:
        proc, handle = submit_from_child(project, "wait_for", str(go), env=env)
        try:
            ref = leader(launchers, str(handle["job_id"]))
            [launcher] = live_launchers(launchers)
            assert wait_gone(ref["pid"])
            return launcher
        finally:
            proc.kill()
            proc.communicate()

    first = run_one()
    assert run_one() == first  # unchanged code: the same launcher serves again
    fs = site / "runner" / "fs.py"
    fs.write_text(fs.read_text() + "\n# upgraded\n")
    second = run_one()
    assert second != first
    assert wait_gone(first), "the outdated launcher kept running"


def test_without_the_launcher_jobs_start_as_before(
    project: Path,
    launchers: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("KINETIC_LOCAL_LAUNCHER", "0")
    monkeypatch.setattr(local_launcher, "_warned", set())  # as in a fresh process
    import jobs  # type: ignore[import-not-found]

    fn = kinetic.run()(jobs.wait_for)
    with caplog.at_level(logging.WARNING, logger="kinetic"):
        job = fn.run_async(str(project / "jobs.py"))  # exists: returns at once
        ref = leader(launchers, job.job_id)
        job.result(timeout=60)
        fn.run_async(str(project / "jobs.py")).result(timeout=60)
    assert not (launchers / "launcher").exists()
    said = [r.getMessage() for r in caplog.records if "KINETIC_LOCAL_LAUNCHER" in r.getMessage()]
    assert len(said) == 1, said  # why, once per process
    assert ref["pid"] > 0


def test_a_malformed_request_does_not_stop_the_launcher(launchers: Path) -> None:
    """Nor does a connection that sends nothing hold up the others: each used to be
    read in turn, for up to 10 s, and every job start waited behind an idle one."""
    import socket

    from runner.launcher import launcher_tag, socket_address

    tag = launcher_tag(sys.executable, os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.launcher", "--root", str(launchers), "--tag", tag],
        cwd=str(launchers.parent),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(runner.__file__).parent.parent)},
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(socket_address(launchers, tag))
                break
            except ConnectionRefusedError:
                s.close()
                assert time.monotonic() < deadline
                assert proc.poll() is None
                time.sleep(0.02)
        silent, s = s, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(socket_address(launchers, tag))  # after `silent`, which says nothing
        with silent, s, s.makefile() as answers:
            s.sendall(b'{"v": 1, "args": ["--nonsense"]}\n')
            reply = json.loads(answers.readline())
            assert "error" in reply
            silent.setblocking(False)
            with pytest.raises(BlockingIOError):  # still waited for: not answered first
                silent.recv(1)
            silent.sendall(b"not json\n")
            silent.setblocking(True)
            silent.settimeout(30)
            assert "bad request" in json.loads(silent.makefile().readline())["error"]
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_jobs_share_the_launchers_session_and_a_paused_one_outlives_it(
    project: Path, launchers: Path, tmp_path: Path
) -> None:
    # All jobs of a root share the launcher's session, each in a process group of its
    # own: where the kernel shares CPU time by session (autogroup), a hundred jobs then
    # take one share beside the submitting application, not a hundred.
    import jobs  # type: ignore[import-not-found]

    from runner.launcher import socket_address

    go = tmp_path / "go"
    job = kinetic.run()(jobs.wait_for).run_async(str(go))
    ref = leader(launchers, job.job_id)
    [launcher] = live_launchers(launchers)
    assert os.getsid(ref["pid"]) == os.getsid(launcher) != os.getsid(0)
    assert os.getpgid(ref["pid"]) == ref["pgid"] == ref["pid"]
    # Paused, the job must outlive the launcher stopping (here: its lock file removed).
    # A launcher that left at once would orphan the job's stopped process group, and the
    # kernel would end it with SIGHUP.
    os.killpg(ref["pgid"], signal.SIGSTOP)
    try:
        lock = next((launchers / "launcher").glob("*.lock"))
        lock.unlink()
        # Until it no longer listens (not by connecting: a request would keep it serving).
        name = "@" + socket_address(launchers, lock.stem)[1:].decode()
        deadline = time.monotonic() + 30
        while name in Path("/proc/net/unix").read_text().split():
            assert time.monotonic() < deadline, "the launcher kept serving without its lock"
            time.sleep(0.05)
        assert alive(launcher), "the launcher left before its job"
    finally:
        with contextlib.suppress(ProcessLookupError):  # never leave a stopped job behind
            os.killpg(ref["pgid"], signal.SIGCONT)
        go.touch()
    assert job.result(timeout=60)[1] == ref["pid"]
    assert wait_gone(launcher), "the launcher stayed after its last job"
