"""The coordinated pool (runner/pool/coordinator/) as real processes on a directory store:
a coordinator (``python -m runner.pool.coordinator``) on loopback and workers
(``python -m runner.pool`` with the batch's token), killed and restarted as pods are.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from runner import protocol, results_log
from runner.pool.coordinator import commits, wire
from runner.pool.coordinator import messages as m
from runner.pool.coordinator.link import connect
from runner.pool.coordinator.server import EXIT_DEPOSED
from runner.pool.counting import REQUESTS_MARKER
from runner.pool.signals import EXIT_TERMINATED
from runner.store import FileStore
from tests.local.test_pool_worker import GID, REPO, double, finish, record

pytestmark = [pytest.mark.local, pytest.mark.timeout(120)]

TOKEN = os.urandom(16)


def sleepy(x: int) -> int:
    time.sleep(0.05)
    return x * x


def fail_on_seven(x: int) -> int:
    if x == 7:
        raise ValueError("seven")
    time.sleep(0.1)
    return x


def noisy(x: int) -> int:
    time.sleep(0.05)
    print(f"finished {x}", flush=True)
    return x


def big(x: int) -> bytes:
    return bytes(2 << 20) if x == 1 else b"small"


def ran_here(x: int, log: str) -> int:
    time.sleep(3.5 if x < 2 else 0.02)  # the first two outlast the coordinator's 3 s of silence
    with open(log, "a") as f:
        f.write(f"{x}\n")
    return os.getpid()


def _env(name: str, token: bytes = TOKEN) -> dict[str, str]:
    return {
        **os.environ,
        "KINETIC_WORKER": name,
        "PYTHONPATH": str(REPO),
        wire.TOKEN_ENV: token.hex(),
    }


_STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _STARTED.append(proc)
    return proc


def start_coordinator(root: Path) -> subprocess.Popen[bytes]:
    storage = ["--storage", f"file://{root}", "--group", GID]
    return _start(["runner.pool.coordinator", *storage, "--host", "127.0.0.1"], _env("coordinator"))


def start_worker(root: Path, name: str, token: bytes = TOKEN) -> subprocess.Popen[bytes]:
    return _start(["runner.pool", "--storage", f"file://{root}", "--group", GID], _env(name, token))


def committed(store: FileStore) -> dict[int, tuple[dict[str, Any], Any]]:
    """What every reader reports: an input's object of its own, else the earliest
    commit's record."""
    found: dict[int, tuple[dict[str, Any], Any]] = {}
    prefix = commits.commits_prefix(GID)
    for key in sorted(store.list(prefix)):
        assert commits.parse_commit_key(GID, key) is not None, key
        for index, header, payload in results_log.decode_burst(store.read(key)):
            found.setdefault(index, (dict(header), cloudpickle.loads(payload)))
    own = protocol.group_results_prefix(GID)
    for key in store.list(own):
        index = protocol.parse_outcome_name(key.removeprefix(own))
        assert index is not None
        header, payload = protocol.decode_outcome(store.read(key))
        found[index] = (dict(header), cloudpickle.loads(payload))
    return found


def test_a_coordinator_hands_out_the_inputs_and_commits_each_once(tmp_path: Path) -> None:
    n = 60
    store = record(tmp_path, double, [((i,), {}) for i in range(n)])
    procs = [start_worker(tmp_path, f"w{k}") for k in range(3)]  # before their coordinator
    time.sleep(0.5)
    coordinator = start_coordinator(tmp_path)
    outs = finish([coordinator, *procs])
    found = committed(store)
    assert sorted(found) == list(range(n))
    assert all(payload["result"] == 2 * i for i, (_, payload) in found.items())
    assert found[5][0]["output"] == "doubling 5\n"
    assert {h["worker"] for h, _ in found.values()} <= {"w0", "w1", "w2"}
    # Few objects: commits by time, not by input; no claim, no burst.
    assert len(store.list(commits.commits_prefix(GID))) < n / 3
    assert not store.list(protocol.group_claims_prefix(GID))
    assert not store.list(protocol.group_bursts_prefix(GID))
    assert store.list(commits.coordinator_prefix(GID)) == [
        commits.coordinator_key(GID, 0),
        commits.done_key(GID),
        commits.running_key(GID),
    ]
    assert "epoch 0 finished" in outs[0]


