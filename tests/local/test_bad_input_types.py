"""Arguments of the wrong type are clear errors naming the argument, at decoration or
call time: a truthy string must not switch a feature on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kinetic
from kinetic import aio
from tests.fix_env import job_dirs

pytestmark = pytest.mark.local


def plain(x: int) -> int:
    return x


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"spot": "false"}, "spot"),
        ({"debug": "no"}, "debug"),
        ({"debug": 1}, "debug"),
        ({"namespace": 123}, "namespace"),
        ({"accelerator": 4}, "accelerator"),
        ({"container_image": ["img"]}, "container_image"),
        ({"base_image_repo": 1}, "base_image_repo"),
        ({"zone": 1}, "zone"),
        ({"project": 1}, "project"),
        ({"cluster": 1}, "cluster"),
        ({"backend": 1}, "backend"),
        ({"output_dir": Path("/tmp/out")}, "output_dir"),
        ({"capture_env_vars": ["HOME", 3]}, "capture_env_vars"),
        ({"capture_env_vars": {"HOME": "x"}}, "capture_env_vars"),
    ],
)
def test_a_decorator_argument_of_the_wrong_type_is_named(
    kwargs: dict[str, Any], named: str
) -> None:
    for decorator in (kinetic.run, aio.run):
        with pytest.raises(kinetic.ConfigError, match=rf"^{named} must be"):
            decorator(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"fail_fast": "yes"}, "fail_fast"),
        ({"cancel_running_on_fail": "no"}, "cancel_running_on_fail"),
        ({"pod_per_input": "false"}, "pod_per_input"),
        ({"max_concurrent": "4"}, "max_concurrent"),
        ({"retries": 1.5}, "retries"),
        ({"name": 7}, "name"),
        ({"tags": {"a": 1}}, "tags"),
        ({"input_mode": 3}, "input_mode"),
    ],
)
def test_a_run_async_map_argument_of_the_wrong_type_is_named(
    kwargs: dict[str, Any], named: str, kinetic_env: Path
) -> None:
    fn = kinetic.run()(plain)
    with pytest.raises(kinetic.ConfigError, match=rf"^{named} must be"):
        fn.run_async_map([1, 2], **kwargs)
    assert job_dirs(kinetic_env) == []


def test_cancel_running_on_fail_without_fail_fast_is_refused(kinetic_env: Path) -> None:
    fn = kinetic.run()(plain)
    with pytest.raises(kinetic.ConfigError, match="needs fail_fast=True"):
        fn.run_async_map([1, 2], cancel_running_on_fail=True)
    assert job_dirs(kinetic_env) == []


def test_mapping_a_debug_function_is_refused(kinetic_env: Path) -> None:
    fn = kinetic.run(debug=True)(plain)
    with pytest.raises(kinetic.ConfigError, match="debug=True is for single jobs"):
        fn.run_async_map([1, 2])
    assert job_dirs(kinetic_env) == []


def test_negative_timeouts_and_counts_are_refused() -> None:
    job = kinetic.run()(plain).run_async(4)
    with pytest.raises(kinetic.ConfigError, match=r"^timeout must be a non-negative"):
        job.result(timeout=-1)
    with pytest.raises(kinetic.ConfigError, match=r"^timeout must be a non-negative"):
        job.result(timeout="60")  # type: ignore[arg-type]
    with pytest.raises(kinetic.ConfigError, match=r"^cleanup_timeout must be"):
        job.result(cleanup_timeout=-1)
    with pytest.raises(kinetic.ConfigError, match=r"^n must be a non-negative integer"):
        job.tail(n=-5)
    assert job.result(timeout=120) == 4  # the job itself was never disturbed


def test_negative_batch_timeouts_are_refused() -> None:
    batch = kinetic.run()(plain).run_async_map([1, 2])
    with pytest.raises(kinetic.ConfigError, match=r"^timeout must be a non-negative"):
        batch.wait(timeout=-1)
    with pytest.raises(kinetic.ConfigError, match=r"^timeout must be a non-negative"):
        batch.results(timeout=-3)
    assert batch.results(timeout=120) == [1, 2]
