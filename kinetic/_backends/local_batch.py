"""The local backend's side of batches: launching the supervisor, talking to it, and
reading the durable records when it is not there.

The supervisor (:mod:`runner.batch`) is the only writer of a batch's progress. This
module never guesses from wall-clock time: it listens to the supervisor's event
socket while one runs, and reads the results directory when none does. Whether a
supervisor runs is answered by its ``flock``, which the kernel drops when it dies.
"""

from __future__ import annotations

import os
import sys
import threading
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import cloudpickle
from anyio.abc import SocketAttribute

from kinetic._backends._process import ProcessRef, is_alive, spawn_detached
from kinetic._backends.base import BatchEvents, InputActivity, JobRef, Loaded, input_index
from kinetic._core.status import GPU_WAIT_REASON
from kinetic._exceptions import BackendError, ObjectNotFoundError
from kinetic._storage.local import LocalStorage, check_root
from runner import protocol, results_log
from runner.batch import SUPERVISOR_LOCK, socket_address
from runner.fs import lock_held, try_lock
from runner.gpu_lease import group_wait_key
from runner.peer import check_server

__all__ = [
    "BatchEvents",
    "Loaded",
    "LocalBatchRunner",
    "LocalBatches",
    "check_batch_backend_ready",
    "event_chunks",
    "parse_events",
]

_POLL = 0.1
"""Seconds an input's waiter sleeps when no supervisor answers (one is being started)."""

_STATE: dict[bytes, protocol.InputState] = {
    b"s": "succeeded",
    b"f": "failed",
    b"c": "cancelled",
}


