"""A coordinated pool worker's upkeep while an input runs in its own process
(``reuse_process``): the member's messages (beats, its next ask, outcomes heard as
acknowledged, a read ahead) go on from a helper thread, as the leaderless worker's
machine's do (:class:`runner.pool.attempts.Upkeep`, whose hand-over it shares: the main
thread lends the member until :meth:`finish`).

An input in the worker's own process cannot be ended alone: a stop that ends running
inputs (a cancel, a ``fail_fast`` failure), and SIGTERM, end the worker once its
outcomes are acknowledged, the input cut with it (no outcome: it never finished).
"""

from __future__ import annotations

import os
import select
from typing import TYPE_CHECKING

from runner import protocol
from runner.pool.attempts import Upkeep
from runner.pool.ops import Exit, Kill, Run, Sleep

if TYPE_CHECKING:
    from runner.pool.coordinator.member import Member
    from runner.pool.coordinator.worker import CoordinatedWorker


class MemberUpkeep(Upkeep):
    """The member's upkeep while an input runs in the worker's own process."""

    def __init__(self, worker: CoordinatedWorker) -> None:
        super().__init__(worker)
        self.coordinated = worker

    def run(self) -> None:
        worker = self.coordinated
        member = worker.member
        assert member is not None
        try:
            while not self.done.is_set():
                if worker.termination.check():
                    os._exit(worker.terminate(member))  # the input is cut: no outcome
                op = worker.next_op()
                if isinstance(op, Sleep):
                    self._sleep(op.seconds)
                elif isinstance(op, Kill):
                    if member.exit is None and member.gone is None:
                        continue  # this input alone dropped: it finishes (its cancel stands)
                    member.ended(op.index)  # cut when the worker exits: no outcome
                    self._exit_when_acknowledged(member)
                else:
                    worker.perform(member, op)
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread
            self.error = exc

    def _sleep(self, seconds: float) -> None:
        select.select([self._wake_read, *self.coordinated.wake_fds()], [], [], seconds)

    def _exit_when_acknowledged(self, member: Member) -> None:
        worker = self.coordinated
        while True:
            if worker.termination.check():
                os._exit(worker.terminate(member))
            op = worker.next_op()
            if isinstance(op, Exit):
                print(f"kinetic pool: worker {worker.name} exits ({op.reason})", flush=True)
                worker.report()
                os._exit(protocol.EXIT_OK)
            if isinstance(op, Sleep):
                self._sleep(op.seconds)
            elif not isinstance(op, (Run, Kill)):
                worker.perform(member, op)
