"""Nothing is lost when the submitting process (or the supervisor) dies with SIGKILL."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kinetic

pytestmark = pytest.mark.local

N = 1000

_SUBMITTER = textwrap.dedent(
    """
    import time, kinetic

    @kinetic.run()
    def triple(x):
        time.sleep(0.001)
        return 3 * x

    batch = triple.run_async_map(range({n}))
    print(batch.group_id, flush=True)
    for handle in batch.as_completed():  # consume while the batch runs
        pass
    print("done", flush=True)
    """
).format(n=N)


def _groups(root: Path) -> list[str]:
    groups = root / "storage" / "_groups"
    return sorted(p.name for p in groups.iterdir()) if groups.is_dir() else []


def _kill_supervisor(root: Path, group_id: str) -> bool:
    record = root / "storage" / "_groups" / group_id / "supervisor.json"
    try:
        pid = json.loads(record.read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return False
    return True


@pytest.mark.parametrize("trial", range(5))
def test_kill_9_at_random_points_loses_no_input(trial: int, kinetic_env: Path) -> None:
    rng = random.Random(1000 + trial)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SUBMITTER], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    time.sleep(rng.uniform(0.0, 1.2))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.stderr is not None
    proc.stderr.close()
    assert proc.stdout is not None
    proc.stdout.close()
    groups = _groups(kinetic_env)
    assert len(groups) <= 1
    if not groups:
        return  # killed before anything was recorded: there is nothing to lose
    group_id = groups[0]
    if trial % 2 == 1:
        # Also kill the detached supervisor mid-run: a new one must resume the batch.
        _kill_supervisor(kinetic_env, group_id)
    manifest = kinetic_env / "storage" / "_groups" / group_id / "manifest.json"
    if not manifest.exists():
        # Killed while recording: the batch was never committed, and says so.
        with pytest.raises(kinetic.JobNotFoundError, match="never fully recorded"):
            kinetic.attach_batch(group_id)
        return
    batch = kinetic.attach_batch(group_id)
    assert batch.results(timeout=120) == [3 * x for x in range(N)]


def test_resumed_inputs_are_visible_as_at_least_once(kinetic_env: Path) -> None:
    @kinetic.run()
    def nap(x: int) -> int:
        time.sleep(0.02)
        return x

    batch = nap.run_async_map(range(200), max_concurrent=2)
    # The supervisor names itself before it runs any input (and 200 inputs take seconds):
    # kill it once it has, however long a loaded machine takes to start it.
    deadline = time.monotonic() + 30
    while not _kill_supervisor(kinetic_env, batch.group_id):
        assert time.monotonic() < deadline, "the supervisor did not start within 30 s"
        time.sleep(0.02)
    assert batch.results(timeout=120) == list(range(200))
    manifest = json.loads(
        (kinetic_env / "storage" / "_groups" / batch.group_id / "manifest.json").read_text()
    )
    assert manifest["delivery"] == "at-least-once"
