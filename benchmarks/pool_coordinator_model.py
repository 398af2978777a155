"""A coordinator's pool, modelled for issue 38's comparison; not an engine of Kinetic's.

Issue 38 asks that the leaderless pool (``runner/pool/``) be compared, on the same
simulated runs, with the design that moves the dynamic part to one writer per batch: a
coordinator in the batch's Job that hands out spans, hears outcomes and group-commits
them to GCS. ``bench_pool_sim.py --engine coord`` runs this model instead of the pool's
workers, against the same rate-limited fake-gcs-server, inputs, kills and pauses.

What is modelled
----------------
* **The coordinator** (:func:`coordinator_main`, a process of its own): at the start it
  reads the manifest, the function and every input chunk from the bucket (in production
  it would send the inputs with the spans; the workers read nothing). It listens on
  loopback (one TCP connection per worker, JSON lines: in a cluster a pod-to-pod
  connection, well under a millisecond). Spans are handed out by guided
  self-scheduling from one queue: ``ceil(left / (2 x workers))`` inputs, at most
  :data:`SPAN_CAP_S` of work at the pace reported so far; a worker asks for its next
  span as its span's last input starts. Outcomes are buffered and written every
  :data:`COMMIT_S` as one object (``bursts/c{seq}``: JSON, any set of inputs), the
  first outcome of an input kept, later ones dropped.
* **Failures**: a killed worker's connection closes (its pod's sockets close with it):
  its span's inputs without outcomes go back to the queue at once. A paused worker is
  presumed dead after :data:`SILENCE_S` without a message (workers send one every
  :data:`HEARTBEAT_S`); when it resumes, its outcomes are kept if first. A worker keeps
  each outcome until the coordinator acknowledges it durable. With
  ``--kill-coordinator`` the coordinator dies and starts again on the same port (its
  pod's address): it lists and reads the commits, waits :data:`RECONNECT_GRACE_S` for
  the workers, which went on with their spans and reconnect, saying what they hold and
  sending again what was not acknowledged, and hands the rest out again.
* **The knobs**: :data:`COMMIT_S`, :data:`SPAN_CAP_S`, :data:`HEARTBEAT_S`,
  :data:`SILENCE_S` — four, against the pool's ~17 (and :data:`RECONNECT_GRACE_S`).

What is not modelled: the coordinator's pod starting later than the workers, a network
partition, the client's readers of the new object format, and the payload's transfer
to the workers.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

COMMIT_S = 0.2
"""Seconds between two group commits (simulated): five writes a second, any pool size."""
SPAN_CAP_S = 2.0
"""Work a span holds at most, at the pace reported so far (simulated seconds)."""
HEARTBEAT_S = 1.0
"""A worker's message at least this often (simulated seconds)."""
SILENCE_S = 3.0
"""A worker silent this long (simulated seconds) is presumed dead."""
RECONNECT_GRACE_S = 1.0
"""A restarted coordinator hands nothing out for this long (simulated seconds): the
workers reconnect and say what they hold."""


def commit_key(group: str, epoch: int, seq: int) -> str:
    """The name of a commit: ``epoch`` counts the coordinator's restarts, so that a
    commit of one that died, landing late, never takes a name its successor writes."""
    return f"_groups/{group}/bursts/c{epoch:03d}-{seq:09d}"


@dataclass
class _Worker:
    name: str
    writer: asyncio.StreamWriter
    last: float
    assigned: set[int] = field(default_factory=set)
    waiting: bool = False
    dead: bool = False


