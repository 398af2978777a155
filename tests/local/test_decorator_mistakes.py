"""Mistakes users make with the decorator get clear errors; batch inputs attach by id."""

from __future__ import annotations

import pytest

import kinetic
from kinetic import aio

pytestmark = pytest.mark.local


def square(x: int) -> int:
    return x * x


def test_decorator_without_parentheses_says_how_to_write_it() -> None:
    with pytest.raises(kinetic.ConfigError, match=r"@kinetic\.run\(\)"):
        kinetic.run(square)  # type: ignore[arg-type]
    with pytest.raises(kinetic.ConfigError, match=r"@kinetic\.run\(\)"):
        aio.run(square)  # type: ignore[arg-type]


def test_capture_env_vars_as_a_string_is_refused() -> None:
    with pytest.raises(kinetic.ConfigError, match=r"\['HOME'\]"):
        kinetic.run(capture_env_vars="HOME")  # type: ignore[arg-type]
    kinetic.run(capture_env_vars=["HOME", "WANDB_*"])  # the list form is fine


@pytest.mark.parametrize("bad", ["out", "./out", "outputs/run1"])
def test_a_relative_output_dir_is_refused(bad: str) -> None:
    with pytest.raises(kinetic.ConfigError, match="absolute path or a gs:// URI"):
        kinetic.run(output_dir=bad)


def test_absolute_and_gcs_output_dirs_are_accepted() -> None:
    kinetic.run(output_dir="/tmp/kinetic-out")
    kinetic.run(output_dir="gs://bucket/out")


def test_a_batch_inputs_job_id_attaches() -> None:
    fn = kinetic.run()(square)
    batch = fn.run_async_map([2, 3, 4])
    batch.wait(timeout=120)
    member = batch.jobs[1]
    assert member is not None
    attached = kinetic.attach(member.job_id)
    assert (attached.group_id, attached.group_index) == (batch.group_id, 1)
    assert attached.result(cleanup=False) == 9
    missing = member.job_id[:-8] + f"{7:08x}"  # same batch, no input 7
    with pytest.raises(kinetic.JobNotFoundError, match="no input 7"):
        kinetic.attach(missing)
