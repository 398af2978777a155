"""Errors of concurrent steps reach the user as one Kinetic error, never as an
``ExceptionGroup`` (``kinetic/_core/exception_groups.py``): ``except kinetic.DataError``
catches a ``Data`` path removed before the call, ``result(stream_logs=True)`` raises the
storage error its two concurrent readers met, and the CLI prints ``kinetic: message`` for
a cluster it cannot reach and for a listing whose record cannot be read."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kinetic
from kinetic import Data, aio
from kinetic._engine.data_refs import upload_to_cache
from kinetic._storage.local import LocalStorage

pytestmark = pytest.mark.local


def count_files(d: object) -> int:
    return len(os.listdir(str(d)))


def look(path: str) -> list[str]:
    return sorted(os.listdir(path))


@pytest.fixture
def gone(tmp_path: Path) -> Data:
    """A ``Data`` whose directory was removed after it was made."""
    root = tmp_path / "dataset"
    root.mkdir()
    (root / "a.txt").write_text("alpha")
    d = Data(str(root))
    shutil.rmtree(root)
    return d


def test_a_removed_data_argument_is_a_data_error(gone: Data) -> None:
    fn = kinetic.run()(count_files)
    with pytest.raises(kinetic.DataError) as caught:
        fn(gone)
    assert not isinstance(caught.value, BaseExceptionGroup)
    with pytest.raises(kinetic.DataError):
        fn.run_async(gone)


def test_a_removed_volume_is_a_data_error(gone: Data) -> None:
    fn = kinetic.run(volumes={"/kinetic-test-data": gone})(look)
    with pytest.raises(kinetic.DataError):
        fn("/kinetic-test-data")


@pytest.mark.anyio
async def test_a_removed_data_argument_is_a_data_error_when_awaited(gone: Data) -> None:
    fn = kinetic.run()(count_files)
    with pytest.raises(kinetic.DataError):
        await fn.aio(gone)
    with pytest.raises(kinetic.DataError):
        await fn.aio.run_async(gone)


@pytest.mark.anyio
async def test_a_file_gone_during_the_upload_is_a_data_error(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(8):
        (tree / f"f{i}.txt").write_text(str(i))
    (tree / "vanished.txt").symlink_to(tmp_path / "nowhere")  # listed, then unreadable
    storage = LocalStorage(str(tmp_path / "store"))
    with pytest.raises(kinetic.DataError, match="vanished.txt' is gone"):
        await upload_to_cache(storage, tree, "0" * 64)


def kinetic_cli(*args: str, kubeconfig: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("KINETIC_PROJECT", "GOOGLE_CLOUD_PROJECT")
    }
    env.update(KUBECONFIG=str(kubeconfig), HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "kinetic", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def refused_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


UNREACHABLE = """\
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: abc}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""


