"""A coordinated pool's coordinator as a sans-IO state machine. Pure.

The shell (its IO: the listener, the connections, storage) feeds it events, each with
the time of a monotonic clock, and carries out the actions it returns, in order:
:class:`Send` a message on a connection, :class:`Close` one, :class:`WriteCommit` (create
the commit if absent, until storage answers, then :meth:`Coordinator.landed`),
:class:`WriteStop` (``stop.json``, a ``fail_fast`` stop), :class:`Finished` (every
outcome is durable, or the batch stopped and nothing is left to commit). It calls
:meth:`Coordinator.tick` by :meth:`Coordinator.next_tick` at the latest.

Invariants (checked after every step by ``tests/unit/test_pool_coordinator_explorer.py``,
with crashes of workers and of the coordinator, dropped connections, paused workers
and commits whose answer is lost):

1. An outcome is acknowledged to a worker only once it is durable.
2. An input has at most one holder in the coordinator's view.
3. The coordinator's commits never hold two records of one input; an input has
   records in two commits only across a restart (a commit of the coordinator that
   died landing after its successor read them), and the earliest stands.
4. Every input ends with a durable outcome unless the batch stopped, and
   :class:`Finished` comes only then; nothing is handed out after a stop, and every
   connected worker hears of the stop at once (whatever the pool's size).
5. A worker's outcome reported and not acknowledged is said again on its next
   connection, so what a live worker ran is never lost.

Knobs: :data:`COMMIT_SECONDS`, :data:`SPAN_CAP_SECONDS`, :data:`SILENCE_SECONDS` (and the
workers' :data:`BEAT_SECONDS`); a restarted coordinator waits for its workers, at most
:data:`RESTART_GRACE_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from runner.pool.coordinator import messages as m
from runner.pool.coordinator.ledger import Commit, Ledger
from runner.pool.coordinator.queue import SpanQueue

COMMIT_SECONDS: Final = 0.2
"""Seconds from one commit's cut to the next at least: five writes a second, any size."""
SPAN_CAP_SECONDS: Final = 2.0
"""Work a span holds at most, at the pace heard so far."""
BEAT_SECONDS: Final = 1.0
"""A worker says something at least this often."""
SILENCE_SECONDS: Final = 3.0
"""A worker silent this long is presumed dead: its inputs are handed out again."""
RESTART_GRACE_SECONDS: Final = 5.0
"""A restarted coordinator hands nothing out until every worker of the pool has
reconnected and said what it holds, or for this long at most (a worker looks for its
coordinator again within :data:`runner.pool.coordinator.member.RECONNECT_MAX_S`): what
it hands out before, a worker not back yet may be running."""


@dataclass(frozen=True)
class Send:
    conn: int
    message: m.ToWorker


@dataclass(frozen=True)
class Close:
    conn: int


@dataclass(frozen=True)
class WriteCommit:
    commit: Commit


@dataclass(frozen=True)
class WriteStop:
    reason: str
    detail: str


@dataclass(frozen=True)
class Finished:
    reason: str


Action = Send | Close | WriteCommit | WriteStop | Finished


@dataclass
class _Worker:
    name: str
    conn: int | None
    heard_at: float
    holding: set[int] = field(default_factory=set)
    wants: bool = False
    silent: bool = False
    released: set[int] = field(default_factory=set)
    """What it held when it was presumed dead (it may still run them)."""


