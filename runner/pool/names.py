"""The names of one pool batch's objects in storage, and what listed names tell.

Under ``_groups/{group_id}/``: ``claims/``, ``bursts/``, ``holes/``, ``results/`` and
``stop.json`` (``docs/pool-protocol.md``, "The objects"). The formats of the names are
:mod:`runner.protocol`'s, which the readers share; here are one worker's prefixes, the
narrower prefixes it lists to learn of a few inputs' objects rather than all, and the
parsing of what a listing returned. Pure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from runner import protocol
from runner.pool.spans import Span


class PoolNames:
    """The names of the objects of the batch ``group_id``."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.claims = protocol.group_claims_prefix(group_id)
        self.bursts = protocol.group_bursts_prefix(group_id)
        self.holes = protocol.group_holes_prefix(group_id)
        self.results = protocol.group_results_prefix(group_id)
        self.stop = protocol.group_stop_key(group_id)
        self.settled = self.holes + protocol.POOL_SETTLED_NAME
        """Created by the first worker that saw every input done (a large pool's)."""

    # -- names -----------------------------------------------------------------------

    def claim(self, start: int, number: int) -> str:
        return protocol.group_claim_key(self.group_id, start, number)

    def span_claims(self, start: int) -> str:
        """The prefix of the names of every claim of the span at ``start``."""
        return f"{self.claims}{start:07d}."

    def claims_between(self, first: int, last: int) -> str:
        """A prefix of claim names that covers the claims of inputs ``first`` to
        ``last`` (the digits they share)."""
        return self.claims + common_prefix(first, last)

    def bursts_between(self, first: int, last: int) -> str:
        """A prefix of burst names that covers the bursts of inputs ``first`` to
        ``last`` (the digits they share: a listing of a few names, not all)."""
        return self.bursts + common_prefix(first, last)

    def burst(self, first: int, end: int, span: Span) -> str:
        """The burst of inputs ``[first, end)`` written under ``span``'s claim."""
        return self.bursts + protocol.burst_name(first, end, span.start, span.number)

    def hole(self, span: Span) -> str:
        """The announcement of the hole that ``span``, a takeover, cut."""
        assert span.reach is not None
        return self.holes + protocol.hole_name(
            span.start, span.number, span.end, span.reach, span.slot, span.expires
        )

    def outcome(self, index: int) -> str:
        """Input ``index``'s outcome object of its own."""
        return protocol.group_outcome_key(self.group_id, index)

    # -- parsing -----------------------------------------------------------------------

    def parse_claim(self, key: str) -> tuple[int, int] | None:
        """``(start, number)`` of a claim's key, or None when ``key`` is none."""
        return protocol.parse_claim_name(key.removeprefix(self.claims))

    def claims_in(self, keys: list[str]) -> Iterator[tuple[int, int]]:
        """``(start, number)`` of each claim among listed ``keys``."""
        for key in keys:
            parsed = self.parse_claim(key)
            if parsed is not None:
                yield parsed

    def bursts_in(self, keys: list[str]) -> Iterator[tuple[int, int]]:
        """The inputs ``(first, end)`` of each burst among listed ``keys``."""
        for key in keys:
            burst = protocol.parse_burst_name(key.removeprefix(self.bursts))
            if burst is not None:
                yield burst[0], burst[1]

    def holes_in(self, keys: list[str]) -> Iterator[tuple[int, int, int, int, int, float]]:
        """Each hole announced among listed ``keys`` (:func:`runner.protocol.hole_name`)."""
        for key in keys:
            hole = protocol.parse_hole_name(key.removeprefix(self.holes))
            if hole is not None:
                yield hole

    def outcomes_in(self, keys: list[str]) -> Iterator[int]:
        """The input of each outcome object of its own among listed ``keys``."""
        for key in keys:
            index = protocol.parse_outcome_name(key.removeprefix(self.results))
            if index is not None:
                yield index


def common_prefix(first: int, last: int) -> str:
    """The digits that the names of inputs ``first`` to ``last`` share."""
    return os.path.commonprefix([f"{first:07d}", f"{last:07d}"])
