"""Append-only logs of batch results: each input's outcome is one record, written alone.

A batch input's result is appended to its worker's log with a single ``write``
of a framed record (magic, index, length, CRC-32, then a JSON header line and
the pickled payload). Creating a file per input costs ~100 µs here; one append
costs a few. A record torn by a crash fails its length or CRC check and is
ignored with everything after it in that log: the input simply runs again
(delivery is at-least-once).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import protocol

_MAGIC = b"\x1eKR1"
_HEAD = struct.Struct(">4sIII")  # magic, input index, body length, crc32(body)


@dataclass(frozen=True)
class Record:
    """Where one input's outcome lies in a log."""

    index: int
    header: dict[str, Any]
    path: Path
    payload_offset: int
    payload_length: int


def encode(index: int, header: dict[str, Any], payload: bytes) -> bytes:
    body = protocol.dump_json(header) + b"\n" + payload
    return _HEAD.pack(_MAGIC, index, len(body), zlib.crc32(body)) + body


def append(fd: int, index: int, header: dict[str, Any], payload: bytes) -> None:
    """Append one record with one ``write`` (the fd must be opened with O_APPEND)."""
    data = encode(index, header, payload)
    written = os.write(fd, data)
    if written != len(data):  # a short write on a regular file means the disk is full
        raise OSError(f"short write to the results log ({written} of {len(data)} bytes)")


def open_log(path: Path) -> int:
    """Open (creating) a results log for appending."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def parse(data: bytes, path: Path, start: int = 0) -> tuple[list[Record], int]:
    """Records in ``data`` from ``start``; and the offset after the last whole record."""
    records: list[Record] = []
    pos = start
    while pos + _HEAD.size <= len(data):
        magic, index, length, crc = _HEAD.unpack_from(data, pos)
        body_start = pos + _HEAD.size
        body = data[body_start : body_start + length]
        if magic != _MAGIC or len(body) < length or zlib.crc32(body) != crc:
            break  # torn or foreign: stop trusting this log here
        head, _, _ = body.partition(b"\n")
        header = protocol.load_json(head)
        payload_offset = body_start + len(head) + 1
        records.append(
            Record(index, header, path, payload_offset, body_start + length - payload_offset)
        )
        pos = body_start + length
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
