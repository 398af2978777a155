"""One pool worker's decisions, sans-IO: what to read, write and run next. Pure.

The protocol as a whole (objects, invariants, failure model, limits, cost) is told in
``docs/pool-protocol.md``; its invariants are checked by a seeded fault explorer
(``tests/unit/pool_explorer.py``).

Theory of operation
-------------------
A :class:`WorkerMachine` holds one worker's state (the span it holds, the input it
runs, the outcomes not yet written) over a :class:`~runner.pool_book.PoolBook`. It does
no IO and reads no clock: a *shell* asks it for the next operation and performs it —
the pod's blocking worker (:mod:`runner.pool`, which forks per input), or an async
simulation of a thousand workers::

    while True:
        op = machine.next(wall=time.time(), mono=time.monotonic(), pick=random.random())
        # List(prefix)      -> machine.listed(prefix, keys)
        # Read(key)         -> machine.read(key, data, generation)  (None, None: missing)
        # Create(key, data) -> machine.created(key, generation or None)  (if absent)
        # Write(key, data)  -> machine.written(key)
        # Replace(key, data, generation) -> machine.replaced(key, new generation or None)
        # Run(index, n)     -> machine.ran(index, record, payload, output, seconds)
        # Kill(index)       -> end the running input, then machine.ended(index)
        # Sleep(seconds)    -> sleep (an input that ends meanwhile may be fed at once)
        # Exit(reason)      -> stop

Exactly one operation is outstanding at a time (``Sleep`` and ``Exit`` need no answer);
a failed operation (storage down) is the shell's to retry. While an input runs (after
``Run``, before ``ran``/``ended``) :meth:`WorkerMachine.next` returns only upkeep:
reading the stop record, renewing the lease, looking for a cancel of the input,
writing a due burst, ``Kill`` — or ``Sleep`` until the next is due.

What a worker does (the protocol is in :mod:`runner.pool_book`):

1. claim the next span of the region it works in (create-if-absent; a lost race reads
   the winner's claim and tries after it); once the region is exhausted, list the
   claims and move to the region with the most left (work stealing);
2. run the span's inputs in order (retries in place), buffering their outcomes; write
   them as one burst when ``burst_max`` are buffered, ``burst_s`` after the first, at
   the span's end, and before waiting or exiting — an outcome is never visible before
   its burst is durable, and a takeover writes its first outcome at once;
3. renew the claim every third of the lease, and before writing a burst once it
   lapsed: a replace at the claim's generation, which fails once another worker took
   the span over (this worker stalled past its lease), and the span is dropped with its
   buffer; end the running input when the batch stops (cancel,
   ``cancel_running_on_fail``) or the input was cancelled alone;
4. with no span left: list, read a few claims that may have expired, take one over from
   its first input without an outcome (or fail that input once it had ``max_claims``
   claims; a takeover that cuts a long span announces its hole in ``holes/``; a
   takeover first replaces the expired claim, at the generation read after its lease
   ended, so that of it and a late renewal exactly one wins), else
   sleep until a lease may end, rationed; in a large pool, look first after a spread
   wait (:data:`FIRST_LOOK_READS`), and between two such full looks only at the holes,
   and join one (:data:`QUICK_VISITS`); exit once every input has an outcome or the
   batch stopped. After a final failure with ``fail_fast``: write the burst, then the
   stop record.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace

from runner import protocol, results_log
from runner.pool_book import (
    FIRST_SPAN,
    LARGE_RESULT,
    LEASE_WAIT_MAX,
    MAX_SPAN,
    PoolBook,
    PoolOptions,
    Span,
    claim_record,
    parse_claim,
    pick_region,
    span_size,
    stop_kills,
    take_over,
)

STOP_EVERY = 1.0
"""Seconds between two reads of the stop record by a worker, whatever the pool's size:
the bound on how late a stop (``fail_fast``, a cancel) is seen. A worker reads it
before it starts an input once the period is over, so no input starts later than
1.5 periods after the record is durable (the first period is spread from a half to one
and a half), one period once the worker has read it before, plus a read's time — 1.5 s
at 4 workers as at 10,000. The cost is a read a second per worker: ``input time /
STOP_EVERY`` reads per input (0.05 for 50 ms inputs), and a pool of ``W`` workers reads
the record ``W`` times a second, a fifth of a bucket's starting read rate (about
5,000/s) at 1,000 workers; a larger pool leans on the rate GCS grants a bucket as its
load grows. (A period that grew with the pool kept its reads flat, but let a pool of
10,000 workers start inputs for 20 s after a failure.)"""
SAMPLE = 4
"""Claims a worker with nothing to do reads per look, to find one whose lease ran out
(a sample: a thousand idle workers must not each read every claim)."""
WALK_READS = 4000
"""Claims the whole pool may read in one look each for work outside their regions (to
learn where a region's chain of spans ends): a worker reads ``WALK_READS / workers``
per look, at least :data:`SAMPLE`, then sleeps. At a batch's tail a thousand idle
workers would otherwise each walk every region's chain while the work left is a few
spans, past the bucket's 5,000 reads a second."""
IDLE_READS_PER_S = 2000
"""Reads a second (a listing costs one per page of :data:`PAGE` names) that the pool's
idle workers make at most together: two fifths of what a bucket takes at first. An idle
worker sleeps ``workers x its reads since it last slept idle / IDLE_READS_PER_S`` (at
most :data:`~runner.pool_book.LEASE_WAIT_MAX`; a worker just out of work counts its
spans' upkeep reads too, so its first idle sleep is the longer): at a large batch's
tail, hundreds of idle workers looking every quarter second would starve the reads of
the workers still running, and a 429 stalls those for a second or more. A dead worker's span is still
found soon: each look reads a few claims that may have expired (:data:`SAMPLE`), and
with hundreds of idle workers one of them looks every few milliseconds."""
PAGE = 1000
"""Names in a page of a listing (the storage's)."""
QUICK_VISITS = 1
"""Holes whose claims an idle worker of a :attr:`~runner.pool_book.PoolOptions.large`
pool lists in a *quick* look. Such a worker lists every claim, burst and outcome (a
*full* look, which also reads :data:`SAMPLE` claims that may have expired) only as
often as half of :data:`IDLE_READS_PER_S` allows. In between it makes quick looks,
rationed by the other half: a listing of the cut takeovers (``holes/``, a few names
that tell each hole's slots and age), then the claims of one hole with slots not known
to be claimed (the newest mostly) and a claim of one of its free slots, else
:data:`QUICK_SAMPLE` claims that may have expired. A look that cheap comes several
times as often as a full one: a dead worker's rest is joined within a second, and its
expired claim found as soon; and ``holes/settled`` there tells that the batch is done."""
FIRST_LOOK_READS = 8
"""Reads budgeted for each worker's first look when a large pool runs out of work: a
worker that ran inputs waits ``pick x workers x FIRST_LOOK_READS /``
:data:`IDLE_READS_PER_S` seconds (at most :data:`~runner.pool_book.LEASE_WAIT_MAX`: 4 s
at 1,000 workers) before it looks. A first look lists every claim, burst and outcome
(pages of :data:`PAGE` names) and reads a few claims, a dozen reads or more; a thousand
of them within a second are three times the reads a bucket takes at first, and a 429
stalls each worker still running for a second or more."""
QUICK_SAMPLE = 1
"""Claims that may have expired read in a quick look."""
HOLE_SLOTS = 8
"""Parts a large pool's takeover cuts a dead worker's rest into at least (its own part
and its hole's slots, each at most ``rest / HOLE_SLOTS``, rounded up). Sized as a fresh
span alone they held a second of work or more (a worker's outcomes known as of its last
full look make the work left look large), and the takeovers of the spans whose leases
end last run while every other worker is idle: the batch ended a slot's time after
them."""
IDLE_FIRST = 0.25
"""Seconds a worker with nothing to do first sleeps before it looks again (doubling)."""
OUTPUT_TAIL = 64 * 1024
"""Bytes of an input's output kept in its outcome's header."""


@dataclass(frozen=True)
class List:
    prefix: str


@dataclass(frozen=True)
class Read:
    key: str


@dataclass(frozen=True)
class Create:
    key: str
    data: bytes


@dataclass(frozen=True)
class Write:
    key: str
    data: bytes


@dataclass(frozen=True)
class Replace:
    """Replace ``key`` with ``data`` if it is still at ``generation`` (the answer, its
    new generation or None, goes to :meth:`WorkerMachine.replaced`)."""

    key: str
    data: bytes
    generation: int


@dataclass(frozen=True)
class Run:
    """Run attempt ``attempt`` (0 first) of input ``index``."""

    index: int
    attempt: int


@dataclass(frozen=True)
class Kill:
    index: int


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Exit:
    """``reason``: ``"done"`` (every input has an outcome) or ``"stopped"``."""

    reason: str


Op = List | Read | Create | Write | Replace | Run | Kill | Sleep | Exit
Storage = List | Read | Create | Write | Replace
"""The operations that wait for an answer."""


@dataclass
class _Buffer:
    """Outcomes run under one claim and not yet written: inputs ``[first, end)``."""

    span: Span
    first: int
    end: int
    since: float | None
    """The monotonic time of its first outcome (set at the step after it)."""
    records: list[bytes]
    wait: float = 0.0
    """Seconds after ``since`` it is due (set with ``since``)."""


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
        together (:data:`IDLE_READS_PER_S`).
    :param ordinal: this worker's number in the pool (an Indexed Job's completion
        index): worker ``k`` starts in region ``k``, where no other worker starts.
        None (no index known): it starts in a region picked at random, where a third
        of the workers meet another and the losers walk the winner's chain of spans.

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
    ) -> None:
        self.book = PoolBook(options)
        self.ordinal = ordinal
        self.options = options
        self.group_id = group_id
        self.worker = worker
        self.stop_every = STOP_EVERY if stop_every is None else stop_every
        self.idle_first = idle_first
        self.wait_max = wait_max
        self.idle_reads_per_s = idle_reads_per_s
        self.claims_prefix = protocol.group_claims_prefix(group_id)
        self.bursts_prefix = protocol.group_bursts_prefix(group_id)
        self.holes_prefix = protocol.group_holes_prefix(group_id)
        self.results_prefix = protocol.group_results_prefix(group_id)
        self.stop_key = protocol.group_stop_key(group_id)
        self.span: Span | None = None
        """The claim this worker holds."""
        self.cursor = 0
        """The next input of the held span to look at."""
        self.region: int | None = None
        self.running: tuple[int, int] | None = None
        """``(index, attempt)`` of the input running now."""
        self.killing = False
        self.retry: tuple[int, int] | None = None
        self.buffer: _Buffer | None = None
        self.ramp = FIRST_SPAN
        self.mean_s: float | None = None
        self.stop_to_write: protocol.StopRecord | None = None
        self.counts: dict[str, int] = {}
        """Operations handed out, by kind (for benchmarks)."""
        self._queue: list[Op] = []
        self._pending: Storage | None = None
        self._claiming: dict[str, Span] = {}  # claim keys being created -> their spans
        # Claim (start, number) -> its generation as this worker last read or wrote it:
        # renewals and takeovers replace a claim only at that generation (the fence).
        self._generations: dict[tuple[int, int], int] = {}
        self._marking: dict[str, Span] = {}  # claims being marked taken -> the new claim
        self._took_from: dict[int, str] = {}  # span start -> the worker of its last claim
        self._stop_due = float("-inf")  # when the stop record is next read (mono)
        self._singles_read = float("-inf")
        self._claims_fresh = False  # claims listed since this worker last won a claim
        self._all_fresh = False  # claims, bursts and outcomes listed since the last sleep
        self._slept = False  # slept with nothing to claim, and not looked since
        self._sampled = True
        self._quick = False  # the look under way lists only the holes
        self._hole: Span | None = None  # the hole a quick look joins
        self._visits = 0  # holes whose claims were listed since the last sleep
        self._looked = float("-inf")  # when this worker last listed everything (mono)
        # Claims listings since the last sleep, by prefix -> the wall time each was sent
        # (a hole's slots are claimed after a listing of its claims: a quick look does
        # not list them all).
        self._claims_walls: dict[str, float] = {}
        self._look_reads = 0  # reads (listing pages included) since the last idle sleep
        self._full = False  # the look before the next idle sleep listed everything
        self._full_every = 0.0  # seconds from a full look to the next (a large pool's)
        # Claims read since the last sleep -> the wall time their read was sent: the
        # content is at least that recent, and only a read sent after a lease ended can
        # show that it ended (a read from before a renewal cannot).
        self._fresh_reads: dict[tuple[int, int], float] = {}
        self._read_wall = float("-inf")  # when the pending read or listing was sent
        # Bursts listings since the last sleep, by prefix -> the wall time each was sent:
        # a span is taken over only once a listing of its bursts sent after its lease
        # ended shows inputs left (its holder's last burst may postdate an older one).
        self._bursts_walls: dict[str, float] = {}
        self._settled = False  # every input has an outcome: seen, or announced in holes/
        self._settled_checked = False  # holes/ listed for that announcement, once seen
        self._names: set[str] = set()  # names listed and learned from (listed())
        self._taking: int | None = None  # the start of the expired span being taken over
        self._walk_reads = 0  # claims read since the last sleep to walk other regions
        self._walking: int | None = None  # the region whose chain is being walked
        self._idle = idle_first  # the next sleep with nothing to do (doubles to wait_max)

    # -- the step ------------------------------------------------------------------------

    def next(self, *, wall: float, mono: float, pick: float) -> Op:
        """The next operation (see the module docstring).

        :param wall: the wall-clock time (leases); :param mono: a monotonic time (timers).
        :param pick: a random number in [0, 1): which region or claim to try.
        :raises RuntimeError: when the previous operation was not answered.
        """
        if self._pending is not None:
            raise RuntimeError(f"{self._pending!r} was not answered")
        if self.buffer is not None and self.buffer.since is None:
            self.buffer.since = mono
            wait = self.options.burst_seconds
            if self.options.large:  # spread the pool's bursts: they would all be due at once
                wait *= 0.75 + pick / 2
            self.buffer.wait = wait
        op = self._decide(wall, mono, pick)
        kind = type(op).__name__
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if isinstance(op, (List, Read, Create, Write, Replace)):
            self._pending = op
            if isinstance(op, (Read, List)):
                self._read_wall = wall
        return op

    def _decide(self, wall: float, mono: float, pick: float) -> Op:
        book = self.book
        if self._queue:
            return self._queue.pop(0)
        if book.stop is None and mono >= self._stop_due:
            # Workers that started together would read it in the same instant every
            # period (a thousand reads in a fraction of a second meet the bucket's read
            # limit, and a 429 stalls a running worker a second or more): the first
            # period is spread, from a half to one and a half, then the phase is kept.
            # Not every period: a worker's reads block its next input, and the pool's
            # last worker to finish would be one that drew short periods.
            first = self._stop_due == float("-inf")
            self._stop_due = mono + self.stop_every * ((0.5 + pick) if first else 1.0)
            return Read(self.stop_key)
        if self.running is not None:
            return self._upkeep(wall, mono)
        if book.stop is not None:
            if self.buffer is not None:
                return self._flush(wall)
            return Exit("stopped")
        if self.retry is not None:
            self.running, self.retry = self.retry, None
            return Run(*self.running)
        span = self.span
        buffer = self.buffer
        if buffer is not None and (
            len(buffer.records) >= self.options.burst_max
            or mono - (buffer.since or mono) >= buffer.wait
            # a takeover: its first outcome at once (runner.pool_book's docstring)
            or (buffer.span.number > 0 and buffer.first == buffer.span.first)
            or span is None
            or self.cursor >= span.end
            or self.stop_to_write is not None  # the failure is durable before the stop
        ):
            return self._flush(wall)
        if self.stop_to_write is not None:
            record, self.stop_to_write = self.stop_to_write, None
            self._stop_due = float("-inf")  # then read back whichever stop stood
            return Create(self.stop_key, protocol.dump_json(record))
        if span is not None:
            renew = self._renew(wall)
            if renew is not None:
                return renew
            index = book.done.first_missing(self.cursor, span.end)
            if index < span.end:
                self.cursor = index
                if index == span.first and span.tries > self.options.max_claims:
                    self._give_up(index, span)
                    return self._decide(wall, mono, pick)
                self.running = (index, 0)
                return Run(index, 0)
            self.span = None  # every input of the span has an outcome (its burst is out)
            self.ramp = min(MAX_SPAN, self.ramp * 4)
        return self._find_work(wall, mono, pick)

    # -- while an input runs --------------------------------------------------------------

    def _upkeep(self, wall: float, mono: float) -> Op:
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
        renew = self._renew(wall)
        if renew is not None:
            return renew
        third = self.options.lease_s / 3
        if mono - self._singles_read >= third:
            self._singles_read = mono
            return List(self.results_prefix)  # a cancel of the input is an object of its own
        buffer = self.buffer
        if buffer is not None and mono - (buffer.since or mono) >= buffer.wait:
            return self._flush(wall)
        due = [
            self._stop_due - mono if book.stop is None else self.wait_max,
            self.span.expires - 2 * third - wall,
            third - (mono - self._singles_read),
        ]
        if buffer is not None:
            due.append(buffer.wait - (mono - (buffer.since or mono)))
        return Sleep(max(0.01, min(due)))

    def _renew(self, wall: float) -> Op | None:
        """Renew the held claim once a third of its lease is gone: a replace at the
        generation this worker last wrote, so that it fails if the claim was taken over
        meanwhile (a takeover replaces it first), however late it lands; the span is
        then dropped (:meth:`replaced`)."""
        span = self.span
        if span is None or wall < span.expires - 2 * self.options.lease_s / 3:
            return None
        generation = self._generations[(span.start, span.number)]
        self.span = replace(span, expires=wall + self.options.lease_s)
        if self.buffer is not None:
            self.buffer.span = self.span
        self.book.learn_span(self.span)
        key = self._claim_key(span.start, span.number)
        return Replace(key, self._claim_bytes(self.span), generation)

    # -- outcomes -------------------------------------------------------------------------

    def ran(
        self,
        index: int,
        record: protocol.FinalRecord,
        payload: bytes,
        output: bytes = b"",
        seconds: float | None = None,
    ) -> None:
        """The running attempt of ``index`` ended with ``record`` and ``payload`` (the
        pickled result payload); ``output`` is what it printed, ``seconds`` its time."""
        assert self.running is not None
        assert self.running[0] == index
        attempt = self.running[1]
        self.running, self.killing = None, False
        # A span lost while the input ran queued its Kill: the input ended first.
        self._queue = [op for op in self._queue if op != Kill(index)]
        if self.span is None:
            return  # the claim was taken over meanwhile: the new holder runs it
        if seconds is not None:
            self.mean_s = seconds if self.mean_s is None else 0.8 * self.mean_s + 0.2 * seconds
        if record["state"] != "succeeded" and attempt < self.options.retries:
            self.retry = (index, attempt + 1)
            return
        header = protocol.outcome_header(
            attempt, record, claim=self.span.number, worker=self.worker
        )
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

    def _give_up(self, index: int, span: Span) -> None:
        error = (
            f"input {index} lost its worker {span.tries - 1} times "
            f"(last: {self._took_from.get(span.start, '?')}); not run again"
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
            key = protocol.group_outcome_key(self.group_id, index)
            self._queue.append(Create(key, protocol.encode_outcome(header, payload)))
            self.book.learn_single(index)
        else:
            data = results_log.encode(index, header, payload)
        buffer = self.buffer
        if buffer is None:
            self.buffer = buffer = _Buffer(span, index, index + 1, None, [])
        buffer.end = index + 1
        if data:
            buffer.records.append(data)

    def _flush(self, wall: float) -> Op:
        """Write the buffered burst (first renewing the claim when it lapsed: a renewal
        that fails tells that it was taken over, and the burst is dropped)."""
        buffer = self.buffer
        assert buffer is not None
        span = buffer.span
        if wall >= span.expires and self.span is span:
            renew = self._renew(wall)
            assert renew is not None  # a lapsed lease is always due
            return renew
        self.buffer = None
        name = protocol.burst_name(buffer.first, buffer.end, span.start, span.number)
        self.book.learn_burst(buffer.first, buffer.end)
        return Write(self.bursts_prefix + name, protocol.encode_burst(b"".join(buffer.records)))

    # -- finding work ---------------------------------------------------------------------

    def _find_work(self, wall: float, mono: float, pick: float) -> Op:
        book = self.book
        if self._settled:
            return Exit("done")
        if self.region is None and self.ordinal is not None:
            self.region = self.ordinal % self.options.regions
        if self.region is not None:
            op = self._next_in(self.region, wall, pick)
            if op is not None:
                return op
        if not self._claims_fresh:  # moving to another region: look where others are
            if self._slept:  # nothing was left to claim before: the whole look at once
                return self._look(mono)
            never_looked = self._looked == float("-inf")  # a quick look follows a full one
            if self.options.large and self.mean_s is not None and never_looked:
                # A large pool runs out of work about together, and a first look costs a
                # dozen reads: spread over the seconds the pool's share of reads allows
                # (FIRST_LOOK_READS), or each would meet the bucket's read limit at once.
                self._slept = True  # then the look, as after an idle sleep
                spread = self.options.workers * FIRST_LOOK_READS / self.idle_reads_per_s
                return Sleep(pick * min(self.wait_max, spread))
            self._claims_fresh = True
            return List(self.claims_prefix)
        if self._quick:
            op = (
                self._join_hole(wall, pick)
                or self._take_over_expired(wall, pick)
                or self._sample(wall, pick, QUICK_SAMPLE)
            )
            return op if op is not None else self._idle_sleep(wall, pick)
        # Walk one region's chain to its end before picking another (each step's pick
        # differs: a walk spread over many regions would end none).
        region = self._walking
        if region is None or self.book.free_estimate(region) <= 0:
            region = pick_region(book, pick, avoid=self.region)
        self._walking = None
        if region is not None:
            op = self._next_in(region, wall, pick)
            if op is not None:
                if isinstance(op, Read):
                    self._walking = region
                return op
        if not self._all_fresh:
            return self._look(mono)
        if book.settled:
            if not self._settled and self.options.large:
                # Tell the idle workers: their quick looks list only holes/ (a full look
                # comes every 15 s or so at 1,000 workers) — unless one did already: the
                # whole pool may run out of work together, and a listing is a read.
                if not self._settled_checked:
                    self._settled_checked = True
                    return List(self.holes_prefix)
                self._settled = True
                return Create(self.holes_prefix + protocol.POOL_SETTLED_NAME, b"")
            return Exit("done")
        op = self._take_over_expired(wall, pick) or self._sample(wall, pick, SAMPLE)
        return op if op is not None else self._idle_sleep(wall, pick)

    def _take_over_expired(self, wall: float, pick: float) -> Op | None:
        """Take over a claim whose lease ran out, if one is known (None: none is)."""
        # Take over only a claim whose read was sent after its lease ended (a read from
        # before may predate a renewal), and only once a listing of its bursts sent after
        # then shows inputs left (its holder's last burst may postdate an older one).
        fresh = self._fresh_reads
        expired = [
            s for s in self.book.expired(wall) if fresh.get((s.start, s.number), -1.0) >= s.expires
        ]
        taking = next((s for s in expired if s.start == self._taking), None)
        if taking is None and self._taking is not None and self.options.large:
            # Beaten to the span it picked: at a large pool's tail so are those who read
            # the other expired claims when it did, and each try is two listings.
            return None
        if expired:
            # The one picked first, until it is taken over (each step's pick differs: a
            # worker hopping between spans would list each one's bursts and claims).
            span = taking or expired[min(len(expired) - 1, int(pick * len(expired)))]
            self._taking = span.start
            # Idle workers that read the claim about when its lease ended all find it
            # expired, and at a large pool's tail that is dozens: a listing of the span's
            # claims sent since the read shows the takeover of those before (a read, where
            # a create that loses its race costs a write; the bucket takes five times
            # fewer writes, and a 429 stalls its worker a second or more). It comes
            # before the bursts listing: a span taken over already costs one read.
            claims = self._span_claims_prefix(span.start)
            if self._claims_walls.get(claims, -1.0) < fresh[(span.start, span.number)]:
                return List(claims)
            prefix = self._span_bursts_prefix(span)
            walls = self._bursts_walls
            if max(walls.get(prefix, -1.0), walls.get(self.bursts_prefix, -1.0)) < span.expires:
                return List(prefix)
            return self._take_over(span, wall)
        return None

    def _sample(self, wall: float, pick: float, count: int) -> Op | None:
        """Read ``count`` claims that may have expired, once a look (None: done)."""
        if self._sampled:
            return None
        self._sampled = True
        # Claims read before, whose lease has ended since, first: at a large batch's tail
        # a dead worker's is one among hundreds of suspects, most of them never read (a
        # worker's outcomes are known as of its last full look), and a sample at random
        # rarely meets it; those who read it before wake when its lease ends.
        fresh = self._fresh_reads
        lapsed = [
            s.start
            for s in self.book.expired(wall)
            if fresh.get((s.start, s.number), -1.0) < s.expires
        ]
        picked = _rotated(lapsed, pick)[:count]
        if len(picked) < count:
            chosen = set(picked)
            rest = [start for start in self.book.suspects(wall) if start not in chosen]
            picked += _rotated(rest, pick)[: count - len(picked)]
        if not picked:
            return None
        self._queue.extend(self._read_claim(start, self.book.listed[start]) for start in picked)
        return self._queue.pop(0)

    def _idle_sleep(self, wall: float, pick: float) -> Sleep:
        held = self.book.held(wall)
        soonest = min((s.expires for s in held), default=wall + self.wait_max)
        self._all_fresh = self._claims_fresh = False  # after the sleep: look again
        self._quick, self._hole, self._visits = False, None, 0
        self._slept = True
        self._fresh_reads.clear()
        self._bursts_walls.clear()
        self._claims_walls.clear()
        self._taking = None
        self._walk_reads = 0
        # Held spans end soon or never (their worker died: their lease tells when):
        # look again soon at first, then less and less often — but no more often than
        # the pool's share of reads allows (IDLE_READS_PER_S), spread by ``pick``.
        idle, self._idle = self._idle, min(self.wait_max, self._idle * 2)
        workers, reads = self.options.workers, self._look_reads
        if self.options.large:  # full looks and quick ones, half of the reads each
            rationed = workers * reads / (self.idle_reads_per_s / 2)
            if self._full:  # the next full look waits for the whole of this one's reads
                # ... spread, or the pool's full looks would keep the phase of its first
                # looks (a few seconds wide, every 20 s or so), and none might come for
                # 15 s after the last outcome to tell the idle workers (holes/settled).
                every = max(self.wait_max, rationed) * (0.5 + pick)
                self._full_every, rationed = every, 0.0
        else:
            rationed = workers * reads / self.idle_reads_per_s
        self._look_reads, self._full = 0, False
        rationed = min(rationed, self.wait_max) * (0.5 + pick)  # after the cap: spread
        return Sleep(max(0.05, rationed, min(idle, soonest - wall)))

    def _look(self, mono: float) -> Op:
        """List bursts and outcomes (which spans have inputs left; is everything done),
        then the claims (a burst written after the claims were listed is seen: it lies
        in a claimed span) — or, in a large pool after an idle sleep while the last such
        look is recent, only the cut takeovers (:data:`QUICK_VISITS`)."""
        self._all_fresh = self._claims_fresh = True
        self._sampled = False
        quick, self._slept = self._slept and mono - self._looked < self._full_every, False
        if quick:
            self._quick = True
            return List(self.holes_prefix)
        self._looked, self._full = mono, True
        self._queue.extend([List(self.results_prefix), List(self.claims_prefix)])
        return List(self.bursts_prefix)

    def _next_in(self, region: int, wall: float, pick: float) -> Op | None:
        """Claim the next span of ``region`` (reading the claim that ends its known
        chain first, when its end is unknown); None when the region is all claimed, or
        when another region's chain would need more reads than a look may spend
        (:data:`WALK_READS`)."""
        at, unknown, limit = self.book.frontier(region)
        if unknown is not None:
            # A hole (a dead worker's rest, limit < the region's end) is where the work
            # left is: walking its chain is not rationed.
            if region != self.region and limit == self.options.region(region)[1]:
                self._walk_reads += 1
                if self._walk_reads > max(SAMPLE, WALK_READS // self.options.workers):
                    return None
            return self._read_claim(unknown, self.book.listed[unknown])
        if at >= limit:
            return None
        if self.book.hole_slot(at) is not None:
            op = self._claim_slot(at, limit, wall, pick, rationed=False)
            if isinstance(op, Create):
                self.region = region
            return op
        size = span_size(
            self.options,
            ramp=self.ramp,
            mean_s=self.mean_s,
            free=self.book.free_total(),
            region_left=limit - at,
        )
        self.region = region
        return self._create_claim(
            Span(at, 0, self.worker, wall + self.options.lease_s, at + size, at)
        )

    def _claim_slot(
        self, at: int, limit: int, wall: float, pick: float, *, rationed: bool
    ) -> Op | None:
        """Claim a free slot of the hole ``[at, limit)``, picked at random so that the
        workers who join it do not all race for its first one — after a listing of the
        hole's claims, unless every claim was listed since the last sleep (a quick look
        lists none; ``rationed``: at most :data:`QUICK_VISITS` such listings a look).
        None when no slot is free, or the listing is past the ration."""
        walls = self._claims_walls
        prefix = self.claims_prefix + self._common_prefix(at, limit - 1)
        if self.claims_prefix not in walls and prefix not in walls:
            if rationed:
                if self._visits >= QUICK_VISITS:
                    return None
                self._visits += 1
            return List(prefix)
        slots = self.book.free_slots(at, limit)
        if not slots:
            return None
        lo, hi = slots[min(len(slots) - 1, int(pick * len(slots)))]
        return self._create_claim(Span(lo, 0, self.worker, wall + self.options.lease_s, hi, lo))

    def _join_hole(self, wall: float, pick: float) -> Op | None:
        """A quick look's step: claim a free slot of a hole not known to be full (its
        claims listed first, :meth:`_claim_slot`); None when there is none."""
        cut = self._hole
        if cut is None or not self.book.free_slots(cut.end, cut.link_end):
            holes = self.book.open_holes()
            if not holes:
                return None
            # The newest mostly (pick cubed: half the picks among the eighth newest): an
            # old hole is likely full by now (its slots claimed by others, unknown to
            # this worker until it lists them), and a quick look that lists a full hole's
            # claims joins none. Not the newest alone: its slots would be fought over.
            self._hole = cut = holes[min(len(holes) - 1, int(pick**3 * len(holes)))]
        return self._claim_slot(cut.end, cut.link_end, wall, pick, rationed=True)

    def _span_bursts_prefix(self, span: Span) -> str:
        """A prefix of burst names that covers the bursts of ``span``'s inputs left (the
        digits its first and last input share: a listing of a few names, not all)."""
        return self.bursts_prefix + self._common_prefix(self.book.next_undone(span), span.end - 1)

    def _span_claims_prefix(self, start: int) -> str:
        """The prefix of the names of every claim of the span at ``start``."""
        return f"{self.claims_prefix}{start:07d}."

    @staticmethod
    def _common_prefix(first: int, last: int) -> str:
        """The digits that the names of inputs ``first`` to ``last`` share."""
        return os.path.commonprefix([f"{first:07d}", f"{last:07d}"])

    def _take_over(self, span: Span, wall: float) -> Op:
        """Take over ``span`` from its first input without an outcome — only a part of
        it, sized as a fresh span would be, when the rest is long: others claim that."""
        first = self.book.next_undone(span)
        self._took_from[span.start] = span.worker
        size = span_size(
            self.options,
            ramp=MAX_SPAN,  # the hole's slots are this size: not this worker's ramp
            mean_s=self.mean_s,
            free=self.book.free_total() + span.end - first,
            region_left=span.end - first,
        )
        if self.options.large:  # the rest shared by HOLE_SLOTS idle workers at least
            size = min(size, -(-(span.end - first) // HOLE_SLOTS))
        claim = take_over(span, first, self.worker, wall + self.options.lease_s, first + size)
        # The fence: the claim taken over is first replaced, at the generation read after
        # its lease ended, by itself ended now. Its holder's renewal, if late, then fails
        # (it drops the span); if the renewal landed first, this replace fails instead and
        # the span is left to its holder. Only then is the takeover's claim created.
        key = self._claim_key(span.start, span.number)
        self._marking[key] = claim
        ended = claim_record(replace(span, expires=wall), taken_by=self.worker)
        return Replace(key, ended, self._generations[(span.start, span.number)])

    def _create_claim(self, span: Span) -> Create:
        key = self._claim_key(span.start, span.number)
        self._claiming[key] = span
        return Create(key, self._claim_bytes(span))

    def _read_claim(self, start: int, number: int) -> Read:
        return Read(self._claim_key(start, number))

    def _claim_key(self, start: int, number: int) -> str:
        return protocol.group_claim_key(self.group_id, start, number)

    def _claim_bytes(self, span: Span) -> bytes:
        return claim_record(span)

    # -- answers --------------------------------------------------------------------------

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
        self._look_reads += 1 + len(keys) // PAGE
        book = self.book
        # A full look lists thousands of names, nearly all known from the last one: only
        # the new ones are parsed (a simulation steps a thousand workers in one process).
        seen = self._names
        keys = [key for key in keys if key not in seen]
        if prefix.startswith(self.claims_prefix):
            self._claims_walls[prefix] = self._read_wall
            for key in keys:
                parsed = protocol.parse_claim_name(key.removeprefix(self.claims_prefix))
                if parsed is not None:
                    book.learn_listed(*parsed)
            span = self.span
            taken = span is not None and book.listed.get(span.start, -1) > span.number
            if prefix != self.claims_prefix and taken:
                self._lose_span()
        elif prefix.startswith(self.bursts_prefix):
            self._bursts_walls[prefix] = self._read_wall
            for key in keys:
                burst = protocol.parse_burst_name(key.removeprefix(self.bursts_prefix))
                if burst is not None:
                    book.learn_burst(burst[0], burst[1])
        elif prefix == self.holes_prefix:
            for key in keys:
                name = key.removeprefix(prefix)
                if name == protocol.POOL_SETTLED_NAME:
                    self._settled = True  # every input has an outcome
                hole = protocol.parse_hole_name(name)
                if hole is not None:
                    book.learn_cut(*hole)
        elif prefix == self.results_prefix:
            for key in keys:
                index = protocol.parse_outcome_name(key.removeprefix(prefix))
                if index is not None:
                    book.learn_single(index)
        seen.update(keys)  # the book only grows: a name once learned teaches nothing new

    def _lose_span(self) -> None:
        """The held claim was taken over (this worker stalled past its lease): drop it,
        its unwritten outcomes and the running input (its new holder runs it)."""
        self.span = None
        self.buffer = None
        self.retry = None
        if self.running is not None and not self.killing:
            self.killing = True
            self._queue.append(Kill(self.running[0]))

    def read(self, key: str, data: bytes | None, generation: int | None) -> None:
        """The answer to :class:`Read`: the object's bytes and generation, or None (both)
        when it is missing."""
        self._answer(Read, key)
        self._look_reads += 1
        if key == self.stop_key:
            if data is not None:
                with contextlib.suppress(ValueError):  # being written: read again later
                    self.book.learn_stop(protocol.load_stop(data))
            return
        parsed = protocol.parse_claim_name(key.removeprefix(self.claims_prefix))
        if parsed is not None and data is not None:  # a missing claim: the batch is gone
            span = parse_claim(*parsed, data)
            if span is not None:
                self.book.learn_span(span)
                self._fresh_reads[parsed] = self._read_wall
                if generation is not None:
                    self._generations[parsed] = generation

    def created(self, key: str, generation: int | None) -> None:
        """The answer to :class:`Create`: the new object's generation, or None when one
        existed."""
        self._answer(Create, key)
        span = self._claiming.pop(key, None)
        if span is None:
            return
        if generation is not None:
            self._generations[(span.start, span.number)] = generation
            if span.number > 0 and span.reach is not None:  # a cut: announce the hole
                name = protocol.hole_name(
                    span.start, span.number, span.end, span.reach, span.slot, span.expires
                )
                self._queue.append(Create(self.holes_prefix + name, b""))
            self._quick, self._taking = False, None
            self._idle = self.idle_first
            self.book.learn_span(span)
            self.span, self.cursor = span, span.first
            self.region = self.options.region_of(span.start)
            self._claims_fresh = self._all_fresh = False
            # A dead worker's rest (a takeover, a hole's slot) is a large batch's tail:
            # once it is done, the next look is as after an idle sleep (a quick one
            # while the last full look is recent), not every name listed again and a
            # walk — hundreds of workers finish such a slot each second.
            rest = span.number > 0 or self.book.hole_slot(span.start) is not None
            self._slept = self.options.large and rest
            self._claims_walls.clear()  # its next slot in a hole: list the hole again
        else:
            self.book.learn_listed(span.start, span.number)
            if span.number == 0 and self.book.hole_slot(span.start) is not None:
                # A hole's slot: its extent is known, and its holder's lease is fresh, so
                # its claim is not read. Others are joining the hole: its claims are
                # listed again before this worker claims another slot (a listing is a
                # read; a create that loses is a write, five times as dear).
                self._claims_walls.clear()
            else:
                self._queue.append(self._read_claim(span.start, span.number))

    def written(self, key: str) -> None:
        """The answer to :class:`Write`."""
        self._answer(Write, key)

    def replaced(self, key: str, generation: int | None) -> None:
        """The answer to :class:`Replace`: the object's new generation, or None when it
        was no longer at the generation asked (a claim taken over, or renewed)."""
        self._answer(Replace, key)
        claim = self._marking.pop(key, None)
        if claim is not None:  # a takeover's fence
            if generation is None:  # renewed (or taken) since it was read: read it again
                self._taking = None
                parsed = protocol.parse_claim_name(key.removeprefix(self.claims_prefix))
                assert parsed is not None
                self._fresh_reads.pop(parsed, None)
                self._queue.append(self._read_claim(*parsed))
            else:
                self._generations[(claim.start, claim.number - 1)] = generation
                self._queue.append(self._create_claim(claim))
            return
        span = self.span
        if span is None or key != self._claim_key(span.start, span.number):
            return  # a renewal of a span this worker no longer holds
        if generation is None:
            self._lose_span()  # taken over while this worker stalled past its lease
        else:
            self._generations[(span.start, span.number)] = generation


def _rotated(items: list[int], pick: float) -> list[int]:
    """``items`` from the one ``pick`` (in [0, 1)) points at, wrapping around."""
    at = int(pick * len(items))
    return items[at:] + items[:at]


def _failure_payload(error: str) -> bytes:
    """A pickled failure payload (plain data: the standard pickle is what the client's
    unpickler reads, and the runner's machine needs no cloudpickle)."""
    import pickle

    payload = protocol.result_payload(success=False, phase="execute", error=error, error_type="")
    return pickle.dumps(payload, protocol=4)
