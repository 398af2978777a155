"""Re-attaching to a batch whose results were collected and cleaned up says so, and
when, instead of counting every input as failed."""

from __future__ import annotations

import pytest

import kinetic

pytestmark = pytest.mark.local


def triple(x: int) -> int:
    return 3 * x


def test_results_of_a_cleaned_up_batch_say_when_it_was_cleaned() -> None:
    batch = kinetic.run()(triple).run_async_map([1, 2, 3])
    assert batch.results(timeout=120) == [3, 6, 9]  # collected: cleanup=True by default
    again = kinetic.attach_batch(batch.group_id)
    cleaned = r"was collected and cleaned up at 20\d\d-\d\d-\d\dT[\d:.]+"
    with pytest.raises(kinetic.ResultError, match=cleaned) as caught:
        again.results()
    assert "inputs failed" not in str(caught.value)
    assert again.failures() == []
    assert again.status_counts() == {"SUCCEEDED": 3}
    with pytest.raises(kinetic.ResultError, match="was collected and cleaned up"):
        batch.results()  # the handle that collected them, too
    for h in again.as_completed():
        with pytest.raises(kinetic.ResultError, match=r"deleted by the batch's cleanup at"):
            h.result()


def fails_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("two")
    return x


def test_an_input_of_a_cleaned_up_batch_keeps_its_state() -> None:
    batch = kinetic.run()(fails_on_two).run_async_map([1, 2, 3])
    batch.wait(timeout=120)
    batch.cleanup()  # the outcomes are deleted; the summary keeps each state
    for handle in (batch.jobs, kinetic.attach_batch(batch.group_id).jobs):
        reports = [h.status_report() for h in handle if h is not None]
        assert [r.status for r in reports] == [
            kinetic.JobStatus.SUCCEEDED,
            kinetic.JobStatus.FAILED,
            kinetic.JobStatus.SUCCEEDED,
        ]
        assert "cleaned up" in str(reports[1].reason)
