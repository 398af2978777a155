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
from runner import protocol
from runner.batch import socket_address


@dataclass
class BatchEvents:
    """What one read of the supervisor's stream (or of the records) taught us."""

    done: list[tuple[int, str]] = field(default_factory=list)
    """(index, state) in completion order; state is succeeded/failed/cancelled."""
    running: list[int] = field(default_factory=list)
    snapshot_complete: bool = False


_STATE = {"s": "succeeded", "f": "failed", "c": "cancelled"}


class LocalBatches:
    """Batch operations of one local store."""

    def __init__(self, storage: LocalStorage, env: dict[str, str]) -> None:
        self.storage = storage
        self._env = env

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

    async def read_states(self, group_id: str, known: set[int]) -> list[tuple[int, str]]:
        """States of the inputs whose results exist and are not in ``known``, oldest first."""
        results = self.storage.path_for(protocol.group_results_prefix(group_id).rstrip("/"))

        def _scan() -> list[tuple[int, str]]:
            try:
                entries = [e for e in os.scandir(results) if e.name.endswith(".res")]
            except FileNotFoundError:
                return []
            found: list[tuple[float, int, str]] = []
            for entry in entries:
                index = int(entry.name[:7])
                if index in known:
                    continue
                try:
                    with open(entry.path, "rb") as f:
                        header, _ = protocol.decode_member_result(f.readline())
                    found.append((entry.stat().st_mtime, index, header["state"]))
                except (OSError, ValueError):
                    continue
            found.sort()
            return [(i, s) for _, i, s in found]

        return await anyio.to_thread.run_sync(_scan)

    async def read_member(self, group_id: str, index: int) -> tuple[dict[str, Any], bytes]:
        """The header and payload of input ``index``'s result.

        :raises ObjectNotFoundError: when it has none yet.
        """
        data = await self.storage.read(protocol.group_result_key(group_id, index))
        try:
            return protocol.decode_member_result(data)
        except ValueError:
            return {"state": "corrupted"}, data

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
