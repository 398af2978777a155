"""One pool worker's decisions, sans-IO: what to read, write and run next. Pure.

A :class:`WorkerMachine` holds one worker's state over a
:class:`~runner.pool.book.PoolBook` (what it knows of the batch): what it holds (its
span, the input it runs, the outcomes not yet written: :mod:`runner.pool.holding`) and
where it stands in its search for work (:mod:`runner.pool.search`). It does no IO and
reads no clock: a *shell* asks it for the next operation and performs it — the pod's
worker (:mod:`runner.pool.worker`, which forks per input), or a simulation of a
thousand workers; the operations and their answers are :mod:`runner.pool.ops`'s. While
an input runs (after ``Run``, before ``ran``/``ended``) :meth:`WorkerMachine.next`
returns only upkeep: reading the stop record, renewing the lease, looking for a cancel
of the input, writing a due burst, claiming the next span while the held one's last
input runs, ``Kill`` — or ``Sleep`` until the next is due; between two inputs of a span
it asks for none of these that can wait for the next input. A shell that can carry a
request across an input's end (``overlap``) may ask while one is unanswered: it is then
handed the held span's next input, if one can start, else ``Sleep`` until the answer
(an input's end never waits for a request under way). A
worker exits once every input has an outcome or the batch stopped; after a final
failure with ``fail_fast`` it writes the burst, then the stop record.

The protocol as a whole (objects, invariants, failure model, limits, cost) is told in
``docs/pool-protocol.md``; its invariants are checked by a seeded fault explorer
(``tests/unit/pool_explorer.py``), and a pure refactor leaves the workers' operations
as ``tests/unit/test_pool_replay.py`` recorded them.
"""

from __future__ import annotations

import contextlib

from runner import protocol
from runner.pool.book import PoolBook
from runner.pool.holding import Buffer, Holding
from runner.pool.limits import IDLE_FIRST, IDLE_READS_PER_S, STOP_EVERY
from runner.pool.names import PoolNames
from runner.pool.ops import Create, Exit, List, Op, Read, Replace, Run, Sleep, Storage, Write
from runner.pool.options import LEASE_WAIT_MAX, PoolOptions
from runner.pool.search import Search
from runner.pool.spans import Span


