"""The original's documented behaviours (docs/api.md, "Parity with the original")."""

from __future__ import annotations

import sys

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
