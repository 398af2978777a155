"""The bytes of a coordinated pool's connections, and the handshake that proves both
ends hold the batch's token. Pure, standard library only.

A frame is ``length`` (4 bytes, big-endian: what follows), ``kind`` (1 byte), then
the body: JSON for every kind but :class:`~runner.pool.coordinator.messages.Outcome`
and :class:`~runner.pool.coordinator.messages.Data`, whose body is a JSON header's
length (4 bytes), the header, then the bytes as they are stored (the outcome record as
it is committed; the object served). A frame longer than :data:`MAX_FRAME` is refused.

The handshake, on every connection, before any message of
:mod:`runner.pool.coordinator.messages`:

1. the coordinator sends a :class:`Challenge`: a fresh nonce and its epoch;
2. the worker sends its :class:`~runner.pool.coordinator.messages.Hello` with a nonce of
   its own and ``HMAC-SHA256(token, "hello" | both nonces | its name)``;
3. the coordinator checks it (else closes the connection, having said nothing more) and
   sends a :class:`Welcome` with ``HMAC-SHA256(token, "welcome" | both nonces)``, which
   the worker checks before it takes any span or stop from that connection.

So a process that does not hold the token (another pod of the cluster, another
batch's worker) can neither report an outcome nor hand out work, and a recorded
handshake is worth nothing on another connection. The frames are not encrypted: the
records travel as they would to storage, in the cluster's network.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Final

from runner.pool.coordinator import messages as m

MAX_FRAME: Final = 64 << 20
"""Bytes a frame holds at most (an outcome's record is at most about 1 MiB: a larger
result is an object of its own)."""
NONCE_BYTES: Final = 16
TOKEN_ENV: Final = "KINETIC_POOL_TOKEN"
"""The environment variable that holds the batch's token (hex), in the coordinator's
pod and in every worker's."""

_LENGTH = struct.Struct(">I")
_HEAD = struct.Struct(">IB")  # length, kind


class WireError(ValueError):
    """The peer sent bytes that are not a frame of this protocol, or failed the
    handshake: the connection is closed."""


@dataclass(frozen=True)
class Challenge:
    nonce: bytes
    epoch: int


@dataclass(frozen=True)
class Welcome:
    proof: bytes


@dataclass(frozen=True)
class Greeting:
    """A worker's hello as it travels: the message, and its part of the handshake."""

    hello: m.Hello
    nonce: bytes
    proof: bytes


Frame = m.ToCoordinator | m.ToWorker | m.Read | m.Data | Challenge | Welcome | Greeting

_KINDS: Final[dict[type, int]] = {
    Challenge: 1,
    Welcome: 2,
    Greeting: 3,
    m.Outcome: 4,
    m.More: 5,
    m.Beat: 6,
    m.Assign: 7,
    m.Drop: 8,
    m.Ack: 9,
    m.Exit: 10,
    m.Read: 11,
    m.Data: 12,
}


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def hello_proof(token: bytes, challenge: bytes, nonce: bytes, worker: str) -> bytes:
    return _mac(token, b"hello", challenge, nonce, worker.encode())


def welcome_proof(token: bytes, challenge: bytes, nonce: bytes) -> bytes:
    return _mac(token, b"welcome", challenge, nonce)


def _mac(token: bytes, *parts: bytes) -> bytes:
    body = b"".join(_LENGTH.pack(len(p)) + p for p in parts)
    return hmac.new(token, body, hashlib.sha256).digest()


def check_greeting(token: bytes, challenge: Challenge, greeting: Greeting) -> None:
    """:raises WireError: the greeting's proof is not the token's."""
    expected = hello_proof(token, challenge.nonce, greeting.nonce, greeting.hello.worker)
    if len(greeting.nonce) != NONCE_BYTES or not hmac.compare_digest(expected, greeting.proof):
        raise WireError(f"worker {greeting.hello.worker!r} does not hold the batch's token")


def check_welcome(token: bytes, challenge: Challenge, nonce: bytes, welcome: Welcome) -> None:
    """:raises WireError: the coordinator's proof is not the token's."""
    if not hmac.compare_digest(welcome_proof(token, challenge.nonce, nonce), welcome.proof):
        raise WireError("the coordinator does not hold the batch's token")


def encode(frame: Frame) -> bytes:
    """One frame's bytes.

    :raises WireError: the frame would exceed :data:`MAX_FRAME`.
    """
    kind = _KINDS[type(frame)]
    if isinstance(frame, m.Outcome):
        head = _json(
            {
                "index": frame.index,
                "failed": frame.failed,
                "seconds": frame.seconds,
                "own": frame.record is None,
            }
        )
        body = _LENGTH.pack(len(head)) + head + (frame.record or b"")
    elif isinstance(frame, m.Data):
        head = _json({"key": frame.key, "served": frame.data is not None})
        body = _LENGTH.pack(len(head)) + head + (frame.data or b"")
    else:
        body = _json(_fields(frame))
    if len(body) + 1 > MAX_FRAME:
        raise WireError(f"a frame of {len(body) + 1} bytes is over the limit of {MAX_FRAME}")
    return _HEAD.pack(len(body) + 1, kind) + body


