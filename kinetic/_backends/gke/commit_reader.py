"""A follower's reading of a coordinated pool batch's commits (``docs/pool-protocol.md``,
"The coordinated pool").

A coordinated batch keeps its outcomes in group commits
(:mod:`runner.pool.coordinator.commits`), not in bursts: each commit is read once, and
its records are offered to the follower's
:class:`~runner.pool.outcomes.OutcomeChoice` ranked by the commit's place in the
sequence, ``(epoch, seq)``: of two records of one input, the earlier commit's stands.
A record of epoch 0 is reported at once (no commit can come before it); one of a later
epoch (a coordinator that restarted) is held a lease after its commit was first
listed, or until no pod of the pool may still write: a commit of the coordinator that
died, landing late, then stands over it in every reader alike.
"""

from __future__ import annotations

import logging

import anyio

from kinetic._core.exception_groups import one_error
from kinetic._storage.base import Storage
from runner import protocol, results_log
from runner.pool.coordinator import commits
from runner.pool.outcomes import OutcomeChoice

log = logging.getLogger(__name__)

_READS = 16

Value = tuple[protocol.OutcomeHeader, bytes]


class CommitReader:
    """The commits of batch ``group_id`` read so far (see the module docstring)."""

    def __init__(self, storage: Storage, group_id: str) -> None:
        self.storage = storage
        self.group_id = group_id
        self._read: set[str] = set()
        self._seen: dict[str, float] = {}  # key -> when first listed (monotonic)

    async def refresh(self, choice: OutcomeChoice[Value]) -> None:
        """List the commits and read the new ones into ``choice``."""
        prefix = commits.commits_prefix(self.group_id)
        new: list[tuple[int, int, str]] = []
        async for key in self.storage.list(prefix):
            place = commits.parse_commit_key(self.group_id, key)
            if place is not None and key not in self._read:
                new.append((*place, key))
        listed = anyio.current_time()
        for _, _, key in new:
            self._seen.setdefault(key, listed)
        limiter = anyio.CapacityLimiter(_READS)

        async def read(epoch: int, seq: int, key: str) -> None:
            async with limiter:
                data = await self.storage.read(key)
            self._offer(choice, epoch, seq, key, data)
            self._read.add(key)

        with one_error():
            async with anyio.create_task_group() as tg:
                for epoch, seq, key in sorted(new):
                    tg.start_soon(read, epoch, seq, key)

    def _offer(
        self, choice: OutcomeChoice[Value], epoch: int, seq: int, key: str, data: bytes
    ) -> None:
        try:
            records = results_log.decode_burst(data)
        except ValueError as exc:
            # Commits are written whole, once: this one was changed in storage. Its
            # inputs cannot be named (a commit holds any set): they stay without an
            # outcome, and the batch ends with inputs left.
            log.error("batch %s: commit %s is corrupted: %s", self.group_id, key, exc)
            return
        rank = (1, *commits.commit_rank(epoch, seq), key)
        seen = self._seen[key]
        for index, header, payload in records:
            choice.offer(index, rank, (header, payload), first=epoch == 0, seen=seen)
