"""A ``kinetic.Retries`` for each input of a local batch (``run_async_map(retries=)``, or
the function's ``run(retries=)``): real supervisor, real workers (:mod:`runner.batch`,
:mod:`runner.retry_rule`). Delays show in the order of what ran and in the times the
inputs recorded (lower bounds only: a retry never comes early)."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import kinetic

pytestmark = pytest.mark.local


class Flaky(ConnectionError):
    pass


def _note(ledger: str, **fields: object) -> int:
    """Append one line to ``ledger`` (inputs share no memory with the test); how many
    lines it has now."""
    with open(ledger, "a") as f:
        f.write(json.dumps(fields) + "\n")
    return len(Path(ledger).read_text().splitlines())


def _read(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()]


@kinetic.run()
def fails_twice(ledger: str) -> str:
    """Fails (Flaky) on its first two attempts, noting each attempt's times."""
    started = time.monotonic()
    attempt = os.environ.get("KINETIC_ATTEMPT")
    if attempt in ("0", "1"):
        _note(ledger, attempt=attempt, started=started, ended=time.monotonic())
        raise Flaky(f"attempt {attempt}")
    _note(ledger, attempt=attempt, started=started, ended=time.monotonic())
    return f"ok on attempt {attempt}"


@kinetic.run()
def not_named(ledger: str) -> None:
    _note(ledger, attempt=os.environ.get("KINETIC_ATTEMPT"))
    raise ValueError("not a connection problem")


@kinetic.run()
def first_fails(ledger: str, x: int) -> int:
    """Input 0 fails once; each input notes when it ran, in one ledger."""
    attempt = os.environ.get("KINETIC_ATTEMPT")
    _note(ledger, x=x, attempt=attempt, at=time.monotonic())
    if x == 0 and attempt == "0":
        raise Flaky("once")
    return x


@kinetic.run(retries=kinetic.Retries(1, initial_delay=0, on=(Flaky,)))
def decorated(ledger: str) -> str:
    if _note(ledger) == 1:
        raise Flaky("first call")
    return "second call"


@kinetic.run()
def dies_first(ledger: str) -> str:
    if _note(ledger) == 1:
        os._exit(3)
    return "second call"


def test_an_input_failing_twice_succeeds_on_its_third_attempt(tmp_path: Path) -> None:
    ledgers = [tmp_path / f"{i}.jsonl" for i in range(2)]
    retries = kinetic.Retries(2, initial_delay=0.3, backoff=2.0, on=(ConnectionError,))
    batch = fails_twice.run_async_map([str(p) for p in ledgers], retries=retries)
    assert batch.results(timeout=60, cleanup=False) == ["ok on attempt 2"] * 2
    for ledger in ledgers:
        notes = _read(ledger)
        assert [n["attempt"] for n in notes] == ["0", "1", "2"]
        # Each retry waited at least its delay after the failure before it (0.3, 0.6 s).
        gaps = [b["started"] - a["ended"] for a, b in itertools.pairwise(notes)]
        assert gaps[0] >= 0.3
        assert gaps[1] >= 0.6
    for handle in batch.jobs:
        assert handle is not None
        report = handle.status_report()
        assert report.status is kinetic.JobStatus.SUCCEEDED
        assert report.attempt == 3


def test_an_exception_not_named_in_on_is_not_retried(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    retries = kinetic.Retries(3, initial_delay=0, on=(ConnectionError,))
    batch = not_named.run_async_map([str(ledger)], retries=retries)
    results = batch.results(return_exceptions=True, timeout=60, cleanup=False)
    assert isinstance(results[0], ValueError)
    assert _read(ledger) == [{"attempt": "0"}]
    handle = batch.jobs[0]
    assert handle is not None
    report = handle.status_report()
    assert report.status is kinetic.JobStatus.FAILED
    assert report.attempt is None  # never retried


def test_an_input_waiting_for_its_retry_holds_no_worker(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    retries = kinetic.Retries(1, initial_delay=1.5, on=(Flaky,))
    inputs = [(str(ledger), x) for x in range(3)]
    batch = first_fails.run_async_map(inputs, retries=retries, max_concurrent=1)
    assert batch.results(timeout=60) == [0, 1, 2]
    notes = _read(ledger)
    # One worker: inputs 1 and 2 ran while input 0 waited out its delay.
    assert [(n["x"], n["attempt"]) for n in notes] == [(0, "0"), (1, "0"), (2, "0"), (0, "1")]
    assert notes[3]["at"] - notes[0]["at"] >= 1.5


def test_the_function_s_retries_are_its_batches_default(tmp_path: Path) -> None:
    assert decorated.run_async_map([str(tmp_path / "a")]).results(timeout=60) == ["second call"]
    # run_async_map(retries=) overrides it: 0 is none.
    batch = decorated.run_async_map([str(tmp_path / "b")], retries=0)
    assert isinstance(batch.results(return_exceptions=True, timeout=60)[0], Flaky)


def test_a_waiting_input_is_cancelled_at_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    retries = kinetic.Retries(1, initial_delay=600, on=(Flaky,))
    batch = first_fails.run_async_map([(str(ledger), 0)], retries=retries)
    deadline = time.monotonic() + 60
    while not ledger.exists():
        assert time.monotonic() < deadline, "input 0 never ran"
        time.sleep(0.05)
    handle = batch.jobs[0]
    assert handle is not None
    handle.cancel()
    results = batch.results(return_exceptions=True, timeout=60)
    assert isinstance(results[0], kinetic.JobCancelledError)
    assert len(_read(ledger)) == 1


def test_a_worker_s_death_is_retried_by_a_plain_count_only(tmp_path: Path) -> None:
    plain = dies_first.run_async_map([str(tmp_path / "a")], retries=1)
    assert plain.results(timeout=60) == ["second call"]
    named = dies_first.run_async_map(
        [str(tmp_path / "b")], retries=kinetic.Retries(1, initial_delay=0)
    )
    results = named.results(return_exceptions=True, timeout=60)
    assert isinstance(results[0], kinetic.JobFailedError)
    assert "exited with status 3" in str(results[0])
