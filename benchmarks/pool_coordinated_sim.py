"""The coordinated pool's own code in ``bench_pool_sim.py`` (``--engine coord``).

Issue 38 asks that the two designs be compared on the same simulated runs. This runs
the coordinated pool as built (``runner/pool/coordinator/``) against the same
rate-limited fake-gcs-server, inputs, kills and pauses as the leaderless pool's workers:

* **The coordinator** (:func:`coordinator_main`, a process of its own, as its pod):
  the production :class:`runner.pool.coordinator.server.Server` over the runner's
  ``gs://`` store (:class:`kinetic._storage.runner_gcs.GCSStore`, its client's
  back-off dilated), its protocol clock slowed by the run's dilation
  (``timescale``): it reads the manifest, takes its epoch, hands out spans, hears
  outcomes, group-commits them and exits once every outcome is durable. With
  ``--kill-coordinator`` it is killed and a new process started: it takes the next
  epoch, reads the commits and serves the workers that reconnect.
* **The workers** (:func:`workers_main`): each the production sans-IO
  :class:`runner.pool.coordinator.member.Member`, its clock slowed the same way,
  driven by an async shell (:func:`drive`) that does what the pod's shell
  (:class:`runner.pool.coordinator.worker.CoordinatedWorker`) does: the start spread,
  finding the coordinator in storage (:func:`reach`: epoch 0's record first, later a
  listing and a read, as :func:`runner.pool.coordinator.link.find`), the handshake of
  :mod:`runner.pool.coordinator.wire` with the batch's token, the batch's reads
  (manifest, function, input chunks) from the coordinator's shelf (:class:`Served`;
  from storage while no coordinator is reached), then frames; an input is
  ``asyncio.sleep`` whose value (its index squared) the runner's
  :func:`runner.job.build_success` pickles.
* **Failures**: a killed worker's connection is cut (its pod's sockets close with
  it); a paused worker decides nothing for 1.1-1.5 leases, then goes on.

What is not simulated: the pod's process per input, its log, the Kubernetes objects
(the coordinator's Job, its Secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from collections import Counter, deque
from dataclasses import replace
from typing import Any

from benchmarks.bench_pool_sim import (
    GROUP,
    Chunks,
    WorkerStats,
    _retry,
    checked,
    dilated_client,
    every_worker,
    input_seconds,
    process_start,
    read_batch,
)

CONNECT_S = 5.0
"""A connection and its handshake take at most this long (simulated seconds), as the
pod's :data:`runner.pool.coordinator.link.CONNECT_SECONDS`."""


def coordinator_main(cfg: dict[str, Any]) -> None:
    """The coordinator's process: prints ``ready``, takes the start time on stdin, serves
    the batch until every outcome is durable, then prints a ``result`` line."""
    from kinetic._storage.gcs import GCSStorage
    from kinetic._storage.runner_gcs import GCSStore
    from runner.pool.coordinator.server import Server

    dilate = cfg["dilate"]

    def open_store() -> GCSStore:
        return GCSStore(cfg["bucket"], GCSStorage(cfg["bucket"], **dilated_client(dilate)))

    store = open_store()
    token = bytes.fromhex(cfg["token"])
    server = Server(store, GROUP, token, timescale=dilate, readers=open_store)
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))

    async def serve() -> int:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.terminate)
        return await server.serve("127.0.0.1", 0, "127.0.0.1")

    try:
        status = asyncio.run(serve())
    finally:
        server.close()
        store.close()
    core = server.core
    out = {
        "coordinator": {
            "status": status,
            "epoch": server.epoch,
            "commits": core.ledger.next_seq if core is not None else 0,
            "shelf_reads": server.shelf.reads if server.shelf is not None else 0,
            "shelf_served": server.shelf.served if server.shelf is not None else 0,
        },
        "cpu_s": time.process_time(),
    }
    print("result " + json.dumps(out), flush=True)