def test_workers_read_the_batch_from_their_coordinator(tmp_path: Path) -> None:
    n = 60
    store = record(tmp_path, double, [((i,), {}) for i in range(n)])  # 15 chunks
    coordinator = start_coordinator(tmp_path)
    deadline = time.monotonic() + 30
    while not store.list(commits.coordinator_prefix(GID)):
        assert time.monotonic() < deadline, "the coordinator never took its epoch"
        time.sleep(0.05)
    procs = [start_worker(tmp_path, f"w{k}") for k in range(3)]
    outs = finish([coordinator, *procs])
    found = committed(store)
    assert sorted(found) == list(range(n))
    assert all(payload["result"] == 2 * i for i, (_, payload) in found.items())
    for out in outs[1:]:
        (line,) = (x for x in out.splitlines() if x.startswith(REQUESTS_MARKER))
        # Epoch 0's record, one read: the manifest, the function and every input chunk
        # came from the coordinator's shelf, and the stop from the coordinator.
        assert json.loads(line.removeprefix(REQUESTS_MARKER)) == {"read": 1}, out


def test_reuse_process_runs_the_inputs_in_the_workers_own_processes(tmp_path: Path) -> None:
    n, log = 12, tmp_path / "ran.log"
    store = record(
        tmp_path / "s", ran_here, [((i, str(log)), {}) for i in range(n)], reuse_process=True
    )
    procs = [
        start_coordinator(tmp_path / "s"),
        *(start_worker(tmp_path / "s", f"w{k}") for k in range(2)),
    ]
    # While a long input runs, the coordinator says so (readers' statuses).
    running: list[int] = []
    deadline = time.monotonic() + 30
    while not {0, 1} & set(running) and time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            running = commits.decode_running(store.read(commits.running_key(GID)))
        time.sleep(0.1)
    assert {0, 1} & set(running), running
    finish(procs)
    found = committed(store)
    assert sorted(found) == list(range(n))
    assert {payload["result"] for _, payload in found.values()} <= {p.pid for p in procs[1:]}
    # Each ran once: a worker in a long input still beats (its upkeep thread), so its
    # inputs are not presumed abandoned and handed to the other.
    assert sorted(int(x) for x in log.read_text().split()) == list(range(n))


def test_a_large_result_is_an_object_of_its_own(tmp_path: Path) -> None:
    store = record(tmp_path, big, [((i,), {}) for i in range(4)])
    finish([start_coordinator(tmp_path), start_worker(tmp_path, "w0")])
    found = committed(store)
    assert found[1][1]["result"] == bytes(2 << 20)
    assert found[2][1]["result"] == b"small"
    assert store.list(protocol.group_results_prefix(GID)) == [protocol.group_outcome_key(GID, 1)]


def test_a_killed_worker_and_a_killed_coordinator_lose_nothing(tmp_path: Path) -> None:
    n = 120
    store = record(tmp_path, sleepy, [((i,), {}) for i in range(n)], max_concurrent=3)
    coordinator = start_coordinator(tmp_path)
    workers = [start_worker(tmp_path, f"w{k}") for k in range(3)]
    time.sleep(1.5)
    os.killpg(workers[0].pid, signal.SIGKILL)  # its pod gone: its span goes to the others
    workers[0].wait()
    os.killpg(coordinator.pid, signal.SIGKILL)  # and the coordinator: a new one takes over
    coordinator.wait()
    time.sleep(0.5)
    again = start_coordinator(tmp_path)
    outs = finish([again, *workers[1:]])
    found = committed(store)
    assert sorted(found) == list(range(n))
    assert all(payload["result"] == i * i for i, (_, payload) in found.items())
    assert "epoch 1 on" in outs[0]
    assert commits.coordinator_key(GID, 1) in store.list(commits.coordinator_prefix(GID))