class Queue:
    """The coordinator's book: inputs not handed out, handed back, held, and outcomes.
    Pure."""

    def __init__(self, total: int, workers: int, cap_s: float) -> None:
        self.total, self.workers, self.cap_s = total, workers, cap_s
        self.next = 0
        self.returned: deque[int] = deque()
        self.held: set[int] = set()
        self.outcomes: dict[int, Any] = {}
        self.pace: float | None = None

    def left(self) -> int:
        return self.total - self.next + len(self.returned)

    def span(self) -> list[int]:
        """The next span (guided self-scheduling), or [] when nothing is left: inputs
        handed back first, then the next ones never handed out."""
        size = max(1, math.ceil(self.left() / (2 * self.workers)))
        if self.pace:
            size = min(size, max(1, int(self.cap_s / self.pace)))
        out: list[int] = []
        while self.returned and len(out) < size:
            index = self.returned.popleft()
            if index not in self.outcomes and index not in self.held:
                out.append(index)
        if not out:
            out = list(range(self.next, min(self.total, self.next + size)))
            self.next += len(out)
        self.held.update(out)
        return out

    def give_back(self, indices: set[int]) -> None:
        self.held -= indices
        self.returned.extend(sorted(i for i in indices if i not in self.outcomes))

    def heard(self, index: int, value: Any, seconds: float | None) -> bool:
        """An outcome; True when it is the input's first."""
        if seconds is not None:
            self.pace = seconds if self.pace is None else 0.9 * self.pace + 0.1 * seconds
        self.held.discard(index)
        if index in self.outcomes:
            return False
        self.outcomes[index] = value
        return True

    def restarted(self, committed: dict[int, Any]) -> None:
        """A coordinator that restarts: what the commits hold is done; every other input
        is handed out again, but those a worker says it holds (:meth:`hold`)."""
        self.outcomes.update(committed)
        self.next = self.total
        self.returned = deque(i for i in range(self.total) if i not in self.outcomes)

    def hold(self, indices: list[int]) -> list[int]:
        """A reconnected worker's span: kept by it where still free; the ones kept."""
        kept = [i for i in indices if i not in self.outcomes and i not in self.held]
        self.held.update(kept)
        return kept


async def coordinator_main(cfg: dict[str, Any]) -> None:
    """The coordinator's process: prints ``ready PORT``, takes the start time on stdin,
    prints ``done WALL`` once every outcome is durable, then a ``result`` line. With
    ``cfg["port"]`` it listens there: a coordinator restarted after it died, which
    rebuilds its queue from the commits and waits :data:`RECONNECT_GRACE_S` for the
    workers to say what they hold before it hands anything out."""
    from benchmarks.bench_pool_sim import GROUP, _retry, dilated_client
    from kinetic._storage.gcs import GCSStorage
    from runner import protocol

    dilate = cfg["dilate"]
    restart = bool(cfg.get("port"))
    epoch = int(cfg.get("epoch", 0))
    store = GCSStorage(cfg["bucket"], **dilated_client(dilate))
    timeout = 60.0 * dilate
    queue = Queue(cfg["inputs"], cfg["workers"], SPAN_CAP_S * dilate)
    workers: dict[str, _Worker] = {}
    pending: list[tuple[int, Any, str]] = []
    ready = asyncio.Event()
    finished = asyncio.Event()
    counts: Counter[str] = Counter()

    async def send(w: _Worker, message: dict[str, Any]) -> None:
        if w.dead and "exit" not in message and "ack" not in message:
            return
        try:
            w.writer.write(json.dumps(message).encode() + b"\n")
            await w.writer.drain()
        except (ConnectionError, RuntimeError):
            pass

    async def hand_out(w: _Worker) -> None:
        span = queue.span()
        if span:
            w.assigned.update(span)
            w.waiting = False
            counts["spans"] += 1
            await send(w, {"span": span})
        else:
            w.waiting = True  # woken when a dead worker's inputs come back

    async def give_back(w: _Worker) -> None:
        w.dead = True
        queue.give_back(w.assigned)
        w.assigned.clear()
        for other in list(workers.values()):
            if other.waiting and not other.dead and queue.returned:
                await hand_out(other)

    def hear(w: _Worker, index: int, value: Any, seconds: float | None) -> None:
        w.assigned.discard(index)
        if queue.heard(index, value, seconds):
            pending.append((index, value, w.name))
        else:
            counts["outcomes dropped"] += 1

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = json.loads(await reader.readline())
        w = _Worker(hello["hello"], writer, time.time())
        workers[w.name] = w
        for index, value in hello.get("unacked", []):  # sent to a coordinator that died
            hear(w, int(index), value, None)
        w.assigned.update(queue.hold(hello.get("holding", [])))
        await ready.wait()
        if len(hello.get("holding", [])) <= 1:  # its ask for more may have been lost
            await hand_out(w)
        while True:
            line = await reader.readline()
            if not line:
                if not finished.is_set():
                    counts["connections lost"] += 1
                    await give_back(w)
                return
            w.last = time.time()
            message = json.loads(line)
            if "done" in message:
                hear(w, int(message["done"]), message["v"], float(message["s"]))
            if message.get("more"):
                if w.dead:  # presumed dead, and back: a worker again
                    w.dead = False
                    counts["resumed"] += 1
                await hand_out(w)

    async def silence() -> None:
        while not finished.is_set():
            await asyncio.sleep(0.25 * dilate)
            now = time.time()
            for w in list(workers.values()):
                if not w.dead and w.assigned and now - w.last > SILENCE_S * dilate:
                    counts["presumed dead"] += 1
                    await give_back(w)

    async def commit(seq: int) -> None:
        while True:
            await asyncio.sleep(COMMIT_S * dilate)
            if not pending:
                continue
            batch, pending[:] = list(pending), []
            body = json.dumps({str(i): v for i, v, _ in batch}).encode()
            await _retry(store.write, commit_key(GROUP, epoch, seq), body, timeout=timeout)
            seq += 1
            counts["commits"] += 1
            acks: dict[str, list[int]] = {}
            for index, _, name in batch:
                acks.setdefault(name, []).append(index)
            for name, indices in acks.items():  # durable: the workers may forget them
                await send(workers[name], {"ack": indices})
            if len(queue.outcomes) >= queue.total and not pending:
                print(f"done {time.time()}", flush=True)
                finished.set()
                for w in list(workers.values()):
                    await send(w, {"exit": "done"})
                return

    server = await asyncio.start_server(handle, "127.0.0.1", cfg.get("port") or 0)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    start_at = float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
    await asyncio.sleep(max(0.0, start_at - time.time()))
    manifest = protocol.load_manifest(
        await _retry(store.read, protocol.group_manifest_key(GROUP), timeout=timeout)
    )
    await _retry(store.read, protocol.group_payload_key(GROUP), timeout=timeout)
    await asyncio.gather(
        *(
            _retry(store.read, protocol.group_inputs_key(GROUP, k), timeout=timeout)
            for k in range(int(manifest["n_chunks"]))
        )
    )
    seq = 0
    if restart:
        keys = [k async for k in store.list(f"_groups/{GROUP}/bursts/c")]
        committed: dict[int, Any] = {}
        for key in keys:
            body = await _retry(store.read, key, timeout=timeout)
            committed.update((int(i), v) for i, v in json.loads(body).items())
        queue.restarted(committed)
        await asyncio.sleep(RECONNECT_GRACE_S * dilate)
        counts["restarted"] += 1
    ready.set()
    watch = asyncio.ensure_future(silence())
    stop = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.cancel)
    committing = asyncio.ensure_future(commit(seq))
    await asyncio.wait([committing, stop], return_when=asyncio.FIRST_COMPLETED)
    watch.cancel()
    await asyncio.sleep(0.5)  # the exits sent
    for w in workers.values():  # a paused worker's connection too: its handler ends
        w.writer.close()
    await asyncio.sleep(0.1)
    server.close()
    await store.aclose()
    print("result " + json.dumps({"coordinator": dict(counts), "cpu_s": time.process_time()}))
    sys.stdout.flush()


