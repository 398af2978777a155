"""A coordinated pool worker's connection to its coordinator.

:func:`connect` finds the coordinator (the highest epoch's record in storage), connects
and runs the handshake (:mod:`.wire`); a :class:`Link` then sends (small frames, a
blocking ``sendall`` with a timeout, one thread at a time) and reads in a helper
thread, which queues what it hears and makes :attr:`Link.fd` readable: the worker's
waits watch it, so a stop is acted on at once. :meth:`Link.read` asks the coordinator
for one of the batch's objects (:mod:`.shelf`) and waits for its answer.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import struct
import threading
from concurrent.futures import Future
from typing import Final

from runner import protocol
from runner.pool.coordinator import commits, wire
from runner.pool.coordinator import messages as m
from runner.store import RunnerStore

CONNECT_SECONDS: Final = 5.0
"""A connection, and the handshake after it, take at most this long each."""
SEND_SECONDS: Final = 10.0
"""A send that blocks this long (the coordinator stalled) drops the connection."""
READ_SECONDS: Final = 20.0
"""How long :meth:`Link.read` waits for the coordinator's answer (it may be reading the
object from a slow bucket) before the worker reads it from storage itself."""


class Dropped(ConnectionError):
    """The connection to the coordinator dropped."""


class Link:
    """An open, authenticated connection (see the module docstring)."""

    def __init__(self, sock: socket.socket, decoder: wire.Decoder, early: list[wire.Frame]) -> None:
        self.sock = sock
        self._decoder = decoder
        self._heard: queue.SimpleQueue[m.ToWorker | None] = queue.SimpleQueue()
        self._send_lock = threading.Lock()
        self._reads: dict[str, Future[bytes | None]] = {}
        self._reads_lock = threading.Lock()
        self._dropped = False
        self._wake_read, self._wake_write = os.pipe()
        self._queue(early)  # what came with the welcome
        self._thread = threading.Thread(target=self._read, name="kinetic-link", daemon=True)
        self._thread.start()

    @property
    def fd(self) -> int:
        """Readable while something heard waits to be taken (:meth:`take`)."""
        return self._wake_read

    def send(self, message: m.ToCoordinator | m.Read) -> None:
        """:raises Dropped: the connection is gone."""
        try:
            with self._send_lock:
                self.sock.sendall(wire.encode(message))
        except OSError as e:
            raise Dropped(f"sending to the coordinator: {e}") from e

    def read(self, key: str, timeout: float = READ_SECONDS) -> bytes | None:
        """The batch's object ``key`` from the coordinator, or None when it does not
        serve it (the caller reads it from storage). Any thread may call it; two reads
        of one key share the answer.

        :raises Dropped: the connection dropped, or no answer came within ``timeout``.
        """
        with self._reads_lock:
            if self._dropped:
                raise Dropped("the coordinator closed the connection")
            answer = self._reads.get(key)
            asking = answer is None
            if answer is None:
                answer = self._reads[key] = Future()
        if asking:
            self.send(m.Read(key))
        try:
            return answer.result(timeout)
        except TimeoutError:
            raise Dropped(f"no answer for {key} in {timeout:.0f} s") from None

    def take(self) -> list[m.ToWorker]:
        """What was heard since the last call.

        :raises Dropped: the connection dropped (after what was heard before it).
        """
        out: list[m.ToWorker] = []
        while True:
            try:
                item = self._heard.get_nowait()
            except queue.Empty:
                return out
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_read, 1)
            if item is None:
                self._heard.put(None)  # every later call says so too
                os.write(self._wake_write, b"x")
                if out:
                    return out
                raise Dropped("the coordinator closed the connection")
            out.append(item)

    def _queue(self, frames: list[wire.Frame]) -> None:
        """:raises wire.WireError: a frame the coordinator never sends after the handshake."""
        for frame in frames:
            if isinstance(frame, m.Data):
                with self._reads_lock:
                    answer = self._reads.pop(frame.key, None)
                if answer is not None:
                    answer.set_result(frame.data)
                continue
            if not isinstance(frame, (m.Assign, m.Drop, m.Ack, m.Exit)):
                raise wire.WireError(f"the coordinator sent {type(frame).__name__}")
            self._heard.put(frame)
            os.write(self._wake_write, b"x")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(timeout=5)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _read(self) -> None:
        try:
            while data := self.sock.recv(1 << 16):
                self._queue(self._decoder.feed(data))
        except (OSError, wire.WireError) as e:
            print(f"kinetic pool: the link to the coordinator dropped: {e}", flush=True)
        with self._reads_lock:
            self._dropped = True
            waiting, self._reads = list(self._reads.values()), {}
        for answer in waiting:
            answer.set_exception(Dropped("the coordinator closed the connection"))
        self._heard.put(None)
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")


def find(
    store: RunnerStore, group_id: str, *, first: bool = False
) -> tuple[int, commits.CoordinatorRecord] | str | None:
    """Where the coordinator listens (its epoch and record); else ``"done"`` or the
    stop's reason when the batch ended; None when no coordinator has started yet.

    :param first: a worker's first look: epoch 0's record, one read (no listing); the
        caller looks again in full if that coordinator cannot be reached (it restarted).
    :raises OSError: storage failed.
    """
    if first:
        key = commits.coordinator_key(group_id, 0)
        try:
            return 0, commits.decode_coordinator(store.read(key))
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise OSError(f"the coordinator's record {key} is damaged: {e}") from e
    prefix = commits.coordinator_prefix(group_id)
    keys = store.list(prefix)
    if commits.done_key(group_id) in keys:
        return "done"
    epochs = [(commits.parse_coordinator_key(group_id, k), k) for k in keys]
    found = [(e, k) for e, k in epochs if e is not None]
    if not found:
        return None
    epoch, key = max(found)
    try:
        return epoch, commits.decode_coordinator(store.read(key))
    except ValueError as e:
        raise OSError(f"the coordinator's record {key} is damaged: {e}") from e


def stopped(store: RunnerStore, group_id: str) -> str | None:
    """The batch's stop reason, if it stopped."""
    try:
        data = store.read(protocol.group_stop_key(group_id))
    except FileNotFoundError:
        return None
    return str(protocol.load_json(data).get("reason", "cancelled"))


