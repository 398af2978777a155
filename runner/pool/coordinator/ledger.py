"""The outcomes a coordinator heard: which are durable, which wait for the next group
commit, and which worker to acknowledge once they are durable. Pure.

A worker keeps each outcome it reported until the coordinator acknowledges it, and
the coordinator acknowledges an outcome only once a commit that holds it was created
in storage (or the worker wrote it as an object of its own before reporting it): so an
outcome is never forgotten by both. Of two outcomes of one input the first heard is
committed; a later one is only acknowledged (its worker may forget it).

One commit is in flight at a time, under a name fixed when it was cut
(:func:`runner.pool.coordinator.commits.commit_key`): the shell writes it
create-if-absent until storage answers, and a precondition failure means an earlier
try of the same name landed (a lost answer), which is the same as success.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Commit:
    """One group commit: its place in the sequence and the records it holds."""

    epoch: int
    seq: int
    records: dict[int, bytes]


class Ledger:
    """What is known of the outcomes of inputs ``0 .. total - 1``.

    :param durable: inputs whose outcomes are in storage already (a restarted
        coordinator read them).
    """

    def __init__(self, total: int, epoch: int, durable: Iterable[int] = ()) -> None:
        self.total = total
        self.epoch = epoch
        self.durable: set[int] = set(durable)
        self.pending: dict[int, bytes] = {}
        """First outcomes heard since the last commit was cut."""
        self.in_flight: Commit | None = None
        self.ackers: dict[int, set[str]] = {}
        """Who reported each outcome not durable yet (acknowledged once it is)."""
        self.next_seq = 0

    def has(self, index: int) -> bool:
        """Input ``index`` has an outcome (durable or on its way)."""
        return (
            index in self.durable
            or index in self.pending
            or (self.in_flight is not None and index in self.in_flight.records)
        )

    def heard(self, index: int, record: bytes | None, worker: str) -> tuple[bool, bool]:
        """``worker`` reported an outcome of ``index``: its record, or None when the worker
        wrote it as an object of its own (durable already).

        :returns: ``(first, ack_now)``: the input had no outcome before; the worker may
            forget the outcome at once (it is durable).
        """
        if not 0 <= index < self.total:
            raise ValueError(f"input {index} is not one of the batch's {self.total}")
        first = not self.has(index)
        if record is None:
            # Its own object stands over any record; one pending or in flight is still
            # committed, so that the workers that reported it are acknowledged.
            self.durable.add(index)
            return first, True
        if index in self.durable:
            return first, True
        self.ackers.setdefault(index, set()).add(worker)
        if first:
            self.pending[index] = record
        return first, False

    def own(self, index: int) -> None:
        """Input ``index`` has an outcome object of its own (durable: it stands over any
        record of it)."""
        self.durable.add(index)

    def cut(self) -> Commit | None:
        """The next commit to write, or None while one is in flight or nothing waits."""
        if self.in_flight is not None or not self.pending:
            return None
        self.in_flight = Commit(self.epoch, self.next_seq, self.pending)
        self.pending = {}
        self.next_seq += 1
        return self.in_flight

    def landed(self, commit: Commit) -> dict[str, list[int]]:
        """``commit`` was created in storage: the inputs each worker may forget.

        :raises ValueError: ``commit`` is not the one in flight.
        """
        if commit is not self.in_flight:
            raise ValueError(f"commit {commit.seq} is not the one in flight")
        self.in_flight = None
        acks: dict[str, list[int]] = {}
        for index in sorted(commit.records):
            self.durable.add(index)
            for worker in sorted(self.ackers.pop(index, ())):
                acks.setdefault(worker, []).append(index)
        return acks

    def settled(self) -> bool:
        """Nothing waits to be committed."""
        return not self.pending and self.in_flight is None

    def complete(self) -> bool:
        """Every input's outcome is durable."""
        return len(self.durable) >= self.total and self.settled()