async def workers_main(cfg: dict[str, Any], stats: Any) -> Any:
    """This process's workers, each a connection to the coordinator (``cfg["port"]``):
    it runs the spans handed to it, reports each outcome and keeps it until the
    coordinator acknowledges it durable, asks for the next span as the last input of
    one starts; when the connection drops it goes on with its span and reconnects
    (saying what it holds and what was not acknowledged); killed (its connection
    closed) or paused as ``cfg`` says."""
    from benchmarks.bench_pool_sim import input_seconds

    dilate = cfg["dilate"]  # the spans' seconds are dilated already
    kills = {int(k): (float(t), str(how)) for k, (t, how) in cfg["kills"].items()}
    print("ready", flush=True)
    start_at = float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def one(i: int, name: str) -> None:
        if i in kills and kills[i][1] == "pause":
            at = start_at + kills[i][0]  # frozen as long as the pool's paused workers
            paused = (at, at + cfg["lease_s"] * random.uniform(1.1, 1.5))
        else:
            paused = (float("inf"), float("inf"))
        spans: asyncio.Queue[list[int] | str] = asyncio.Queue()
        unacked: dict[int, Any] = {}
        rest: list[int] = []  # the span's inputs not ended yet
        link: dict[str, Any] = {"writer": None}

        async def unpaused() -> None:
            now = time.time()
            if paused[0] <= now < paused[1]:
                await asyncio.sleep(paused[1] - now)

        async def say(message: dict[str, Any]) -> None:
            await unpaused()
            writer = link["writer"]
            if writer is None:
                return  # said again on reconnecting, if it matters (outcomes)
            try:
                writer.write(json.dumps(message).encode() + b"\n")
                await writer.drain()
            except (ConnectionError, RuntimeError):
                link["writer"] = None

        async def listen() -> None:
            """Connect (again, while the coordinator is away), then hear it."""
            while True:
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", cfg["port"])
                except OSError:
                    await asyncio.sleep(0.5 * dilate)
                    continue
                link["writer"] = writer
                # What it holds and what was not acknowledged, as of now: the span went
                # on while the coordinator was away.
                unsaid = [[k, v] for k, v in unacked.items()]
                await say({"hello": name, "holding": list(rest), "unacked": unsaid})
                while True:
                    try:
                        line = await reader.readline()
                    except ConnectionError:
                        line = b""
                    if not line:
                        break
                    message = json.loads(line)
                    if "ack" in message:
                        for index in message["ack"]:
                            unacked.pop(index, None)
                    elif "exit" in message:
                        spans.put_nowait(str(message["exit"]))
                        return
                    else:
                        spans.put_nowait(message["span"])
                link["writer"] = None
                writer.close()
                await asyncio.sleep(0.5 * dilate)

        async def heartbeat() -> None:
            while True:
                await asyncio.sleep(HEARTBEAT_S * dilate)
                await say({"hb": 1})

        async def work() -> str:
            while True:
                span = await spans.get()
                if isinstance(span, str):
                    return span
                rest[:] = span
                for k, index in enumerate(span):
                    await unpaused()
                    if k == len(span) - 1:
                        await say({"more": 1})
                    started = time.time()
                    await asyncio.sleep(
                        input_seconds(index, cfg["input_s"], cfg["skew"], cfg["inputs"])
                    )
                    stats.runs[index] += 1
                    rest.remove(index)
                    unacked[index] = index * index
                    seconds = time.time() - started
                    await say({"done": index, "s": seconds, "v": index * index})

        listener = asyncio.ensure_future(listen())
        beat = asyncio.ensure_future(heartbeat())
        task = asyncio.ensure_future(work())
        try:
            if i in kills and kills[i][1] != "pause":
                at = kills[i][0]  # killed as it is: its worker writes nothing to storage
                await asyncio.wait([task], timeout=max(0.0, start_at + at - time.time()))
                if not task.done():
                    task.cancel()
                    listener.cancel()
                    if link["writer"] is not None:
                        link["writer"].transport.abort()  # the pod's sockets close with it
                    stats.killed += 1
                    stats.kills["input"] += 1
                    stats.killed_at.append(time.time() - start_at)
                    stats.exits["killed"] += 1
                    return
            elif paused[0] < float("inf"):
                stats.paused_at.append((paused[0] - start_at, paused[1] - paused[0]))
            reason = await task
            stats.exits[reason] += 1
            stats.last_exit = max(stats.last_exit, time.time() - start_at)
        finally:
            beat.cancel()
            listener.cancel()
            if link["writer"] is not None:
                link["writer"].close()

    everyone = asyncio.gather(*(one(i, n) for i, n in enumerate(cfg["names"])))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, everyone.cancel)
    try:
        await everyone
    except asyncio.CancelledError:
        stats.exits["stopped at the cap"] += len(cfg["names"]) - sum(stats.exits.values())
    return stats


async def check_commits(bucket: str, n: int) -> dict[str, Any]:
    """Every committed outcome read back: lost, recorded more than once, wrong."""
    from benchmarks.bench_pool_sim import GROUP
    from kinetic._storage.gcs import GCSStorage

    seen: Counter[int] = Counter()
    wrong = 0
    async with GCSStorage(bucket) as store:
        prefix = f"_groups/{GROUP}/bursts/c"
        keys = [k async for k in store.list(prefix)]
        for key in keys:
            for index, value in json.loads(await store.read(key)).items():
                seen[int(index)] += 1
                wrong += value != int(index) ** 2
    return {
        "objects": {"bursts": len(keys), "singles": 0, "all": len(keys)},
        "outcomes": sum(seen.values()),
        "lost": sum(1 for i in range(n) if i not in seen),
        "duplicated": sum(1 for c in seen.values() if c > 1),
        "readers_may_disagree": 0,
        "states": {"succeeded": len(seen)},
        "wrong_values": wrong,
    }
