"""The GKE pool's worker (``python -m runner.pool``) on a directory store, as real processes.

The same worker runs in the pods of a pool batch (tests/cluster/test_gke_pool.py); here
several run side by side on this machine against ``file://`` storage, which has the
same create-if-absent claims, so races, crashes and lease takeovers are cheap to try.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import kinetic
from runner import protocol, results_log
from runner.pool.spans import parse_claim
from runner.store import FileStore

REPO = Path(__file__).resolve().parents[2]
GID = "grp-00000000aaaa"

pytestmark = [pytest.mark.local, pytest.mark.timeout(120)]


def double(x: int) -> int:
    print(f"doubling {x}", flush=True)
    return 2 * x


def crash_on_three(x: int) -> int:
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def slow_on_zero(x: int, flag: str) -> int:
    if x == 0 and not os.path.exists(flag):
        open(flag, "w").close()  # the first run of input 0 marks that it started
        time.sleep(60)
    return x


_COUNT = [0]


def pid_and_count(x: int) -> tuple[int, int]:
    """Which process ran the input, and how many inputs that process ran so far."""
    print(f"counting {x}", flush=True)
    _COUNT[0] += 1
    return os.getpid(), _COUNT[0]


def pid_parent_and_count(x: int) -> tuple[int, int, int]:
    """Which process ran the input, its parent, and how many inputs it ran so far."""
    _COUNT[0] += 1
    return os.getpid(), os.getppid(), _COUNT[0]


class _Unloadable:
    """Pickles as a reference to a module no worker has: unpickling fails."""

    def __reduce__(self) -> tuple[Any, ...]:
        import importlib

        return importlib.import_module, ("kinetic_no_such_module",)


def doomed_worker(tmp_path: Path) -> tuple[FileStore, subprocess.Popen[bytes]]:
    """A batch of 4 (2 s lease) and a worker that is running its input 0, which would
    sleep a minute (a later run of input 0 does not)."""
    flag = tmp_path / "started"
    store = record(
        tmp_path, slow_on_zero, [((i, str(flag)), {}) for i in range(4)], chunk=4, lease=2.0
    )
    worker = start_worker(tmp_path, "doomed")
    deadline = time.monotonic() + 30
    while not flag.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return store, worker


def hang_on_five(x: int, flag: str) -> int:
    if x == 5:
        open(flag, "w").close()  # inputs 0 to 4 ran: their outcomes wait in the buffer
        time.sleep(60)
    return x


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def fail_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("two")
    # Slow enough that the other inputs outlast a worker's stop check (every STOP_EVERY s):
    # 27 inputs after the failure take > 2 s on two workers, so some never start.
    time.sleep(0.2)
    return x


def record(
    root: Path, fn: Any, calls: list[tuple[tuple[Any, ...], dict[str, Any]]], **kw: Any
) -> FileStore:
    """Record a batch the way submission does (manifest last)."""
    store = FileStore(root)
    chunk = kw.pop("chunk", 4)
    lease = kw.pop("lease", 30.0)
    reuse = kw.pop("reuse_process", False)
    fn_bytes = bytes(cloudpickle.dumps(fn))
    options = {
        "input_mode": "auto",
        "max_concurrent": 3,
        "retries": 0,
        "fail_fast": False,
        "cancel_running_on_fail": False,
    }
    options.update(kw)
    manifest = {
        "format": protocol.FORMAT,
        "group_id": GID,
        "total": len(calls),
        "chunk_size": chunk,
        "func_name": getattr(fn, "__name__", "fn"),
        "options": options,
        "spec": {
            "format": protocol.FORMAT,
            "job_id": GID,
            "func_name": "fn",
            "payload_sha256": hashlib.sha256(fn_bytes).hexdigest(),
            "context_key": None,
            "context_sha256": None,
            "cwd": None,
            "sys_path": [],
            "env": {},
            "output_dir": str(root / "outputs"),
        },
        "gke": {"engine": protocol.ENGINE_POOL, "lease_s": lease, "reuse_process": reuse},
    }
    store.write(protocol.group_payload_key(GID), fn_bytes)
    for n, start in enumerate(range(0, len(calls), chunk)):
        part = bytes(cloudpickle.dumps(calls[start : start + chunk]))
        store.write(protocol.group_inputs_key(GID, n), part)
    store.write(protocol.group_manifest_key(GID), protocol.dump_json(manifest))
    return store


def start_worker(
    root: Path, name: str, index: int | None = None, pool: int | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KINETIC_WORKER": name, "PYTHONPATH": str(REPO)}
    if index is not None:  # an Indexed Job's completion index
        env["KINETIC_WORKER_INDEX"] = str(index)
    if pool is not None:  # the pool's size, as the Job tells its pods
        env["KINETIC_POOL_WORKERS"] = str(pool)
    return subprocess.Popen(
        [sys.executable, "-m", "runner.pool", "--storage", f"file://{root}", "--group", GID],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finish(procs: list[subprocess.Popen[bytes]], timeout: float = 60) -> list[str]:
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(out.decode(errors="replace"))
        assert p.returncode == 0, outs[-1]
    return outs


def outcomes(store: FileStore) -> dict[int, tuple[dict[str, Any], Any]]:
    """Every input's outcome, from the bursts and the outcome objects of their own; an
    input with two outcomes fails the test (none is ever written twice here)."""
    found: dict[int, tuple[dict[str, Any], Any]] = {}
    bursts = protocol.group_bursts_prefix(GID)
    for key in store.list(bursts):
        assert protocol.parse_burst_name(key.removeprefix(bursts)) is not None, key
        for index, header, payload in results_log.decode_burst(store.read(key)):
            assert index not in found, f"input {index} has two outcomes"
            found[index] = (dict(header), cloudpickle.loads(payload))
    prefix = protocol.group_results_prefix(GID)
    for key in store.list(prefix):
        index = protocol.parse_outcome_name(key.removeprefix(prefix))
        assert index is not None
        assert index not in found, f"input {index} has two outcomes"
        header, payload = protocol.decode_outcome(store.read(key))
        found[index] = (dict(header), cloudpickle.loads(payload))
    return found


def claims(store: FileStore) -> list[tuple[int, int, int, int]]:
    """``(start, number, first, end)`` of every claim."""
    prefix = protocol.group_claims_prefix(GID)
    out = []
    for key in store.list(prefix):
        parsed = protocol.parse_claim_name(key.removeprefix(prefix))
        assert parsed is not None
        span = parse_claim(*parsed, store.read(key))
        assert span is not None
        out.append((span.start, span.number, span.first, span.end))
    return sorted(out)


def test_workers_share_the_inputs_once_each(tmp_path: Path) -> None:
    n = 40
    store = record(tmp_path, double, [((i,), {}) for i in range(n)])
    finish([start_worker(tmp_path, f"w{k}") for k in range(3)])
    found = outcomes(store)
    assert sorted(found) == list(range(n))
    assert all(payload["result"] == 2 * i for i, (_, payload) in found.items())
    # Spans: claims that tile the inputs without overlap, each a first claim.
    spans = claims(store)
    assert all(number == 0 and first == start for start, number, first, _ in spans)
    assert [(s, e) for s, _, _, e in spans] == list(
        zip([s for s, *_ in spans], [s for s, *_ in spans[1:]] + [n], strict=True)
    )
    assert len(spans) < n / 2  # far fewer claims than inputs
    assert found[5][0]["output"] == "doubling 5\n"
    assert {h["worker"] for h, _ in found.values()} <= {"w0", "w1", "w2"}
    bursts = store.list(protocol.group_bursts_prefix(GID))
    assert len(bursts) <= 2 * len(spans)
    assert not store.list(protocol.group_results_prefix(GID))


def test_inputs_may_run_in_the_workers_own_process(tmp_path: Path) -> None:
    n = 20
    store = record(tmp_path, pid_and_count, [((i,), {}) for i in range(n)], reuse_process=True)
    out = finish([start_worker(tmp_path, "w0")])
    found = outcomes(store)
    assert sorted(found) == list(range(n))
    pids = {payload["result"][0] for _, payload in found.values()}
    assert len(pids) == 1  # one process, the worker's: no fork per input
    assert sorted(payload["result"][1] for _, payload in found.values()) == list(range(1, n + 1))
    assert found[3][0]["output"] == "counting 3\n"
    assert "counting 3" in out[0]  # copied to the pod's log too


def test_each_input_runs_in_a_fresh_process_forked_from_the_zygote(tmp_path: Path) -> None:
    n = 12
    store = record(tmp_path, pid_parent_and_count, [((i,), {}) for i in range(n)])
    worker = start_worker(tmp_path, "w0")
    finish([worker])
    results = [payload["result"] for _, payload in outcomes(store).values()]
    assert len({pid for pid, _, _ in results}) == n  # a process per input
    assert {count for _, _, count in results} == {1}  # no input sees another's globals
    parents = {parent for _, parent, _ in results}
    assert len(parents) == 1  # all forked from one process: the zygote, not the worker
    assert parents != {worker.pid}


def test_a_function_that_cannot_be_unpickled_stops_the_batch(tmp_path: Path) -> None:
    store = record(tmp_path, _Unloadable(), [((1,), {})])
    out = finish([start_worker(tmp_path, "w0")])
    stop = protocol.load_json(store.read(protocol.group_stop_key(GID)))
    assert (stop["reason"], stop["phase"]) == ("failed", "deserialize"), out
    assert "kinetic_no_such_module" in stop["detail"]


def test_a_worker_whose_zygote_dies_exits_and_its_span_is_taken_over(tmp_path: Path) -> None:
    store, first = doomed_worker(tmp_path)
    try:
        (zygote,) = children(first.pid)
        os.kill(zygote, signal.SIGKILL)
        out, _ = first.communicate(timeout=30)
        assert first.returncode != 0
        assert b"zygote" in out
    finally:
        with contextlib.suppress(ProcessLookupError):  # input 0's process, orphaned, sleeps on
            os.killpg(first.pid, signal.SIGKILL)
    finish([start_worker(tmp_path, "heir")])
    found = outcomes(store)
    assert sorted(found) == [0, 1, 2, 3]
    assert found[0][0]["worker"] == "heir"


def test_an_input_that_kills_its_process_fails_alone(tmp_path: Path) -> None:
    store = record(tmp_path, crash_on_three, [((i,), {}) for i in range(6)], retries=1)
    finish([start_worker(tmp_path, "w0")])
    found = outcomes(store)
    assert [found[i][1]["result"] for i in (0, 1, 2, 4, 5)] == [0, 1, 2, 4, 5]
    header, payload = found[3]
    assert header["state"] == "failed"
    assert header["attempt"] == 1
    assert "killed by signal 9" in payload["error"]


def test_a_dead_workers_input_is_taken_over_after_its_lease(tmp_path: Path) -> None:
    store, first = doomed_worker(tmp_path)
    os.killpg(first.pid, signal.SIGKILL)  # the worker and the input's process
    first.communicate()
    finish([start_worker(tmp_path, "heir")])
    found = outcomes(store)
    assert sorted(found) == [0, 1, 2, 3]
    assert found[0][0]["worker"] == "heir"
    assert found[0][0]["claim"] == 1
    # Input 0's span was taken over from its first input without an outcome.
    assert any(c[:3] == (0, 1, 0) for c in claims(store)), claims(store)


def test_fail_fast_stops_the_pool(tmp_path: Path) -> None:
    # Worker 0 of the Indexed Job starts on the first region, so input 2 fails within its
    # first inputs (a worker with no index picks its region at random: the first region
    # could come last, taken at the end in short spans that all ran before a stop read).
    calls = [((i,), {}) for i in range(30)]
    store = record(tmp_path, fail_on_two, calls, chunk=30, fail_fast=True)
    finish([start_worker(tmp_path, f"w{k}", index=k) for k in range(2)])
    stop = protocol.load_json(store.read(protocol.group_stop_key(GID)))
    assert stop["reason"] == "fail_fast"
    assert "input 2" in stop["detail"]
    found = outcomes(store)
    assert found[2][0]["state"] == "failed"
    assert len(found) < 30  # the rest never ran


@pytest.mark.parametrize("reuse_process", [False, True])
def test_a_worker_deleted_mid_input_writes_the_outcomes_it_buffered(
    tmp_path: Path, reuse_process: bool
) -> None:
    """cancel() deletes the pool's pods: each worker gets SIGTERM, then a grace. The
    input it runs is cut (no outcome: the stopped batch reports it cancelled), but the
    inputs it finished have run — their side effects are done — and their outcomes,
    buffered for a burst, are written before it exits."""
    flag = tmp_path / "started"
    # 4,000 workers: bursts wait 10 s (spread from 7.5 s), so inputs 0-4 are still
    # buffered when input 5 starts; worker 0's first span is its whole region, [0, 8).
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
    calls = [((i, str(flag)), {}) for i in range(4000 * 8)]
    store = record(
        tmp_path,
        hang_on_five,
        calls,
        chunk=1000,
        max_concurrent=4000,
        reuse_process=reuse_process,
    )
    worker = start_worker(tmp_path, "w0", index=0, pool=4000)  # its start: 1 ms at most
    try:
        deadline = time.monotonic() + 30
        while not flag.exists():
            assert time.monotonic() < deadline, "input 5 never started"
            assert worker.poll() is None
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # input 5, if it outlived the worker
            os.killpg(worker.pid, signal.SIGKILL)
    text = out.decode(errors="replace")
    found = outcomes(store)
    assert sorted(found) == [0, 1, 2, 3, 4], text
    assert all(found[i][1]["result"] == i for i in range(5))
    assert worker.returncode == 128 + signal.SIGTERM, text  # not 0: a drained node's
    assert not store.list(protocol.group_stop_key(GID))  # the pod ended, not the batch


def test_an_unusable_function_stops_the_batch_with_the_phase(tmp_path: Path) -> None:
    store = record(tmp_path, double, [((1,), {})])
    store.write(protocol.group_payload_key(GID), b"corrupted")
    finish([start_worker(tmp_path, "w0")])
    stop = protocol.load_json(store.read(protocol.group_stop_key(GID)))
    assert stop["reason"] == "failed"
    assert stop["phase"] == "verify"
    assert outcomes(store) == {}


@kinetic.run()
def negate(x: int) -> int:
    return -x


def test_pod_per_input_is_checked_and_means_nothing_locally() -> None:
    with pytest.raises(kinetic.ConfigError, match="pod_per_input"):
        negate.run_async_map([1], pod_per_input="yes")  # type: ignore[arg-type]
    batch = negate.run_async_map([1, 2], pod_per_input=True)
    assert batch.results(timeout=60) == [-1, -2]