def connect(host: str, port: int, epoch: int, token: bytes, hello: m.Hello) -> Link:
    """Connect to the coordinator of ``epoch`` and run the handshake.

    :raises OSError: the coordinator cannot be reached or did not answer in time.
    :raises wire.WireError: the peer is not the batch's coordinator of that epoch (one
        that restarted listens elsewhere: the worker looks again).
    """
    sock = socket.create_connection((host, port), timeout=CONNECT_SECONDS)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        decoder = wire.Decoder()
        challenge, early = _first(sock, decoder)
        if early:
            raise wire.WireError("frames before the handshake ended")
        if not isinstance(challenge, wire.Challenge):
            raise wire.WireError(f"the coordinator began with {type(challenge).__name__}")
        if challenge.epoch != epoch:
            raise wire.WireError(f"{host}:{port} is epoch {challenge.epoch}'s, not {epoch}'s")
        nonce = wire.new_nonce()
        proof = wire.hello_proof(token, challenge.nonce, nonce, hello.worker)
        sock.sendall(wire.encode(wire.Greeting(hello, nonce, proof)))
        welcome, early = _first(sock, decoder)
        if not isinstance(welcome, wire.Welcome):
            raise wire.WireError(f"the coordinator answered with {type(welcome).__name__}")
        wire.check_welcome(token, challenge, nonce, welcome)
        _settle(sock)
        return Link(sock, decoder, early)
    except BaseException:
        sock.close()
        raise


def _settle(sock: socket.socket) -> None:
    """Blocking reads with no limit (the coordinator may say nothing for long), sends
    limited to :data:`SEND_SECONDS`, and keepalives that drop the connection within about
    ten seconds of its coordinator's node going silent (no FIN from a lost node)."""
    sock.settimeout(None)
    seconds = struct.pack("ll", int(SEND_SECONDS), 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 4), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):  # Linux's names (a pod's)
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def _first(sock: socket.socket, decoder: wire.Decoder) -> tuple[wire.Frame, list[wire.Frame]]:
    """The next frame during the handshake, and any that came with it."""
    while True:
        data = sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the coordinator closed the connection in the handshake")
        frames = decoder.feed(data)
        if frames:
            return frames[0], frames[1:]