def _fields(frame: Frame) -> dict[str, Any]:
    if isinstance(frame, Challenge):
        return {"nonce": frame.nonce.hex(), "epoch": frame.epoch}
    if isinstance(frame, Welcome):
        return {"proof": frame.proof.hex()}
    if isinstance(frame, Greeting):
        hello = frame.hello
        return {
            "worker": hello.worker,
            "holding": list(hello.holding),
            "wants": hello.wants,
            "nonce": frame.nonce.hex(),
            "proof": frame.proof.hex(),
        }
    if isinstance(frame, (m.Assign, m.Drop, m.Ack)):
        return {"indices": list(frame.indices)}
    if isinstance(frame, m.Exit):
        return {"reason": frame.reason, "kill": frame.kill}
    if isinstance(frame, m.Read):
        return {"key": frame.key}
    return {}


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class Decoder:
    """Frames out of a byte stream, as it arrives in pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """The whole frames that ``data`` completes.

        :raises WireError: the stream holds something that is not a frame.
        """
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if not 1 <= length <= MAX_FRAME:
                raise WireError(f"a frame of {length} bytes")
            if len(self._buffer) < _LENGTH.size + length:
                break
            kind = self._buffer[_LENGTH.size]
            body = bytes(self._buffer[_HEAD.size : _LENGTH.size + length])
            del self._buffer[: _LENGTH.size + length]
            frames.append(decode(kind, body))
        return frames


def decode(kind: int, body: bytes) -> Frame:
    """One frame from its kind and body.

    :raises WireError: they are not a frame of this protocol.
    """
    try:
        return _decode(kind, body)
    except (ValueError, KeyError, TypeError, struct.error) as e:
        if isinstance(e, WireError):
            raise
        raise WireError(f"a frame of kind {kind} that does not parse: {e}") from e


def _decode(kind: int, body: bytes) -> Frame:
    if kind == _KINDS[m.Outcome]:
        (head_len,) = _LENGTH.unpack_from(body)
        head = json.loads(body[_LENGTH.size : _LENGTH.size + head_len])
        record = body[_LENGTH.size + head_len :]
        own = bool(head["own"])
        if own == bool(record):
            raise WireError("an outcome with both a record and an object of its own, or neither")
        return m.Outcome(
            _index(head["index"]),
            None if own else record,
            bool(head["failed"]),
            float(head["seconds"]),
        )
    if kind == _KINDS[m.Data]:
        (head_len,) = _LENGTH.unpack_from(body)
        head = json.loads(body[_LENGTH.size : _LENGTH.size + head_len])
        data = body[_LENGTH.size + head_len :]
        if not head["served"] and data:
            raise WireError("an object not served, with bytes")
        return m.Data(_key(head["key"]), data if head["served"] else None)
    fields = json.loads(body)
    if not isinstance(fields, dict):
        raise WireError(f"a frame of kind {kind} whose body is not an object")
    if kind == _KINDS[Challenge]:
        return Challenge(bytes.fromhex(fields["nonce"]), int(fields["epoch"]))
    if kind == _KINDS[Welcome]:
        return Welcome(bytes.fromhex(fields["proof"]))
    if kind == _KINDS[Greeting]:
        worker = fields["worker"]
        if not isinstance(worker, str) or not 0 < len(worker) <= 253:
            raise WireError(f"a worker's name {worker!r}")
        hello = m.Hello(worker, _indices(fields["holding"]), bool(fields["wants"]))
        return Greeting(hello, bytes.fromhex(fields["nonce"]), bytes.fromhex(fields["proof"]))
    if kind == _KINDS[m.More]:
        return m.More()
    if kind == _KINDS[m.Beat]:
        return m.Beat()
    if kind == _KINDS[m.Assign]:
        return m.Assign(_indices(fields["indices"]))
    if kind == _KINDS[m.Drop]:
        return m.Drop(_indices(fields["indices"]))
    if kind == _KINDS[m.Ack]:
        return m.Ack(_indices(fields["indices"]))
    if kind == _KINDS[m.Exit]:
        return m.Exit(str(fields["reason"]), bool(fields["kill"]))
    if kind == _KINDS[m.Read]:
        return m.Read(_key(fields["key"]))
    raise WireError(f"a frame of unknown kind {kind}")


def _index(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WireError(f"an input index {value!r}")
    return value


def _key(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 1024:
        raise WireError(f"an object's key {value!r}")
    return value


def _indices(values: object) -> tuple[int, ...]:
    if not isinstance(values, list):
        raise WireError(f"input indices {values!r}")
    return tuple(_index(v) for v in values)
