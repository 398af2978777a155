"""A coordinated pool's worker, its decisions as a sans-IO state machine. Pure.

The worker's shell (:mod:`runner.pool.coordinator.worker`) asks :meth:`Member.next`
for its next operation and answers it, like the leaderless worker's shell answers its
machine (:mod:`runner.pool.ops`)::

    Connect(hello)    -> find the coordinator, connect, handshake: linked(), or
                         unreachable(), or gone(reason) (the batch is done or stopped)
    Say(message)      -> send it on the link (a failure: disconnected())
    Run(index, n)     -> ran(index, record, payload, output, seconds, error_types)
    Kill(index)       -> end the running input, then ended(index)
    Create(key, data) -> an outcome object of its own (a large result): created(key)
    Fetch(chunk)      -> read an input chunk ahead, into the chunks kept: fetched()
    Sleep(seconds)    -> wait (a message heard or an input's end may come first)
    Exit(reason)      -> exit

and hands it what the coordinator says (:meth:`heard`) and a dropped connection
(:meth:`disconnected`). It keeps every outcome it reported until the coordinator
acknowledges it durable, and says the unacknowledged ones again on each new
connection; it asks for its next span as it starts its span's last input; it says
something at least every :data:`~runner.pool.coordinator.core.BEAT_SECONDS` while it
holds or runs inputs, or has outcomes not acknowledged. While an input runs it reads
ahead the input chunks its span needs next (the span's inputs are anywhere in the
batch: without it, a span's first input would wait for its chunk).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

from runner import protocol, results_log
from runner.pool.coordinator import messages as m
from runner.pool.coordinator.core import BEAT_SECONDS
from runner.pool.ops import Create, Exit, Kill, Run, Sleep
from runner.pool.options import LARGE_RESULT, PoolOptions

OUTPUT_TAIL: Final = 64 * 1024
"""Bytes of an input's output kept in its outcome's header (the end of it)."""
RECONNECT_FIRST_S: Final = 0.25
RECONNECT_MAX_S: Final = 4.0
EXIT_ACK_SECONDS: Final = 10.0
"""How long a worker told to exit waits for its last outcomes' acknowledgements."""
IDLE_SLEEP_S: Final = 5.0


@dataclass(frozen=True)
class Connect:
    """Find the coordinator and connect to it, greeting it with ``hello``."""

    hello: m.Hello


@dataclass(frozen=True)
class Say:
    message: m.ToCoordinator


@dataclass(frozen=True)
class Fetch:
    """Read input chunk ``chunk`` ahead (the shell keeps it for the inputs that need it)."""

    chunk: int


MemberOp = Connect | Say | Run | Kill | Create | Fetch | Sleep | Exit


