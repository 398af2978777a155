"""The objects a coordinated batch keeps in storage: their names and bytes. Pure.

Under ``_groups/{group_id}/``, besides the batch the client wrote (manifest, function,
input chunks) and ``stop.json``:

* ``coordinator/{epoch:04d}.json``: a coordinator's start, created if absent. Its
  *epoch* counts the coordinator's starts (a restart after it died takes the next
  one): of two that start at once, one creates the name and the other takes the next
  epoch. It says where the coordinator listens; the workers connect to the highest.
* ``coordinator/done``: every input's outcome is durable (its workers may exit).
* ``commits/{epoch:04d}-{seq:09d}``: a group commit, created if absent. The outcome
  records (:func:`runner.results_log.encode`) of any set of inputs, after
  :data:`runner.protocol.BURST_MAGIC` (a burst's bytes: one decoder reads both). A
  coordinator writes one at a time, in sequence; one that died may have left a later
  commit landing after its successor read them, so an input can have records in two
  commits: the earliest commit's stands (:func:`commit_rank`), and every reader
  applies that rule.
"""

from __future__ import annotations

import json
from typing import Final, TypedDict

from runner import protocol

EPOCH_DIGITS: Final = 4
SEQ_DIGITS: Final = 9


class CoordinatorRecord(TypedDict):
    """``coordinator/{epoch}.json``: where the coordinator of that epoch listens."""

    host: str
    port: int
    started: float
    """Its wall clock when it started (for people reading the bucket)."""


def coordinator_prefix(group_id: str) -> str:
    return f"_groups/{group_id}/coordinator/"


def coordinator_key(group_id: str, epoch: int) -> str:
    return f"{coordinator_prefix(group_id)}{epoch:0{EPOCH_DIGITS}d}.json"


def parse_coordinator_key(group_id: str, key: str) -> int | None:
    """The epoch of a coordinator record's key, or None when ``key`` is none."""
    name = key.removeprefix(coordinator_prefix(group_id))
    head, _dot, tail = name.partition(".")
    if name == key or tail != "json" or len(head) != EPOCH_DIGITS or not head.isdigit():
        return None
    return int(head)


def encode_coordinator(record: CoordinatorRecord) -> bytes:
    return json.dumps(record, sort_keys=True).encode()


def decode_coordinator(data: bytes) -> CoordinatorRecord:
    """:raises ValueError: ``data`` is not a coordinator record."""
    try:
        raw = json.loads(data)
        record = CoordinatorRecord(
            host=str(raw["host"]), port=int(raw["port"]), started=float(raw["started"])
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a coordinator record: {e}") from e
    if not 0 < record["port"] < 65536:
        raise ValueError(f"not a coordinator record: port {record['port']}")
    return record


def done_key(group_id: str) -> str:
    """Created by a coordinator once every input's outcome is durable: a worker that
    cannot reach the coordinator any more exits when it finds it."""
    return f"{coordinator_prefix(group_id)}done"


def running_key(group_id: str) -> str:
    """The inputs the coordinator's workers run, as it last told (readers' ``RUNNING``:
    :func:`encode_running`); rewritten every few seconds while it changes."""
    return f"{coordinator_prefix(group_id)}running.json"


def encode_running(epoch: int, inputs: list[int]) -> bytes:
    return json.dumps({"epoch": epoch, "inputs": inputs}, separators=(",", ":")).encode()


def decode_running(data: bytes) -> list[int]:
    """:raises ValueError: ``data`` is not a running record."""
    try:
        inputs = json.loads(data)["inputs"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a running record: {e}") from e
    if not isinstance(inputs, list) or not all(type(i) is int and i >= 0 for i in inputs):
        raise ValueError("not a running record: its inputs")
    return inputs


def commits_prefix(group_id: str) -> str:
    return f"_groups/{group_id}/commits/"


def commit_key(group_id: str, epoch: int, seq: int) -> str:
    """The name of commit ``seq`` of the coordinator of ``epoch``: names sort as the
    commits were made, so a reader lists only what follows the last one it read."""
    return f"{commits_prefix(group_id)}{epoch:0{EPOCH_DIGITS}d}-{seq:0{SEQ_DIGITS}d}"


def parse_commit_key(group_id: str, key: str) -> tuple[int, int] | None:
    """``(epoch, seq)`` of a commit's key, or None when ``key`` is none."""
    name = key.removeprefix(commits_prefix(group_id))
    epoch, dash, seq = name.partition("-")
    if (
        name == key
        or not dash
        or len(epoch) != EPOCH_DIGITS
        or len(seq) != SEQ_DIGITS
        or not (epoch.isdigit() and seq.isdigit())
    ):
        return None
    return int(epoch), int(seq)


def commit_rank(epoch: int, seq: int) -> tuple[int, int]:
    """Of two commits' records of one input, the one of the lower rank stands."""
    return (epoch, seq)


def encode_commit(records: list[bytes]) -> bytes:
    """A commit's bytes: the outcome records, each whole, after the burst magic."""
    return protocol.encode_burst(b"".join(records))