class WorkerMachine:
    """One worker of a pool batch, sans-IO (see the module docstring).

    :param options: the batch's options (:meth:`PoolOptions.from_manifest`).
    :param group_id: the batch; :param worker: this worker's name (its pod's).
    :param stop_every: seconds between reads of the stop record (the first period
        spread from a half to one and a half times; default :data:`STOP_EVERY`, for any
        pool size).
    :param idle_first: the first sleep of a worker with nothing to do (it doubles).
    :param wait_max: the longest sleep (idle, or waiting for a lease to end).
    :param idle_reads_per_s: the reads a second the pool's idle workers make at most
        together (:data:`~runner.pool.limits.IDLE_READS_PER_S`).
    :param ordinal: this worker's number in the pool (an Indexed Job's completion
        index): worker ``k`` starts in region ``k``, where no other worker starts.
        None (no index known): it starts in a region picked at random, where a third
        of the workers meet another and the losers walk the winner's chain of spans.
    :param overlap: the shell can ask for the next operation while a storage request
        is unanswered (it sends upkeep from a helper thread): then :meth:`next` hands
        out only the held span's next input, or ``Sleep`` (until the answer); without
        it, asking before the answer is an error.
    :param spread_start: wait a spread time before the first claim (a pool's workers
        start together: :meth:`PoolOptions.start_wait`); False when the worker waited
        it before it read the batch, and for a test of a later stage.
    :param stop_read: the worker read the stop record (and found none) as it started:
        the first read comes a spread period later, not before the first claim.

    The time constants and the rate are parameters so that a simulation can dilate
    time.
    """

    def __init__(
        self,
        options: PoolOptions,
        group_id: str,
        worker: str,
        *,
        stop_every: float | None = None,
        idle_first: float = IDLE_FIRST,
        wait_max: float = LEASE_WAIT_MAX,
        idle_reads_per_s: float = IDLE_READS_PER_S,
        ordinal: int | None = None,
        overlap: bool = False,
        spread_start: bool = True,
        stop_read: bool = False,
    ) -> None:
        self.book = PoolBook(options)
        self.options = options
        self.group_id = group_id
        self.worker = worker
        self.names = PoolNames(group_id)
        self.stop_every = STOP_EVERY if stop_every is None else stop_every
        self.wait_max = wait_max
        self.counts: dict[str, int] = {}
        """Operations handed out, by kind (for benchmarks)."""
        self._queue: list[Op] = []  # operations to hand out first (shared with the parts)
        # Claim (start, number) -> its generation as this worker last read or wrote it:
        # renewals and takeovers replace a claim only at that generation (the fence).
        generations: dict[tuple[int, int], int] = {}
        self.holding = Holding(options, self.book, self.names, worker, self._queue, generations)
        self.search = Search(
            options,
            self.book,
            self.names,
            self.holding,
            self._queue,
            generations,
            idle_first=idle_first,
            wait_max=wait_max,
            idle_reads_per_s=idle_reads_per_s,
            ordinal=ordinal,
        )
        self._pending: Storage | None = None
        self._read_wall = float("-inf")  # when the pending read or listing was sent
        self._stop_due = float("-inf")  # when the stop record is next read (mono)
        self._stop_read = stop_read  # the worker read it (none) as it started
        self._spread_start = spread_start  # its first claim waits (PoolOptions.start_wait)
        self._ordinal = ordinal
        self._overlap = overlap

    @property
    def span(self) -> Span | None:
        """The claim this worker holds."""
        return self.holding.span

    @property
    def running(self) -> tuple[int, int] | None:
        """``(index, attempt)`` of the input running now."""
        return self.holding.running

    @property
    def buffer(self) -> Buffer | None:
        """The outcomes run and not yet written."""
        return self.holding.buffer

    @property
    def stop_to_write(self) -> protocol.StopRecord | None:
        """A ``fail_fast`` stop not yet written."""
        return self.holding.stop_to_write

    # -- the step ------------------------------------------------------------------------

    def next(self, *, wall: float, mono: float, pick: float) -> Op:
        """The next operation (see the module docstring).

        :param wall: the wall-clock time (leases); :param mono: a monotonic time (timers).
        :param pick: a random number in [0, 1): which region or claim to try.
        :raises RuntimeError: when the previous operation was not answered, unless the
            machine was made with ``overlap``.
        """
        if self._pending is not None and not self._overlap:
            raise RuntimeError(f"{self._pending!r} was not answered")
        self.holding.start_buffer_clock(mono, pick)
        self.holding.time_renewal(wall, pick)
        if self._pending is not None:
            op = self._while_pending(wall, mono)
        else:
            op = self._decide(wall, mono, pick)
        if isinstance(op, Run):
            self.holding.run_since = mono
        kind = type(op).__name__
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if isinstance(op, (List, Read, Create, Write, Replace)):
            self._pending = op
            if isinstance(op, (Read, List)):
                self._read_wall = wall
        return op

    def _while_pending(self, wall: float, mono: float) -> Op:
        """A request is under way (``overlap``): the held span's next input if one can
        start (as :meth:`_decide` would run it), else a wait for the answer. Nothing
        else is decided before the answer: it may change what comes next."""
        holding = self.holding
        span = holding.span
        if (
            span is not None
            and not self._queue
            and holding.input_ready(wall)
            and not (holding.flush_due(mono) and not holding.flush_can_wait())
        ):
            index = holding.next_input()
            if index is not None and not holding.exhausted(index):
                return holding.run(index)
        return Sleep(self.wait_max)

    def _decide(self, wall: float, mono: float, pick: float) -> Op:
        book, holding = self.book, self.holding
        if self._queue:
            return self._queue.pop(0)
        # An input of the held span can start: the stop read, a renewal or a due burst
        # waits for it, performed while it runs (an operation between two inputs is
        # time the worker runs none).
        ready = holding.input_ready(wall)
        soon = holding.ending_soon(mono, self.stop_every / 4)
        if book.stop is None and mono >= self._stop_due and not ready and not soon:
            # Workers that started together would read it in the same instant every
            # period (a thousand reads in a fraction of a second meet the bucket's read
            # limit, and a 429 stalls a running worker a second or more): the first
            # period is spread, from a half to one and a half, then the phase is kept.
            # Not every period: a worker's reads block its next input, and the pool's
            # last worker to finish would be one that drew short periods.
            first = self._stop_due == float("-inf")
            self._stop_due = mono + self.stop_every * ((0.5 + pick) if first else 1.0)
            if not (first and self._stop_read):
                return Read(self.names.stop)
        if holding.running is not None:
            if holding.ahead_due() and book.stop is None:
                ahead = self.search.claim_ahead(wall)
                if ahead is not None:
                    return ahead
            return holding.upkeep(wall, mono, self._stop_due, self.wait_max, soon)
        holding.take_ahead(wall)
        if book.stop is not None:
            return holding.flush(wall) if holding.unwritten else Exit("stopped")
        if holding.retry is not None:
            if holding.retry_due is None:
                holding.retry_due = mono + holding.retry_delay
            if mono >= holding.retry_due:
                retry, holding.retry = holding.retry, None
                return holding.run(*retry)
            return self._wait_for_retry(wall, mono, holding.retry_due)
        if holding.flush_due(mono) and not (ready and holding.flush_can_wait()):
            return holding.flush(wall)
        if holding.stop_to_write is not None:
            record, holding.stop_to_write = holding.stop_to_write, None
            self._stop_due = float("-inf")  # then read back whichever stop stood
            return Create(self.names.stop, protocol.dump_json(record))
        span = holding.span
        if span is not None:
            renew = None if ready else holding.renew(wall)
            if renew is not None:
                return renew
            index = holding.next_input()
            if index is not None:
                if holding.exhausted(index):
                    holding.give_up(index, span, self.search.took_from.get(span.start, "?"))
                    return self._decide(wall, mono, pick)
                return holding.run(index)
            if holding.buffer is not None and wall >= span.expires:
                return holding.flush(wall)  # lapsed: renewed first (the fence), then written
            holding.span_done(wall)
            if holding.span is not None:  # the span claimed ahead
                return self._decide(wall, mono, pick)
        if self._spread_start:
            self._spread_start = False
            wait = self.options.start_wait(self._ordinal, pick)
            if wait > 0:
                return Sleep(wait)
        op = self.search.next(wall, mono, pick)
        if holding.buffer is not None:
            # The span's last burst: written while the next span's first input runs when
            # this claims it at once, else now (before a wait, a look or a takeover).
            claims = isinstance(op, Create) and op.key in self.search.claiming
            if not (claims and holding.carry(wall)):
                self._queue.insert(0, op)
                return holding.flush(wall)
        return op

    def _wait_for_retry(self, wall: float, mono: float, due: float) -> Op:
        """A failed input waits for its retry's back-off in place: the span stays held
        (renewed) and due bursts are written meanwhile."""
        holding = self.holding
        if holding.flush_due(mono):
            return holding.flush(wall)
        renew = holding.renew(wall)
        if renew is not None:
            return renew
        span = holding.span
        waits = [due - mono, self._stop_due - mono]
        if span is not None:
            waits.append(holding.renew_at - wall)
        if holding.buffer is not None:
            buffer = holding.buffer
            waits.append(holding.burst_wait(buffer, mono))
        return Sleep(max(0.01, min(waits)))

    # -- answers --------------------------------------------------------------------------

    def ran(
        self,
        index: int,
        record: protocol.FinalRecord,
        payload: bytes,
        output: bytes = b"",
        seconds: float | None = None,
        error_types: frozenset[str] | None = None,
    ) -> None:
        """The running attempt of ``index`` ended with ``record`` and ``payload`` (the
        pickled result payload); ``output`` is what it printed, ``seconds`` its time;
        ``error_types`` the qualified names of its exception's type and bases (None: no
        exception), which a ``kinetic.Retries``' ``on`` is matched against."""
        self.holding.ran(index, record, payload, output, seconds, error_types)

    def ended(self, index: int) -> None:
        """The running input was ended from outside (after :class:`Kill`): no outcome."""
        self.holding.ended(index)

    def _answer(self, op_type: type, key: str) -> None:
        pending = self._pending
        if not isinstance(pending, op_type) or getattr(pending, "key", None) != key:
            raise RuntimeError(f"answer for {key!r} but {pending!r} was asked")
        self._pending = None

    def listed(self, prefix: str, keys: list[str]) -> None:
        """The answer to :class:`List`: the keys under ``prefix``."""
        pending = self._pending
        if not isinstance(pending, List) or pending.prefix != prefix:
            raise RuntimeError(f"answer for list {prefix!r} but {pending!r} was asked")
        self._pending = None
        self.search.listed(prefix, keys, self._read_wall)
        claims, span = self.names.claims, self.holding.span
        taken = span is not None and self.book.listed.get(span.start, -1) > span.number
        if prefix.startswith(claims) and prefix != claims and taken:
            self.holding.lose()  # taken over: this worker stalled past its lease

    def read(self, key: str, data: bytes | None, generation: int | None) -> None:
        """The answer to :class:`Read`: the object's bytes and generation, or None (both)
        when it is missing."""
        self._answer(Read, key)
        self.search.look_reads += 1
        if key == self.names.stop:
            if data is not None:
                with contextlib.suppress(ValueError):  # being written: read again later
                    self.book.learn_stop(protocol.load_stop(data))
            return
        self.search.read(key, data, generation, self._read_wall)

    def created(self, key: str, generation: int | None) -> None:
        """The answer to :class:`Create`: the new object's generation, or None when one
        existed."""
        self._answer(Create, key)
        won = self.search.created(key, generation)
        holding = self.holding
        if won is not None and (holding.span is not None or holding.running is not None):
            holding.ahead = won  # claimed while the held span's last inputs ran
        elif won is not None:
            holding.hold(won)

    def written(self, key: str) -> None:
        """The answer to :class:`Write`."""
        self._answer(Write, key)

    def replaced(self, key: str, generation: int | None) -> None:
        """The answer to :class:`Replace`: the object's new generation, or None when it
        was no longer at the generation asked (a claim taken over, or renewed)."""
        self._answer(Replace, key)
        if not self.search.replaced(key, generation):  # else a takeover's fence
            self.holding.renewed(key, generation)