class Link:
    """An authenticated connection to the coordinator: what it says is queued by a
    reading task (owned: :meth:`close` ends it) and wakes :attr:`heard`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        decoder: Any,
        early: list[Any],
    ) -> None:
        self.reader, self.writer, self.decoder = reader, writer, decoder
        self.frames: deque[Any] = deque(early)
        self.reads: dict[str, asyncio.Future[bytes | None]] = {}
        self.dropped = False
        self.heard = asyncio.Event()
        if early:
            self.heard.set()
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        from runner.pool.coordinator import messages as m
        from runner.pool.coordinator import wire

        try:
            while data := await self.reader.read(1 << 16):
                for frame in self.decoder.feed(data):
                    if isinstance(frame, m.Data):
                        answer = self.reads.pop(frame.key, None)
                        if answer is not None and not answer.done():
                            answer.set_result(frame.data)
                    else:
                        self.frames.append(frame)
                self.heard.set()
        except (OSError, wire.WireError):
            pass
        self.dropped = True
        for answer in self.reads.values():
            if not answer.done():
                answer.set_result(None)  # read from storage instead
        self.reads.clear()
        self.heard.set()

    async def read(self, key: str, timeout: float) -> bytes | None:
        """The batch's object ``key`` from the coordinator's shelf (the pod's
        :meth:`runner.pool.coordinator.link.Link.read`); None: read it from storage."""
        from runner.pool.coordinator import messages as m

        answer = self.reads.get(key)
        if answer is None:
            if not self.send(m.Read(key)):
                return None
            answer = self.reads[key] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(asyncio.shield(answer), timeout)
        except TimeoutError:
            return None

    def take(self) -> list[Any]:
        out = list(self.frames)
        self.frames.clear()
        self.heard.clear()
        return out

    def send(self, message: Any) -> bool:
        """False when the connection is gone."""
        from runner.pool.coordinator import wire

        if self.dropped or self.writer.is_closing():
            return False
        self.writer.write(wire.encode(message))
        return True

    def close(self, *, cut: bool = False) -> None:
        self._task.cancel()
        if cut:
            self.writer.transport.abort()
        else:
            self.writer.close()


class Served:
    """The pod's :class:`runner.pool.coordinator.served.ServedStore`: reads asked of the
    coordinator's shelf while the worker is linked (``state["link"]``), else storage's."""

    def __init__(self, store: Any, state: dict[str, Any]) -> None:
        self.store, self.state = store, state

    async def read(self, key: str, *, timeout: float) -> bytes:
        link = self.state.get("link")
        if link is not None:
            data = await link.read(key, timeout)
            if data is not None:
                self.state["stats"].ops["served"] += 1
                return data
        return await self.store.read(key, timeout=timeout)  # type: ignore[no-any-return]


async def reach(
    store: Any, hello: Any, token: bytes, state: dict[str, Any], *, first: bool = False
) -> tuple[str, Any]:
    """Find the coordinator and connect (the pod's ``_connect``): ``("linked", Link)``,
    ``("gone", reason)`` (the batch is done or stopped) or ``("unreachable", None)``.
    ``first``: the pod's look before it sets up (epoch 0's record, one read; no
    listing, and no stop read when it is not there)."""
    from kinetic._exceptions import ObjectNotFoundError
    from runner import protocol
    from runner.pool.coordinator import commits, wire
    from runner.pool.coordinator.server import first_frame

    stats, timeout, dilate = state["stats"], state["timeout"], state["dilate"]

    async def keys(prefix: str, *, timeout: float) -> list[str]:
        return [k async for k in store.list(prefix, timeout=timeout)]

    async def stopped() -> str | None:
        try:
            data = await timed(
                _retry(store.read, protocol.group_stop_key(GROUP), timeout=timeout, stats=stats)
            )
        except ObjectNotFoundError:
            return None
        return str(protocol.load_json(data).get("reason", "cancelled"))

    async def timed(call: Any) -> Any:
        sent = time.monotonic()
        try:
            return await call
        finally:
            stats.op_ms[round((time.monotonic() - sent) * 1000 / dilate)] += 1

    try:
        if first:
            epoch, key = 0, commits.coordinator_key(GROUP, 0)
        else:
            listed = await timed(
                _retry(keys, commits.coordinator_prefix(GROUP), timeout=timeout, stats=stats)
            )
            if commits.done_key(GROUP) in listed:
                return "gone", "done"
            epochs = [(commits.parse_coordinator_key(GROUP, k), k) for k in listed]
            found = [(e, k) for e, k in epochs if e is not None]
            if not found:
                reason = await stopped()
                return ("gone", reason) if reason else ("unreachable", None)
            epoch, key = max(found)
        record = commits.decode_coordinator(
            await timed(_retry(store.read, key, timeout=timeout, stats=stats))
        )
        async with asyncio.timeout(CONNECT_S * dilate):
            reader, writer = await asyncio.open_connection(record["host"], record["port"])
        try:
            decoder = wire.Decoder()
            async with asyncio.timeout(CONNECT_S * dilate):
                challenge, early = await first_frame(reader, decoder)
                if early or not isinstance(challenge, wire.Challenge) or challenge.epoch != epoch:
                    raise wire.WireError(f"not epoch {epoch}'s coordinator")
                nonce = wire.new_nonce()
                proof = wire.hello_proof(token, challenge.nonce, nonce, hello.worker)
                writer.write(wire.encode(wire.Greeting(hello, nonce, proof)))
                welcome, early = await first_frame(reader, decoder)
                if not isinstance(welcome, wire.Welcome):
                    raise wire.WireError(f"answered with {type(welcome).__name__}")
                wire.check_welcome(token, challenge, nonce, welcome)
        except BaseException:
            writer.transport.abort()
            raise
        return "linked", Link(reader, writer, decoder, early)
    except ObjectNotFoundError:  # a first look: no coordinator yet
        return "absent", None
    except (OSError, TimeoutError, wire.WireError, ValueError):
        stats.ops["unreachable"] += 1
        if first:
            return "unreachable", None
        reason = await stopped()
        return ("gone", reason) if reason else ("unreachable", None)


async def drive(member: Any, store: Any, chunks: Chunks, state: dict[str, Any]) -> str:
    """Perform ``member``'s operations until it exits; its exit reason. The loop of the
    pod's shell (:meth:`runner.pool.worker.Worker.loop` with the coordinated worker's
    ``next_op`` and ``request``): what the member says goes out at once, an input runs
    while the member is asked for upkeep (beats, its next ask, outcomes), a connection
    is made in the background (the pod's courier)."""
    from runner.job import build_success
    from runner.pool import ops as pm
    from runner.pool.coordinator.member import Connect, Fetch, Say

    stats, dilate, token = state["stats"], state["dilate"], state["token"]
    link: Link | None = state.get("link")  # connected before setting up
    if link is not None:
        member.linked_up(time.monotonic() / dilate, asked=False)
    connecting: asyncio.Task[tuple[str, Any]] | None = None
    fetching: tuple[int, asyncio.Task[None]] | None = None  # a chunk read ahead
    running: tuple[int, asyncio.Task[None], float, Any] | None = None

    def now() -> float:
        return time.monotonic() / dilate

    def spent(what: str, since: float) -> None:
        stats.between_ms[what] += round((time.monotonic() - since) * 1000 / dilate)

    async def unpaused() -> None:  # a paused worker decides nothing until it resumes
        await asyncio.sleep(max(0.0, state.get("paused_until", 0.0) - time.time()))

    try:
        while True:
            pause = state.get("pause")
            if pause is not None and time.time() >= pause[0]:
                state["pause"] = None
                state["paused_until"] = time.time() + pause[1]
                stats.paused_at.append((time.time() - state["start_at"], pause[1]))
            await unpaused()
            if connecting is not None and connecting.done():
                what, value = connecting.result()
                connecting = None
                if what == "linked":
                    if link is not None:
                        link.close()
                    link = state["link"] = value
                    member.linked_up(now())
                elif what == "gone":
                    member.gone_away(value)
                else:
                    member.unreachable(now(), random.random())
            if fetching is not None and fetching[1].done():
                member.fetched_chunk(fetching[0])
                fetching = None
            if running is not None and running[1].done():
                index, _, started, args = running
                running = None
                stats.runs[index] += 1
                payload, record = build_success(args[0] * args[0])
                member.ran(index, record, payload, b"", (time.monotonic() - started) / dilate)
            if link is not None:
                for message in link.take():
                    member.heard(message, now())
                if link.dropped and not link.frames:
                    link.close()
                    link = state["link"] = None
                    member.disconnected(now(), random.random())
            op = member.next(now())
            stats.ops[type(op).__name__] += 1
            since = time.monotonic()
            if isinstance(op, Say):
                if link is None or not link.send(op.message):
                    if link is not None:
                        link.close()
                        link = state["link"] = None
                    member.disconnected(now(), random.random())
            elif isinstance(op, Connect):
                connecting = asyncio.ensure_future(reach(store, op.hello, token, state))
            elif isinstance(op, pm.Run):
                if not chunks.has(op.index):
                    if fetching is not None:  # the pod's store: one thread at a time
                        await asyncio.wait([fetching[1]])
                        member.fetched_chunk(fetching[0])
                        fetching = None
                    args, _ = await chunks.get(op.index)
                    spent("read inputs", since)
                else:
                    args, _ = await chunks.get(op.index)
                seconds = input_seconds(op.index, state["input_s"], state["skew"], state["total"])
                task = asyncio.ensure_future(asyncio.sleep(seconds))
                running = (op.index, task, time.monotonic(), args)
            elif isinstance(op, pm.Kill):
                assert running is not None
                running[1].cancel()
                stats.ended += 1
                member.ended(running[0])
                running = None
            elif isinstance(op, Fetch):
                fetching = (op.chunk, asyncio.ensure_future(chunks.fetch(op.chunk)))
            elif isinstance(op, pm.Create):
                await _retry(
                    store.create_if_absent, op.key, op.data, timeout=state["timeout"], stats=stats
                )
                member.created(op.key)
            elif isinstance(op, pm.Sleep):
                waits: list[asyncio.Future[Any]] = []
                if running is not None:
                    waits.append(running[1])
                if connecting is not None:
                    waits.append(connecting)
                if fetching is not None:
                    waits.append(fetching[1])
                heard = asyncio.ensure_future(link.heard.wait()) if link is not None else None
                if heard is not None:
                    waits.append(heard)
                try:
                    if waits:
                        await asyncio.wait(
                            waits, timeout=op.seconds * dilate, return_when=asyncio.FIRST_COMPLETED
                        )
                    else:
                        await asyncio.sleep(op.seconds * dilate)
                finally:
                    if heard is not None:
                        heard.cancel()
                if running is None:
                    spent("sleep" if link is not None else "finding the coordinator", since)
            elif isinstance(op, pm.Exit):
                return str(op.reason)
            else:
                raise TypeError(f"not an operation of a coordinated worker: {op!r}")
    finally:
        for task in (running[1] if running else None, connecting, fetching and fetching[1]):
            if task is not None:
                task.cancel()
        if link is not None:
            link.close(cut=True)  # a pod killed: its sockets close with it


async def workers_main(cfg: dict[str, Any], stats: WorkerStats) -> WorkerStats:
    """This process's workers from the start signal on (``cfg`` as the parent makes it
    for every engine, with the batch's token)."""
    from runner.pool import options as pool_options
    from runner.pool.chunks import CHUNKS_KEPT
    from runner.pool.coordinator import messages as m
    from runner.pool.coordinator.member import Member
    from runner.pool.coordinator.worker import FIRST_LOOK_S, FIRST_LOOKS, START_PER_S
    from runner.pool.options import PoolOptions

    names = cfg["names"]
    dilate = cfg["dilate"]
    token = bytes.fromhex(cfg["token"])
    sized = replace(
        PoolOptions.of_pool_size(cfg["workers"]),
        span_s=pool_options.SPAN_SECONDS * dilate,
        claims_per_s=pool_options.CLAIMS_PER_S / dilate,
    )
    stores, timeout, kills, start_at = await process_start(cfg)

    async def one(i: int, name: str) -> None:
        store = stores[i]
        state: dict[str, Any] = {
            "stats": stats, "dilate": dilate, "token": token, "timeout": timeout,
            "start_at": start_at, "pause": None, "input_s": cfg["input_s"],
            "skew": cfg["skew"], "total": cfg["inputs"],
        }  # fmt: skip
        if i in kills and kills[i][1] == "pause":  # frozen a lease and more, then resumes
            state["pause"] = (start_at + kills[i][0], cfg["lease_s"] * random.uniform(1.1, 1.5))
        ordinal = int(name.removeprefix("sim-"))
        # The pod's start (CoordinatedWorker.before_reads): its share of the start
        # spread, then its coordinator (epoch 0's record; a full look if that one is
        # gone), then the manifest and the function, from the coordinator's shelf.
        await asyncio.sleep(sized.start_wait(ordinal, random.random(), rate=START_PER_S / dilate))
        hello = m.Hello(name, (), wants=False)
        wait, looks, first = FIRST_LOOK_S, 1, True
        while True:
            what, value = await reach(store, hello, token, state, first=first)
            if what == "linked":
                state["link"] = value
            elif what == "unreachable" and first:
                first = False  # epoch 0's is gone: a full look
                continue
            elif what == "absent" and looks < FIRST_LOOKS:
                await asyncio.sleep(wait * (0.5 + random.random() / 2) * dilate)
                wait, looks = wait * 2, looks + 1
                continue
            break
        served = Served(store, state)
        options = PoolOptions.from_manifest(
            await read_batch(served, stats, timeout, stop=state.get("link") is None)
        )
        member = Member(options, GROUP, name)
        chunks = Chunks(served, options.chunk_size, timeout, kept=CHUNKS_KEPT)
        work = asyncio.ensure_future(drive(member, store, chunks, state))
        if i in kills and kills[i][1] != "pause":
            await asyncio.wait([work], timeout=max(0.0, start_at + kills[i][0] - time.time()))
            if not work.done():
                work.cancel()  # a pod killed: nothing more is said, its connection cut
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                stats.killed_one(kills[i][1], start_at)
                return
        stats.exited(await work, start_at)

    return await every_worker(one, names, stats, stores)


async def check_commits(
    bucket: str, n: int, landed: dict[str, float], started: float, dilate: float
) -> dict[str, Any]:
    """Every commit read back as a reader reads it (the earliest commit's record of an
    input stands: :func:`runner.pool.coordinator.commits.commit_rank`): lost (no record),
    duplicated (records in two commits), the standing value wrong or failed, inputs
    whose records differ (readers of different commits could disagree), and the inputs
    made durable in each simulated second (by the limiter's landing times)."""
    import cloudpickle

    from kinetic._storage.gcs import GCSStorage
    from runner.pool.coordinator import commits
    from runner.results_log import decode_burst

    records: dict[int, list[tuple[tuple[int, int], str, Any, bytes]]] = {}
    async with GCSStorage(bucket) as store:
        keys = [k async for k in store.list(commits.commits_prefix(GROUP))]
        others = [k async for k in store.list(f"_groups/{GROUP}/results/")]
        datas = await asyncio.gather(*(store.read(k) for k in keys))
    for key, data in zip(keys, datas, strict=True):
        parsed = commits.parse_commit_key(GROUP, key)
        if parsed is None:
            continue
        for index, header, payload in decode_burst(data):
            records.setdefault(index, []).append(
                (commits.commit_rank(*parsed), key, header, payload)
            )
    states: Counter[str] = Counter()
    wrong = disagree = 0
    first: dict[int, float] = {}
    for index, found in records.items():
        found.sort(key=lambda r: r[0])
        _, key, header, payload = found[0]
        states[header["state"]] += 1
        value = cloudpickle.loads(payload)["result"] if header["state"] == "succeeded" else None
        wrong += value != index * index
        if any(h["state"] != header["state"] or p != payload for _, _, h, p in found[1:]):
            disagree += 1
        first[index] = min(landed.get(k, float("inf")) for _, k, _, _ in found)
    counts: Counter[int] = Counter(
        int(max(0.0, at - started) / dilate) for at in first.values() if at != float("inf")
    )
    objects = {"commits": len(keys), "singles": len(others), "all": len(keys) + len(others)}
    check = checked(objects, records, n, disagree, states, wrong)
    check["durable_per_s"] = [counts.get(s, 0) for s in range(max(counts, default=-1) + 1)]
    return check
