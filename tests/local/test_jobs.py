"""Single jobs end to end on the local backend: real runner processes, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import kinetic
from kinetic import aio
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local


class Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("this object refuses to be pickled")


class CustomError(Exception):
    pass


@kinetic.run(accelerator="cpu")
def square(x: int) -> int:
    print(f"squaring {x}")
    return x * x


@kinetic.run()
def fails(msg: str) -> None:
    raise CustomError(msg)


@kinetic.run()
def exits(code: int) -> None:
    sys.exit(code)


@kinetic.run()
def returns_unpicklable() -> Unpicklable:
    return Unpicklable()


@kinetic.run()
def sleeps(seconds: float) -> str:
    print("started", flush=True)
    time.sleep(seconds)
    return "woke"


@kinetic.run()
def kill_self(sig: int) -> None:
    os.kill(os.getpid(), sig)


@kinetic.run(capture_env_vars=["KT_EXACT", "KT_PRE*"])
def read_env() -> dict[str, str | None]:
    names = ("KT_EXACT", "KT_PRE_ONE", "KT_PRE_TWO", "KT_OTHER", "KINETIC_OUTPUT_DIR")
    return {name: os.environ.get(name) for name in names}


@kinetic.run()
def write_output(text: str) -> str:
    out = Path(os.environ["KINETIC_OUTPUT_DIR"])
    (out / "result.txt").write_text(text)
    return str(out)


def test_call_blocks_and_returns_value(capfd: pytest.CaptureFixture[str]) -> None:
    assert square(7) == 49
    # The job's output is streamed to the terminal while the call blocks.
    assert "squaring 7" in capfd.readouterr().out


def test_run_async_handle_lifecycle(kinetic_env: Path) -> None:
    job = square.run_async(5)
    assert isinstance(job, kinetic.JobHandle)
    assert job.backend == "local"
    assert job.job_id.startswith("job-")
    assert job.func_name == "square"
    assert job.accelerator == "cpu"
    assert job.result(cleanup=False) == 25
    assert job.status() is kinetic.JobStatus.SUCCEEDED
    assert "squaring 5" in job.logs()
    assert job.tail(1).strip() == "squaring 5"
    job.cleanup()
    assert job.status() is kinetic.JobStatus.NOT_FOUND
    assert job_dirs(kinetic_env) == []


def test_result_cleans_up_by_default(kinetic_env: Path) -> None:
    job = square.run_async(2)
    assert job.result() == 4
    assert job_dirs(kinetic_env) == []


def test_handle_round_trips_through_dict() -> None:
    job = square.run_async(3)
    data = json.loads(json.dumps(job.to_dict()))
    data["field_from_the_future"] = 1
    again = kinetic.JobHandle.from_dict(data)
    assert again == job
    assert again.result() == 9


def test_remote_exception_reraised_with_remote_traceback() -> None:
    with pytest.raises(CustomError, match="boom") as info:
        fails("boom")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Remote traceback" in notes
    assert "raise CustomError(msg)" in notes


def test_system_exit_is_a_job_failure_naming_the_phase() -> None:
    with pytest.raises(kinetic.JobFailedError, match="SystemExit") as info:
        exits(3)
    assert info.value.phase == "execute"


def test_unpicklable_result_names_serialize_phase() -> None:
    with pytest.raises(kinetic.JobFailedError, match="cannot be pickled") as info:
        returns_unpicklable()
    assert info.value.phase == "serialize"


def test_runner_killed_by_signal_fails_with_reason() -> None:
    job = kill_self.run_async(signal.SIGKILL)
    with pytest.raises(kinetic.JobFailedError, match="signal 9"):
        job.result(timeout=60)
    assert job.status() is kinetic.JobStatus.FAILED


def test_missing_result_is_a_clear_error(kinetic_env: Path) -> None:
    job = square.run_async(4)
    job.result(cleanup=False)
    (kinetic_env / "storage" / job.job_id / "result.pkl").unlink()
    with pytest.raises(kinetic.ResultError, match="missing"):
        job.result()


def test_corrupted_result_payload_is_a_clear_error(kinetic_env: Path) -> None:
    job = square.run_async(4)
    job.result(cleanup=False)
    (kinetic_env / "storage" / job.job_id / "result.pkl").write_bytes(b"\x80\x05garbage")
    with pytest.raises(kinetic.ResultError, match="corrupted"):
        job.result()


def test_corrupted_payload_fails_in_verify_phase(kinetic_env: Path) -> None:
    job = sleeps.run_async(0)
    job.result(cleanup=False)
    # Re-run the same job with a tampered payload: the runner must refuse it.
    payload = kinetic_env / "storage" / job.job_id / "payload.pkl"
    payload.write_bytes(payload.read_bytes() + b"tampered")
    (kinetic_env / "storage" / job.job_id / "status.json").unlink()
    (kinetic_env / "storage" / job.job_id / "result.pkl").unlink()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            "--storage",
            (kinetic_env / "storage").as_uri(),
            "--job-id",
            job.job_id,
        ],
        check=False,
        capture_output=True,
    )
    with pytest.raises(kinetic.JobFailedError, match="corrupted") as info:
        job.result()
    assert info.value.phase == "verify"


def test_timeout_leaves_job_running() -> None:
    job = sleeps.run_async(30)
    with pytest.raises(kinetic.JobTimeoutError):
        job.result(timeout=0.5)
    assert job.status() is kinetic.JobStatus.RUNNING
    job.cancel()
    assert job.status() is kinetic.JobStatus.FAILED
    with pytest.raises(kinetic.JobCancelledError):
        job.result()


def test_except_runtime_error_catches_every_job_that_ended_without_a_value() -> None:
    """As in the original: a cancelled job, and a result read after cleanup, keeping
    their own types."""
    cancelled = sleeps.run_async(30)
    cancelled.cancel()
    with pytest.raises(RuntimeError) as info:
        cancelled.result(timeout=60)
    assert isinstance(info.value, kinetic.JobCancelledError)
    done = sleeps.run_async(0.01)
    assert done.result(timeout=60) == "woke"  # read, then cleaned up
    with pytest.raises(RuntimeError) as info:
        done.result(timeout=60)
    assert isinstance(info.value, kinetic.JobNotFoundError)


def test_on_status_change_sees_each_status_once() -> None:
    seen: list[kinetic.JobStatus] = []
    job = sleeps.run_async(0.3)
    assert job.result(on_status_change=seen.append) == "woke"
    assert seen == [kinetic.JobStatus.RUNNING, kinetic.JobStatus.SUCCEEDED]


def test_follow_logs_streams_until_the_end(capfd: pytest.CaptureFixture[str]) -> None:
    job = sleeps.run_async(0.2)
    assert job.logs(follow=True) is None
    assert "started" in capfd.readouterr().out
    assert job.status() is kinetic.JobStatus.SUCCEEDED


def test_output_dir_and_captured_env(monkeypatch: pytest.MonkeyPatch, kinetic_env: Path) -> None:
    monkeypatch.setenv("KT_EXACT", "exact")
    monkeypatch.setenv("KT_PRE_ONE", "1")
    monkeypatch.setenv("KT_PRE_TWO", "2")
    monkeypatch.setenv("KT_OTHER", "not sent")
    job = read_env.run_async()
    env = job.result()
    assert env["KT_EXACT"] == "exact"
    assert env["KT_PRE_ONE"] == "1"
    assert env["KT_PRE_TWO"] == "2"
    assert env["KINETIC_OUTPUT_DIR"] == str(kinetic_env / "outputs" / job.job_id)
    out = Path(write_output("kept"))
    assert (out / "result.txt").read_text() == "kept"


def test_an_output_dir_made_for_a_job_that_wrote_nothing_is_not_left_behind(
    kinetic_env: Path, tmp_path: Path
) -> None:
    job = read_env.run_async()
    assert job.result()["KINETIC_OUTPUT_DIR"] == str(kinetic_env / "outputs" / job.job_id)
    assert not (kinetic_env / "outputs" / job.job_id).exists()  # one empty folder a job
    # A folder of the user's stays, empty or not.
    mine = tmp_path / "mine"
    mine.mkdir()
    env = kinetic.run(output_dir=str(mine))(read_env.__wrapped__)()
    assert env["KINETIC_OUTPUT_DIR"] == str(mine)
    assert mine.is_dir()


def test_other_variables_do_not_leak_from_the_spec(kinetic_env: Path) -> None:
    job = read_env.run_async()
    job.result(cleanup=False)
    spec = json.loads((kinetic_env / "storage" / job.job_id / "spec.json").read_text())
    assert set(spec["env"]) <= {"KT_EXACT", "KT_PRE_ONE", "KT_PRE_TWO"}


_OTHER_PROCESS = textwrap.dedent(
    """
    import json, sys
    import kinetic
    cmd = sys.argv[1]
    if cmd == "attach":
        job = kinetic.attach(sys.argv[2])
        print(json.dumps({"status": job.status().value, "result": job.result(cleanup=False)}))
    elif cmd == "list":
        print(json.dumps([h.job_id for h in kinetic.list_jobs()]))
    """
)


def _in_other_process(*args: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def test_attach_and_list_from_another_process() -> None:
    first = square.run_async(6)
    second = square.run_async(8)
    first.result(cleanup=False)
    listed = _in_other_process("list")
    assert {first.job_id, second.job_id} <= set(listed)
    attached = _in_other_process("attach", second.job_id)
    assert attached == {"status": attached["status"], "result": 64}
    assert attached["status"] in {"RUNNING", "SUCCEEDED"}


async def test_list_jobs_newest_first() -> None:
    a = await square.aio.run_async(1)
    b = await square.aio.run_async(2)
    jobs = await aio.list_jobs()
    ids = [j.job_id for j in jobs]
    assert set(ids) == {a.job_id, b.job_id}
    assert [j.created_at for j in jobs] == sorted((j.created_at for j in jobs), reverse=True)
    assert await a.result() == 1
    assert await b.result() == 4


def test_job_survives_the_submitting_process(kinetic_env: Path) -> None:
    script = textwrap.dedent(
        """
        import os, time, kinetic
        @kinetic.run()
        def slow():
            time.sleep(1.5)
            return os.getpid()
        print(slow.run_async().job_id, flush=True)
        os._exit(0)  # the submitter dies at once, without any cleanup
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    job_id = proc.stdout.strip()
    job = kinetic.attach(job_id)
    assert job.status() is kinetic.JobStatus.RUNNING
    assert isinstance(job.result(timeout=60), int)


async def test_async_api_end_to_end() -> None:
    assert await square.aio(9) == 81
    job = await square.aio.run_async(10)
    assert isinstance(job, aio.JobHandle)
    assert await job.result() == 100


async def test_cancelling_result_wait_leaves_the_job_running() -> None:
    import anyio

    job = await sleeps.aio.run_async(30)
    with anyio.move_on_after(0.5):
        await job.result()
    assert await job.status() is kinetic.JobStatus.RUNNING
    await job.cancel()
    assert await job.status() is kinetic.JobStatus.FAILED


class Greeter:
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    @kinetic.run()
    def greet(self, name: str) -> str:
        return f"{self.greeting}, {name}"


def test_methods_receive_their_instance() -> None:
    assert Greeter("hi").greet("ada") == "hi, ada"


def test_local_backend_notice_is_one_line_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KINETIC_QUIET")
    script = textwrap.dedent(
        """
        import kinetic

        @kinetic.run()
        def one():
            return 1

        assert one() + one() == 2
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    notices = [line for line in out.stderr.splitlines() if "local backend" in line]
    assert len(notices) == 1
    assert "no GCP project configured" in notices[0]
