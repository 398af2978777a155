"""A coordinated pool's worker: ``python -m runner.pool --storage URL --group GID`` with
the batch's token in :data:`~runner.pool.coordinator.wire.TOKEN_ENV`.

The shell of :class:`~runner.pool.coordinator.member.Member`. It connects to its
coordinator first (its start spread, then one read: epoch 0's record), then sets up
like the leaderless worker (:class:`runner.pool.worker.Worker`, whose set-up and input
runs it shares: the manifest, the function checked and held by a zygote, the context;
each input in a process forked from the zygote, its output echoed), reading the
batch's objects from the coordinator's shelf (:mod:`.served`), and, instead of
claiming spans in storage, runs what its coordinator hands it: storage sees this
worker for that one read and a large result's object of its own (and, while no
coordinator can be reached, for the batch's reads themselves).

On SIGTERM (its pod deleted) it ends the running input, tells the coordinator, and
waits up to :data:`TERM_ACK_SECONDS` for its outcomes' acknowledgements before it exits
:data:`~runner.pool.signals.EXIT_TERMINATED`.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import time
from pathlib import Path
from typing import Final

from runner import protocol
from runner.pool.coordinator import messages as m
from runner.pool.coordinator import wire
from runner.pool.coordinator.link import Dropped, Link, connect, find, stopped
from runner.pool.coordinator.member import Connect, Fetch, Member, Say
from runner.pool.coordinator.served import ServedStore
from runner.pool.coordinator.upkeep import MemberUpkeep
from runner.pool.courier import Answer
from runner.pool.ops import Create, Exit, Kill, Op, Run, Sleep
from runner.pool.options import PoolOptions
from runner.pool.signals import EXIT_TERMINATED
from runner.pool.worker import Worker
from runner.store import RunnerStore

START_PER_S: Final = 4_000.0
"""Workers a second a pool's start admits (:meth:`PoolOptions.start_wait`): each reads
its coordinator's record, under the bucket's 5,000 reads a second before it scales up
(0.25 s at 1,000 workers)."""
FIRST_LOOKS: Final = 5
"""Looks for epoch 0's record before setting up, while it is not there (after about
0.1, 0.2, 0.4 and 0.8 s: the coordinator's start takes two storage requests): then the
worker reads the batch from storage."""
FIRST_LOOK_S: Final = 0.1
TERM_ACK_SECONDS: Final = 5.0
"""After SIGTERM, how long the worker waits for its last outcomes' acknowledgements
(a commit takes a fifth of a second; a pod's grace is 30 s by default)."""


def coordinated_worker(
    store: RunnerStore, group_id: str, name: str, workdir: Path, ordinal: int | None
) -> CoordinatedWorker:
    """The worker of ``python -m runner.pool`` when the batch's token is set.

    :raises SystemExit: the token is not hex.
    """
    try:
        token = bytes.fromhex(os.environ[wire.TOKEN_ENV])
    except ValueError:
        raise SystemExit(f"{wire.TOKEN_ENV} must hold the batch's token in hex") from None
    return CoordinatedWorker(store, group_id, name, workdir, token, ordinal)


class CoordinatedWorker(Worker):
    """One worker of a coordinated pool (see the module docstring)."""

    def __init__(
        self,
        store: RunnerStore,
        group_id: str,
        name: str,
        workdir: Path,
        token: bytes,
        ordinal: int | None = None,
    ) -> None:
        super().__init__(store, group_id, name, workdir, ordinal)
        self.token = token
        self.link: Link | None = None
        self.member: Member | None = None
        self.served = ServedStore(self.store.store, lambda: self.link)
        self.store.store = self.served  # the patient store's retries go around it

    # -- the start -----------------------------------------------------------------------

    def start_wait(self, sized: PoolOptions) -> float:
        return sized.start_wait(self.ordinal, random.random(), rate=START_PER_S)

    def before_reads(self) -> None:
        """Connect before setting up, so that the batch's reads are the coordinator's
        (its hello asks for nothing yet): epoch 0's record, looked for again while it is
        not there (a pool's pods and its coordinator start together) for
        :data:`FIRST_LOOKS` looks; a full look if that coordinator is gone. Unreached,
        the worker reads from storage and its member connects later."""
        hello = m.Hello(self.name, (), wants=False)
        wait, looks, first = FIRST_LOOK_S, 1, True
        while True:
            try:
                where = find(self.store, self.group_id, first=first)
                if isinstance(where, tuple):
                    host, port = where[1]["host"], where[1]["port"]
                    self.link = connect(host, port, where[0], self.token, hello)
                    return
            except (OSError, wire.WireError) as e:
                print(f"kinetic pool: worker {self.name}: no coordinator yet: {e}", flush=True)
                if not first:
                    return
                first = False  # epoch 0's is gone (a restart): a full look
                continue
            if where is not None or not first or looks >= FIRST_LOOKS:
                return  # the batch ended, or no coordinator started yet
            time.sleep(wait * (0.5 + random.random() / 2))
            wait, looks = wait * 2, looks + 1

    def stopped_before_start(self) -> bool:
        # Linked, the coordinator says so (an Exit on connecting).
        return self.link is None and super().stopped_before_start()

    def _member(self) -> Member:
        assert self.member is not None
        return self.member

    # -- the loop ------------------------------------------------------------------------

    def _run(self, options: PoolOptions, *, spread_start: bool) -> int:
        if not self.set_up_or_stop(options):
            return protocol.EXIT_OK
        member = self.member = Member(options, self.group_id, self.name)
        if self.link is not None:  # connected before setting up: ask for a span now
            member.linked_up(time.monotonic(), asked=False)
        # The member answers what the leaderless worker's machine answers (run_input's
        # ran() and ended(), the loop's operations): the shell is shared.
        self.machine = member  # type: ignore[assignment]
        try:
            return self.loop(member)  # type: ignore[arg-type]
        finally:
            if self.link is not None:
                self.link.close()

    def upkeep(self) -> MemberUpkeep:
        return MemberUpkeep(self)

    def perform(self, machine: object, op: Op) -> None:
        self.request(machine, op)()

    def wake_fds(self) -> list[int]:
        fds = [self.termination.read_fd, self.courier.fd]
        return fds if self.link is None else [*fds, self.link.fd]

    def next_op(self) -> Op:
        """The member's next operation; what it says goes out here, at once."""
        member = self._member()
        while True:
            self._hear(member)
            op = member.next(time.monotonic())
            if not isinstance(op, Say):
                return op  # type: ignore[return-value]  # Connect: the courier's or ours
            self._say(member, op.message)

    def _hear(self, member: Member) -> None:
        link = self.link
        if link is None:
            return
        try:
            heard = link.take()
        except Dropped:
            self._drop(member)
            return
        now = time.monotonic()
        for message in heard:
            member.heard(message, now)

    def _say(self, member: Member, message: m.ToCoordinator) -> None:
        if self.link is None:
            member.disconnected(time.monotonic(), random.random())
            return
        try:
            self.link.send(message)
        except Dropped as e:
            print(f"kinetic pool: worker {self.name}: {e}", flush=True)
            self._drop(member)

    def _drop(self, member: Member) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None
        member.disconnected(time.monotonic(), random.random())

    # -- the slow operations (the courier's while an input runs) -------------------------

    def request(self, machine: object, op: Op) -> Answer:
        member = self._member()
        if isinstance(op, Create):
            self.store.create_if_absent(op.key, op.data)  # found there: an earlier try's
            return lambda: member.created(op.key)
        if isinstance(op, Connect):
            return self._connect(member, op.hello)
        if isinstance(op, Fetch):
            chunks = self.chunks
            try:
                items = chunks.read(op.chunk)
            except Exception as e:  # noqa: BLE001 - the input that needs it reads it then, and says why
                print(f"kinetic pool: worker {self.name}: reading ahead: {e}", flush=True)
                return lambda: member.fetched_chunk(op.chunk)

            def keep() -> None:
                chunks.keep(op.chunk, items)
                member.fetched_chunk(op.chunk)

            return keep
        raise TypeError(f"not an operation of a coordinated worker: {op!r}")

    def _connect(self, member: Member, hello: m.Hello) -> Answer:
        try:
            where = find(self.store, self.group_id)
            if isinstance(where, tuple):
                epoch, record = where
                link = connect(record["host"], record["port"], epoch, self.token, hello)
                return lambda: self._linked(member, link)
            reason = where or stopped(self.store, self.group_id)
        except (OSError, wire.WireError) as e:
            print(f"kinetic pool: worker {self.name} cannot reach its coordinator: {e}", flush=True)
            reason = None
            with contextlib.suppress(OSError):
                reason = stopped(self.store, self.group_id)
        if reason is not None:
            return lambda: member.gone_away(reason)
        return lambda: member.unreachable(time.monotonic(), random.random())

    def _linked(self, member: Member, link: Link) -> None:
        if self.link is not None:
            self.link.close()
        self.link = link
        member.linked_up(time.monotonic())

    def terminate(self, machine: object) -> int:
        """After SIGTERM: the running input was ended (no outcome); the coordinator
        hears of it, and the last outcomes are acknowledged, within a bound."""
        print(f"kinetic pool: worker {self.name} got SIGTERM", flush=True)
        member = self._member()
        self.courier.settle()
        member.heard(m.Exit("terminated", kill=True), time.monotonic())
        deadline = time.monotonic() + TERM_ACK_SECONDS
        while time.monotonic() < deadline:
            op = self.next_op()
            if isinstance(op, Exit):
                break
            if isinstance(op, (Run, Kill)):
                if member.running is not None:
                    member.ended(member.running[0])
            elif isinstance(op, Sleep):
                fds = self.wake_fds()[1:]  # the SIGTERM byte is read already
                select.select(fds, [], [], min(op.seconds, deadline - time.monotonic()))
            else:
                self.request(member, op)()
        print(f"kinetic pool: worker {self.name} exits (terminated)", flush=True)
        self.report()
        return EXIT_TERMINATED
