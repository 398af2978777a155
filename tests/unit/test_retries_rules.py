"""``run(retries=)``'s pure parts: the public ``kinetic.Retries``, its checks, the record
its runner reads, and how a job's attempts are reported."""

from __future__ import annotations

import pytest

import kinetic
from kinetic._cli.jobs import job_document, status_line
from kinetic._core.retries import Retries, check_retries, retries_record
from kinetic._core.status import Attempt, JobStatus, StatusReport, status_from_records


class MyError(Exception):
    pass


def test_a_count_is_retries_of_every_exception() -> None:
    assert check_retries(None) is None
    assert check_retries(0) is None
    assert check_retries(Retries(0)) is None
    assert check_retries(2) == Retries(2)
    assert Retries(2).on == (Exception,)


@pytest.mark.parametrize(
    "bad", [-1, "2", 1.5, True, [1]], ids=["negative", "str", "float", "bool", "list"]
)
def test_retries_must_be_a_count_or_a_retries(bad: object) -> None:
    with pytest.raises(kinetic.ConfigError, match="(?i)retries"):
        check_retries(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"count": -1},
        {"count": 1, "backoff": 0.5},
        {"count": 1, "initial_delay": -1},
        {"count": 1, "initial_delay": float("inf")},
        {"count": 1, "on": ()},
        {"count": 1, "on": (int,)},
        {"count": 1, "on": ("ValueError",)},
    ],
)
def test_a_bad_retries_is_refused_when_made(kwargs: dict[str, object]) -> None:
    with pytest.raises(kinetic.ConfigError, match="Retries"):
        Retries(**kwargs)  # type: ignore[arg-type]


def test_one_type_in_on_is_a_tuple_of_it() -> None:
    assert Retries(1, on=ValueError).on == (ValueError,)  # type: ignore[arg-type]


def test_the_delays_grow_by_backoff() -> None:
    r = Retries(4, backoff=3.0, initial_delay=0.5)
    assert [r.delay(n) for n in (1, 2, 3)] == [0.5, 1.5, 4.5]


def test_the_record_names_types_by_qualified_name() -> None:
    record = retries_record(Retries(2, backoff=1.5, initial_delay=0, on=(MyError, OSError)))
    assert record == {
        "count": 2,
        "backoff": 1.5,
        "initial_delay": 0.0,
        "on": [f"{__name__}.MyError", "builtins.OSError"],
    }


def test_decorating_checks_retries() -> None:
    with pytest.raises(kinetic.ConfigError, match="retries"):
        kinetic.run(retries="3")  # type: ignore[arg-type]
    assert kinetic.aio.Retries is kinetic.Retries


FINAL = {
    "state": "failed",
    "phase": "execute",
    "error": "MyError: third",
    "error_type": "m.MyError",
    "attempt": 3,
    "attempts": [
        {
            "attempt": n,
            "started": 1_800_000_000.0 + n,
            "ended": 1_800_000_000.5 + n,
            "phase": "execute",
            "error": f"MyError: {word}",
            "error_type": "m.MyError",
        }
        for n, word in ((1, "first"), (2, "second"))
    ]
    + [{"attempt": "broken"}],
}


def test_the_final_record_says_the_attempts() -> None:
    report = status_from_records(final=FINAL, cancelled=False)
    assert report is not None
    assert report.attempt == 3
    assert report.attempts == (
        Attempt(1, 1_800_000_001.0, 1_800_000_001.5, "execute", "MyError: first", "m.MyError"),
        Attempt(2, 1_800_000_002.0, 1_800_000_002.5, "execute", "MyError: second", "m.MyError"),
    )
    plain = status_from_records(final={"state": "succeeded"}, cancelled=False)
    assert plain is not None
    assert (plain.attempt, plain.attempts) == (None, ())


def test_jobs_status_lists_the_earlier_attempts() -> None:
    report = status_from_records(final=FINAL, cancelled=False)
    assert report is not None
    assert status_line(report).splitlines() == [
        "FAILED  (in phase execute: MyError: third)  attempt 3",
        "  attempt 1 failed at 2027-01-15T08:00:01Z in phase execute: MyError: first",
        "  attempt 2 failed at 2027-01-15T08:00:02Z in phase execute: MyError: second",
    ]
    document = job_document({"job_id": "job-1"}, report)
    assert document["attempt"] == 3
    assert document["attempts"][0]["error"] == "MyError: first"
    assert job_document({}, StatusReport(JobStatus.RUNNING))["attempts"] == []
