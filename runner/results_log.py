"""Append-only logs of batch results: each input's outcome is one framed record.

A batch input's result is a framed record (magic, index, length, CRC-32, then a
JSON header line and the pickled payload) appended to its worker's log. A worker
appends the records of a burst of inputs with a single ``write`` before it
reports any of them (creating a file per input costs ~100 µs here; one append
costs a few, whatever it holds). A record torn by a crash fails its length or
CRC check and is ignored with everything after it in that log: the input simply
runs again (delivery is at-least-once)."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from runner import protocol

_MAGIC = b"\x1eKR1"
_HEAD = struct.Struct(">4sIII")  # magic, input index, body length, crc32(body)


@dataclass(frozen=True)
class Record:
    """Where one input's outcome lies in a log."""

    index: int
    header: protocol.OutcomeHeader
    path: Path
    payload_offset: int
    payload_length: int


def encode(index: int, header: protocol.OutcomeHeader, payload: bytes) -> bytes:
    return encode_raw(index, protocol.dump_json(header), payload)


def encode_raw(index: int, head: bytes, payload: bytes) -> bytes:
    """A record from an already encoded JSON header (workers cache the common ones)."""
    body = b"".join((head, b"\n", payload))
    return _HEAD.pack(_MAGIC, index, len(body), zlib.crc32(body)) + body


def append(fd: int, index: int, header: protocol.OutcomeHeader, payload: bytes) -> None:
    """Append one record with one ``write`` (the fd must be opened with O_APPEND)."""
    append_encoded(fd, encode(index, header, payload))


def append_encoded(fd: int, data: bytes) -> None:
    """Append already encoded records (one or many) with one ``write``.

    Each record is whole or absent after a crash only as far as the kernel's write is:
    a torn tail fails its CRC and is ignored, with everything after it, when read.
    """
    written = os.write(fd, data)
    if written != len(data):  # a short write on a regular file means the disk is full
        raise OSError(f"short write to the results log ({written} of {len(data)} bytes)")


def open_log(path: Path) -> int:
    """Open (creating) a results log for appending."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def scan(data: bytes, start: int = 0) -> tuple[list[tuple[int, bytes, int, int]], int]:
    """The whole records in ``data`` from ``start``, cheaply: ``(index, header bytes,
    body offset, body length)`` each; and the offset after the last whole record.

    Bodies are checked (CRC) without being copied; headers are not decoded.
    """
    out: list[tuple[int, bytes, int, int]] = []
    view = memoryview(data)
    size = len(data)
    pos = start
    unpack = _HEAD.unpack_from
    head_size = _HEAD.size
    crc32 = zlib.crc32
    while pos + head_size <= size:
        magic, index, length, crc = unpack(data, pos)
        body_start = pos + head_size
        end = body_start + length
        if magic != _MAGIC or end > size or crc32(view[body_start:end]) != crc:
            break  # torn or foreign: stop trusting this log here
        newline = data.find(b"\n", body_start, end)
        if newline < 0:
            break
        out.append((index, data[body_start:newline], body_start, length))
        pos = end
    return out, pos


_HEADERS: dict[bytes, protocol.OutcomeHeader] = {}


def header(head: bytes) -> protocol.OutcomeHeader:
    """A record's header, decoded (the common ones once per process). Do not mutate it."""
    parsed = _HEADERS.get(head)
    if parsed is None:
        parsed = cast(protocol.OutcomeHeader, protocol.load_json(head))
        if len(_HEADERS) < 4096:
            _HEADERS[head] = parsed
    return parsed


def parse(data: bytes, path: Path, start: int = 0) -> tuple[list[Record], int]:
    """Records in ``data`` from ``start``; and the offset after the last whole record."""
    found, pos = scan(data, start)
    records = [
        Record(index, header(head).copy(), path, body + len(head) + 1, length - len(head) - 1)
        for index, head, body, length in found
    ]
    return records, pos


def read_new(path: Path, offset: int) -> tuple[list[Record], int]:
    """Records appended to ``path`` since ``offset``; and the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    records, end = parse(data, path)
    shifted = [
        Record(r.index, r.header, r.path, r.payload_offset + offset, r.payload_length)
        for r in records
    ]
    return shifted, offset + end


def read_payload(record: Record) -> bytes:
    with open(record.path, "rb") as f:
        f.seek(record.payload_offset)
        return f.read(record.payload_length)


def iter_logs(results_dir: Path) -> Iterator[Path]:
    try:
        names = sorted(os.listdir(results_dir))
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(".log"):
            yield results_dir / name


def decode_burst(data: bytes) -> list[tuple[int, protocol.OutcomeHeader, bytes]]:
    """The outcomes in a pool worker's burst object (:func:`runner.protocol.encode_burst`):
    ``(index, header, payload)`` each, in order.

    :raises ValueError: when ``data`` is not a whole burst (objects are written whole:
        a burst that fails its checks was changed in storage).
    """
    start = len(protocol.BURST_MAGIC)
    if not data.startswith(protocol.BURST_MAGIC):
        raise ValueError("not a burst of outcomes")
    found, end = scan(data, start)
    if end != len(data):
        raise ValueError(f"the burst is damaged at byte {end} of {len(data)}")
    view = memoryview(data)
    return [
        (index, header(head).copy(), bytes(view[body + len(head) + 1 : body + length]))
        for index, head, body, length in found
    ]