@pytest.mark.parametrize("command", [["status"], ["up", "--use-kubeconfig", "--yes"]])
def test_no_kubeconfig_or_an_unreachable_server_is_one_line(
    command: list[str], tmp_path: Path
) -> None:
    missing = kinetic_cli(*command, kubeconfig=tmp_path / "none.yaml", home=tmp_path)
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.startswith("kinetic: no kubeconfig at"), missing.stderr
    assert len(missing.stderr.splitlines()) == 1

    kubeconfig = tmp_path / "kubeconfig.yaml"
    port = refused_port()
    kubeconfig.write_text(UNREACHABLE.format(port=port))
    down = kinetic_cli(*command, kubeconfig=kubeconfig, home=tmp_path)
    assert down.returncode == 1, down.stderr
    assert down.stderr.startswith("kinetic: Kubernetes API:"), down.stderr
    assert f"cannot connect to 127.0.0.1:{port}: Connection refused" in down.stderr
    assert "ExceptionGroup" not in down.stderr
    assert "Traceback" not in down.stderr


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal: the batch progress bar is drawn."""

    def isatty(self) -> bool:
        return True


def fails_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("two")
    return x


def test_a_batch_error_under_the_progress_bar_is_a_batch_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = kinetic.run()(fails_on_two).run_async_map([1, 2, 3])
    monkeypatch.setattr(sys, "stderr", _Terminal())
    with pytest.raises(kinetic.BatchError) as caught:
        batch.results(timeout=120)
    assert caught.value.partial_results == [1, None, 3]


def waits_for(path: str) -> str:
    import time

    while not os.path.exists(path):
        time.sleep(0.05)
    return "went"


def _break_status_record(root: Path, job_id: str) -> Path:
    """Make the job's final status record unreadable (a directory where the file goes):
    every status read then fails with a StorageError until it is removed."""
    record = root / "storage" / job_id / "status.json"
    record.mkdir()
    return record


@pytest.mark.anyio
async def test_a_status_read_failing_while_logs_stream_is_a_storage_error(
    kinetic_env: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    job = await kinetic.run()(waits_for).aio.run_async(str(go))
    record = _break_status_record(kinetic_env, job.job_id)
    # The log follower and the waiter both read the status, concurrently: both fail.
    with pytest.raises(kinetic.StorageError, match="status.json") as caught:
        await job.result(timeout=60, stream_logs=True)
    assert not isinstance(caught.value, BaseExceptionGroup)
    record.rmdir()
    go.touch()
    assert await (await aio.attach(job.job_id)).result(timeout=60) == "went"


def test_a_job_listing_meeting_an_unreadable_record_says_so_in_one_line(
    kinetic_env: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    fn = kinetic.run()(waits_for)
    jobs = [fn.run_async(str(go)) for _ in range(3)]
    env_home = tmp_path / "home"
    env_home.mkdir()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kinetic", "--backend", "local", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "HOME": str(env_home)},
            timeout=120,
            check=False,
        )

    # A corrupted handle: that job is left out with a warning, the others are listed.
    handle = kinetic_env / "storage" / jobs[0].job_id / "handle.json"
    saved = handle.read_bytes()
    handle.write_bytes(b"{not json")
    listed = cli("jobs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {j["job_id"] for j in json.loads(listed.stdout)} == {j.job_id for j in jobs[1:]}
    assert f"skipping job {jobs[0].job_id}: its handle cannot be read" in listed.stderr
    handle.write_bytes(saved)

    # An unreadable status record: that job's status is UNKNOWN, said in one line, and
    # the others are still listed with theirs; the exit status says not all were read.
    record = _break_status_record(kinetic_env, jobs[1].job_id)
    broken = cli("jobs", "list")
    assert broken.returncode == 1, broken.stderr
    assert broken.stderr.startswith(f"kinetic: job {jobs[1].job_id}: "), broken.stderr
    assert "status.json" in broken.stderr
    assert len(broken.stderr.splitlines()) == 1, broken.stderr  # no traceback, no group
    assert all(j.job_id in broken.stdout for j in jobs)
    as_json = cli("jobs", "list", "--json")
    assert as_json.returncode == 1, as_json.stderr
    statuses = {j["job_id"]: j["status"] for j in json.loads(as_json.stdout)}
    assert statuses[jobs[1].job_id] == "UNKNOWN"
    assert {statuses[j.job_id] for j in (jobs[0], jobs[2])} <= {"PENDING", "RUNNING"}
    record.rmdir()
    go.touch()
    assert [j.result(timeout=60) for j in jobs] == ["went"] * 3


def test_a_batch_listing_skips_a_manifest_it_cannot_read(kinetic_env: Path, tmp_path: Path) -> None:
    fn = kinetic.run()(fails_on_two)
    kept, spoilt = fn.run_async_map([1]), fn.run_async_map([3])
    assert kept.results(timeout=120, cleanup=False) == [1]
    assert spoilt.results(timeout=120, cleanup=False) == [3]
    manifest = kinetic_env / "storage" / "_groups" / spoilt.group_id / "manifest.json"
    home = tmp_path / "home"
    home.mkdir()
    for content in (b"{not json", b"[1, 2]", b'"a string"'):
        manifest.write_bytes(content)
        listed = subprocess.run(
            [sys.executable, "-m", "kinetic", "--backend", "local", "batch", "list", "--json"],
            capture_output=True,
            text=True,
            env={**os.environ, "HOME": str(home)},
            timeout=120,
            check=False,
        )
        assert listed.returncode == 0, listed.stderr
        assert [b["group_id"] for b in json.loads(listed.stdout)] == [kept.group_id]
        assert "Traceback" not in listed.stderr
    kept.cleanup()
