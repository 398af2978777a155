"""Fan-out on the local backend: real supervisor, real worker processes, real files."""

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

pytestmark = pytest.mark.local


@kinetic.run()
def square(x: int) -> int:
    return x * x


@kinetic.run()
def describe(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


class OddError(Exception):
    pass


@kinetic.run()
def reject_odd(x: int) -> int:
    if x % 2:
        raise OddError(f"{x} is odd")
    return x


@kinetic.run()
def flaky(marker_dir: str, x: int, failures: int) -> int:
    """Fails its first ``failures`` attempts (counted with files), then succeeds."""
    attempts = Path(marker_dir) / f"{x}.attempts"
    n = int(attempts.read_text()) if attempts.exists() else 0
    attempts.write_text(str(n + 1))
    if n < failures:
        raise RuntimeError(f"attempt {n} of input {x} fails")
    return x


@kinetic.run()
def slow(marker_dir: str, x: int, seconds: float, fail_at: int = -1) -> int:
    (Path(marker_dir) / f"{x}.started").touch()
    if x == fail_at:
        raise RuntimeError(f"input {x} fails")
    time.sleep(seconds)
    return x


@kinetic.run()
def die_once(marker_dir: str, x: int) -> int:
    marker = Path(marker_dir) / f"{x}.died"
    if x == 3 and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@kinetic.run()
def die_always(x: int) -> int:
    if x == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def group_dir(root: Path, group_id: str) -> Path:
    return root / "storage" / "_groups" / group_id


def test_results_in_input_order() -> None:
    batch = square.run_async_map(range(300))
    assert isinstance(batch, kinetic.BatchHandle)
    assert batch.group_id.startswith("grp-")
    assert len(batch.jobs) == 300
    assert batch.results() == [x * x for x in range(300)]


def test_input_modes() -> None:
    items = [{"a": 1, "b": 2}, (1, 2), [3], 4, {1: "not kwargs"}]
    got = describe.run_async_map(items).results()
    assert got == [
        {"args": [], "kwargs": {"a": 1, "b": 2}},
        {"args": [1, 2], "kwargs": {}},
        {"args": [3], "kwargs": {}},
        {"args": [4], "kwargs": {}},
        {"args": [{1: "not kwargs"}], "kwargs": {}},
    ]
    assert describe.run_async_map([(1, 2)], input_mode="single").results() == [
        {"args": [(1, 2)], "kwargs": {}}
    ]
    assert describe.run_async_map([{"x": 1}], input_mode="kwargs").results() == [
        {"args": [], "kwargs": {"x": 1}}
    ]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"input_mode": "bogus"}, "input_mode"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"retries": -1}, "retries"),
        ({"fail_fast": "yes"}, "fail_fast"),
        ({"tags": {"a": 1}}, "tags"),
        ({"name": 3}, "name"),
    ],
)
def test_invalid_options_raise_at_once(
    kwargs: dict[str, Any], match: str, kinetic_env: Path
) -> None:
    with pytest.raises(kinetic.ConfigError, match=match):
        square.run_async_map(range(3), **kwargs)
    assert not (kinetic_env / "storage" / "_groups").exists()


def test_bad_inputs_leave_nothing_behind(kinetic_env: Path) -> None:
    import threading

    with pytest.raises(kinetic.ConfigError, match="non-empty"):
        square.run_async_map([])
    with pytest.raises(kinetic.ConfigError, match="input 1"):
        describe.run_async_map([(1,), 2], input_mode="args")
    with pytest.raises(kinetic.SerializationError, match="input 2 cannot be pickled"):
        square.run_async_map([1, 2, threading.Lock()])
    assert not (kinetic_env / "storage" / "_groups").exists()