class _LogIndex:
    """What this process parsed of one batch's results logs: where each input's record
    lies, compactly (about 21 bytes per input, whatever the record holds)."""

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.numbers: dict[Path, int] = {}
        self.parsed: list[int] = []  # per log: the offset parsed up to
        self.file = array("i")  # per input: its log's number + 1 (0: no record yet)
        self.body = array("q")  # per input: where its record's body starts, and its size
        self.size = array("i")
        self.state = bytearray()  # per input: its state's first letter
        self.order = array("q")  # inputs in the order their records were found

    def has(self, index: int) -> bool:
        return index < len(self.file) and self.file[index] != 0

    def _grow(self, index: int) -> None:
        more = max(index + 1, 2 * len(self.file), 1024) - len(self.file)
        for column in (self.file, self.body, self.size):
            column.frombytes(bytes(more * column.itemsize))
        self.state.extend(bytes(more))

    def scan(self, results_dir: Path) -> None:
        """Index what was appended to the logs since the last scan. Blocking."""
        for path in results_log.iter_logs(results_dir):
            number = self.numbers.get(path)
            if number is None:
                number = self.numbers[path] = len(self.paths)
                self.paths.append(path)
                self.parsed.append(0)
            offset = self.parsed[number]
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue
            found, end = results_log.scan(data)
            self.parsed[number] = offset + end
            for index, head, body, size in found:
                if index >= len(self.file):
                    self._grow(index)
                if self.file[index]:
                    continue  # the first record of an input is its outcome
                self.file[index] = number + 1
                self.body[index] = offset + body
                self.size[index] = size
                self.state[index] = _state_letter(head)
                self.order.append(index)

    def load(self, indices: list[int]) -> Loaded:
        """The records of ``indices`` that have one: each log read once, in one span
        where its records lie close together. Headers are shared: do not mutate them.
        Blocking."""
        by_file: dict[int, list[int]] = {}
        for index in indices:
            if self.has(index):
                by_file.setdefault(self.file[index] - 1, []).append(index)
        out: Loaded = {}
        for number, wanted in by_file.items():
            try:
                fd = os.open(self.paths[number], os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                body, size = self.body, self.size
                start = min(body[i] for i in wanted)
                end = max(body[i] + size[i] for i in wanted)
                needed = sum(size[i] for i in wanted)
                span = (
                    os.pread(fd, end - start, start) if end - start <= 2 * needed + _SPAN else None
                )
                for index in wanted:
                    at, length = body[index], size[index]
                    data = (
                        span[at - start : at - start + length]
                        if span is not None
                        else os.pread(fd, length, at)
                    )
                    head, _, payload = data.partition(b"\n")
                    out[index] = (results_log.header(head), payload)
            finally:
                os.close(fd)
        return out


_LAUNCHED_KEPT = 256  # supervisors remembered before the ended ones are forgotten
_ACK_TIMEOUT = 10.0  # seconds a command waits for the supervisor to act on it
# Seconds a command waits for a supervisor that holds the batch's lock to listen (it
# prepares the workspace first) or to end.
_SETTLE_TIMEOUT = 120.0
_SPAN = 1 << 20  # read a log's records in one span unless it holds this much more
_STATES: dict[int, protocol.InputState] = {
    ord("s"): "succeeded",
    ord("f"): "failed",
    ord("c"): "cancelled",
}


def _state_letter(head: bytes) -> int:
    state = str(results_log.header(head).get("state") or "failed")
    return ord(state[0]) if ord(state[0]) in _STATES else ord("f")


class LocalBatches:
    """Batch operations of one local store."""

    def __init__(self, storage: LocalStorage, env: dict[str, str]) -> None:
        self.storage = storage
        self._env = env
        # What this process has parsed of each batch's results logs.
        self._indexes: dict[str, _LogIndex] = {}
        # The supervisor this process last started per batch: while it lives (starting up
        # takes an interpreter's start, longer on a loaded machine) no other is started.
        self._launched: dict[str, ProcessRef] = {}
        self._launching = threading.Lock()

    def group_dir(self, group_id: str) -> Path:
        return self.storage.path_for(protocol.group_prefix(group_id).rstrip("/"))

    async def launch(self, group_id: str) -> None:
        """Start a supervisor for the batch, unless the one this process started last is
        still alive (starting, or running). A duplicate started by another process exits
        at once: the supervisor's lock decides."""
        group_dir = self.group_dir(group_id)
        argv = [
            sys.executable,
            "-m",
            "runner.batch",
            "--storage",
            self.storage.url,
            "--group",
            group_id,
        ]
        from kinetic._backends.local_gpus import apply_job_env

        # The inputs' environment is their pods' (a GPU batch: each worker leases its GPUs).
        manifest: protocol.BatchManifest | None = await self.read_json(
            protocol.group_manifest_key(group_id)
        )
        handle = manifest.get("handle") if isinstance(manifest, dict) else None
        accelerator = handle.get("accelerator") if isinstance(handle, dict) else None
        env = dict(self._env)
        apply_job_env(env, str(accelerator or "cpu"), self.storage.root.parent)

        def _spawn() -> None:
            check_root(self.storage.root.parent)
            with self._launching:
                launched = self._launched
                previous = launched.get(group_id)
                if previous is not None and is_alive(previous):
                    return
                if len(launched) >= _LAUNCHED_KEPT:
                    for key in [k for k, ref in launched.items() if not is_alive(ref)]:
                        del launched[key]
                launched[group_id] = spawn_detached(
                    argv,
                    log_file=group_dir / "supervisor.log",
                    status_file=group_dir / "supervisor.exit",
                    cwd=group_dir,
                    env=env,
                    append_log=True,  # a relaunch keeps why the supervisor before it ended
                )

        await anyio.to_thread.run_sync(_spawn)

    def supervisor_running(self, group_id: str) -> bool:
        """Whether a supervisor holds the batch's lock. Blocking but instant."""
        return lock_held(self.group_dir(group_id) / SUPERVISOR_LOCK)

    async def connect(self, group_id: str) -> anyio.abc.SocketStream | None:
        """A stream of the supervisor's events, or None when no supervisor listens.

        :raises BackendError: when the batch's socket is held by another user's process
            (never talked to: it could feed us false events).
        """
        try:
            address = await anyio.to_thread.run_sync(
                socket_address, self.group_dir(group_id), self.storage.url, group_id
            )
            stream = await anyio.connect_unix(address)
        except (ConnectionRefusedError, FileNotFoundError):
            return None
        try:
            check_server(stream.extra(SocketAttribute.raw_socket), f"batch {group_id}'s socket")
        except OSError as exc:
            await stream.aclose()
            raise BackendError(str(exc)) from exc
        return stream

    async def send(self, group_id: str, command: str) -> bool:
        """Send a command to the supervisor and wait (up to ``_ACK_TIMEOUT``) until it
        acted on it (a cancelled input is then out of every queue); False when no
        supervisor is listening."""
        stream = await self.connect(group_id)
        if stream is None:
            return False
        async with stream:
            try:
                await stream.send(command.encode() + b"\np\n")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return False
            with anyio.move_on_after(_ACK_TIMEOUT):
                tail = b""
                while True:  # the snapshot comes first; the answer "P" after it
                    try:
                        data = await stream.receive(1 << 18)
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
                    lines = (tail + data).split(b"\n")
                    tail = lines.pop()
                    if b"P" in lines:
                        break
        return True

    async def tell(
        self, group_id: str, command: str, otherwise: Callable[[], Awaitable[None]]
    ) -> bool:
        """Send ``command`` to the batch's supervisor; with none, await ``otherwise``
        (which records what the command asks) under the supervisor's lock: a supervisor
        that starts meanwhile takes the lock after it, and then reads the record. One
        that holds the lock without listening (it prepares the workspace, or ends) is
        waited for.

        :returns: True when a supervisor acted on ``command``, False when ``otherwise``
            ran.
        :raises BackendError: a supervisor held the lock without listening for
            ``_SETTLE_TIMEOUT`` seconds.
        """
        lock = self.group_dir(group_id) / SUPERVISOR_LOCK
        deadline = anyio.current_time() + _SETTLE_TIMEOUT
        while True:
            if await self.send(group_id, command):
                return True
            fd = await anyio.to_thread.run_sync(try_lock, lock)
            if fd is not None:
                try:
                    await otherwise()
                finally:
                    os.close(fd)
                return False
            if anyio.current_time() >= deadline:
                raise BackendError(
                    f"batch {group_id}: its supervisor held the batch for "
                    f"{_SETTLE_TIMEOUT:.0f}s without taking commands"
                )
            await anyio.sleep(_POLL / 5)

    def _index(self, group_id: str) -> _LogIndex:
        index = self._indexes.get(group_id)
        if index is None:
            index = self._indexes[group_id] = _LogIndex()
        return index

    def _scan_sync(self, group_id: str) -> _LogIndex:
        """Parse what was appended to the batch's results logs since the last scan."""
        results = self.storage.path_for(protocol.group_results_prefix(group_id).rstrip("/"))
        index = self._index(group_id)
        index.scan(results)
        return index

    async def read_states(
        self, group_id: str, known: Collection[int], since: int = 0
    ) -> tuple[list[tuple[int, protocol.InputState]], int]:
        """(index, state) of the inputs recorded after the first ``since`` (in the order
        recorded) that are not in ``known``; and the count recorded so far (the next
        ``since``: a follower that keeps it reads each record once)."""
        index = await anyio.to_thread.run_sync(self._scan_sync, group_id)
        state, order = index.state, index.order
        fresh = [(i, _STATES[state[i]]) for i in order[since:] if i not in known]
        return fresh, len(order)

    def forget(self, group_id: str) -> None:
        """Drop what was learnt of a batch's logs (after they were deleted)."""
        self._indexes.pop(group_id, None)

    async def read_member(self, group_id: str, index: int) -> tuple[protocol.OutcomeHeader, bytes]:
        """The header and payload of input ``index``'s result.

        :raises ObjectNotFoundError: when it has none yet.
        """
        loaded = await self.load_many(group_id, [index])
        if index not in loaded:
            raise ObjectNotFoundError(
                f"{protocol.group_results_prefix(group_id)}#{index}", self.storage.url
            )
        return loaded[index]

    async def load_many(self, group_id: str, indices: list[int]) -> Loaded:
        """Headers and payloads of the given inputs that have results, in one worker
        thread: each log read once (a span of it) for all of them."""

        def _load() -> Loaded:
            index = self._index(group_id)
            if not all(index.has(i) for i in indices):
                self._scan_sync(group_id)
            return index.load(indices)

        return await anyio.to_thread.run_sync(_load)

    async def record_member(
        self, group_id: str, index: int, header: protocol.OutcomeHeader, payload: bytes
    ) -> None:
        """Append an outcome for an input on this process's own log (no supervisor runs)."""
        path = self.storage.path_for(
            protocol.group_results_prefix(group_id) + f"client-{os.getpid()}.log"
        )

        def _append() -> None:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = results_log.open_log(path)
            try:
                results_log.append(fd, index, header, payload)
            finally:
                os.close(fd)

        await anyio.to_thread.run_sync(_append)

    async def member_logs(self, group_id: str, index: int) -> str:
        """The output input ``index`` produced, cut out of its worker's log."""
        logs_dir = self.storage.path_for(protocol.group_logs_prefix(group_id).rstrip("/"))
        marker = protocol.INPUT_MARKER

        def _extract() -> str:
            pieces: list[str] = []
            try:
                files = sorted(logs_dir.iterdir())
            except FileNotFoundError:
                return ""
            for path in files:
                inside = False
                with open(path, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        if line.startswith(marker):
                            inside = line[len(marker) :].strip() == str(index)
                        elif inside:
                            pieces.append(line)
            return "".join(pieces)

        return await anyio.to_thread.run_sync(_extract)

    async def read_json(self, key: str) -> Any:
        """The JSON record at ``key``, or None while it is absent.

        Absence is answered in the worker thread, not raised out of it: an exception that
        crosses the thread stays in a reference cycle with its future (anyio's), and its
        traceback would keep the caller's frames, and the batch, alive until the collector's
        next full pass.
        """
        path = self.storage.path_for(key)

        def _read() -> bytes | None:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return None

        data = await self.storage.run_io(_read)
        return None if data is None else protocol.load_json(data)

    async def read_stop(self, group_id: str) -> protocol.StopRecord | None:
        """The batch's stop record, or None while it has none."""
        stop: protocol.StopRecord | None = await self.read_json(protocol.group_stop_key(group_id))
        return stop


def parse_events(lines: list[bytes], events: BatchEvents) -> None:
    """Parse supervisor event lines (``D <s|f|c> i,i,…``, ``R i,i,…``, ``e``) into ``events``."""
    for raw in lines:
        if raw.startswith(b"D "):
            state = _STATE.get(raw[2:3], "failed")
            events.done.extend((int(i), state) for i in raw[4:].split(b","))
        elif raw.startswith(b"R "):
            events.running.extend(map(int, raw[2:].split(b",")))
        elif raw == b"e":
            events.snapshot_complete = True


async def event_chunks(stream: anyio.abc.SocketStream) -> AsyncIterator[BatchEvents]:
    """Yield parsed events as they arrive, until the supervisor closes the stream."""
    buf = b""
    while True:
        try:
            # 64 KiB of events (~9,000 inputs) at a time: each loop step stays short.
            data = await stream.receive(65536)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return
        buf += data
        *lines, buf = buf.split(b"\n")
        events = BatchEvents()
        parse_events(lines, events)
        yield events


class LocalBatchRunner:
    """The local supervisor engine, as a :class:`~kinetic._backends.base.BatchRunner`:
    events come from its socket while it runs, from its results logs otherwise, and a
    batch nobody drives gets a new supervisor."""

    def __init__(self, batches: LocalBatches) -> None:
        self.batches = batches

    @property
    def storage(self) -> LocalStorage:
        return self.batches.storage

    async def launch(self, group_id: str) -> None:
        await self.batches.launch(group_id)

    async def follow(self, group_id: str, known: Collection[int]) -> AsyncIterator[BatchEvents]:
        batches = self.batches
        seen = 0  # records already read (each is read once, however long this follows)
        while True:
            stream = await batches.connect(group_id)
            if stream is not None:
                async with stream:
                    async for events in event_chunks(stream):
                        yield events
                continue  # the supervisor ended: read what it left behind
            # No supervisor is listening: learn from the records it (or another) left.
            done, seen = await batches.read_states(group_id, known, seen)
            yield BatchEvents(done=done)
            stop = await batches.read_stop(group_id)
            running = await anyio.to_thread.run_sync(batches.supervisor_running, group_id)
            if stop is not None and not running:
                yield BatchEvents(stop=stop)
                continue
            if not running:
                # Unfinished and nobody drives it: resume (a duplicate supervisor exits at once).
                await batches.launch(group_id)
            await anyio.sleep(0.02)  # let the supervisor start listening

    async def snapshot(self, group_id: str, known: Collection[int]) -> BatchEvents:
        batches = self.batches
        out = BatchEvents()
        stream = await batches.connect(group_id)
        if stream is not None:
            out.snapshot_complete = True  # a supervisor answers: its view replaces ours
            async with stream:
                async for events in event_chunks(stream):
                    out.running.extend(events.running)
                    out.done.extend(events.done)
                    if events.snapshot_complete:
                        return out
        heard = {i for i, _ in out.done}
        recorded, _ = await batches.read_states(group_id, known)
        out.done.extend((i, state) for i, state in recorded if i not in heard)
        # No supervisor gave a whole snapshot, so none runs an input now: one that holds
        # the batch without answering is starting (it reads the stop record and exits) or
        # ending. A stop record therefore settles the inputs without an outcome.
        out.stop = await batches.read_stop(group_id)
        return out

    async def load_many(self, group_id: str, indices: list[int]) -> Loaded:
        return await self.batches.load_many(group_id, indices)

    async def cancel(self, group_id: str) -> None:
        """Tell the supervisor (it records the stop, ends the running inputs and exits;
        this waits for that); without one, record the stop unless every input has an
        outcome."""
        batches = self.batches

        async def record() -> None:
            manifest = await batches.read_json(protocol.group_manifest_key(group_id))
            _, recorded = await batches.read_states(group_id, ())
            if not isinstance(manifest, dict) or recorded < manifest["total"]:
                stop = protocol.stop_record("cancelled", "the batch was cancelled")
                await self.storage.write(
                    protocol.group_stop_key(group_id), protocol.dump_json(stop)
                )

        if not await batches.tell(group_id, "C", record):
            return
        # Wait for the supervisor to finish stopping, so statuses are settled on return.
        stream = await batches.connect(group_id)
        if stream is not None:
            async with stream:
                async for _ in event_chunks(stream):
                    pass

    async def release(self, group_id: str) -> None:
        return None  # the supervisor and its workers exit by themselves

    # -- one input ----------------------------------------------------------------------

    async def read_stop(self, group_id: str) -> protocol.StopRecord | None:
        return await self.batches.read_stop(group_id)

    async def input_activity(self, job: JobRef) -> InputActivity:
        """Running while a supervisor holds the batch; waiting while it waits for GPUs."""
        group_id = str(job.group_id)
        batches = self.batches
        if not await anyio.to_thread.run_sync(batches.supervisor_running, group_id):
            return InputActivity(running=False)
        waiting = await self.storage.exists(group_wait_key(group_id))
        return InputActivity(running=True, waiting=GPU_WAIT_REASON if waiting else None)

    async def input_changed(self, job: JobRef) -> None:
        """Return once the supervisor reported the input done, or ended (a batch nobody
        drives gets a supervisor)."""
        group_id, index = str(job.group_id), input_index(job)
        batches = self.batches
        stream = await batches.connect(group_id)
        if stream is None:
            if not await anyio.to_thread.run_sync(batches.supervisor_running, group_id):
                await batches.launch(group_id)  # resume a batch nobody drives
            await anyio.sleep(_POLL)
            return
        async with stream:
            async for events in event_chunks(stream):
                if any(i == index for i, _ in events.done):
                    return

    async def input_logs(self, job: JobRef) -> str:
        return await self.batches.member_logs(str(job.group_id), input_index(job))

    async def cancel_input(self, job: JobRef) -> None:
        """Tell the supervisor (it ends the input's run); without one, record it."""
        group_id, index = str(job.group_id), input_index(job)

        async def record() -> None:
            header = protocol.cancelled_header()
            payload = protocol.result_payload(success=False, error="cancelled")
            await self.batches.record_member(group_id, index, header, cloudpickle.dumps(payload))

        await self.batches.tell(group_id, f"c {index}", record)


def check_batch_backend_ready() -> None:
    """The local batch engine needs Linux abstract sockets and flock."""
    if not sys.platform.startswith("linux"):
        raise BackendError("the local batch engine needs Linux")
