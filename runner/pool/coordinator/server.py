"""The coordinator's process: ``python -m runner.pool.coordinator --storage URL --group GID
--host ADDRESS``. The IO shell of :class:`~runner.pool.coordinator.core.Coordinator`.

It

1. reads the batch's manifest (``stop.json`` too: a batch stopped before it started
   ends it at once), and listens on ``--host`` (a pod's address; any free port unless
   ``--port``);
2. takes its epoch: creates ``coordinator/{epoch}.json`` (where it listens): epoch 0
   if it can, else the epoch after the highest listed; of two that start at once, one
   gets each (a worker that connects meanwhile waits for it to be ready);
3. after a restart (epoch > 0) reads every commit, and lists the inputs' objects of
   their own: those inputs are done; it hands nothing out until its workers have
   reconnected and said what they hold (at most
   :data:`~runner.pool.coordinator.core.RESTART_GRACE_SECONDS`);
4. serves the workers (:mod:`.wire`: a connection whose peer does not prove the batch's
   token is closed before anything is said on it) and the batch's objects that never
   change to them (:mod:`.shelf`: the manifest, function, context, input chunks);
   writes each commit create-if-absent until storage answers (a commit found there is
   an earlier try's that landed); reads ``stop.json`` every :data:`STOP_READ_SECONDS`
   (one read, whatever the pool's size), and writes it on a ``fail_fast`` failure;
   lists the inputs' outcome objects of their own every :data:`OWN_LOOK_SECONDS` (a
   reader's cancel of one input); writes which inputs run (``running.json``, every
   :data:`RUNNING_SECONDS` while it changes), for readers;
5. exits 0 once every outcome is durable (or the batch stopped and its workers are
   gone), after telling its workers to exit.

The token is :data:`~runner.pool.coordinator.wire.TOKEN_ENV`'s (hex). Storage is the
runner's blocking store, used from worker threads: the event loop only moves frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, ParamSpec, TypeVar

from runner import protocol
from runner.pool.coordinator import commits, core, epochs, wire
from runner.pool.coordinator import messages as m
from runner.pool.coordinator.ledger import Commit
from runner.pool.coordinator.shelf import Readers, Shelf, servable_keys, warm_keys
from runner.pool.options import PoolOptions
from runner.pool.signals import EXIT_TERMINATED
from runner.store import RunnerStore, StoreUnavailable

LISTEN_BACKLOG: Final = 4096
"""Connections waiting to be accepted at most (the kernel caps it at ``somaxconn``): a
pool's workers connect within its start spread, 4,000 a second (asyncio's default of
100 refused connections of a 1,000-worker pool that came at once)."""
RUNNING_SECONDS: Final = 2.0
"""Seconds between two writes of the running inputs (``running.json``, for readers'
statuses), while they change."""
OWN_LOOK_SECONDS: Final = 5.0
"""Seconds between two listings of the inputs' outcome objects of their own (a reader's
cancel of one input: its worker ends it within this and one message)."""
STOP_READ_SECONDS: Final = 1.0
"""Seconds between two reads of ``stop.json`` (a cancel reaches every worker within
this and one message)."""
DRAIN_SECONDS: Final = 8.0
"""After SIGTERM, how long the coordinator serves on for its workers' last outcomes
(they wait :data:`runner.pool.coordinator.worker.TERM_ACK_SECONDS` for them; a pod's
grace is longer)."""
HANDSHAKE_SECONDS: Final = 10.0
"""A connection that has not proved the token by then is closed."""
EXIT_DEPOSED: Final = 3
"""The exit status of a coordinator that found a successor: not 0, which would complete
its Job (one completion) and end the successor's pod with it."""
RETRY_SECONDS: Final = 0.5
"""The first wait before a storage request that failed is tried again (doubling to 8 s)."""


P = ParamSpec("P")
T = TypeVar("T")


class CoordinatorError(RuntimeError):
    """The coordinator cannot serve its batch (no token, no manifest)."""


def token_from_env() -> bytes:
    """:raises CoordinatorError: the token is missing or not hex."""
    text = os.environ.get(wire.TOKEN_ENV, "")
    try:
        token = bytes.fromhex(text)
    except ValueError:
        token = b""
    if len(token) < 16:
        raise CoordinatorError(f"{wire.TOKEN_ENV} must hold the batch's token (32 hex digits+)")
    return token


