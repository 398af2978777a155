"""A small Debug Adapter Protocol client, the way VS Code speaks to debugpy.

Used by the debug tests (local and cluster tier) as the real client side of a
``debug=True`` job: it connects (through ``debug_attach``'s forward), attaches,
sets breakpoints, waits for the job to stop, and continues it. Blocking sockets
with a timeout on every read, so a test can never hang on it.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Self


class DapError(AssertionError):
    """The adapter said no, or went silent."""


class DapClosed(DapError):
    """The adapter closed the connection."""


class DapClient:
    """One DAP session over a TCP connection (``Content-Length`` framed JSON)."""

    def __init__(self, port: int, *, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self._buf = b""
        self._seq = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- framing ----------------------------------------------------------------------

    def send(self, command: str, **arguments: Any) -> int:
        self._seq += 1
        body = json.dumps(
            {"seq": self._seq, "type": "request", "command": command, "arguments": arguments}
        ).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self._seq

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\r\n\r\n" not in self._buf:
            self._recv(deadline)
        head, self._buf = self._buf.split(b"\r\n\r\n", 1)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(self._buf) < length:
            self._recv(deadline)
        body, self._buf = self._buf[:length], self._buf[length:]
        message: dict[str, Any] = json.loads(body)
        return message

    def _recv(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DapError("the debug adapter went silent")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise DapError("the debug adapter went silent") from None
        if not chunk:
            raise DapClosed("the debug adapter closed the connection")
        self._buf += chunk

    # -- conversation -----------------------------------------------------------------

    def response(self, seq: int) -> dict[str, Any]:
        """Wait for the response to request ``seq`` (events meanwhile are kept)."""
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._read_message(deadline)
            if msg.get("type") == "event":
                self.events.append(msg)
            elif msg.get("type") == "response" and msg.get("request_seq") == seq:
                if not msg.get("success"):
                    raise DapError(f"{msg.get('command')} failed: {msg.get('message')}")
                return msg

    def event(self, name: str, timeout: float | None = None) -> dict[str, Any]:
        """Wait for event ``name`` (one already received counts)."""
        for i, ev in enumerate(self.events):
            if ev.get("event") == name:
                return self.events.pop(i)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            msg = self._read_message(deadline)
            if msg.get("type") == "event":
                if msg.get("event") == name:
                    return msg
                self.events.append(msg)

    def attach(
        self,
        breakpoints: dict[str, list[int]] | None = None,
        *,
        path_mappings: list[dict[str, str]] | None = None,
    ) -> None:
        """The VS Code attach sequence: initialize, attach (with the launch
        configuration's ``pathMappings``), breakpoints, configurationDone. Without
        breakpoints, the adapter that ends the session after configurationDone (the
        debuggee ran to its end) ends the sequence too: the caller checks the result."""
        self.response(
            self.send(
                "initialize",
                clientID="kinetic-tests",
                adapterID="debugpy",
                pathFormat="path",
                linesStartAt1=True,
                columnsStartAt1=True,
            )
        )
        attach_seq = self.send("attach", justMyCode=False, pathMappings=path_mappings or [])
        self.event("initialized")
        for path, lines in (breakpoints or {}).items():
            reply = self.response(
                self.send(
                    "setBreakpoints",
                    source={"path": path},
                    breakpoints=[{"line": n} for n in lines],
                )
            )
            assert reply["body"]["breakpoints"], reply
        done = self.send("configurationDone")
        try:
            self.response(done)
            self.response(attach_seq)
        except DapError as exc:
            # With no breakpoint the debuggee runs to its end at once, and debugpy's
            # adapter may close the connection, or answer that its server disconnected,
            # before its answer to configurationDone arrives (debugpy issue 314: pydevd
            # may exit before it sends that answer).
            if breakpoints or not (isinstance(exc, DapClosed) or "disconnected" in str(exc)):
                raise

    def stopped(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait until the debuggee stops; the ``stopped`` event's body."""
        body: dict[str, Any] = self.event("stopped", timeout)["body"]
        return body

    def top_frame(self, thread_id: int) -> dict[str, Any]:
        reply = self.response(self.send("stackTrace", threadId=thread_id, levels=1))
        frame: dict[str, Any] = reply["body"]["stackFrames"][0]
        return frame

    def resume(self, thread_id: int) -> None:
        self.response(self.send("continue", threadId=thread_id))
