"""Code written against the original's documented keywords runs unchanged (local backend)."""

from __future__ import annotations

import pytest

import kinetic

pytestmark = pytest.mark.local


@kinetic.run()
def square(x: int) -> int:
    return x * x


def test_result_cancel_and_cleanup_take_the_cleanup_keywords() -> None:
    job = square.run_async(3)
    assert job.result(cleanup_timeout=30, cleanup_poll_interval=0.5) == 9
    with pytest.raises(kinetic.JobNotFoundError):  # the default cleanup ran within the bound
        kinetic.attach(job.job_id)
    other = square.run_async(4)
    other.cancel(cleanup_timeout=30, cleanup_poll_interval=0.5)
    other.cleanup(k8s=True, gcs=True, cleanup_timeout=30, cleanup_poll_interval=0.5)
    with pytest.raises(kinetic.ConfigError, match="cleanup_timeout"):
        other.cleanup(cleanup_timeout=0)


def test_as_completed_and_attach_batch_take_the_polling_keywords() -> None:
    batch = square.run_async_map(range(5))
    seen = sorted(h.result(cleanup=False) for h in batch.as_completed(poll_interval=5.0))
    assert seen == [x * x for x in range(5)]
    again = kinetic.attach_batch(batch.group_id, None, None, 0.01, 10.0)
    assert again.results() == seen
    with pytest.raises(kinetic.ConfigError, match="poll_interval"):
        kinetic.attach_batch(batch.group_id, poll_interval=0)
