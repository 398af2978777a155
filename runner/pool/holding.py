"""What a worker holds: its claimed span, the input it runs, the outcomes it has not
written yet. Pure: the part of :class:`runner.pool.machine.WorkerMachine` that runs
inputs, renews the claim and writes bursts.

A worker runs its span's inputs in order (retries in place), buffering their outcomes;
it writes them as one burst when ``burst_max`` are buffered, ``burst_s`` after the first
(spread; at the span's end if that comes as soon), and before waiting or exiting: an
outcome is never visible before its burst is durable, and a takeover writes its first
outcome at once. A span's last burst waits for the next span's first input when the
worker goes on to claim one (:meth:`Holding.carry`): written while that input runs, it
costs no time. So does the next claim, created while the span's last inputs run
(:attr:`Holding.ahead`). It renews the claim between a third and a half of the lease
after its last write (spread), and before writing a burst once it lapsed: a replace at
the claim's generation, which fails once another worker took the span over (this worker
stalled past its lease), and the span is dropped with its buffer. It ends the running
input when the batch stops (cancel, ``cancel_running_on_fail``) or the input was
cancelled alone. The protocol as a whole is told in ``docs/pool-protocol.md``.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace

from runner import protocol, results_log
from runner.pool.book import PoolBook, stop_kills
from runner.pool.names import PoolNames
from runner.pool.ops import Create, Kill, List, Op, Replace, Run, Sleep, Write
from runner.pool.options import BURST_SPREAD, LARGE_RESULT, MAX_SPAN, PoolOptions
from runner.pool.spans import Span, claim_record

OUTPUT_TAIL = 64 * 1024
"""Bytes of an input's output kept in its outcome's header."""


@dataclass
class Buffer:
    """Outcomes run under one claim and not yet written: inputs ``[first, end)``."""

    span: Span
    first: int
    end: int
    since: float | None
    """The monotonic time of its first outcome (set at the step after it)."""
    records: list[bytes]
    wait: float = 0.0
    """Seconds after ``since`` it is due (set with ``since``)."""

    @property
    def opens_takeover(self) -> bool:
        """Whether it holds a takeover's first outcome, which is written at once
        (``docs/pool-protocol.md``)."""
        return self.span.number > 0 and self.first == self.span.first


class Holding:
    """One worker's claimed span, its running input and its buffer.

    :param queue: the machine's operations to hand out first (shared).
    :param generations: claim ``(start, number)`` -> its generation as this worker last
        read or wrote it (shared): renewals and takeovers replace a claim only at that
        generation (the fence).
    """

    def __init__(
        self,
        options: PoolOptions,
        book: PoolBook,
        names: PoolNames,
        worker: str,
        queue: list[Op],
        generations: dict[tuple[int, int], int],
    ) -> None:
        self.options, self.book, self.names, self.worker = options, book, names, worker
        self.queue = queue
        self.generations = generations
        self.span: Span | None = None
        """The claim this worker holds."""
        self.cursor = 0
        """The next input of the held span to look at."""
        self.running: tuple[int, int] | None = None
        """``(index, attempt)`` of the input running now."""
        self.killing = False
        self.fencing = False
        """A renewal of the held claim after its lease ran out is unanswered: no input
        of it starts before the answer tells whether it was taken over meanwhile."""
        self.retry: tuple[int, int] | None = None
        """``(index, attempt)`` of a failed input to run again, in place."""
        self.retry_delay = 0.0
        """Seconds the retry waits (a ``kinetic.Retries``' back-off), holding the span."""
        self.retry_due: float | None = None
        """When the retry may run (monotonic), once the machine saw it."""
        self.buffer: Buffer | None = None
        self.previous: Buffer | None = None
        """The last outcomes of the span before, written while the next one's first
        input runs (:meth:`carry`)."""
        self.run_since = 0.0
        """When the running input started (monotonic; set by the machine)."""
        self.ahead: Span | None = None
        """The next span, claimed while the held one's last inputs ran: held next."""
        self.ramp = options.first_span
        """The most inputs this worker's next fresh span holds (grows per span done)."""
        self.mean_s: float | None = None
        """Seconds this worker's inputs took, a moving average (None: none ran yet)."""
        self.stop_to_write: protocol.StopRecord | None = None
        """A ``fail_fast`` stop, written once the failure's burst is durable."""
        self.singles_read = float("-inf")  # when the outcomes of their own were listed
        self.renew_at = float("inf")
        """When the held claim is renewed next (wall clock; set at the step after its
        last write landed: :meth:`time_renewal`)."""
        self._written = False  # the held claim was written since the last step

    def hold(self, span: Span) -> None:
        """This worker won ``span``'s claim: its inputs run from ``span.first`` on."""
        self.span, self.cursor = span, span.first
        self._written, self.fencing = True, False

    def time_renewal(self, wall: float, pick: float) -> None:
        """At the first step after the held claim's write landed (won or renewed): when
        to renew it next. Between a third and a half of the lease after the write was
        decided, spread by ``pick`` (workers that claimed together would renew together,
        every period, and meet the bucket's write limit at once); never sooner than
        :attr:`~PoolOptions.object_gap_s` after it landed (a renewal that landed late,
        after 429s, would else be followed at once by the next, which the limit of one
        write a second per object refuses)."""
        span = self.span
        if self._written and span is not None:
            self._written = False
            spread = span.expires - self.options.lease_s * (2 / 3 - pick / 6)
            self.renew_at = max(spread, wall + self.options.object_gap_s)

    def start_buffer_clock(self, mono: float, pick: float) -> None:
        """Start the clock of a buffer whose first outcome came since the last step."""
        buffer = self.buffer
        if buffer is not None and buffer.since is None:
            buffer.since, spread = mono, BURST_SPREAD
            buffer.wait = self.options.burst_seconds * (1 - spread + 2 * spread * pick)

    @property
    def unwritten(self) -> bool:
        """Whether outcomes are buffered (of the held span or the one before)."""
        return self.buffer is not None or self.previous is not None

    def flush_due(self, mono: float) -> bool:
        """Whether a buffer is to be written now (between inputs). The held span's
        last burst is not due here: :meth:`carry`, or the machine's flush before the
        worker waits, decides."""
        buffer = self.buffer
        return self.previous is not None or (
            buffer is not None
            and (
                len(buffer.records) >= self.options.burst_max
                or self.burst_wait(buffer, mono) <= 0
                or buffer.opens_takeover
                or buffer.span is not self.span  # of a span done: before the next's inputs
                or self.stop_to_write is not None  # the failure is durable before the stop
            )
        )

    def burst_wait(self, buffer: Buffer, mono: float) -> float:
        """Seconds until ``buffer`` is due by its clock (0: now). Past its wait, it waits
        on while its span's last input would end by the latest a burst is due
        (:data:`BURST_SPREAD`) at this worker's pace: the span's last burst holds these
        outcomes as soon, for one write fewer (at 1,000 workers of 50 ms inputs, half
        wrote one shortly before their region's end, in the pool's busiest second)."""
        since, span, mean_s = buffer.since or mono, self.span, self.mean_s
        wait = buffer.wait - (mono - since)
        if wait > 0 or buffer.span is not span or span is None or mean_s is None:
            return max(0.0, wait)
        first = self.cursor if self.running is None else self.running[0]
        latest = since + self.options.burst_seconds * (1 + BURST_SPREAD)
        ends = mono + self.book.done.missing(first, span.end) * mean_s
        return latest - mono if ends <= latest else 0.0

    def input_ready(self, wall: float) -> bool:
        """Whether an input can start now — of the held span (its claim has not
        lapsed), or of the span claimed ahead once the held one is done — with none
        running or waiting for a retry and nothing stopping the batch: upkeep due
        between inputs can then be done while it runs."""
        span, ahead = self.span, self.ahead
        if (
            span is None
            or self.running is not None
            or self.fencing
            or self.retry is not None
            or self.stop_to_write is not None
            or self.book.stop is not None
        ):
            return False
        if self.book.done.first_missing(self.cursor, span.end) < span.end:
            return wall < span.expires
        # held next without a renewal first (take_ahead)
        return ahead is not None and wall < ahead.expires - self.options.lease_s * 2 / 3

    def flush_can_wait(self) -> bool:
        """Whether the due burst can be written while the next input runs (upkeep
        writes the span before's first, then the held span's): not a takeover's first
        outcome, which is written at once."""
        buffer = self.buffer
        if buffer is None:
            return self.previous is not None
        return buffer.span is self.span and not buffer.opens_takeover

    def carry(self, wall: float) -> bool:
        """The held span is done and the worker claims the next at once: its buffered
        outcomes become :attr:`previous`, written while the next span's first input
        runs — unless its lease has less than half left. True when carried (or nothing
        was buffered)."""
        buffer = self.buffer
        if buffer is None:
            return True
        if self.previous is not None or buffer.span.expires - wall < self.options.lease_s / 2:
            return False
        self.previous, self.buffer = buffer, None
        return True

    @property
    def next_ramp(self) -> int:
        """The most inputs a fresh span holds once the held span is done (the ramp
        grows with each span)."""
        return min(MAX_SPAN, self.ramp * 4)

    def ending_soon(self, mono: float, horizon: float) -> float:
        """Seconds until the running input should end, by this worker's pace, when it
        is past half of it and its pace is within ``horizon`` seconds (else 0): upkeep
        that can wait then waits for the next input's start. A request started near an
        input's end holds up the next input by what it outlasts it; started with the
        next input, by less."""
        mean = self.mean_s
        if self.running is None or mean is None or mean / 2 > horizon:
            return 0.0
        left = self.run_since + mean - mono
        return left if 0.0 < left <= mean / 2 else 0.0

    def next_input(self) -> int | None:
        """The held span's next input without an outcome (the cursor moves to it), or
        None when every input of it has one."""
        span = self.span
        assert span is not None
        index = self.book.done.first_missing(self.cursor, span.end)
        if index >= span.end:
            return None
        self.cursor = index
        return index

    def exhausted(self, index: int) -> bool:
        """Whether input ``index`` of the held span lost its worker ``max_claims`` times:
        it is failed (:meth:`give_up`), not run again."""
        span = self.span
        return span is not None and index == span.first and span.tries > self.options.max_claims

    def run(self, index: int, attempt: int = 0) -> Run:
        self.running = (index, attempt)
        return Run(index, attempt)

    def span_done(self, wall: float) -> None:
        """Every input of the held span has an outcome (its burst is out, or carried to
        the span claimed ahead, which is held next)."""
        self.span = None
        self.ramp = self.next_ramp
        if self.ahead is not None:
            carried = self.carry(wall)
            self.take_ahead(wall)
            if not carried and self.buffer is not None and self.previous is None:
                self.previous, self.buffer = self.buffer, None  # written first, at once
            # (Else the buffer, of the span done, is written before an input of the held
            # one runs: flush_due.)

    def take_ahead(self, wall: float) -> bool:
        """Hold the span claimed ahead (the held one is done, or was lost and its input
        ended); True when there was one. Claimed a third of a lease ago or more (this
        worker stalled), it is renewed before an input of it runs: the renewal fails
        if it was taken over meanwhile."""
        if self.ahead is None or self.span is not None or self.running is not None:
            return False
        ahead, self.ahead = self.ahead, None
        self.hold(ahead)
        if wall >= ahead.expires - self.options.lease_s * 2 / 3:
            self._written, self.renew_at = False, wall
        return True

    def ahead_due(self) -> bool:
        """Whether to claim the next span now, while the held span's last inputs run
        (a quarter of the longest span's work at most: a create refused by the bucket
        is retried within it, while the span's inputs go on, where a claim sent as the
        last input started stalled its worker a back-off); its pace is known and short
        beside the lease (the claim is not renewed before it is held), and nothing else
        is pending."""
        span, running = self.span, self.running
        return (
            span is not None
            and running is not None
            and self.ahead is None
            and not self.killing
            and self.retry is None
            and self.stop_to_write is None
            and self.mean_s is not None
            and self.mean_s < self.options.lease_s / 6
            and self.book.done.missing(running[0] + 1, span.end) * self.mean_s
            <= self.options.span_seconds / 4
        )

    # -- while an input runs --------------------------------------------------------------

    def upkeep(
        self, wall: float, mono: float, stop_due: float, wait_max: float, soon: float = 0.0
    ) -> Op:
        """The next operation while an input runs: end it, renew the claim, look for a
        cancel of it, write a due burst, or sleep until one of those is due — or, while
        the input should end within ``soon`` seconds (:meth:`ending_soon`), until it ends,
        unless the claim is near its lease's end."""
        book = self.book
        assert self.running is not None
        if self.span is None:
            return Sleep(0.05)  # the claim was lost: its input is being ended
        index = self.running[0]
        if not self.killing and (
            (book.stop is not None and stop_kills(book.stop, self.options)) or index in book.singles
        ):
            self.killing = True
            return Kill(index)
        if self.previous is not None:
            return self.flush(wall)
        if soon > 0 and wall < self.span.expires - self.options.lease_s / 6:
            return Sleep(soon)
        renew = self.renew(wall)
        if renew is not None:
            return renew
        third = self.options.lease_s / 3
        if mono - self.singles_read >= third:
            self.singles_read = mono
            return List(self.names.results)  # a cancel of the input is an object of its own
        buffer = self.buffer
        if buffer is not None and (
            self.burst_wait(buffer, mono) <= 0 or len(buffer.records) >= self.options.burst_max
        ):
            return self.flush(wall)
        due = [
            stop_due - mono if book.stop is None else wait_max,
            self.renew_at - wall,
            third - (mono - self.singles_read),
        ]
        if buffer is not None:
            due.append(self.burst_wait(buffer, mono))
        return Sleep(max(0.01, min(due)))

    def renew(self, wall: float, *, lapsed: bool = False) -> Op | None:
        """Renew the held claim once it is due (:meth:`time_renewal`), or at once when
        its lease ``lapsed``: a replace at the generation this worker last wrote, so
        that it fails if the claim was taken over meanwhile (a takeover replaces it
        first), however late it lands; the span is then dropped (:meth:`renewed`)."""
        span = self.span
        if span is None or (wall < self.renew_at and not lapsed):
            return None
        self.renew_at = float("inf")  # timed again once this write landed
        self.fencing = wall >= span.expires
        generation = self.generations[(span.start, span.number)]
        self.span = replace(span, expires=wall + self.options.lease_s)
        if self.buffer is not None:
            self.buffer.span = self.span
        self.book.learn_span(self.span)
        key = self.names.claim(span.start, span.number)
        return Replace(key, claim_record(self.span), generation)

    def renewed(self, key: str, generation: int | None) -> None:
        """The answer to a renewal: the claim's new generation, or None when it was
        taken over (this worker stalled past its lease)."""
        span = self.span
        self.fencing = False
        if span is None or key != self.names.claim(span.start, span.number):
            return  # a renewal of a span this worker no longer holds
        if generation is None:
            self.lose()  # taken over while this worker stalled past its lease
        else:
            self.generations[(span.start, span.number)] = generation
            self._written = True

    def lose(self) -> None:
        """The held claim was taken over (this worker stalled past its lease): drop it,
        its unwritten outcomes and the running input (its new holder runs it)."""
        self.span = None
        self.buffer = None
        self.fencing = False
        self.previous = None  # of an earlier span: its inputs are run by whoever takes it
        self.retry = None  # a span claimed ahead stays: held once the input ended
        if self.running is not None and not self.killing:
            self.killing = True
            self.queue.append(Kill(self.running[0]))

    # -- outcomes -------------------------------------------------------------------------

    def ran(
        self,
        index: int,
        record: protocol.FinalRecord,
        payload: bytes,
        output: bytes = b"",
        seconds: float | None = None,
        error_types: frozenset[str] | None = None,
    ) -> None:
        """The running attempt of ``index`` ended (see
        :meth:`runner.pool.machine.WorkerMachine.ran`)."""
        assert self.running is not None
        assert self.running[0] == index
        attempt = self.running[1]
        self.running, self.killing = None, False
        # A span lost while the input ran queued its Kill: the input ended first.
        self.queue[:] = [op for op in self.queue if op != Kill(index)]
        span = self.span
        if span is None or not span.first <= index < span.end:
            return  # the claim was taken over meanwhile: the new holder runs it
        if seconds is not None:
            self.mean_s = seconds if self.mean_s is None else 0.8 * self.mean_s + 0.2 * seconds
        if record["state"] != "succeeded":
            delay = self.options.rule.delay_after_types(attempt, error_types)
            if delay is not None:
                self.retry, self.retry_delay, self.retry_due = (index, attempt + 1), delay, None
                return
        header = protocol.outcome_header(attempt, record, claim=span.number, worker=self.worker)
        if output:
            header["output"] = output[-OUTPUT_TAIL:].decode(errors="replace")
        self._record(index, header, payload)
        if record["state"] != "succeeded" and self.options.fail_fast:
            self.stop_to_write = protocol.stop_record("fail_fast", f"input {index} failed")

    def ended(self, index: int) -> None:
        """The running input was ended from outside (after :class:`Kill`): no outcome."""
        assert self.running is not None
        assert self.running[0] == index
        self.running, self.killing = None, False
        self.cursor = index + 1

    def give_up(self, index: int, span: Span, last: str) -> None:
        """Fail input ``index``, whose runs killed ``span.tries - 1`` workers (``last``
        the latest): it is not run again."""
        error = (
            f"input {index} lost its worker {span.tries - 1} times (last: {last}); not run again"
        )
        record: protocol.FinalRecord = {
            "state": "failed",
            "phase": "execute",
            "error": error,
            "error_type": None,
        }
        header = protocol.outcome_header(0, record, claim=span.number, worker=self.worker)
        self._record(index, header, _failure_payload(error))
        if self.options.fail_fast:
            self.stop_to_write = protocol.stop_record("fail_fast", f"input {index} failed")

    def _record(self, index: int, header: protocol.OutcomeHeader, payload: bytes) -> None:
        span = self.span
        assert span is not None
        self.cursor = index + 1
        data = b""
        if len(payload) > LARGE_RESULT:
            # An object of its own (written now, before the burst that covers it).
            key = self.names.outcome(index)
            self.queue.append(Create(key, protocol.encode_outcome(header, payload)))
            self.book.learn_single(index)
        else:
            data = results_log.encode(index, header, payload)
        buffer = self.buffer
        if buffer is None:
            self.buffer = buffer = Buffer(span, index, index + 1, None, [])
        buffer.end = index + 1
        if data:
            buffer.records.append(data)

    def flush(self, wall: float) -> Op:
        """Write a buffered burst, the span before's first (first renewing the held
        claim when it lapsed: a renewal that fails tells that it was taken over, and the
        burst is dropped). The span before's lapsed (this worker stalled while it moved
        on): its burst is dropped, and its inputs run again by whoever takes it over."""
        previous = self.previous
        if previous is not None:
            self.previous = None
            if wall >= previous.span.expires:
                return Sleep(0.01) if self.buffer is None else self.flush(wall)
            self.book.learn_burst(previous.first, previous.end)
            key = self.names.burst(previous.first, previous.end, previous.span)
            return Write(key, protocol.encode_burst(b"".join(previous.records)))
        buffer = self.buffer
        assert buffer is not None
        span = buffer.span
        if wall >= span.expires and self.span is span:
            renew = self.renew(wall, lapsed=True)
            assert renew is not None
            return renew
        self.buffer = None
        self.book.learn_burst(buffer.first, buffer.end)
        key = self.names.burst(buffer.first, buffer.end, span)
        return Write(key, protocol.encode_burst(b"".join(buffer.records)))


def _failure_payload(error: str) -> bytes:
    """A pickled failure payload (plain data: the standard pickle is what the client's
    unpickler reads, and the runner's machine needs no cloudpickle)."""
    payload = protocol.result_payload(success=False, phase="execute", error=error, error_type="")
    return pickle.dumps(payload, protocol=4)
