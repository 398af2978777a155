"""The ``kinetic jobs`` / ``kinetic batch`` command line against real local jobs.

Every command runs as a real subprocess (``python -m kinetic``), as a user runs it;
the exit statuses are the documented ones (0 ok, 1 failed, 2 usage, 3 not found,
4 timeout).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import kinetic

pytestmark = pytest.mark.local


@kinetic.run()
def shout(word: str) -> str:
    print(f"saying {word}")
    return word.upper()


@kinetic.run()
def broken() -> None:
    raise ValueError("no good")


@kinetic.run()
def slow(seconds: float) -> str:
    import time

    for i in range(int(seconds * 10)):
        print(f"tick {i}", flush=True)
        time.sleep(0.1)
    return "done"


@kinetic.run()
def picky(word: str) -> str:
    if word == "bad":
        raise KeyError(word)
    return word * 2


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinetic", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_jobs_commands() -> None:
    job = shout.run_async("hi")
    job.result(cleanup=False)
    listed = cli("jobs", "list")
    assert listed.returncode == 0
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["JOB", "STATUS", "FUNCTION"]
    assert any(r.split()[:3] == [job.job_id, "SUCCEEDED", "shout"] for r in rows)
    assert cli("jobs", "list", "--limit", "0").stdout.split() == header.split()
    as_json = json.loads(cli("jobs", "list", "--json").stdout)
    assert [(j["job_id"], j["status"]) for j in as_json] == [(job.job_id, "SUCCEEDED")]
    assert cli("jobs", "status", job.job_id).stdout.strip() == "SUCCEEDED"
    status = json.loads(cli("jobs", "status", job.job_id, "--json").stdout)
    assert (status["status"], status["func_name"], status["reason"]) == ("SUCCEEDED", "shout", None)
    assert "saying hi" in cli("jobs", "logs", job.job_id).stdout
    assert cli("jobs", "tail", job.job_id, "-n", "1").stdout.strip().endswith("saying hi")
    assert cli("jobs", "result", job.job_id).stdout.strip() == "'HI'"
    assert json.loads(cli("jobs", "result", job.job_id, "--json").stdout) == "HI"
    assert cli("jobs", "cleanup", job.job_id).returncode == 0
    assert job.status() is kinetic.JobStatus.NOT_FOUND
    gone = cli("jobs", "status", job.job_id)
    assert gone.returncode == 3
    assert job.job_id in gone.stderr


def test_failures_and_bad_ids_have_their_exit_codes() -> None:
    job = broken.run_async()
    with pytest.raises(ValueError, match="no good"):
        job.result(cleanup=False)
    status = cli("jobs", "status", job.job_id)
    assert status.returncode == 1
    assert "FAILED" in status.stdout
    assert "no good" in status.stdout
    result = cli("jobs", "result", job.job_id)
    assert result.returncode == 1
    assert "ValueError: no good" in result.stderr
    bad = cli("jobs", "status", "../etc")
    assert bad.returncode == 2
    assert "invalid job id" in bad.stderr
    assert cli("jobs", "status", "job-00000000").returncode == 3
    assert cli("nonsense").returncode == 2
    assert cli("jobs", "tail").returncode == 2


def test_follow_timeout_and_cancel() -> None:
    job = slow.run_async(30.0)
    waited = cli("jobs", "result", job.job_id, "--timeout", "0.5")
    assert waited.returncode == 4, waited.stderr
    with subprocess.Popen(
        [sys.executable, "-m", "kinetic", "jobs", "logs", "-f", job.job_id],
        stdout=subprocess.PIPE,
        text=True,
    ) as follow:
        try:
            assert follow.stdout is not None
            assert follow.stdout.readline().startswith("tick")  # output arrives while it runs
            assert cli("jobs", "cancel", job.job_id).returncode == 0
            follow.communicate(timeout=60)  # following ends with the job
        finally:
            follow.kill()
    assert follow.returncode == 0
    status = json.loads(cli("jobs", "status", job.job_id, "--json").stdout)
    assert (status["status"], status["cancelled"]) == ("FAILED", True)
    job.cleanup()


def test_batch_commands() -> None:
    batch = picky.run_async_map(["a", "bad", "c"], name="three")
    batch.wait()
    listed = cli("batch", "list", "--json")
    assert listed.returncode == 0
    (entry,) = json.loads(listed.stdout)
    assert (entry["group_id"], entry["name"], entry["total"]) == (batch.group_id, "three", 3)
    assert batch.group_id in cli("batch", "list").stdout
    out = cli("batch", "status", batch.group_id)
    assert out.returncode == 1  # an input failed
    assert out.stdout.split()[2:] == ["FAILED", "1", "SUCCEEDED", "2"]
    counts = json.loads(cli("batch", "status", batch.group_id, "--json", "--watch").stdout)
    assert (counts["SUCCEEDED"], counts["FAILED"], counts["total"]) == (2, 1, 3)
    results = cli("batch", "results", batch.group_id, "--json")
    assert results.returncode == 1
    docs = json.loads(results.stdout)
    assert [d["ok"] for d in docs] == [True, False, True]
    assert docs[0]["value"] == "aa"
    assert docs[1]["type"] == "KeyError"
    assert cli("batch", "cleanup", batch.group_id).returncode == 0
    assert cli("batch", "status", "grp-00000000").returncode == 3


def test_batch_cancel() -> None:
    batch = slow.run_async_map([60.0, 60.0], max_concurrent=1)  # outlives a slow cancel
    assert cli("batch", "cancel", batch.group_id).returncode == 0
    deadline = time.monotonic() + 120  # generous: this machine's cores are shared
    while time.monotonic() < deadline:
        counts = json.loads(cli("batch", "status", batch.group_id, "--json").stdout)
        if counts.get("FAILED") == 2:
            break
        time.sleep(0.5)
    assert counts.get("FAILED") == 2, counts
    batch.cleanup()
