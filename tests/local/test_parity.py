"""The original's documented behaviours (docs/api.md, "Parity with the original")."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import kinetic

pytestmark = pytest.mark.local


def exits(code: int) -> None:
    sys.exit(code)


def test_a_failed_job_is_a_runtime_error_as_the_original_documents() -> None:
    assert issubclass(kinetic.JobFailedError, RuntimeError)
    assert issubclass(kinetic.ResultError, RuntimeError)
    job = kinetic.run()(exits).run_async(3)
    with pytest.raises(RuntimeError) as caught:  # what code written for the original catches
        job.result(timeout=120)
    assert isinstance(caught.value, kinetic.JobFailedError)


def double(x: int) -> int:
    return 2 * x


def test_list_jobs_warns_about_an_unreadable_handle(
    kinetic_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fn = kinetic.run()(double)
    good, broken = fn.run_async(1), fn.run_async(2)
    assert (good.result(cleanup=False), broken.result(cleanup=False)) == (2, 4)
    (kinetic_env / "storage" / broken.job_id / "handle.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="kinetic"):
        listed = kinetic.list_jobs()
    assert [h.job_id for h in listed] == [good.job_id]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(broken.job_id in m and "cannot be read" in m for m in warned), warned


def test_list_jobs_lists_a_batchs_inputs_a_page_at_a_time() -> None:
    batch = kinetic.run()(double).run_async_map(range(5))
    assert batch.results(timeout=120, cleanup=False) == [0, 2, 4, 6, 8]
    assert all(h.group_id is None for h in kinetic.list_jobs())  # not in the default list
    every = kinetic.list_jobs(batch=batch.group_id)
    assert [h.group_index for h in every] == [0, 1, 2, 3, 4]
    assert [h.job_id for h in every] == [j.job_id for j in batch.jobs if j is not None]
    page = kinetic.list_jobs(batch=batch.group_id, offset=2, limit=2)
    assert [h.group_index for h in page] == [2, 3]
    assert page[0].result(cleanup=False) == 4  # each is a JobHandle like any job's
    assert kinetic.list_jobs(batch=batch.group_id, offset=9) == []
    with pytest.raises(kinetic.ConfigError, match="pass batch="):
        kinetic.list_jobs(limit=2)
    with pytest.raises(kinetic.ConfigError, match="offset must be a non-negative"):
        kinetic.list_jobs(batch=batch.group_id, offset=-1)
    with pytest.raises(kinetic.JobNotFoundError):
        kinetic.list_jobs(batch="grp-" + "0" * 16)

    out = cli("jobs", "list", "--batch", batch.group_id, "--offset", "1", "--limit", "2", "--json")
    assert out.returncode == 0, out.stderr
    assert [d["group_index"] for d in json.loads(out.stdout)] == [1, 2]
    assert [d["status"] for d in json.loads(out.stdout)] == ["SUCCEEDED"] * 2
    assert "--offset 3 for the next page" in out.stderr


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetic", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class _HourlyClock:
    """``time`` for attach_batch's deadline: an hour passes at every reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 3600.0
        return self.now


def test_attach_batch_with_poll_timeout_none_waits_for_as_long_as_it_takes(
    kinetic_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kinetic._engine import batch_submit

    batch = kinetic.run()(double).run_async_map([1, 2])
    assert batch.results(timeout=120, cleanup=False) == [2, 4]
    group = kinetic_env / "storage" / "_groups" / batch.group_id
    manifest = group / "manifest.json"
    aside = group / "manifest.aside"
    manifest.rename(aside)  # as if still being recorded, by this (live) process
    (group / "recording.json").write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started_at": "x"})
    )
    # The submitter commits the batch a little later (whenever: nothing here is timed).
    committer = threading.Timer(0.3, aside.rename, (manifest,))
    with monkeypatch.context() as patched:
        patched.setattr(batch_submit, "time", _HourlyClock())  # a 60 s deadline would pass
        committer.start()
        try:
            again = kinetic.attach_batch(batch.group_id, poll_timeout=None, poll_interval=0.001)
        finally:
            committer.join()
    assert again.results(cleanup=False) == [2, 4]
    # A bounded wait still ends, with a message that says what is known.
    manifest.rename(aside)
    with pytest.raises(kinetic.JobNotFoundError, match="not fully recorded within 0s"):
        kinetic.attach_batch(batch.group_id, poll_timeout=0)
    aside.rename(manifest)