class Coordinator:
    """The coordinator of one batch of ``total`` inputs run by ``workers`` workers.

    :param epoch: its start's number (0 for the first; a restart takes the next).
    :param durable: inputs with a durable outcome already (read by a restart).
    :param fail_fast: a final failure stops the batch.
    :param kill_on_fail: such a stop ends the running inputs too (else they finish);
        any other stop (a cancel, a batch that cannot run) ends them.
    :param now: the time it starts (monotonic clock).
    """

    def __init__(
        self,
        total: int,
        workers: int,
        *,
        epoch: int = 0,
        durable: Iterable[int] = (),
        fail_fast: bool = False,
        kill_on_fail: bool = False,
        now: float = 0.0,
    ) -> None:
        self.total = total
        self.pool_size = workers
        self.epoch = epoch
        self.fail_fast = fail_fast
        self.kill_on_fail = kill_on_fail
        self.queue = SpanQueue(total, workers, SPAN_CAP_SECONDS)
        self.ledger = Ledger(total, epoch, durable)
        self.holders: dict[int, str] = {}
        self.workers: dict[str, _Worker] = {}
        self.by_conn: dict[int, str] = {}
        self.stopped: str | None = None
        self.finished = False
        self.ready_at = now
        self.commit_at = now
        self.in_grace = epoch > 0
        if epoch > 0:
            self.queue.restart(i for i in range(total) if i not in self.ledger.durable)
            self.ready_at = now + RESTART_GRACE_SECONDS

    # -- events ------------------------------------------------------------------------

    def connected(self, conn: int, hello: m.Hello, now: float) -> list[Action]:
        """A connection ``conn`` said ``hello`` (a worker's first or next connection)."""
        actions: list[Action] = []
        worker = self.workers.get(hello.worker)
        if worker is None:
            worker = self.workers[hello.worker] = _Worker(hello.worker, conn, now)
        elif worker.conn is not None and worker.conn != conn:
            self.by_conn.pop(worker.conn, None)
            actions.append(Close(worker.conn))  # a connection of its that went stale
        worker.conn, worker.heard_at, worker.silent = conn, now, False
        worker.released.clear()  # the hello says what it holds
        self.by_conn[conn] = worker.name
        # What it held and does not say it holds never reached it (a span sent on a
        # connection that died half-open, unnoticed here): it goes back to the queue.
        said = set(hello.holding)
        lost = [i for i in worker.holding if i not in said]
        for index in lost:
            worker.holding.discard(index)
            del self.holders[index]
        self.queue.give_back(i for i in lost if not self.ledger.has(i))
        dropped = []
        for index in hello.holding:
            if self.ledger.has(index) or self.holders.get(index, worker.name) != worker.name:
                dropped.append(index)
            else:
                self.holders[index] = worker.name
                worker.holding.add(index)
        if dropped:
            actions.append(Send(conn, m.Drop(tuple(dropped))))
        worker.wants = hello.wants
        if self.stopped is not None or self.finished:
            actions.append(Send(conn, self._exit()))
        elif self.in_grace and self._all_back():
            self.in_grace = False
            actions += self._serve_waiting(now)
        elif worker.wants:
            actions += self._hand_out(worker, now)
        return actions

    def received(self, conn: int, message: m.ToCoordinator, now: float) -> list[Action]:
        """A message after the hello on connection ``conn``."""
        name = self.by_conn.get(conn)
        if name is None:
            return [Close(conn)]  # a connection replaced by a newer one of its worker
        worker = self.workers[name]
        worker.heard_at = now
        actions: list[Action] = []
        if worker.silent:
            actions += self._back(worker, conn)
        if isinstance(message, m.Outcome):
            actions += self._heard(worker, message, now)
        elif isinstance(message, m.More):
            worker.wants = True
            if self.stopped is None and not self.finished:
                actions += self._hand_out(worker, now)
        elif isinstance(message, m.Hello):
            raise TypeError("a hello after the first message of a connection")
        return actions + self._maybe_finish()

    def disconnected(self, conn: int, now: float) -> list[Action]:
        """Connection ``conn`` closed: its worker's pod died (or the network dropped
        it: the worker reconnects, and keeps what is still free)."""
        name = self.by_conn.pop(conn, None)
        if name is None:
            return []
        worker = self.workers[name]
        worker.conn, worker.wants = None, False
        worker.released.clear()
        actions = self._release(worker, now)
        return actions + self._maybe_finish()

    def tick(self, now: float) -> list[Action]:
        """Time passed: silent workers are presumed dead, a commit is cut when due."""
        actions: list[Action] = []
        for worker in list(self.workers.values()):
            if worker.holding and not worker.silent and now - worker.heard_at >= SILENCE_SECONDS:
                worker.silent = True
                worker.released = set(worker.holding)
                actions += self._release(worker, now)
        if self.in_grace and now >= self.ready_at:
            self.in_grace = False
        actions += self._serve_waiting(now)
        if now >= self.commit_at:
            commit = self.ledger.cut()
            if commit is not None:
                self.commit_at = now + COMMIT_SECONDS
                actions.append(WriteCommit(commit))
        return actions + self._maybe_finish()

    def landed(self, commit: Commit, now: float) -> list[Action]:
        """``commit`` was created in storage (or found there: an earlier try's)."""
        actions: list[Action] = []
        for name, indices in self.ledger.landed(commit).items():
            conn = self.workers[name].conn
            if conn is not None:
                actions.append(Send(conn, m.Ack(tuple(indices))))
        return actions + self._maybe_finish()

    def stop(self, reason: str, now: float) -> list[Action]:
        """The batch stopped (``stop.json`` read: a cancel, a batch that cannot run;
        ``reason`` is its :data:`runner.protocol.StopReason`):
        nothing more is handed out, and every connected worker is told at once."""
        if self.stopped is not None or self.finished:
            return []
        self.stopped = reason
        exit_ = self._exit()
        actions: list[Action] = [
            Send(w.conn, exit_) for w in self.workers.values() if w.conn is not None
        ]
        return actions + self._maybe_finish()

    def own_outcomes(self, indices: list[int], now: float) -> list[Action]:
        """Inputs found with an outcome object of their own (a reader's cancel of one
        input, a worker's large result): durable, never handed out again; a worker that
        holds one is told to drop it (and ends it if it runs it)."""
        actions: list[Action] = []
        for index in indices:
            if not 0 <= index < self.ledger.total or index in self.ledger.durable:
                continue
            self.ledger.own(index)
            name = self.holders.pop(index, None)
            if name is not None:
                holder = self.workers[name]
                holder.holding.discard(index)
                if holder.conn is not None:
                    actions.append(Send(holder.conn, m.Drop((index,))))
        return actions + self._maybe_finish()

    def running(self) -> list[int]:
        """The input each worker heard from runs, as far as the coordinator can tell:
        the first it holds (a worker runs its spans in order)."""
        return sorted(min(w.holding) for w in self.workers.values() if w.holding and not w.silent)

    def next_tick(self) -> float | None:
        """When :meth:`tick` is due at the latest (None: no time-driven step is left)."""
        if self.finished:
            return None
        times = [
            w.heard_at + SILENCE_SECONDS
            for w in self.workers.values()
            if w.holding and not w.silent
        ]
        if self.ledger.pending and self.ledger.in_flight is None:
            times.append(self.commit_at)
        if self.in_grace:
            times.append(self.ready_at)
        return min(times, default=None)

    # -- steps -------------------------------------------------------------------------

    def _exit(self) -> m.Exit:
        if self.stopped is None:
            return m.Exit("done")
        kill = self.stopped != "fail_fast" or self.kill_on_fail
        return m.Exit(self.stopped, kill=kill)

    def _heard(self, worker: _Worker, outcome: m.Outcome, now: float) -> list[Action]:
        actions: list[Action] = []
        first, ack_now = self.ledger.heard(outcome.index, outcome.record, worker.name)
        if self.holders.get(outcome.index) is not None:
            holder = self.workers[self.holders.pop(outcome.index)]
            holder.holding.discard(outcome.index)
        self.queue.heard(outcome.seconds)
        if ack_now and worker.conn is not None:
            actions.append(Send(worker.conn, m.Ack((outcome.index,))))
        if first and outcome.failed and self.fail_fast and self.stopped is None:
            actions.append(WriteStop("fail_fast", f"input {outcome.index} failed"))
            actions += self.stop("fail_fast", now)
        return actions

    def _all_back(self) -> bool:
        """Whether as many workers are connected as the pool has."""
        return sum(1 for w in self.workers.values() if w.conn is not None) >= self.pool_size

    def _serve_waiting(self, now: float) -> list[Action]:
        """A span for each connected worker that waits for one."""
        actions: list[Action] = []
        if not self.in_grace and self.stopped is None and not self.finished:
            for worker in self.workers.values():
                if worker.wants and worker.conn is not None and not worker.silent:
                    actions += self._hand_out(worker, now)
        return actions

    def _hand_out(self, worker: _Worker, now: float) -> list[Action]:
        if self.in_grace or worker.conn is None:
            return []

        def wanted(index: int) -> bool:
            return not self.ledger.has(index) and index not in self.holders

        span: list[int] = []
        while not span and (taken := self.queue.take(wanted, worker.name)):
            span = [i for i in taken if wanted(i)]  # fresh ones too: one may be cancelled
        if not span:
            worker.wants = True  # handed a span when a dead worker's inputs come back
            return []
        worker.wants = False
        for index in span:
            self.holders[index] = worker.name
        worker.holding.update(span)
        return [Send(worker.conn, m.Assign(tuple(span)))]

    def _back(self, worker: _Worker, conn: int) -> list[Action]:
        """A worker presumed dead was heard: it holds again what it held that is still
        free, and is told to drop what went to others or has an outcome."""
        worker.silent = False
        dropped = []
        for index in sorted(worker.released):
            if self.ledger.has(index) or index in self.holders:
                dropped.append(index)
            else:  # still in the queue, which skips what has a holder
                self.holders[index] = worker.name
                worker.holding.add(index)
        worker.released.clear()
        return [Send(conn, m.Drop(tuple(dropped)))] if dropped else []

    def _release(self, worker: _Worker, now: float) -> list[Action]:
        """``worker``'s inputs without an outcome go back to the queue, and to the
        workers waiting for work."""
        back = [i for i in worker.holding if not self.ledger.has(i)]
        for index in worker.holding:
            if self.holders.get(index) == worker.name:
                del self.holders[index]
        worker.holding.clear()
        if not back:
            return []
        self.queue.give_back(back)
        actions: list[Action] = []
        if self.stopped is None and not self.finished:
            for other in self.workers.values():
                if other.wants and not other.silent and other.conn is not None:
                    actions += self._hand_out(other, now)
        return actions

    def _maybe_finish(self) -> list[Action]:
        if self.finished or not self.ledger.settled():
            return []
        if self.stopped is None and not self.ledger.complete():
            return []
        if self.stopped is not None and any(w.conn is not None for w in self.workers.values()):
            return []  # a stopped batch keeps what its workers still report
        self.finished = True
        reason = self.stopped or "done"
        actions: list[Action] = []
        if self.stopped is None:
            exit_ = self._exit()
            actions += [Send(w.conn, exit_) for w in self.workers.values() if w.conn is not None]
        return [*actions, Finished(reason)]
