"""A worker's death is charged to the input it was running, and to no other (issue 14).

A worker runs the inputs it holds back to back and reports them in bursts, so when
it dies the supervisor may not yet have heard of the inputs it finished just before.
Those keep their recorded outcome (or their retry); the inputs it held but had not
started go back to the queue; only the input it was running is failed, or retried.
"""

from __future__ import annotations

import os
import random
import resource
import signal
from pathlib import Path

import pytest

import kinetic

pytestmark = pytest.mark.local

N = 24


@kinetic.run()
def crashy(x: int, how: str, marker_dir: str) -> int:
    """``ok``: returns 10x. ``exit``/``segv``: the process dies, on every attempt.
    ``raise_once``: fails its first attempt, then succeeds."""
    if how in ("exit", "segv", "raise_once"):
        fd = os.open(f"{marker_dir}/{x}.attempts", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, b".")
        attempts = os.fstat(fd).st_size
        os.close(fd)
        if how == "exit":
            os._exit(7)
        if how == "segv":
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file to write
            os.kill(os.getpid(), signal.SIGSEGV)
        if attempts == 1:
            raise RuntimeError(f"first attempt of input {x} fails")
    return 10 * x


def _plan(rng: random.Random, *, raisers: bool) -> list[str]:
    """Crashing inputs among successes, some next to each other, never at the very start."""
    hows = ["ok"] * N
    for i in rng.sample(range(2, N), 5):
        hows[i] = rng.choice(["exit", "segv"])
    if raisers:
        for i in rng.sample([i for i in range(N) if hows[i] == "ok"], 4):
            hows[i] = "raise_once"
    return hows


def _check(results: list[object], hows: list[str], marker_dir: Path, retries: int) -> None:
    for i, (result, how) in enumerate(zip(results, hows, strict=True)):
        if how in ("exit", "segv"):
            assert isinstance(result, kinetic.JobFailedError), (i, how, result)
            want = "exited with status 7" if how == "exit" else "killed by signal 11"
            assert f"{want} while running input {i}" in str(result), (i, how, result)
            # Each of its deaths was charged to it: one attempt per allowed try, no more
            # (the supervisor never died either, which would have rerun it from scratch).
            attempts = (marker_dir / f"{i}.attempts").read_text()
            assert attempts == "." * (retries + 1), (i, how, attempts)
        else:
            assert result == 10 * i, (i, how, result)


@pytest.mark.parametrize("trial", range(10))
def test_only_the_running_input_is_failed(trial: int, tmp_path: Path) -> None:
    rng = random.Random(14_000 + trial)
    hows = _plan(rng, raisers=False)
    inputs = [(x, how, str(tmp_path)) for x, how in enumerate(hows)]
    batch = crashy.run_async_map(inputs, max_concurrent=2 + trial % 3)
    _check(batch.results(return_exceptions=True, timeout=60), hows, tmp_path, retries=0)


@pytest.mark.parametrize("trial", range(8))
def test_retries_are_charged_to_the_running_input_only(trial: int, tmp_path: Path) -> None:
    rng = random.Random(14_100 + trial)
    hows = _plan(rng, raisers=True)
    inputs = [(x, how, str(tmp_path)) for x, how in enumerate(hows)]
    batch = crashy.run_async_map(inputs, max_concurrent=2 + trial % 3, retries=1)
    _check(batch.results(return_exceptions=True, timeout=60), hows, tmp_path, retries=1)