def test_fail_fast_stops_every_worker(tmp_path: Path) -> None:
    n = 200
    store = record(tmp_path, fail_on_seven, [((i,), {}) for i in range(n)], fail_fast=True)
    procs = [
        start_coordinator(tmp_path),
        start_worker(tmp_path, "w0"),
        start_worker(tmp_path, "w1"),
    ]
    finish(procs)
    stop = protocol.load_json(store.read(protocol.group_stop_key(GID)))
    assert stop["reason"] == "fail_fast"
    found = committed(store)
    assert found[7][0]["state"] == "failed"
    assert len(found) < n / 2  # the rest never started


def test_a_cancel_keeps_the_outcomes_of_inputs_that_finished(tmp_path: Path) -> None:
    n = 400
    store = record(tmp_path, noisy, [((i,), {}) for i in range(n)])
    procs = [
        start_coordinator(tmp_path),
        start_worker(tmp_path, "w0"),
        start_worker(tmp_path, "w1"),
    ]
    time.sleep(2.0)
    stop = protocol.stop_record("cancelled", "cancelled by the test")
    store.create_if_absent(protocol.group_stop_key(GID), protocol.dump_json(stop))
    outs = finish(procs, timeout=20)
    assert all("exits (cancelled)" in out for out in outs[1:])
    finished = {
        int(line.split()[1])
        for out in outs[1:]
        for line in out.splitlines()
        if line.startswith("finished ")
    }
    found = committed(store)
    assert 0 < len(found) < n
    # Every input that finished has its outcome, but the one each worker was running
    # when the stop ended it (it may have printed its line as it was ended).
    assert len(finished - set(found)) <= 2
    assert set(found) <= finished


