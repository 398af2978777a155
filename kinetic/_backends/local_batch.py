"""The local backend's side of batches: launching the supervisor, talking to it, and
reading the durable records when it is not there.

The supervisor (:mod:`runner.batch`) is the only writer of a batch's progress. This
module never guesses from wall-clock time: it listens to the supervisor's event
socket while one runs, and reads the results directory when none does. Whether a
supervisor runs is answered by its ``flock``, which the kernel drops when it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from kinetic._backends._process import spawn_detached
from kinetic._exceptions import BackendError, ObjectNotFoundError
from kinetic._storage.local import LocalStorage
from runner import _results_log as results_log
from runner import protocol
from runner.batch import socket_address


@dataclass
class BatchEvents:
    """What one read of the supervisor's stream (or of the records) taught us."""

    done: list[tuple[int, str]] = field(default_factory=list)
    """(index, state) in completion order; state is succeeded/failed/cancelled."""
    running: list[int] = field(default_factory=list)
    snapshot_complete: bool = False
    stop: dict[str, Any] | None = None
    """The batch's stop record, once it stopped and nothing of it runs any more."""


_STATE = {"s": "succeeded", "f": "failed", "c": "cancelled"}


class LocalBatches:
    """Batch operations of one local store."""

    def __init__(self, storage: LocalStorage, env: dict[str, str]) -> None:
        self.storage = storage
        self._env = env
        # What this process has parsed of each batch's results logs.
        self._offsets: dict[str, dict[Path, int]] = {}
        self._records: dict[str, dict[int, results_log.Record]] = {}

    def group_dir(self, group_id: str) -> Path:
        return self.storage.path_for(protocol.group_prefix(group_id).rstrip("/"))

    async def launch(self, group_id: str) -> None:
        """Start a supervisor for the batch (a no-op one exits if another already runs)."""
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

        def _spawn() -> None:
            spawn_detached(
                argv,
                log_file=group_dir / "supervisor.log",
                status_file=group_dir / "supervisor.exit",
                cwd=group_dir,
                env=self._env,
            )

        await anyio.to_thread.run_sync(_spawn)

    def supervisor_running(self, group_id: str) -> bool:
        """Whether a supervisor holds the batch's lock. Blocking but instant."""
        lock_path = self.group_dir(group_id) / "supervisor.lock"
        try:
            fd = os.open(lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    async def connect(self, group_id: str) -> anyio.abc.SocketStream | None:
        """A stream of the supervisor's events, or None when no supervisor listens."""
        try:
            return await anyio.connect_unix(socket_address(self.storage.url, group_id))
        except (ConnectionRefusedError, FileNotFoundError):
            return None

    async def send(self, group_id: str, command: str) -> bool:
        """Send a command to the supervisor; False when none is listening."""
        stream = await self.connect(group_id)
        if stream is None:
            return False
        async with stream:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.send(command.encode() + b"\n")
                return True
        return False

    def _scan_sync(self, group_id: str) -> list[results_log.Record]:
        """Parse what was appended to the batch's results logs since the last scan."""
        results = self.storage.path_for(protocol.group_results_prefix(group_id).rstrip("/"))
        offsets = self._offsets.setdefault(group_id, {})
        known = self._records.setdefault(group_id, {})
        fresh: list[results_log.Record] = []
        for path in results_log.iter_logs(results):
            records, offsets[path] = results_log.read_new(path, offsets.get(path, 0))
            for record in records:
                if record.index not in known:
                    known[record.index] = record
                    fresh.append(record)
        return fresh

    async def read_states(self, group_id: str, known: set[int]) -> list[tuple[int, str]]:
        """(index, state) of the recorded inputs not in ``known``, in the order recorded."""
        await anyio.to_thread.run_sync(self._scan_sync, group_id)
        records = self._records.get(group_id, {})
        return [(i, str(r.header["state"])) for i, r in records.items() if i not in known]

    def forget(self, group_id: str) -> None:
        """Drop what was learnt of a batch's logs (after they were deleted)."""
        self._offsets.pop(group_id, None)
        self._records.pop(group_id, None)

    async def read_member(self, group_id: str, index: int) -> tuple[dict[str, Any], bytes]:
        """The header and payload of input ``index``'s result.

        :raises ObjectNotFoundError: when it has none yet.
        """
        loaded = await self.load_many(group_id, [index])
        if index not in loaded:
            raise ObjectNotFoundError(
                f"{protocol.group_results_prefix(group_id)}#{index}", self.storage.url
            )
        return loaded[index]

    async def load_many(
        self, group_id: str, indices: list[int]
    ) -> dict[int, tuple[dict[str, Any], bytes]]:
        """Headers and payloads of the given inputs that have results, in one worker thread."""

        def _load() -> dict[int, tuple[dict[str, Any], bytes]]:
            known = self._records.setdefault(group_id, {})
            if any(i not in known for i in indices):
                self._scan_sync(group_id)
            out: dict[int, tuple[dict[str, Any], bytes]] = {}
            for index in indices:
                record = known.get(index)
                if record is not None:
                    try:
                        out[index] = (record.header, results_log.read_payload(record))
                    except FileNotFoundError:
                        continue
            return out

        return await anyio.to_thread.run_sync(_load)

    async def record_member(
        self, group_id: str, index: int, header: dict[str, Any], payload: bytes
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
        try:
            return protocol.load_json(await self.storage.read(key))
        except ObjectNotFoundError:
            return None


def parse_events(lines: list[bytes], events: BatchEvents) -> None:
    """Parse supervisor event lines (``d i s``, ``r i``, ``e``) into ``events``."""
    for raw in lines:
        parts = raw.split()
        if not parts:
            continue
        kind = parts[0]
        if kind == b"d" and len(parts) == 3:
            events.done.append((int(parts[1]), _STATE.get(parts[2].decode(), "failed")))
        elif kind == b"r" and len(parts) == 2:
            events.running.append(int(parts[1]))
        elif kind == b"e":
            events.snapshot_complete = True


async def event_chunks(stream: anyio.abc.SocketStream) -> AsyncIterator[BatchEvents]:
    """Yield parsed events as they arrive, until the supervisor closes the stream."""
    buf = b""
    while True:
        try:
            data = await stream.receive(65536)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return
        buf += data
        *lines, buf = buf.split(b"\n")
        events = BatchEvents()
        parse_events(lines, events)
        yield events


def check_batch_backend_ready() -> None:
    """The local batch engine needs Linux abstract sockets and flock."""
    if not sys.platform.startswith("linux"):
        raise BackendError("the local batch engine needs Linux")
