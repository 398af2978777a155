"""A pool batch's run-time limit (``timeout=``) and its ``kinetic.Retries``, applied by the
pool worker (``python -m runner.pool``) as real processes on a directory store: inputs
forked from the zygote and run in the worker's own process alike."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import kinetic
from kinetic._core.retries import retries_record
from runner import protocol
from runner.store import FileStore
from tests.local.test_pool_worker import GID, finish, outcomes, record, start_worker

pytestmark = [pytest.mark.local, pytest.mark.timeout(120)]


def hangs_on_one(x: int) -> int:
    if x == 1:
        time.sleep(60)
    return x


def ignores_its_limit_on_one(x: int) -> int:
    if x == 1:
        try:
            time.sleep(60)
        except BaseException:  # noqa: BLE001 - a function that will not stop
            time.sleep(60)
    return x


@pytest.mark.parametrize("reuse_process", [False, True])
def test_an_input_past_the_limit_fails_naming_it_and_the_others_run(
    tmp_path: Path, reuse_process: bool
) -> None:
    store = record(
        tmp_path,
        hangs_on_one,
        [((i,), {}) for i in range(4)],
        reuse_process=reuse_process,
        retries=2,  # a time limit is never retried
    )
    spec_timeout(store, 1.0)
    finish([start_worker(tmp_path, "w")])
    found = outcomes(store)
    assert [found[i][1]["result"] for i in (0, 2, 3)] == [0, 2, 3]
    header, payload = found[1]
    assert (header["state"], header["phase"], header["attempt"]) == ("failed", "execute", 0)
    assert "time limit of 1 s" in header["error"]
    assert payload["exception"] is None  # a Kinetic failure, not the function's exception


def test_an_input_that_does_not_unwind_is_killed_and_fails_naming_the_limit(
    tmp_path: Path,
) -> None:
    store = record(tmp_path, ignores_its_limit_on_one, [((i,), {}) for i in range(3)])
    spec_timeout(store, 0.5)
    finish([start_worker(tmp_path, "w")], timeout=90)  # the limit, then the hard grace
    found = outcomes(store)
    assert [found[i][1]["result"] for i in (0, 2)] == [0, 2]
    assert found[1][0]["state"] == "failed"
    assert "time limit of 0.5 s" in found[1][0]["error"]


def flaky(x: int) -> int:
    attempt = int(os.environ["KINETIC_ATTEMPT"])
    print(f"input {x} attempt {attempt} at {time.monotonic()}", flush=True)
    if x == 0 and attempt < 2:
        raise ConnectionError(f"attempt {attempt}")
    if x == 1:
        raise KeyError("not retried")
    return x


@pytest.mark.parametrize("reuse_process", [False, True])
def test_a_retries_retries_what_on_names_after_its_back_off(
    tmp_path: Path, reuse_process: bool
) -> None:
    rule = retries_record(kinetic.Retries(3, initial_delay=0.3, backoff=2, on=(OSError,)))
    store = record(
        tmp_path,
        flaky,
        [((i,), {}) for i in range(3)],
        retries=3,
        retry_rule=rule,
        reuse_process=reuse_process,
    )
    (out,) = finish([start_worker(tmp_path, "w")])
    found = outcomes(store)
    # ConnectionError derives from OSError: retried twice, then its third attempt stands.
    assert (found[0][0]["state"], found[0][0]["attempt"], found[0][1]["result"]) == (
        "succeeded",
        2,
        0,
    )
    assert (found[1][0]["state"], found[1][0]["attempt"]) == ("failed", 0)  # KeyError
    starts = {
        int(words[3]): float(words[5])
        for line in out.splitlines()
        if (words := line.split())[:2] == ["input", "0"] and len(words) == 6
    }
    # (the back-off's order: the second wait doubles the first)
    assert starts[1] - starts[0] >= 0.3
    assert starts[2] - starts[1] >= 0.6


def spec_timeout(store: FileStore, seconds: float) -> None:
    """Give the recorded batch a run-time limit, as ``run(timeout=)`` records it."""
    key = protocol.group_manifest_key(GID)
    manifest = protocol.load_json(store.read(key))
    manifest["spec"]["timeout"] = seconds
    store.write(key, protocol.dump_json(manifest))
