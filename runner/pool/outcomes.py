"""Which durable outcome of an input a reader reports, and when. Pure.

Every reader (:mod:`kinetic._backends.gke.pool`: ``results()``, ``as_completed()``,
``attach_batch``, ``kinetic batch status``) reports the same outcome of each input,
whatever the order it listed and read the objects in: the rule, and the races it
leaves open, are told in ``docs/pool-protocol.md`` ("Which outcome of an input
stands").
"""

from __future__ import annotations

from typing import Generic, TypeVar

from runner import protocol

Rank = tuple[int, int, int, str]
"""Of two durable records of one input, the one of the lower rank stands."""
OWN_OUTCOME: Rank = (0, 0, 0, "")
"""The rank of an input's outcome object of its own: it stands over every burst."""

V = TypeVar("V")


def outcome_rank(burst: str) -> Rank:
    """The rank of a record in the burst named ``burst`` (relative to the bursts prefix):
    the earliest claim's stands — the lowest claim start, then claim number, then name.

    :raises ValueError: ``burst`` is not a burst's name.
    """
    parsed = protocol.parse_burst_name(burst)
    if parsed is None:
        raise ValueError(f"not a burst's name: {burst!r}")
    return (1, parsed[2], parsed[3], burst)


class OutcomeChoice(Generic[V]):
    """Which durable record of each input a reader reports, and when
    (``docs/pool-protocol.md``, "Which outcome of an input stands"). Pure: times are a monotonic clock's, passed in.

    :param hold: seconds a record of a later claim waits after its burst was first listed.
    """

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.reported: dict[int, Rank] = {}
        """The rank of the record reported of each input (never changed)."""
        self.late = 0
        """Records that would have stood over one reported before (see the docstring)."""
        self._held: dict[int, tuple[Rank, float, V]] = {}  # index -> rank, seen, value

    def offer(self, index: int, rank: Rank, value: V, *, first: bool, seen: float) -> None:
        """A durable record of input ``index``, of ``rank`` (:data:`OWN_OUTCOME` or
        :func:`outcome_rank`). ``first``: it is of the input's first claim
        (:meth:`PoolBook.first_claim`); ``seen``: when its burst was first listed."""
        reported = self.reported.get(index)
        if reported is not None:
            if rank < reported:
                self.late += 1
            return
        held = self._held.get(index)
        if held is not None and held[0] <= rank:
            return
        self._held[index] = (rank, float("-inf") if first or rank == OWN_OUTCOME else seen, value)

    def known(self, index: int) -> bool:
        """Whether a record of the input is known (reported, or held)."""
        return index in self.reported or index in self._held

    def release(self, now: float) -> list[tuple[int, V]]:
        """The records to report now (each input once, ever), by input."""
        due = sorted(i for i, (_, seen, _) in self._held.items() if seen + self.hold <= now)
        out = []
        for index in due:
            rank, _, value = self._held.pop(index)
            self.reported[index] = rank
            out.append((index, value))
        return out

    @property
    def held(self) -> int:
        """Records known but not reported yet."""
        return len(self._held)

    def next_due(self) -> float | None:
        """When the next held record is reported, or None when none is held."""
        return min((seen + self.hold for _, seen, _ in self._held.values()), default=None)

    def forget_held(self, index: int) -> None:
        """Drop the held record of ``index`` (one that stands over it is on its way)."""
        self._held.pop(index, None)