def test_inputs_are_chunked_and_shared_artifacts_stored_once(kinetic_env: Path) -> None:
    batch = square.run_async_map(range(1000), name="squares", tags={"team": "ml"})
    gdir = group_dir(kinetic_env, batch.group_id)
    manifest_before = (gdir / "manifest.json").read_bytes()
    stat_before = (gdir / "manifest.json").stat()
    assert batch.results(cleanup=False) == [x * x for x in range(1000)]
    chunks = list((gdir / "inputs").iterdir())
    assert 1 <= len(chunks) <= 64
    assert (gdir / "fn.pkl").is_file()
    # One context archive, and no per-input job directories or payloads.
    assert len(list((kinetic_env / "storage" / "default" / "contexts").iterdir())) == 1
    assert not [p for p in (kinetic_env / "storage").iterdir() if p.name.startswith("job-")]
    # The manifest is written once, never rewritten per input.
    assert (gdir / "manifest.json").read_bytes() == manifest_before
    assert (gdir / "manifest.json").stat().st_mtime_ns == stat_before.st_mtime_ns
    manifest = json.loads(manifest_before)
    assert manifest["delivery"] == "at-least-once"
    assert manifest["total"] == 1000
    assert (batch.name, batch.tags) == ("squares", {"team": "ml"})


def test_as_completed_and_unordered_results_follow_completion_order(tmp_path: Path) -> None:
    # Later inputs finish first.
    batch = slow.run_async_map(
        [(str(tmp_path), x, 0.4 - 0.1 * x) for x in range(4)], max_concurrent=4
    )
    seen = [h.group_index for h in batch.as_completed()]
    assert sorted(seen) == [0, 1, 2, 3]
    assert seen[0] == 3
    assert seen[-1] == 0
    assert batch.results(ordered=False) == seen


def test_failures_raise_batch_error_with_partial_results() -> None:
    batch = reject_odd.run_async_map(range(6))
    with pytest.raises(kinetic.BatchError) as info:
        batch.results(cleanup=False)
    err = info.value
    assert err.group_id == batch.group_id
    assert err.partial_results == [0, None, 2, None, 4, None]
    assert sorted(h.group_index for h in err.failures) == [1, 3, 5]
    mixed = batch.results(return_exceptions=True)
    assert mixed[0] == 0
    assert isinstance(mixed[1], OddError)
    assert "Remote traceback" in "\n".join(mixed[1].__notes__)
    # failures() stays accurate after cleanup deleted the results.
    assert sorted(h.group_index for h in batch.failures()) == [1, 3, 5]
    counts = batch.status_counts()
    assert counts == {"SUCCEEDED": 3, "FAILED": 3}


def test_member_handles_work_like_jobs() -> None:
    batch = reject_odd.run_async_map(range(3))
    batch.wait()
    ok, bad = batch.jobs[0], batch.jobs[1]
    assert ok is not None
    assert bad is not None
    assert ok.status() is kinetic.JobStatus.SUCCEEDED
    assert ok.result(cleanup=False) == 0
    assert bad.status() is kinetic.JobStatus.FAILED
    with pytest.raises(OddError):
        bad.result(cleanup=False)
    assert "1 is odd" in bad.logs()


def test_retries_rerun_failed_inputs(tmp_path: Path) -> None:
    inputs = [(str(tmp_path), x, 2) for x in range(5)]
    assert flaky.run_async_map(inputs, retries=2).results() == list(range(5))
    for x in range(5):
        assert (tmp_path / f"{x}.attempts").read_text() == "3"


def test_without_retries_the_first_failure_is_final(tmp_path: Path) -> None:
    batch = flaky.run_async_map([(str(tmp_path), x, 1) for x in range(3)])
    with pytest.raises(kinetic.BatchError) as info:
        batch.results()
    assert len(info.value.failures) == 3


def test_fail_fast_stops_launching(tmp_path: Path) -> None:
    inputs = [(str(tmp_path), x, 0.05, 2) for x in range(60)]
    batch = slow.run_async_map(inputs, fail_fast=True, max_concurrent=2)
    results = batch.results(return_exceptions=True)
    started = len(list(tmp_path.glob("*.started")))
    assert started < 20, started
    cancelled = [r for r in results if isinstance(r, kinetic.JobCancelledError)]
    assert len(cancelled) >= 60 - started
    assert isinstance(results[2], RuntimeError)


def test_cancel_running_on_fail_ends_running_siblings(tmp_path: Path) -> None:
    inputs = [(str(tmp_path), x, 0.1 if x == 0 else 30.0, 0) for x in range(3)]
    batch = slow.run_async_map(
        inputs, fail_fast=True, cancel_running_on_fail=True, max_concurrent=3
    )
    started = time.monotonic()
    results = batch.results(return_exceptions=True, timeout=60)
    assert time.monotonic() - started < 20
    assert isinstance(results[0], RuntimeError)
    assert all(isinstance(r, kinetic.KineticError) for r in results[1:])