def test_a_peer_without_the_token_is_refused(tmp_path: Path) -> None:
    record(tmp_path, double, [((i,), {}) for i in range(3)])
    coordinator = start_coordinator(tmp_path)
    try:
        store = FileStore(tmp_path)
        deadline = time.monotonic() + 20
        while commits.coordinator_key(GID, 0) not in store.list(commits.coordinator_prefix(GID)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        where = commits.decode_coordinator(store.read(commits.coordinator_key(GID, 0)))
        with pytest.raises(OSError, match="closed the connection"):
            connect(where["host"], where["port"], 0, b"not the batch's token!", m.Hello("intruder"))
        # An address read from a record of another epoch is not taken for this one.
        with pytest.raises(wire.WireError, match="is epoch 0's, not 5's"):
            connect(where["host"], where["port"], 5, TOKEN, m.Hello("late"))
        # Bytes that are no frame are refused too, and the coordinator serves on.
        with socket.create_connection((where["host"], where["port"]), timeout=5) as sock:
            sock.recv(1 << 10)  # the challenge
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
            assert sock.recv(1 << 10) == b""
        finish([start_worker(tmp_path, "w0")], timeout=30)
        assert finish([coordinator], timeout=30)
        assert sorted(committed(store)) == [0, 1, 2]
    finally:
        if coordinator.poll() is None:
            os.killpg(coordinator.pid, signal.SIGKILL)
            coordinator.wait()


def test_a_worker_deleted_mid_input_exits_terminated_and_keeps_what_it_finished(
    tmp_path: Path,
) -> None:
    n = 100
    store = record(tmp_path, noisy, [((i,), {}) for i in range(n)], max_concurrent=1)
    coordinator = start_coordinator(tmp_path)
    worker = start_worker(tmp_path, "w0")
    time.sleep(1.5)
    worker.send_signal(signal.SIGTERM)  # its pod deleted: the container's main process
    out = worker.communicate(timeout=20)[0].decode()
    assert worker.returncode == EXIT_TERMINATED, out  # a drained worker is replaced
    assert "exits (terminated)" in out
    finished = {int(line.split()[1]) for line in out.splitlines() if line.startswith("finished ")}
    assert finished
    assert finished - set(committed(store)) <= {max(finished)}
    finish([start_worker(tmp_path, "w1"), coordinator])  # its replacement finishes
    assert sorted(committed(store)) == list(range(n))


def test_a_coordinator_without_a_token_says_so(tmp_path: Path) -> None:
    record(tmp_path, double, [((0,), {})])
    env = {k: v for k, v in _env("coordinator").items() if k != wire.TOKEN_ENV}
    proc = _start(
        [
            "runner.pool.coordinator",
            "--storage",
            f"file://{tmp_path}",
            "--group",
            GID,
            "--host",
            "127.0.0.1",
        ],
        env,
    )
    out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 2
    assert f"{wire.TOKEN_ENV} must hold the batch's token" in out


def test_a_coordinator_replaced_while_alive_stops_committing(tmp_path: Path) -> None:
    """Its pod cut off and replaced (a node partition): it learns of its successor at its
    next commit and commits no more; the workers carry on with the successor."""
    n = 100
    store = record(tmp_path, sleepy, [((i,), {}) for i in range(n)], max_concurrent=1)
    first = start_coordinator(tmp_path)
    worker = start_worker(tmp_path, "w0")
    prefix = commits.commits_prefix(GID)
    deadline = time.monotonic() + 30
    while not store.list(prefix):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # A successor's record (its address is nobody's): the first sees it at its next commit.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    successor = commits.CoordinatorRecord(host="127.0.0.1", port=port, started=time.time())
    store.create_if_absent(commits.coordinator_key(GID, 1), commits.encode_coordinator(successor))
    out = first.communicate(timeout=30)[0].decode()
    assert first.returncode == EXIT_DEPOSED  # not 0: that would complete its Job
    assert "epoch 0 stops: epoch 1 started" in out
    before = set(store.list(prefix))
    assert all(commits.parse_commit_key(GID, k) == (0, i) for i, k in enumerate(sorted(before)))
    third = start_coordinator(tmp_path)  # epoch 2: the workers find the highest
    finish([third, worker])
    assert sorted(committed(store)) == list(range(n))
    after = set(store.list(prefix))
    assert {k for k in after if k.removeprefix(prefix).startswith("0000-")} == before
    assert {k.removeprefix(prefix)[:4] for k in after} == {"0000", "0002"}


def test_pods_deleted_together_keep_what_finished_and_a_new_pool_carries_on(
    tmp_path: Path,
) -> None:
    """The pool's pods deleted at once (a drained node pool, a cancel's delete): the
    coordinator serves on while its workers report their last outcomes."""
    n = 150
    store = record(tmp_path, noisy, [((i,), {}) for i in range(n)], max_concurrent=2)
    coordinator = start_coordinator(tmp_path)
    workers = [start_worker(tmp_path, f"w{k}") for k in range(2)]
    time.sleep(1.5)
    for proc in (coordinator, *workers):
        proc.send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=30)[0].decode() for p in (coordinator, *workers)]
    assert "kinetic coordinator: epoch 0 terminated" in outs[0]
    assert coordinator.returncode == EXIT_TERMINATED  # its Job replaces it
    assert all(p.returncode == EXIT_TERMINATED for p in workers), outs[1:]
    finished = {
        int(line.split()[1])
        for out in outs[1:]
        for line in out.splitlines()
        if line.startswith("finished ")
    }
    kept = set(committed(store))
    assert len(finished - kept) <= 2  # at most the input each worker was running
    assert kept <= finished
    finish([start_coordinator(tmp_path), start_worker(tmp_path, "w9")])
    assert sorted(committed(store)) == list(range(n))