class Server:
    """One coordinator's IO (see the module docstring)."""

    def __init__(
        self,
        store: RunnerStore,
        group_id: str,
        token: bytes,
        *,
        timescale: float = 1.0,
        readers: Callable[[], RunnerStore] | None = None,
    ) -> None:
        """:param readers: opens a store for each of the shelf's reading threads
        (:class:`~.shelf.Readers`); without it the shelf reads through ``store``'s
        thread."""
        self.store, self.group_id, self.token = store, group_id, token
        self.timescale = timescale
        """Wall seconds per second of the protocol's clock: 1, but for a simulation that
        runs slower than real time (``benchmarks/bench_pool_sim.py``)."""
        self.core: core.Coordinator | None = None
        self.shelf: Shelf | None = None
        self.readers = None if readers is None else Readers(readers)
        self.epoch = 0
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        """Every connection's handler (the server's task), and its writer: the
        coordinator closes them and waits for their ends before it exits."""
        self.next_conn = 0
        self.wake = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once the core is made: a connection's handshake waits for it."""
        self.finished = asyncio.Event()
        """Set once the coordinator finished, or got SIGTERM (:meth:`terminate`)."""
        self.terminated = False
        self.commit_due: asyncio.Queue[Commit] = asyncio.Queue()
        self.stop_to_write: list[tuple[str, str]] = []
        # The runner's stores are used by one thread at a time (the gs:// one drives a
        # private event loop): every call goes through this one thread, in turn.
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="kinetic-store")

    def now(self) -> float:
        """The protocol's clock (:class:`~runner.pool.coordinator.core.Coordinator`'s): the
        monotonic clock's seconds, divided by :attr:`timescale`."""
        return time.monotonic() / self.timescale

    def close(self) -> None:
        """End the store's thread and the shelf's (after the calls under way)."""
        self._store_thread.shutdown(wait=True)
        if self.readers is not None:
            self.readers.close()

    async def patiently(
        self, what: str, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``call(*args)`` in the store's thread, tried again while storage fails in a
        way that may pass (the store's own retries spent)."""
        loop = asyncio.get_running_loop()
        delay = RETRY_SECONDS * self.timescale
        while True:
            try:
                return await loop.run_in_executor(
                    self._store_thread, functools.partial(call, *args, **kwargs)
                )
            except StoreUnavailable as e:
                print(f"kinetic coordinator: {what}: {e}; again in {delay:.1f} s", flush=True)
                await asyncio.sleep(delay)
                delay = min(8.0 * self.timescale, delay * 2)

    # -- start -----------------------------------------------------------------------------

    async def serve(self, host: str, port: int, advertise: str) -> int:
        manifest_key = protocol.group_manifest_key(self.group_id)
        manifest_bytes = await self._read(manifest_key, "the manifest")
        manifest = protocol.load_manifest(manifest_bytes)
        options = PoolOptions.from_manifest(manifest)
        self.shelf = Shelf(servable_keys(self.group_id, manifest), self._shelf_read)
        self.shelf.put(manifest_key, manifest_bytes)
        server = await asyncio.start_server(self._connection, host, port, backlog=LISTEN_BACKLOG)
        bound = server.sockets[0].getsockname()[1]
        try:
            self.epoch = await epochs.take_epoch(
                self.patiently, self.store, self.group_id, advertise, bound
            )
            durable = set()
            if self.epoch:
                durable = await epochs.durable_inputs(self.patiently, self.store, self.group_id)
            self.core = core.Coordinator(
                options.total,
                options.workers,
                epoch=self.epoch,
                durable=durable,
                fail_fast=options.fail_fast,
                kill_on_fail=options.cancel_running_on_fail,
                now=self.now(),
            )
            self.ready.set()
            print(
                f"kinetic coordinator: epoch {self.epoch} on {advertise}:{bound}, "
                f"{len(durable)} of {options.total} inputs done",
                flush=True,
            )
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.shelf.warm(warm_keys(self.group_id, manifest, durable)))
                tasks.create_task(self._ticks())
                tasks.create_task(self._commits())
                tasks.create_task(self._stops())
                tasks.create_task(self._tell_running())
                tasks.create_task(self._own_outcomes(durable))
                await self.finished.wait()
                if self.terminated:
                    await self._drain()
                await self._flush_writers()
                if coordinator_done(self.core):
                    key = commits.done_key(self.group_id)
                    await self.patiently("writing done", self.store.create_if_absent, key, b"{}")
                raise _Done
        except* _Done:
            outcome, status = "finished", protocol.EXIT_OK
            if self.terminated:
                outcome, status = "terminated", EXIT_TERMINATED
        except* Deposed as group:
            outcome, status = f"{group.exceptions[0]}", EXIT_DEPOSED
        finally:
            server.close()
            await self._close_connections()
        print(f"kinetic coordinator: epoch {self.epoch} {outcome}", flush=True)
        return status

    async def _read(self, key: str, what: str) -> bytes:
        try:
            data = await self.patiently(f"reading {what}", self.store.read, key)
        except FileNotFoundError as e:
            raise CoordinatorError(f"{what} ({key}) is missing") from e
        return data

    async def _shelf_read(self, key: str) -> bytes:
        if self.readers is not None:
            return await self.readers.read(key)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._store_thread, self.store.read, key)

    # -- connections -----------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections[task] = writer
        try:
            await self._converse(reader, writer)
        finally:
            del self.connections[task]

    async def _close_connections(self) -> None:
        """Close every connection, and wait for their handlers to see it and end."""
        for writer in self.connections.values():
            writer.close()
        if self.connections:
            await asyncio.wait(list(self.connections), timeout=HANDSHAKE_SECONDS)

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self.next_conn
        self.next_conn += 1
        decoder = wire.Decoder()
        try:
            async with asyncio.timeout(HANDSHAKE_SECONDS * self.timescale):
                greeting = await self._handshake(reader, writer, decoder)
        except (TimeoutError, wire.WireError, ConnectionError, asyncio.IncompleteReadError) as e:
            print(f"kinetic coordinator: a connection refused: {e}", flush=True)
            writer.close()
            return
        try:
            async with asyncio.timeout(HANDSHAKE_SECONDS * self.timescale):
                await self.ready.wait()  # the epoch taken, the commits read
        except TimeoutError:
            writer.close()  # still starting: the worker connects again
            return
        if writer.is_closing():  # the coordinator ended while this one waited
            return
        coordinator = self.core
        assert coordinator is not None
        self.writers[conn] = writer
        self._perform(coordinator.connected(conn, greeting.hello, self.now()))
        serving: set[asyncio.Task[None]] = set()
        try:
            async with asyncio.TaskGroup() as reads:  # the shelf's answers to this worker
                while data := await reader.read(1 << 16):
                    for frame in decoder.feed(data):
                        if isinstance(frame, m.Read):
                            task = reads.create_task(self._serve(writer, frame.key))
                            serving.add(task)
                            task.add_done_callback(serving.discard)
                            continue
                        if not isinstance(frame, (m.Outcome, m.More, m.Beat)):
                            raise wire.WireError(f"a worker sent {type(frame).__name__}")
                        self._perform(coordinator.received(conn, frame, self.now()))
                    await writer.drain()
                for task in serving:  # the worker is gone: its answers are not waited for
                    task.cancel()
        except* (wire.WireError, ConnectionError) as group:
            why = group.exceptions[0]
            print(f"kinetic coordinator: connection {conn} dropped: {why}", flush=True)
        finally:
            writer.close()
            if self.writers.pop(conn, None) is not None:
                self._perform(coordinator.disconnected(conn, self.now()))

    async def _serve(self, writer: asyncio.StreamWriter, key: str) -> None:
        assert self.shelf is not None
        data = await self.shelf.get(key)
        if not writer.is_closing():
            writer.write(wire.encode(m.Data(key, data)))
            with contextlib.suppress(ConnectionError):
                await writer.drain()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, decoder: wire.Decoder
    ) -> wire.Greeting:
        challenge = wire.Challenge(wire.new_nonce(), self.epoch)
        writer.write(wire.encode(challenge))
        await writer.drain()
        greeting, early = await first_frame(reader, decoder)
        if not isinstance(greeting, wire.Greeting):
            raise wire.WireError(f"the first frame is a {type(greeting).__name__}")
        wire.check_greeting(self.token, challenge, greeting)
        writer.write(
            wire.encode(
                wire.Welcome(wire.welcome_proof(self.token, challenge.nonce, greeting.nonce))
            )
        )
        if early:
            raise wire.WireError("frames before the welcome")
        return greeting

    # -- actions ---------------------------------------------------------------------------

    def _perform(self, actions: list[core.Action]) -> None:
        for action in actions:
            if isinstance(action, core.Send):
                writer = self.writers.get(action.conn)
                if writer is not None and not writer.is_closing():
                    writer.write(wire.encode(action.message))
            elif isinstance(action, core.Close):
                writer = self.writers.pop(action.conn, None)
                if writer is not None:
                    writer.close()
            elif isinstance(action, core.WriteCommit):
                self.commit_due.put_nowait(action.commit)
            elif isinstance(action, core.WriteStop):
                self.stop_to_write.append((action.reason, action.detail))
            elif isinstance(action, core.Finished):
                self.finished.set()
        self.wake.set()

    async def _ticks(self) -> None:
        coordinator = self.core
        assert coordinator is not None
        while True:
            due = coordinator.next_tick()
            wait = 1.0 if due is None else max(0.0, min(1.0, due - self.now()))
            wait *= self.timescale
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):  # not wait_for: 3.11's can swallow a cancel
                    await self.wake.wait()
            self._perform(coordinator.tick(self.now()))
            self.wake.clear()

    async def _commits(self) -> None:
        coordinator = self.core
        assert coordinator is not None
        successor = commits.coordinator_key(self.group_id, self.epoch + 1)
        while True:
            commit = await self.commit_due.get()
            # A coordinator that lost its pod's network and was replaced learns it here,
            # and commits no more: its last write lands within one storage request of a
            # successor's start, which readers wait out (docs/pool-protocol.md).
            try:
                await self.patiently("reading a successor's record", self.store.read, successor)
            except FileNotFoundError:
                pass
            else:
                raise Deposed(f"stops: epoch {self.epoch + 1} started")
            key = commits.commit_key(self.group_id, commit.epoch, commit.seq)
            data = commits.encode_commit(list(commit.records.values()))
            # Created, or found there (an earlier try landed and its answer was lost).
            await self.patiently(
                f"writing commit {commit.seq}", self.store.create_if_absent, key, data
            )
            self._perform(coordinator.landed(commit, self.now()))

    async def _own_outcomes(self, seen: set[int]) -> None:
        coordinator = self.core
        assert coordinator is not None
        prefix = protocol.group_results_prefix(self.group_id)
        while True:
            await asyncio.sleep(OWN_LOOK_SECONDS * self.timescale)
            keys = await self.patiently("listing outcomes", self.store.list, prefix)
            found = {protocol.parse_outcome_name(k.removeprefix(prefix)) for k in keys}
            new = sorted(i for i in found if i is not None and i not in seen)
            if new:
                seen.update(new)
                self._perform(coordinator.own_outcomes(new, self.now()))

    async def _tell_running(self) -> None:
        coordinator = self.core
        assert coordinator is not None
        key, told = commits.running_key(self.group_id), None
        while True:
            running = coordinator.running()
            ending = self.terminated or coordinator.finished or coordinator.stopped is not None
            if running != told and not ending:  # (a stopped batch's cleanup may be under way)
                data = commits.encode_running(self.epoch, running)
                await self.patiently("writing the running inputs", self.store.write, key, data)
                told = running
            await asyncio.sleep(RUNNING_SECONDS * self.timescale)

    async def _stops(self) -> None:
        coordinator = self.core
        assert coordinator is not None
        key = protocol.group_stop_key(self.group_id)
        while True:
            for reason, detail in self.stop_to_write:
                record = protocol.stop_record(reason, detail)  # type: ignore[arg-type]
                await self.patiently(
                    "writing the stop", self.store.create_if_absent, key, protocol.dump_json(record)
                )
            self.stop_to_write.clear()
            if coordinator.stopped is None:
                try:
                    data = await self.patiently("reading the stop", self.store.read, key)
                except FileNotFoundError:
                    pass
                else:
                    stop = protocol.load_json(data)
                    self._perform(
                        coordinator.stop(str(stop.get("reason", "cancelled")), self.now())
                    )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_READ_SECONDS * self.timescale):
                    await self._stop_wanted()

    async def _stop_wanted(self) -> None:
        while not self.stop_to_write:
            self.wake.clear()
            await self.wake.wait()

    def terminate(self) -> None:
        """SIGTERM: its pod is being deleted (a cancel, a drained node). It serves on
        for at most :data:`DRAIN_SECONDS` while connections are open, so that workers
        deleted with it report and see committed what they finished, then exits
        :data:`~runner.pool.signals.EXIT_TERMINATED`: not 0, so that its Job replaces it
        where the batch goes on (the successor takes the next epoch)."""
        print("kinetic coordinator: got SIGTERM: commits what its workers report", flush=True)
        self.terminated = True
        self.finished.set()

    async def _drain(self) -> None:
        coordinator = self.core
        assert coordinator is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_SECONDS * self.timescale):
                while self.writers or not coordinator.ledger.settled():
                    self.wake.clear()
                    await self.wake.wait()

    async def _flush_writers(self) -> None:
        for writer in list(self.writers.values()):
            with contextlib.suppress(ConnectionError):
                async with asyncio.timeout(5.0):
                    await writer.drain()


async def first_frame(
    reader: asyncio.StreamReader, decoder: wire.Decoder
) -> tuple[wire.Frame, list[wire.Frame]]:
    """The next frame of a handshake, and any that came with it.

    :raises ConnectionError: the peer closed the connection first.
    """
    while True:
        data = await reader.read(1 << 16)
        if not data:
            raise ConnectionError("closed during the handshake")
        frames = decoder.feed(data)
        if frames:
            return frames[0], frames[1:]


def coordinator_done(coordinator: core.Coordinator | None) -> bool:
    return coordinator is not None and coordinator.finished and coordinator.stopped is None


class Deposed(Exception):
    """A later epoch's coordinator started: this one must not commit any more."""


class _Done(Exception):
    """Ends the coordinator's task group once it finished."""