def test_cancel_stops_queued_and_running_inputs_and_never_retries(tmp_path: Path) -> None:
    inputs = [(str(tmp_path), x, 0.5) for x in range(40)]
    batch = slow.run_async_map(inputs, max_concurrent=2, retries=3)
    time.sleep(0.8)
    batch.cancel()
    started_after_cancel = len(list(tmp_path.glob("*.started")))
    time.sleep(1.0)
    assert len(list(tmp_path.glob("*.started"))) == started_after_cancel
    assert started_after_cancel < 10
    statuses = dict(batch.statuses())
    assert all(s.is_terminal for s in statuses.values())
    results = batch.results(return_exceptions=True, timeout=30)
    assert sum(isinstance(r, kinetic.JobCancelledError) for r in results) >= 30


def test_a_worker_dying_mid_input_fails_that_input_and_the_batch_goes_on() -> None:
    batch = die_always.run_async_map(range(6), max_concurrent=2)
    results = batch.results(return_exceptions=True, timeout=60)
    assert [r for i, r in enumerate(results) if i != 2] == [0, 1, 3, 4, 5]
    assert isinstance(results[2], kinetic.JobFailedError)
    assert "signal 9" in str(results[2])


def test_a_worker_dying_is_retried_when_asked(tmp_path: Path) -> None:
    inputs = [(str(tmp_path), x) for x in range(6)]
    assert die_once.run_async_map(inputs, retries=1).results(timeout=60) == list(range(6))


async def test_async_fan_out() -> None:
    batch = await square.aio.run_async_map(range(50))
    assert isinstance(batch, aio.BatchHandle)
    seen = [h.group_index async for h in batch.as_completed()]
    assert sorted(seen) == list(range(50))
    assert await batch.results() == [x * x for x in range(50)]


_CONSUMER = textwrap.dedent(
    """
    import sys, json, kinetic
    batch = kinetic.attach_batch(sys.argv[1])
    print(json.dumps(batch.results()))
    """
)


def test_attach_batch_from_another_process() -> None:
    batch = square.run_async_map(range(100))
    out = subprocess.run(
        [sys.executable, "-c", _CONSUMER, batch.group_id],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert json.loads(out.stdout) == [x * x for x in range(100)]


def test_attach_batch_errors() -> None:
    with pytest.raises(kinetic.ConfigError):
        kinetic.attach_batch("../grp-1")
    with pytest.raises(kinetic.JobNotFoundError):
        kinetic.attach_batch("grp-0123456789ab")


def test_sync_as_completed_crosses_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    from kinetic._sync import portal as portal_module

    batch = square.run_async_map(range(500))
    batch.wait()
    crossings = 0
    real = portal_module.wait_future

    def counting(future: Any) -> Any:
        nonlocal crossings
        crossings += 1
        return real(future)

    monkeypatch.setattr(portal_module, "wait_future", counting)
    handles = list(batch.as_completed())
    assert len(handles) == 500
    assert crossings <= 5, crossings


_SLOW_SUBMITTER = textwrap.dedent(
    """
    import time, kinetic

    class SlowToPickle:
        def __init__(self, x):
            self.x = x
        def __reduce__(self):
            time.sleep(0.4)  # keeps the submission "in progress" for a while
            return (int, (self.x,))

    @kinetic.run()
    def ident(x):
        return x

    ident.run_async_map([SlowToPickle(i) for i in range(8)])
    """
)


def test_attach_batch_waits_for_a_submission_in_progress(kinetic_env: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_SUBMITTER],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        groups = kinetic_env / "storage" / "_groups"
        deadline = time.monotonic() + 60
        while not (groups.is_dir() and any(groups.iterdir())):
            assert time.monotonic() < deadline, "the submission never started recording"
            time.sleep(0.01)
        group_id = next(groups.iterdir()).name
        assert not (groups / group_id / "manifest.json").exists()  # still in progress
        batch = kinetic.attach_batch(group_id)
        assert batch.results(timeout=60) == list(range(8))
    finally:
        # Reaped, and its pipe closed, on every path (a leak would be charged to a
        # later test as an unraisable ResourceWarning).
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        assert proc.stderr is not None
        proc.stderr.close()
