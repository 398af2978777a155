"""A discrete-event driver for pool workers' machines (runner.pool.machine): many
workers over one in-memory object store, on a simulated clock. No loop, no IO: the
machines are pure, so their interleavings (races, deaths, takeovers) are replayed
exactly, from a seed."""

from __future__ import annotations

import hashlib
import heapq
import pickle
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from runner import protocol, results_log
from runner.pool.machine import WorkerMachine
from runner.pool.ops import Create, Exit, Kill, List, Op, Read, Replace, Run, Sleep, Write
from runner.pool.options import PoolOptions

GID = "grp-00000000feed"


def ok(index: int) -> tuple[protocol.FinalRecord, bytes]:
    record: protocol.FinalRecord = {
        "state": "succeeded",
        "phase": None,
        "error": None,
        "error_type": None,
    }
    return record, pickle.dumps(protocol.result_payload(success=True, result=index * index))


@dataclass
class Store:
    """Objects by key, with create-if-absent; counts requests by kind."""

    objects: dict[str, bytes] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)

    def outcomes(self, group_id: str = GID) -> dict[int, list[protocol.OutcomeHeader]]:
        """Every outcome record per input, over all bursts and single objects."""
        found: dict[int, list[protocol.OutcomeHeader]] = {}
        for key, data in sorted(self.objects.items()):
            if key.startswith(protocol.group_bursts_prefix(group_id)):
                assert data.startswith(protocol.BURST_MAGIC)
                records, _ = results_log.scan(data, len(protocol.BURST_MAGIC))
                for index, head, _, _ in records:
                    found.setdefault(index, []).append(results_log.header(head))
            elif key.startswith(protocol.group_results_prefix(group_id)):
                index = protocol.parse_outcome_name(
                    key.removeprefix(protocol.group_results_prefix(group_id))
                )
                assert index is not None
                found.setdefault(index, []).append(protocol.decode_outcome(data)[0])
        return found


def generation(data: bytes) -> int:
    """An object's generation in :class:`Store`: a digest of its bytes (a claim's bytes
    differ in every version: its lease's end moves on, a takeover ends it)."""
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1


def answer(machine: WorkerMachine, objects: dict[str, bytes], op: object) -> bool:
    """Answer a storage operation over ``objects`` at once; False for any other
    operation."""
    if isinstance(op, List):
        machine.listed(op.prefix, sorted(k for k in objects if k.startswith(op.prefix)))
    elif isinstance(op, Read):
        data = objects.get(op.key)
        machine.read(op.key, data, None if data is None else generation(data))
    elif isinstance(op, Create):
        won = op.key not in objects
        objects.setdefault(op.key, op.data)
        machine.created(op.key, generation(op.data) if won else None)
    elif isinstance(op, Write):
        objects[op.key] = op.data
        machine.written(op.key)
    elif isinstance(op, Replace):
        current = objects.get(op.key)
        if current is None or generation(current) != op.generation:
            machine.replaced(op.key, None)
        else:
            objects[op.key] = op.data
            machine.replaced(op.key, generation(op.data))
    else:
        return False
    return True


Runner = Callable[[int, int], tuple[float, protocol.FinalRecord, bytes]]
"""``(index, attempt) -> (seconds, record, payload)``."""


