"""A coordinator's start in storage: its epoch, and after a restart, which inputs'
outcomes are durable already (:class:`~runner.pool.coordinator.server.Server`).

Both go through the server's ``patiently`` (a storage call tried again while it fails
in a way that may pass).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from runner import protocol
from runner.pool.coordinator import commits
from runner.results_log import decode_burst
from runner.store import RunnerStore

Patiently = Callable[..., Awaitable[Any]]
"""``patiently(what, call, *args)``: ``call(*args)`` in the store's thread, tried again."""


async def take_epoch(
    patiently: Patiently, store: RunnerStore, group_id: str, host: str, port: int
) -> int:
    """Create ``coordinator/{epoch}.json`` (where this coordinator listens) and return
    its epoch: 0 if it can (a batch's first coordinator lists nothing), else the one
    after the highest listed; of two coordinators that start at once, one gets each."""
    record = commits.CoordinatorRecord(host=host, port=port, started=time.time())
    data = commits.encode_coordinator(record)
    first = commits.coordinator_key(group_id, 0)
    if await patiently("taking epoch 0", store.create_if_absent, first, data):
        return 0
    prefix = commits.coordinator_prefix(group_id)
    keys = await patiently("listing coordinators", store.list, prefix)
    listed = [commits.parse_coordinator_key(group_id, k) for k in keys]
    epoch = max((e for e in listed if e is not None), default=-1) + 1
    while True:
        key = commits.coordinator_key(group_id, epoch)
        if await patiently("taking an epoch", store.create_if_absent, key, data):
            return epoch
        epoch += 1  # another coordinator of this batch took it at the same time


async def durable_inputs(patiently: Patiently, store: RunnerStore, group_id: str) -> set[int]:
    """The inputs whose outcomes are in storage: in a commit, or an object of their own
    (a restart's). A commit listed and gone since (the batch cleaned up) counts none."""
    done: set[int] = set()
    prefix = commits.commits_prefix(group_id)
    for key in await patiently("listing commits", store.list, prefix):
        if commits.parse_commit_key(group_id, key) is not None:
            try:
                data = await patiently("reading a commit", store.read, key)
            except FileNotFoundError:
                continue
            done.update(index for index, _, _ in decode_burst(data))
    prefix = protocol.group_results_prefix(group_id)
    for key in await patiently("listing outcomes", store.list, prefix):
        index = protocol.parse_outcome_name(key.removeprefix(prefix))
        if index is not None:
            done.add(index)
    return done