class Member:
    """One worker of a coordinated pool (see the module docstring).

    :param options: the batch's (retries and their rule, ``fail_fast``).
    :param group_id: the batch's; :param name: this worker's (its pod's).
    """

    def __init__(self, options: PoolOptions, group_id: str, name: str) -> None:
        self.options = options
        self.group_id = group_id
        self.name = name
        self.rest: deque[int] = deque()
        self.running: tuple[int, int] | None = None
        self.retry: tuple[int, int, float] | None = None  # index, attempt, due (mono)
        self.unacked: dict[int, m.Outcome] = {}
        self.outbox: deque[m.ToCoordinator] = deque()
        self.creating: dict[str, m.Outcome] = {}  # own objects to write, then say
        self.objects: dict[str, bytes] = {}
        self.pending_create: str | None = None
        self.chunk_size = options.chunk_size
        self.wanted: deque[int] = deque()  # chunks of inputs handed out, in their order
        self.fetched: set[int] = set()  # read, or being read (by a Fetch or a Run)
        self.fetching = False
        self.linked = False
        self.connecting = False
        self.reconnect_at = 0.0
        self.reconnect_wait = RECONNECT_FIRST_S
        self.said_at = 0.0
        self.asked = False
        self.exit: m.Exit | None = None
        self.exit_since: float | None = None
        self.killing = False
        self.dropping = False  # the running input was dropped: it is ended
        self.gone: str | None = None
        self.now = 0.0
        """The monotonic clock's time at the latest :meth:`next`."""

    # -- what the shell hands in -------------------------------------------------------

    def heard(self, message: m.ToWorker, mono: float) -> None:
        """The coordinator said ``message``."""
        if isinstance(message, m.Assign):
            if self.exit is None:
                self.rest.extend(i for i in message.indices if i not in self.rest)
                self.asked = False
                for index in message.indices:
                    chunk = index // self.chunk_size
                    if chunk not in self.fetched and (not self.wanted or self.wanted[-1] != chunk):
                        self.wanted.append(chunk)
        elif isinstance(message, m.Drop):
            dropped = set(message.indices)
            self.rest = deque(i for i in self.rest if i not in dropped)
            if self.running is not None and self.running[0] in dropped:
                self.dropping = True  # another ran it, or it was cancelled: end it
            if self.retry is not None and self.retry[0] in dropped:
                self.retry = None
        elif isinstance(message, m.Ack):
            for index in message.indices:
                self.unacked.pop(index, None)
        elif isinstance(message, m.Exit):
            self.exit = message
            self.exit_since = mono
            self.rest.clear()
            self.retry = None

    def linked_up(self, mono: float, *, asked: bool = True) -> None:
        """The connection is up (the handshake passed): what was not acknowledged is said
        again, and the ask for a span if one is wanted.

        :param asked: whether its hello asked for a span if one was wanted: False for
            the connection the worker made before it set up (its hello asked nothing).
        """
        self.linked, self.connecting = True, False
        self.reconnect_wait = RECONNECT_FIRST_S
        self.said_at = mono
        self.outbox = deque(self.unacked[i] for i in sorted(self.unacked))
        self.asked = asked and not self.rest  # the hello said it wants a span

    def unreachable(self, mono: float, pick: float = 1.0) -> None:
        """The coordinator could not be reached (not started yet, restarting): tried
        again after a back-off, its ``pick`` (a random number in [0, 1)) from half of it
        to all of it, so that a pool whose coordinator died does not look for the next
        one in step (each look is a listing and a read)."""
        self.connecting = False
        self.reconnect_at = mono + self.reconnect_wait * (0.5 + pick / 2)
        self.reconnect_wait = min(RECONNECT_MAX_S, self.reconnect_wait * 2)

    def gone_away(self, reason: str) -> None:
        """The batch is done or stopped, and the coordinator gone: exit."""
        self.connecting = False
        self.gone = reason
        self.rest.clear()
        self.retry = None

    def disconnected(self, mono: float, pick: float = 0.0) -> None:
        """The connection dropped: connected again after ``pick`` (a random number in
        [0, 1)) of the first back-off."""
        self.linked = False
        self.outbox.clear()  # said again on the next connection, if it matters
        self.reconnect_at = mono + RECONNECT_FIRST_S * pick

    def ran(
        self,
        index: int,
        record: protocol.FinalRecord,
        payload: bytes,
        output: bytes = b"",
        seconds: float | None = None,
        error_types: frozenset[str] | None = None,
    ) -> None:
        """The running attempt of ``index`` ended with ``record`` and ``payload``."""
        assert self.running is not None
        assert self.running[0] == index
        attempt = self.running[1]
        self.running, self.killing, self.dropping = None, False, False
        failed = record["state"] != "succeeded"
        if failed and self.exit is None and self.gone is None:
            delay = self.options.rule.delay_after_types(attempt, error_types)
            if delay is not None:
                self.retry = (index, attempt + 1, self.now + delay)
                return
        header = protocol.outcome_header(attempt, record, worker=self.name)
        if output:
            header["output"] = output[-OUTPUT_TAIL:].decode(errors="replace")
        took = 0.0 if seconds is None else seconds
        if len(payload) > LARGE_RESULT:
            key = protocol.group_outcome_key(self.group_id, index)
            # Reported once its object is written (said before, it would read as durable).
            self.creating[key] = m.Outcome(index, None, failed, took)
            self.objects[key] = protocol.encode_outcome(header, payload)
            return
        outcome = m.Outcome(index, results_log.encode(index, header, payload), failed, took)
        self._report(outcome)

    def ended(self, index: int) -> None:
        """The running input was ended from outside (after :class:`Kill`): no outcome."""
        assert self.running is not None
        assert self.running[0] == index
        self.running, self.killing, self.dropping = None, False, False

    def fetched_chunk(self, chunk: int) -> None:
        """The chunk asked for by :class:`Fetch` was read (or the read failed: the input
        that needs it reads it then)."""
        self.fetching = False

    def created(self, key: str) -> None:
        """An outcome object of its own was written (or found: an earlier try's)."""
        self.pending_create = None
        outcome = self.creating.pop(key)
        self.objects.pop(key, None)
        self._report(outcome)

    # -- decisions ---------------------------------------------------------------------

    def hello(self) -> m.Hello:
        holding = ([self.running[0]] if self.running else []) + list(self.rest)
        if self.retry is not None:
            holding.insert(0, self.retry[0])
        return m.Hello(self.name, tuple(holding), wants=not self.rest and self.retry is None)

    def next(self, mono: float) -> MemberOp:
        """The next operation (see the module docstring)."""
        self.now = mono
        # One slow operation at a time.
        slow_op_out = self.connecting or self.pending_create is not None or self.fetching
        if not slow_op_out and self.creating:
            key = next(iter(self.creating))
            self.pending_create = key
            return Create(key, self.objects[key])
        if self.linked and self.outbox:
            return self._say(self.outbox.popleft(), mono)
        stopping = self.exit is not None or self.gone is not None
        ending = self.dropping or stopping and self._kills()
        if self.running is not None and not self.killing and ending:
            self.killing = True
            return Kill(self.running[0])
        if stopping and self.running is None and self.pending_create is None:
            if self.gone is not None:
                return Exit(self.gone)
            assert self.exit is not None
            assert self.exit_since is not None
            # Its last outcomes acknowledged (a dropped link is connected again for
            # them), or waited for long enough.
            if not self.unacked or mono - self.exit_since >= EXIT_ACK_SECONDS:
                return Exit(self.exit.reason)
        reconnect = not slow_op_out and mono >= self.reconnect_at and self.gone is None
        if not self.linked and reconnect:
            self.connecting = True
            return Connect(self.hello())
        if self.running is None and not stopping:
            if self.retry is not None and mono >= self.retry[2]:
                index, attempt, _ = self.retry
                self.retry = None
                self.running = (index, attempt)
                return Run(index, attempt)
            if self.retry is None and self.rest:
                index = self.rest.popleft()
                self.running = (index, 0)
                self.fetched.add(index // self.chunk_size)  # the run reads it if need be
                if not self.rest and self.linked and not self.asked:
                    self.asked = True
                    self.outbox.append(m.More())
                return Run(index, 0)
            if self.linked and not self.rest and self.retry is None and not self.asked:
                self.asked = True
                return self._say(m.More(), mono)
        busy = self.running is not None or self.rest or self.unacked or self.retry is not None
        if self.linked and busy and mono - self.said_at >= BEAT_SECONDS:
            return self._say(m.Beat(), mono)
        if not stopping and not slow_op_out and (chunk := self._to_fetch()) is not None:
            self.fetched.add(chunk)
            self.fetching = True
            return Fetch(chunk)
        return Sleep(self._wait(mono, busy=bool(busy)))

    def _to_fetch(self) -> int | None:
        """The next chunk a held input needs and nobody read yet."""
        while self.wanted:
            chunk = self.wanted.popleft()
            if chunk not in self.fetched:
                return chunk
        return None

    def _kills(self) -> bool:
        if self.gone is not None:
            return True
        assert self.exit is not None
        return self.exit.kill

    def _report(self, outcome: m.Outcome) -> None:
        self.unacked[outcome.index] = outcome
        if self.linked:
            self.outbox.append(outcome)

    def _say(self, message: m.ToCoordinator, mono: float) -> Say:
        self.said_at = mono
        return Say(message)

    def _wait(self, mono: float, *, busy: bool) -> float:
        waits = [IDLE_SLEEP_S]
        if self.linked and busy:
            waits.append(self.said_at + BEAT_SECONDS - mono)
        if not self.linked and not self.connecting:
            waits.append(self.reconnect_at - mono)
        if self.retry is not None:
            waits.append(self.retry[2] - mono)
        if self.exit_since is not None:
            waits.append(self.exit_since + EXIT_ACK_SECONDS - mono)
        return max(0.01, min(waits))