@dataclass
class Pool:
    """Workers stepping their machines over :class:`Store` on a simulated clock."""

    options: PoolOptions
    run: Runner
    store: Store = field(default_factory=Store)
    seed: int = 0
    io_s: float = 0.002
    now: float = 1_000.0
    machines: dict[str, WorkerMachine] = field(default_factory=dict)
    exits: dict[str, str] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)
    runs: Counter[int] = field(default_factory=Counter)
    doom: set[int] = field(default_factory=set)
    """Inputs whose run kills their worker; the Job controller starts another."""
    machine_type: type[WorkerMachine] = WorkerMachine
    """The machines' class (a subclass records their operations: test_pool_replay)."""

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._events: list[tuple[float, int, str]] = []
        self._seq = 0
        self._running: dict[str, tuple[int, float, float, protocol.FinalRecord, bytes]] = {}
        self.last_write = self.now
        self._paused: dict[str, float] = {}

    def start(
        self,
        name: str,
        at: float | None = None,
        ordinal: int | None = None,
        *,
        spread_start: bool = True,
    ) -> WorkerMachine:
        machine = self.machine_type(
            self.options, GID, name, ordinal=ordinal, spread_start=spread_start
        )
        self.machines[name] = machine
        self._at(self.now if at is None else at, name)
        return machine

    def pause(self, name: str, until: float) -> None:
        """The worker stalls (no step of it runs) until ``until``."""
        self._at(until, name)
        self._paused[name] = until

    def kill(self, name: str) -> None:
        """The worker dies now: nothing it buffered is written."""
        self.dead.add(name)
        self._running.pop(name, None)

    def _at(self, when: float, name: str) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, name))

    def step_until(self, until: float | None = None, *, max_steps: int = 2_000_000) -> None:
        for _ in range(max_steps):
            if not self._events:
                return
            when, _, name = self._events[0]
            if until is not None and when > until:
                self.now = until
                return
            heapq.heappop(self._events)
            self.now = max(self.now, when)
            if self._paused.get(name, self.now) > self.now:
                continue
            if name not in self.dead and name not in self.exits:
                self._step(name)
        raise AssertionError("the pool did not finish")

    def _step(self, name: str) -> None:
        machine = self.machines[name]
        self._perform(name, machine, self._next_op(name, machine))

    def _next_op(self, name: str, machine: WorkerMachine) -> Op:
        """Feed the machine the input that ended, if one did; its next operation."""
        running = self._running.get(name)
        if running is not None and self.now >= running[1]:
            index, _, seconds, record, payload = self._running.pop(name)
            kind = record.get("error_type")  # (the runner sends its type's and bases' names)
            types = frozenset({kind}) if kind else None
            machine.ran(index, record, payload, seconds=seconds, error_types=types)
        op = machine.next(wall=self.now, mono=self.now, pick=self.rng.random())
        self.store.requests[type(op).__name__] += 1
        return op

    def _perform(self, name: str, machine: WorkerMachine, op: Op) -> None:
        """Perform ``op`` at once and schedule the worker's next step."""
        delay = self.io_s
        if answer(machine, self.store.objects, op):
            if isinstance(op, (Write, Replace)):
                self.last_write = self.now
        elif isinstance(op, Run):
            self.runs[op.index] += 1
            if op.index in self.doom:
                self.kill(name)
                self.start(f"{name}+")
                return
            seconds, record, payload = self.run(op.index, op.attempt)
            self._running[name] = (op.index, self.now + seconds, seconds, record, payload)
            delay = 0.0
        elif isinstance(op, Kill):
            self._running.pop(name, None)
            machine.ended(op.index)
            delay = 0.0
        elif isinstance(op, Sleep):
            delay = op.seconds
        elif isinstance(op, Exit):
            self.exits[name] = op.reason
            return
        if name in self._running:  # an input that ends meanwhile is fed at once
            delay = min(delay, max(0.0, self._running[name][1] - self.now))
        self._at(self.now + delay, name)


def running(
    machine: WorkerMachine, wall: float = 1_000.0, pick: float = 0.0
) -> tuple[WorkerMachine, Run]:
    """Step a lone worker over an empty store until it runs its first input."""
    op = machine.next(wall=wall, mono=0.0, pick=pick)
    while not isinstance(op, Run):
        if isinstance(op, Read):
            machine.read(op.key, None, None)
        elif isinstance(op, Create):
            machine.created(op.key, generation(op.data))
        elif isinstance(op, List):
            machine.listed(op.prefix, [])
        else:
            raise TypeError(f"unexpected {op!r}")
        op = machine.next(wall=wall, mono=0.0, pick=pick)
    return machine, op
