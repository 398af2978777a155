"""Status derivation for local jobs: pure rules over records and liveness."""

from __future__ import annotations

import pytest

from kinetic._core.status import JobStatus, describe_exit, status_from_local_records


def derive(**kw: object) -> object:
    base: dict[str, object] = {
        "final": None,
        "cancelled": False,
        "launched": True,
        "alive": False,
        "exit_code": None,
    }
    base.update(kw)
    return status_from_local_records(**base)  # type: ignore[arg-type]


def test_final_record_wins_over_liveness() -> None:
    r = derive(final={"state": "succeeded"}, alive=True)
    assert r.status is JobStatus.SUCCEEDED  # type: ignore[attr-defined]
    r = derive(final={"state": "failed", "phase": "verify", "error": "bad sha"})
    assert (r.status, r.phase, r.reason) == (JobStatus.FAILED, "verify", "bad sha")  # type: ignore[attr-defined]


def test_pending_running_and_vanished() -> None:
    assert derive(launched=False).status is JobStatus.PENDING  # type: ignore[attr-defined]
    assert derive(alive=True).status is JobStatus.RUNNING  # type: ignore[attr-defined]
    gone = derive(exit_code=137)
    assert gone.status is JobStatus.FAILED  # type: ignore[attr-defined]
    assert "signal 9" in gone.reason  # type: ignore[attr-defined]


def test_cancelled_is_failed_and_marked() -> None:
    r = derive(cancelled=True, alive=True)
    assert (r.status, r.cancelled) == (JobStatus.FAILED, True)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("code", "words"),
    [(None, "vanished"), (143, "signal 15"), (1, "status 1")],
)
def test_describe_exit(code: int | None, words: str) -> None:
    assert words in describe_exit(code)


def test_terminal_statuses() -> None:
    assert {s for s in JobStatus if s.is_terminal} == {
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.NOT_FOUND,
    }
