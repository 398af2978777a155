"""A GKE batch pool at scale, simulated: up to 1,000 workers against a rate-limited bucket.

Run from the repository root: ``.venv/bin/python benchmarks/bench_pool_sim.py``
(``--help`` for the knobs); ``--matrix`` runs the points of :data:`MATRIX` (issue 38:
100, 300 and 1,000 workers, inputs of 50 ms and 1 s; about 35 minutes on 2 cores).

What runs (issue 27, item 5; issue 38)
--------------------------------------
* **Storage**: fake-gcs-server (memory backend) behind :mod:`benchmarks.gcs_limiter`, a
  loopback proxy that enforces GCS's starting rates — 1,000 writes/s and 5,000 reads/s
  per bucket as token buckets with 0.05 s of burst (no second passes more than 1,050
  writes), 1 write/s per object name — and answers 429 past them. Every request takes
  GCS's 30–80 ms (uniform, dilated), half on its way in and half back.
* **Workers**: ``--workers`` pool workers as asyncio tasks in ``--procs`` processes.
  Each is the real sans-IO worker, :class:`runner.pool.machine.WorkerMachine` over the
  real :class:`runner.pool.book.PoolBook`, driven by an async shell (:func:`drive`) that
  performs its operations with Kinetic's real storage client,
  :class:`kinetic._storage.gcs.GCSStorage` (one per worker, as one per pod), retries and
  back-off on 429 included. :func:`drive` follows the pod's shell
  (:meth:`runner.pool.worker.Worker._run` and ``_collect``): while an input runs it asks
  the machine for upkeep and performs it — lease renewals, stop-record reads, listings
  for a cancel of the input, due bursts — sent as the pod's courier sends them
  (:mod:`runner.pool.courier`): the input's end does not wait for the request under
  way, and the machine (``overlap``) hands out the span's next input meanwhile. An input is ``asyncio.sleep(--input-ms)`` whose value
  (its index squared) is pickled by the runner's own :func:`runner.job.build_success`.
  What is not simulated: the pod's process per input, its log, the Kubernetes Job.
* **The inputs' cost**: ``--input-ms`` each, or with ``--input-skew S`` sorted by
  cost, from ``1 - S`` to ``1 + S`` times it (:func:`input_seconds`; the ideal is the
  same).
* **The other design** (``--engine coord``): issue 38's coordinated pool, its own code
  (:mod:`benchmarks.pool_coordinated_sim`: the coordinator's process and the workers'
  sans-IO member, their protocol clocks dilated) against the same bucket, inputs, kills
  and pauses; its rows get ``_coordinated`` in their names, beside the matrix's
  (``_coord``: stop 48's model of the design, which this replaced). With
  ``--kill-coordinator F`` its process is killed at ``F`` x the ideal and a new one
  started ``--restart-s`` later (simulated): it takes the next epoch.
* **The batch**: ``--inputs`` inputs recorded as a submission records them (the
  manifest and cloudpickled chunks of :func:`kinetic._core.inputs.chunk_size`), written
  straight to fake-gcs-server (submission is not what is measured).

Runs
----
1. **steady**: every worker lives. Elapsed from the start signal (all processes ready,
   nothing read yet) to the last outcome durable, against the ideal ``inputs × input
   time ÷ workers``; goal 1.2×.
2. **killed** (the short lease, ``--lease-s``, 6 s) and **killed30** (the production
   lease, 30 s): ``--kill`` (10%) of the workers, chosen at random, fail at a random
   time in the first ``--kill-window`` of the ideal, a third each way: killed while an
   input of theirs runs (no further write); killed during a write (the first after that
   time, or as it is at the window's end if none came), a random part of the
   way through its latency (the write lands, or is cut on its way in and never applied,
   or lands unanswered); or *paused* for 1.1–1.5 leases before their next storage
   operation, decided before the pause (a renewal that then fails, or a burst that lands
   after its span was taken over), then resumed. The ideal is the survivors' plus one
   lease: the time ``T`` by which the pool's capacity does the work, ``T = (inputs ×
   input time − Σ dead workers' kill times + Σ the paused workers' time paused before
   T) ÷ (workers − dead workers)`` (:func:`survivors_ideal`: a dead worker's capacity
   counts until it died, a paused one's but for its pause), plus one lease, since a
   dead worker's span is taken over only once its lease ends. Goal 1.2× that.
3. with ``--before TREE`` (a checkout of the engine before issue 27, e.g. ``git
   archive``), **before**: that tree's blocking worker (:class:`runner.pool.Worker`, one
   claim and one outcome object per input) in threads, ``--before-inputs`` inputs,
   stopped after ``--before-cap-s`` — the figure the span/burst design is measured
   against.

Once every input has a burst (the limiter's names, polled), the workers are stopped 2
simulated seconds later: their exit (idle workers learning the batch is done) is not
measured. Checked after each run, reading storage straight from fake-gcs-server: every
input has a record, the one every reader reports (:class:`runner.pool.outcomes.OutcomeChoice`:
an outcome object of its own, else the earliest claim's) has the right value and
succeeded, and no reader could have reported another one first (by the limiter's landing
times: a later record visible at once, or after the readers' hold of a lease, before
the chosen one landed: ``readers_may_disagree``). Inputs with records in more than one
object (``duplicated``: not reported twice) and inputs run more than once (a dead or
paused worker's unwritten outcomes run again) are counted. Printed and written to
``benchmarks/results/pool_sim.json`` (the matrix's rows under ``matrix``): elapsed,
ideal, ratio; the storage latency (p50/p99 of requests, and of the workers' operations
with retries and back-off); the limiter's 429s by limit, and the operations that still
failed after the client's retries; requests per input by kind, with listings counted
with the writes (``writes_per_input``: GCS bills a listing as Class A) and apart; the
peak writes and reads per second against the limits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Self

HERE = Path(__file__).resolve().parent
_TREE_FLAG = "--tree"
if _TREE_FLAG in sys.argv:  # a child running another tree's engine imports it first
    sys.path.insert(0, sys.argv[sys.argv.index(_TREE_FLAG) + 1])
sys.path.insert(1 if _TREE_FLAG in sys.argv else 0, str(HERE.parent))

from benchmarks.gcs_limiter import area_of

GROUP = "grp-poolsim"
BOUND = 1.2
LATENCY_MS = (30.0, 80.0)
"""A GCS request's latency, uniform (scaled by the dilation)."""
BURST_S = 0.05
"""A bucket's burst, in seconds of its rate."""
PRODUCTION_LEASE_S = 30.0


# --- the child: a process of workers --------------------------------------------------


@dataclass
class WorkerStats:
    """What one process of workers saw (summed by the parent)."""

    runs: Counter[int] = field(default_factory=Counter)
    ops: Counter[str] = field(default_factory=Counter)
    storage_errors: Counter[str] = field(default_factory=Counter)
    exits: Counter[str] = field(default_factory=Counter)
    killed: int = 0
    last_exit: float = 0.0
    killed_at: list[float] = field(default_factory=list)
    kills: Counter[str] = field(default_factory=Counter)
    """Kills made, by how: ``input`` (while an input ran), ``write`` (during a write)."""
    paused_at: list[tuple[float, float]] = field(default_factory=list)
    """Pauses made: (wall seconds from the start, wall seconds long)."""
    op_ms: Counter[int] = field(default_factory=Counter)
    """Storage operations' times (retries and back-off included), simulated ms."""
    ended: int = 0
    """Inputs ended by the machine (Kill) while they ran."""
    between_ms: Counter[str] = field(default_factory=Counter)
    """Time the workers ran no input, by what they did (simulated ms, summed): an
    operation between inputs (its kind), a sleep, reading an input chunk, or waiting
    after an input's end for the upkeep operation under way ("upkeep overhang")."""

    def killed_one(self, how: str, start_at: float) -> None:
        """A worker was killed (``how``), now."""
        self.killed += 1
        self.kills[how] += 1
        self.killed_at.append(time.time() - start_at)
        self.exits["killed"] += 1

    def exited(self, reason: str, start_at: float) -> None:
        """A worker exited by itself (``reason``), now."""
        self.exits[reason] += 1
        self.last_exit = max(self.last_exit, time.time() - start_at)


class Chunks:
    """The input chunks a worker has read (the pod's reads: each chunk once per worker)."""

    def __init__(self, store: Any, chunk_size: int, timeout: float, kept: int = 1) -> None:
        self.store, self.chunk_size, self.timeout, self.kept = store, chunk_size, timeout, kept
        self.items: dict[int, list[Any]] = {}

    def has(self, index: int) -> bool:
        """Whether the chunk of input ``index`` is read already."""
        return index // self.chunk_size in self.items

    async def get(self, index: int) -> Any:
        chunk, offset = divmod(index, self.chunk_size)
        if chunk not in self.items:
            await self.fetch(chunk)
        return self.items[chunk][offset]

    async def fetch(self, chunk: int) -> None:
        """Read chunk ``chunk``; the last ``kept`` read are kept."""
        import cloudpickle

        from runner import protocol

        key = protocol.group_inputs_key(GROUP, chunk)
        items = cloudpickle.loads(await _retry(self.store.read, key, timeout=self.timeout))
        self.items.pop(chunk, None)
        self.items[chunk] = items
        while len(self.items) > self.kept:
            del self.items[next(iter(self.items))]


async def _retry(fn: Any, *args: Any, timeout: float, stats: WorkerStats | None = None) -> Any:
    """``fn(*args, timeout=timeout)``, again after a second while it fails past the client's
    own retries (a pod's shell would crash and be restarted; the sim's carries on and
    counts it); ObjectNotFoundError passes through."""
    from kinetic._exceptions import ObjectNotFoundError, StorageError

    while True:
        try:
            return await fn(*args, timeout=timeout)
        except ObjectNotFoundError:
            raise
        except StorageError as exc:
            if stats is not None:
                what = str(exc).split(": ", 1)[-1]  # "create 'key' failed: HTTP 429 ..."
                key = what.split("'")[1] if what.count("'") >= 2 else "?"
                reason = "timed out" if "timed out" in what else what.split("failed: ")[-1][:8]
                stats.storage_errors[f"{what.split(' ')[0]} {area_of(key)}: {reason}"] += 1
            await asyncio.sleep(1.0)


async def perform(
    machine: Any, op: Any, store: Any, stats: WorkerStats, state: dict[str, Any], timeout: float
) -> None:
    """Perform the storage operation ``op`` with ``store`` and answer ``machine`` (as
    :meth:`runner.pool.worker.Worker.perform` does with the pod's blocking store)."""
    answer(machine, op, await request(op, store, stats, state, timeout))


async def request(
    op: Any, store: Any, stats: WorkerStats, state: dict[str, Any], timeout: float
) -> Any:
    """Perform the storage operation ``op`` with ``store``; its answer (as
    :meth:`runner.pool.worker.Worker.request` does, in the pod's courier thread while an
    input runs).

    A pause due (``state["pause"]``: its wall-clock start and length) comes first: the
    worker decided ``op`` before it froze, and sends it after (a burst or a renewal
    decided before its lease ran out, landing after a takeover). ``state["writing"]`` is
    set while a write is under way (a kill may wait for one); each operation's time,
    retries and back-off included, goes to ``stats.op_ms`` (simulated milliseconds)."""
    from kinetic._exceptions import ObjectNotFoundError
    from runner.pool import ops as pm

    pause = state.get("pause")
    if pause is not None and time.time() >= pause[0]:
        state["pause"] = None
        state["paused_until"] = time.time() + pause[1]  # the whole worker: drive() waits
        stats.paused_at.append((time.time() - state["start_at"], pause[1]))
        await asyncio.sleep(pause[1])
    sent = time.monotonic()
    writing = isinstance(op, (pm.Create, pm.Write, pm.Replace))
    if writing:
        state["writing"].set()
    try:
        if isinstance(op, pm.List):

            async def keys(prefix: str = op.prefix, *, timeout: float) -> list[str]:
                return [k async for k in store.list(prefix, timeout=timeout)]

            answer: Any = await _retry(keys, timeout=timeout, stats=stats)
        elif isinstance(op, pm.Read):
            try:
                answer = await _retry(store.read_versioned, op.key, timeout=timeout, stats=stats)
            except ObjectNotFoundError:
                answer = (None, None)
        elif isinstance(op, pm.Create):
            answer = await _retry(
                store.create_versioned, op.key, op.data, timeout=timeout, stats=stats
            )
        elif isinstance(op, pm.Write):
            write = functools.partial(store.write, fresh=True)  # as the pod's shell
            answer = await _retry(write, op.key, op.data, timeout=timeout, stats=stats)
        elif isinstance(op, pm.Replace):
            answer = await _retry(
                store.replace_if, op.key, op.data, op.generation, timeout=timeout, stats=stats
            )
        else:
            raise TypeError(f"not a storage operation: {op!r}")
    finally:
        if writing:
            state["writing"].clear()
    stats.op_ms[round((time.monotonic() - sent) * 1000 / state["dilate"])] += 1
    return answer


def answer(machine: Any, op: Any, answer: Any) -> None:
    """Answer ``machine``'s storage operation ``op`` with what :func:`request` got."""
    from runner.pool import ops as pm

    if isinstance(op, pm.List):
        machine.listed(op.prefix, answer)
    elif isinstance(op, pm.Read):
        machine.read(op.key, *answer)
    elif isinstance(op, pm.Create):
        machine.created(op.key, answer)
    elif isinstance(op, pm.Write):
        machine.written(op.key)
    else:
        machine.replaced(op.key, answer)


def input_seconds(index: int, input_s: float, skew: float, total: int) -> float:
    """How long input ``index`` runs: ``input_s``, or with ``--input-skew`` the inputs
    sorted by size, from ``1 - skew`` to ``1 + skew`` times it (the mean stays)."""
    if not skew or total < 2:
        return input_s
    return input_s * (1.0 + skew * (2.0 * index / (total - 1) - 1.0))


async def drive(
    machine: Any,
    store: Any,
    chunks: Chunks,
    input_s: float,
    stats: WorkerStats,
    state: dict[str, Any],
    timeout: float,
) -> str:
    """Perform ``machine``'s operations with ``store`` until it exits; its exit reason.

    The loop of the pod's shell (:meth:`runner.pool.worker.Worker._run`), and while an input
    runs, its upkeep (:meth:`runner.pool.worker.Worker._collect`): the machine is asked for its
    next operation at once and after each one, renewals, stop-record reads, cancel
    listings and due bursts are performed while the input runs, a ``Sleep`` waits for
    the input's end at most that long, and ``Kill`` ends the input (no outcome).
    ``state["running"]`` is set while an input runs (a kill may wait for that);
    ``timeout`` bounds each storage operation (the client's default, dilated);
    ``state["skew"]`` and ``state["total"]`` size each input (:func:`input_seconds`)."""
    from runner.job import build_success
    from runner.pool import ops as pm

    rng = random.Random()

    def next_op() -> Any:
        op = machine.next(wall=time.time(), mono=time.monotonic(), pick=rng.random())
        stats.ops[type(op).__name__] += 1
        return op

    dilate = state["dilate"]

    def spent(what: str, since: float) -> None:
        stats.between_ms[what] += round((time.monotonic() - since) * 1000 / dilate)

    # The request the courier has under way (runner.pool.courier): sent while an input
    # ran, answered in the loop, never waited for by an input's end.
    courier: tuple[Any, asyncio.Task[Any]] | None = None

    def collect() -> None:
        nonlocal courier
        if courier is not None and courier[1].done():
            (sent, task), courier = courier, None
            answer(machine, sent, task.result())

    async def settle() -> None:
        if courier is not None:
            await asyncio.wait([courier[1]])
            collect()

    async def unpaused() -> None:  # a paused worker decides nothing until it resumes
        await asyncio.sleep(max(0.0, state.get("paused_until", 0.0) - time.time()))

    try:
        while True:
            await unpaused()
            collect()
            op = next_op()
            since = time.monotonic()
            if isinstance(op, pm.Run):
                if not chunks.has(op.index):
                    await settle()  # the pod's store: one thread at a time
                args, _kwargs = await chunks.get(op.index)
                spent("read inputs", since)
                started = time.monotonic()
                this_s = input_seconds(op.index, input_s, state["skew"], state["total"])
                running = asyncio.ensure_future(asyncio.sleep(this_s))
                state["running"].set()
                try:
                    ended, wait = False, 0.0
                    while not running.done():  # runner.pool.worker.Worker._collect
                        if wait > 0:
                            waits: list[asyncio.Future[Any]] = [running]
                            if courier is not None:
                                waits.append(courier[1])
                            await asyncio.wait(
                                waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                            )
                            if running.done():
                                break
                        await unpaused()
                        collect()
                        upkeep = next_op()
                        if isinstance(upkeep, pm.Sleep):
                            wait = upkeep.seconds
                            continue
                        wait = 0.0
                        if isinstance(upkeep, pm.Kill):
                            running.cancel()
                            ended = True
                            break
                        task = asyncio.ensure_future(request(upkeep, store, stats, state, timeout))
                        courier = (upkeep, task)
                finally:
                    running.cancel()
                    state["running"].clear()
                spent("upkeep overhang", started + this_s)
                if ended:
                    stats.ended += 1
                    machine.ended(op.index)
                    continue
                stats.runs[op.index] += 1
                payload, record = build_success(args[0] * args[0])
                machine.ran(op.index, record, payload, b"", time.monotonic() - started)
            elif isinstance(op, pm.Kill):
                machine.ended(op.index)  # nothing runs between inputs
            elif isinstance(op, pm.Sleep):
                if courier is not None:  # woken by the answer
                    await asyncio.wait([courier[1]], timeout=op.seconds)
                else:
                    await asyncio.sleep(op.seconds)
                spent("sleep", since)
            elif isinstance(op, pm.Exit):
                return str(op.reason)
            else:
                await settle()  # (the machine asks for none while one is under way)
                await perform(machine, op, store, stats, state, timeout)
                key = getattr(op, "key", None) or getattr(op, "prefix", "")
                spent(
                    f"{type(op).__name__} {key.split('/')[2] if key.count('/') > 2 else key}", since
                )
    finally:
        if courier is not None:
            courier[1].cancel()  # a worker killed with a request out: never answered


TIMES = ("lease_s", "burst_s", "span_s", "object_gap_s")
"""The PoolOptions fields that are durations (dilated)."""
RATES = ("claims_per_s",)
"""The PoolOptions fields that are rates (divided by the dilation)."""


def _dilated(field: str, value: float, dilate: float) -> float:
    """An overridden PoolOptions field's value in dilated time."""
    if field in TIMES:
        return value * dilate
    return value / dilate if field in RATES else value


def dilated_client(dilate: float) -> dict[str, float]:
    """GCSStorage's back-off settings, its defaults times ``dilate``."""
    import inspect

    from kinetic._storage.gcs import GCSStorage

    params = inspect.signature(GCSStorage).parameters
    return {k: params[k].default * dilate for k in ("backoff", "max_backoff", "slow_down")}


async def span_process(cfg: dict[str, Any]) -> WorkerStats:
    """Run this process's workers (the span/burst engine) from the start signal on."""
    from runner.pool import machine as pool_machine
    from runner.pool import options as pool_options
    from runner.pool.machine import WorkerMachine
    from runner.pool.options import PoolOptions

    stats = WorkerStats()
    names = cfg["names"]
    dilate = cfg["dilate"]
    stores, timeout, kills, start_at = await process_start(cfg)

    async def one(i: int, name: str) -> None:
        store = stores[i]
        state: dict[str, Any] = {
            "running": asyncio.Event(), "writing": asyncio.Event(), "dilate": dilate,
            "start_at": start_at, "pause": None, "skew": cfg["skew"], "total": cfg["inputs"],
        }  # fmt: skip
        if i in kills and kills[i][1] == "pause":  # frozen a lease and more, then resumes
            state["pause"] = (start_at + kills[i][0], cfg["lease_s"] * random.uniform(1.1, 1.5))
        ordinal = int(name.removeprefix("sim-"))  # an Indexed Job's completion index
        # The pod's start (runner.pool.worker.Worker._start): its share of the start
        # spread, then the manifest, the stop record and the function.
        # (A tree of before the spread moved there spreads in the machine.)
        spread_first = hasattr(PoolOptions, "start_wait")
        stop_read = "stop_read" in inspect.signature(WorkerMachine).parameters
        if spread_first:
            sized = replace(
                PoolOptions.of_pool_size(cfg["workers"]),
                span_s=pool_options.SPAN_SECONDS * dilate,
                claims_per_s=pool_options.CLAIMS_PER_S / dilate,
            )
            await asyncio.sleep(sized.start_wait(ordinal, random.random()))
        manifest = await read_batch(store, stats, timeout)
        options = PoolOptions.from_manifest(manifest)  # its lease_s is dilated already
        options = replace(
            options,
            burst_s=options.burst_s * dilate,
            span_s=options.span_s * dilate,
            object_gap_s=options.object_gap_s * dilate,
            claims_per_s=options.claims_per_s / dilate,
            **{k: _dilated(k, v, dilate) for k, v in cfg["overrides"].items()},
        )
        machine = WorkerMachine(
            options,
            GROUP,
            name,
            idle_first=pool_machine.IDLE_FIRST * dilate,
            wait_max=pool_machine.LEASE_WAIT_MAX * dilate,
            idle_reads_per_s=pool_machine.IDLE_READS_PER_S / dilate,
            ordinal=ordinal,
            overlap=True,  # the pod's courier (runner.pool.courier)
            spread_start=not spread_first,  # spread before the manifest, as the pod does
            **({"stop_read": True} if stop_read else {}),  # read above, as the pod does
        )
        machine.stop_every *= dilate  # its default follows the pool's size
        chunks = Chunks(store, options.chunk_size, timeout)
        work = asyncio.ensure_future(
            drive(machine, store, chunks, cfg["input_s"], stats, state, timeout)
        )
        if i in kills and kills[i][1] != "pause":
            at, how = kills[i]
            await asyncio.wait([work], timeout=max(0.0, start_at + at - time.time()))
            # Killed while an input runs, or during a write: a random part of the way
            # through the request's latency, so that the write lands or not. Not later
            # than the kill window's end (a worker's next write may be seconds away):
            # then killed as it is.
            busy = asyncio.ensure_future(state["running" if how == "input" else "writing"].wait())
            await asyncio.wait(
                [work, busy],
                timeout=max(0.0, start_at + cfg["kill_by"] - time.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            busy.cancel()
            if how == "write" and busy.done() and not busy.cancelled() and not work.done():
                await asyncio.wait([work], timeout=random.uniform(0.0, cfg["latency_hi_s"]))
            if not work.done():
                work.cancel()  # a pod killed mid-span: nothing more is written
                stats.killed_one(how, start_at)
                return
        stats.exited(await work, start_at)

    return await every_worker(one, names, stats, stores)


async def process_start(
    cfg: dict[str, Any],
) -> tuple[list[Any], float, dict[int, tuple[float, str]], float]:
    """A process of workers, set up: a storage client per worker (one per pod), a
    storage operation's timeout, the kills by worker (when, how), and the start time,
    once the parent said it (after ``ready``) and it came."""
    from kinetic._storage.base import DEFAULT_TIMEOUT
    from kinetic._storage.gcs import GCSStorage

    dilate = cfg["dilate"]
    stores = [GCSStorage(cfg["bucket"], **dilated_client(dilate)) for _ in cfg["names"]]
    kills = {int(k): (float(t), str(how)) for k, (t, how) in cfg["kills"].items()}
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    await asyncio.sleep(max(0.0, start_at - time.time()))
    return stores, DEFAULT_TIMEOUT * dilate, kills, start_at


async def read_batch(store: Any, stats: WorkerStats, timeout: float, *, stop: bool = True) -> Any:
    """A pod's first reads (:meth:`runner.pool.worker.Worker._start`): the manifest
    (returned), the stop record (unless ``stop`` is False: a coordinated worker linked
    to its coordinator hears of a stop from it) and the function."""
    from kinetic._exceptions import ObjectNotFoundError
    from runner import protocol

    manifest = protocol.load_manifest(
        await _retry(store.read, protocol.group_manifest_key(GROUP), timeout=timeout, stats=stats)
    )
    with contextlib.suppress(ObjectNotFoundError):
        if stop:
            await _retry(store.read, protocol.group_stop_key(GROUP), timeout=timeout, stats=stats)
    await _retry(store.read, protocol.group_payload_key(GROUP), timeout=timeout, stats=stats)
    return manifest


async def every_worker(
    one: Any, names: list[str], stats: WorkerStats, stores: list[Any]
) -> WorkerStats:
    """Run ``one(i, name)`` for each of this process's workers; stopped at the run's cap
    (SIGTERM), what was seen is reported all the same."""
    everyone = asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, everyone.cancel)
    try:
        await everyone
    except asyncio.CancelledError:
        stats.exits["stopped at the cap"] += len(names) - sum(stats.exits.values())
    finally:
        await asyncio.gather(*(s.aclose() for s in stores))
    return stats


def before_process(cfg: dict[str, Any]) -> WorkerStats:
    """Run this process's workers with the tree's blocking worker, one thread each."""
    from kinetic._storage.gcs import GCSStorage
    from runner import pool, pool_book
    from runner.job import build_success
    from runner.pool import Worker
    from runner.store import GCSStore

    stats = WorkerStats()
    lock = threading.Lock()
    input_s = cfg["input_s"]
    dilate = cfg["dilate"]
    # Its timers are module constants: dilated here (the only way in without a change).
    pool.STOP_EVERY *= dilate
    pool.REFRESH_AFTER_RACE *= dilate
    pool_book.LEASE_WAIT_MAX *= dilate

    class SimWorker(Worker):
        """The tree's worker, its input run a sleep (no fork, no function to fetch)."""

        def setup(self) -> None:
            self.fn = None

        def attempt(self, index: int, attempt: int, args: Any, kwargs: Any, lease: Any) -> Any:
            time.sleep(input_s)
            with lock:
                stats.runs[index] += 1
            data, record = build_success(args[0] * args[0])
            return data, record, b""

    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))

    def one(name: str) -> None:
        store = GCSStore(cfg["bucket"])
        store._storage = GCSStorage(cfg["bucket"], **dilated_client(dilate))
        try:
            SimWorker(store, GROUP, name, Path("/nonexistent")).run()
            with lock:
                stats.exits["done"] += 1
                stats.last_exit = max(stats.last_exit, time.time() - start_at)
        except Exception as exc:  # noqa: BLE001 - a worker that died: counted
            with lock:
                stats.exits[f"crashed: {type(exc).__name__}: {str(exc)[:80]}"] += 1
        finally:
            store.close()

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in cfg["names"]]
    for t in threads:
        t.start()
    deadline = start_at + cfg["cap_s"]
    for t in threads:
        t.join(max(0.0, deadline - time.time()))
    return stats


def run_engine(cfg: dict[str, Any]) -> WorkerStats:
    """This process's workers, by the run's engine."""
    if cfg["engine"] == "before":
        return before_process(cfg)
    if cfg["engine"] == "coord":
        from benchmarks.pool_coordinated_sim import workers_main

        stats: WorkerStats = asyncio.run(workers_main(cfg, WorkerStats()))
        return stats
    return asyncio.run(span_process(cfg))


def child_main(cfg: dict[str, Any]) -> None:
    profile = os.environ.get("POOLSIM_PROFILE")  # a file: where the first process's profile goes
    if profile and cfg["names"][0].endswith("0000"):
        import cProfile

        with cProfile.Profile() as prof:
            stats = run_engine(cfg)
        prof.dump_stats(profile)
    else:
        stats = run_engine(cfg)
    out = {
        "runs": sorted(stats.runs.elements()),
        "ops": dict(stats.ops),
        "storage_errors": dict(stats.storage_errors),
        "exits": dict(stats.exits),
        "killed": stats.killed,
        "killed_at": stats.killed_at,
        "kills": dict(stats.kills),
        "paused_at": stats.paused_at,
        "op_ms": dict(stats.op_ms),
        "ended": stats.ended,
        "between_ms": dict(stats.between_ms),
        "last_exit": stats.last_exit,
        "cpu_s": time.process_time(),
    }
    sys.stdout.write("result " + json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)  # the before engine's threads may still be in their loops at its cap


# --- the parent -----------------------------------------------------------------------


def start_limiter(
    upstreams: list[str], dilate: float, lifetime: float
) -> tuple[subprocess.Popen[str], str]:
    """The limiter, its rates GCS's divided by ``dilate``, its burst 0.05 s of them, and
    each request's latency GCS's 30-80 ms times ``dilate``."""
    lo, hi = (ms * dilate for ms in LATENCY_MS)
    argv = [sys.executable, str(HERE / "gcs_limiter.py"), "--lifetime", str(lifetime),
            "--write-rate", str(1000 / dilate), "--read-rate", str(5000 / dilate),
            "--object-rate", str(1 / dilate), "--burst", str(BURST_S * dilate),
            "--latency-ms", str(lo), str(hi)]  # fmt: skip
    for upstream in upstreams:
        argv += ["--upstream", upstream]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "listening":
        proc.kill()
        raise SystemExit(f"the limiter did not start: {line}")
    return proc, line[1]


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def create_bucket(urls: list[str]) -> str:
    """A new bucket, of the same name on every server."""
    name = f"poolsim-{uuid.uuid4().hex[:12]}"
    for url in urls:
        request = urllib.request.Request(
            url + "/storage/v1/b?project=p", data=json.dumps({"name": name}).encode(), method="POST"
        )
        request.add_header("Content-Type", "application/json")
        urllib.request.urlopen(request, timeout=10).read()
    return name


def limiter_call(url: str, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(
        url + path, method=method, data=b"" if method == "POST" else None
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.load(reply)


async def record_batch(bucket: str, n: int, workers: int, lease_s: float) -> int:
    """Write the manifest and chunks of an ``n``-input batch; return the chunk size."""
    import cloudpickle

    from kinetic._core.inputs import chunk_size
    from kinetic._storage.gcs import GCSStorage
    from runner import protocol

    size = chunk_size(n)
    chunks = [
        cloudpickle.dumps([((i,), {}) for i in range(c, min(n, c + size))])
        for c in range(0, n, size)
    ]
    manifest = {
        "format": protocol.FORMAT, "group_id": GROUP, "group_kind": "map", "name": "poolsim",
        "tags": {}, "func_name": "square", "total": n, "chunk_size": size,
        "n_chunks": len(chunks), "delivery": protocol.DELIVERY, "created_at": "",
        "options": {"max_concurrent": workers, "retries": 0, "fail_fast": False,
                    "cancel_running_on_fail": False, "input_mode": "auto"},
        "spec": {"has_data": False, "output_dir": f"gs://{bucket}/outputs"},
        "handle": {},
        "gke": {"image": "", "namespace": "default", "accelerator": "cpu", "fuse_buckets": [],
                "engine": protocol.ENGINE_POOL, "lease_s": lease_s},
    }  # fmt: skip
    async with GCSStorage(bucket) as store:
        sem = asyncio.Semaphore(16)

        async def put(k: int, data: bytes) -> None:
            async with sem:
                await store.write(protocol.group_inputs_key(GROUP, k), data)

        await asyncio.gather(*(put(k, d) for k, d in enumerate(chunks)))
        await store.write(protocol.group_payload_key(GROUP), cloudpickle.dumps(pow))
        await store.write(protocol.group_manifest_key(GROUP), protocol.dump_json(manifest))
    return size


async def check_outcomes(
    bucket: str, n: int, hold: float, landed: dict[str, float]
) -> dict[str, Any]:
    """Every outcome in storage, read back, and the one readers report of each input
    (:class:`runner.pool.outcomes.OutcomeChoice`'s rule: an outcome object of its own, else
    the record of the earliest claim, :func:`runner.pool.outcomes.outcome_rank`): lost (no
    record), duplicated (records in more than one object: the others are not reported),
    the reported value wrong or failed; and the inputs whose readers may disagree, by
    the limiter's landing times (``landed``, wall clock): one whose reported record
    landed after another record of it could be reported — at once for a record of the
    input's first claim (:meth:`PoolBook.first_claim`), ``hold`` seconds (the lease)
    after it landed for a later claim's."""
    import cloudpickle

    from kinetic._storage.gcs import GCSStorage
    from runner import protocol, results_log
    from runner.pool.book import PoolBook
    from runner.pool.options import PoolOptions
    from runner.pool.outcomes import OWN_OUTCOME, outcome_rank

    records: dict[int, list[tuple[Any, str, bytes, bytes]]] = {}  # index -> rank, key, ...
    async with GCSStorage(bucket) as store:
        prefix = f"_groups/{GROUP}/"
        keys = [k async for k in store.list(prefix)]
        bursts = [k for k in keys if k.startswith(prefix + "bursts/")]
        singles = [k for k in keys if k.startswith(prefix + "results/")]
        claims_prefix = protocol.group_claims_prefix(GROUP)
        claims = [k for k in keys if k.startswith(claims_prefix)]
        sem = asyncio.Semaphore(32)

        async def get(key: str) -> bytes:
            async with sem:
                data: bytes = await store.read(key)
                return data

        manifest = protocol.load_manifest(await store.read(protocol.group_manifest_key(GROUP)))
        datas = await asyncio.gather(*(get(k) for k in bursts + singles))
    book = PoolBook(PoolOptions.from_manifest(manifest))
    for key in claims:
        parsed = protocol.parse_claim_name(key.removeprefix(claims_prefix))
        if parsed is not None:
            book.learn_listed(*parsed)
    bursts_prefix = protocol.group_bursts_prefix(GROUP)
    for key, data in zip(bursts + singles, datas, strict=True):
        if "/bursts/" in key:
            if not data.startswith(protocol.BURST_MAGIC):
                raise SystemExit(f"{key} is not a burst")
            found, end = results_log.scan(data, len(protocol.BURST_MAGIC))
            if end != len(data):
                raise SystemExit(f"{key} is torn at byte {end} of {len(data)}")
            rank = outcome_rank(key.removeprefix(bursts_prefix))
            for index, head, body, length in found:
                payload = data[body + len(head) + 1 : body + length]
                records.setdefault(index, []).append((rank, key, head, payload))
        else:
            header, payload = protocol.decode_outcome(data)
            index = protocol.parse_outcome_name(key.rsplit("/", 1)[1])
            assert index is not None
            head = json.dumps(header).encode()
            records.setdefault(index, []).append((OWN_OUTCOME, key, head, payload))
    states: Counter[str] = Counter()
    wrong = disagree = 0
    for index, found in records.items():
        found.sort(key=lambda r: r[0])
        rank, key, head, payload = found[0]  # the one every reader reports
        state = json.loads(head)["state"]
        states[state] += 1
        if state == "succeeded":
            wrong += cloudpickle.loads(payload)["result"] != index * index
        chosen_at = landed.get(key, float("inf"))
        for other_rank, other, _, _ in found[1:]:
            first = other_rank != OWN_OUTCOME and book.first_claim(other_rank[1], other_rank[2])
            visible = landed.get(other, float("inf")) + (0.0 if first else hold)
            if chosen_at > visible:
                disagree += 1
                break
    objects = {"bursts": len(bursts), "singles": len(singles), "all": len(keys)}
    return checked(objects, records, n, disagree, states, wrong)


def checked(
    objects: dict[str, int],
    records: dict[int, list[Any]],
    n: int,
    disagree: int,
    states: Counter[str],
    wrong: int,
) -> dict[str, Any]:
    """A run's check, from the records of each input read back (``records``: index ->
    its records), the inputs readers may disagree on, the standing records' states and
    the wrong values among them."""
    return {
        "objects": objects,
        "outcomes": sum(len(found) for found in records.values()),
        "lost": sum(1 for i in range(n) if i not in records),
        "duplicated": sum(1 for found in records.values() if len(found) > 1),
        "readers_may_disagree": disagree,
        "states": dict(states),
        "wrong_values": wrong,
    }


MATRIX = {  # "workers x input ms" -> (inputs per worker, dilation, processes)
    "100x50": (100, 2, 1),
    "100x1000": (12, 2, 1),
    "300x50": (100, 4, 2),
    "300x1000": (12, 3, 2),
    "1000x50": (50, 10, 4),
    "1000x1000": (12, 6, 4),
}
"""The points ``--matrix`` runs (issue 38): each a steady run and two killed ones (the
production lease and ``--lease-s``). Inputs per worker are few (the 1 s inputs' runs
last 12 s of work) and time is dilated where the 2 CPUs would not keep up."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument(
        "--dilate", type=int, default=10,
        help="run time this many times slower: inputs and protocol timers longer, limits lower",
    )  # fmt: skip
    parser.add_argument("--shards", type=int, default=16, help="fake-gcs-servers making the bucket")
    parser.add_argument("--input-ms", type=float, default=50.0)
    parser.add_argument(
        "--input-skew", type=float, default=0.0,
        help="inputs sorted by size: from (1 - skew) to (1 + skew) times --input-ms",
    )  # fmt: skip
    parser.add_argument(
        "--lease-s",
        type=float,
        default=6.0,
        help="the killed run's short lease (renewed every third)",
    )
    parser.add_argument("--kill", type=float, default=0.10)
    parser.add_argument("--kill-window", type=float, default=0.5)
    parser.add_argument(
        "--runs", default="steady,killed",
        help="steady, killed (the short lease), killed30 (the production lease)",
    )  # fmt: skip
    parser.add_argument("--override", action="append", default=[], help="PoolOptions field=value")
    parser.add_argument("--before", type=Path, help="a tree with the engine before issue 27")
    parser.add_argument("--before-inputs", type=int, default=10_000)
    parser.add_argument("--before-cap-s", type=float, default=60.0)
    parser.add_argument("--cap-s", type=float, default=None, help="a run is stopped after this")
    parser.add_argument(
        "--matrix", nargs="?", const=",".join(MATRIX), default=None, metavar="POINTS",
        help=f"run the points of MATRIX (default all: {','.join(MATRIX)}), with --runs",
    )  # fmt: skip
    parser.add_argument(
        "--table", action="store_true", help="print the matrix's rows as a Markdown table"
    )
    parser.add_argument(_TREE_FLAG, help=argparse.SUPPRESS)
    parser.add_argument(
        "--engine", choices=("span", "coord"), default="span",
        help="span: the leaderless pool's workers; coord: the coordinated pool (pool_coordinated_sim)",
    )  # fmt: skip
    parser.add_argument(
        "--kill-coordinator", type=float, default=None, metavar="F",
        help="coord: kill the coordinator at F x the ideal, restart it --restart-s later",
    )  # fmt: skip
    parser.add_argument("--restart-s", type=float, default=5.0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        child_main(json.loads(ns.child))
        return
    if ns.coordinator:
        from benchmarks.pool_coordinated_sim import coordinator_main

        coordinator_main(json.loads(ns.coordinator))
        return
    if ns.table:
        from benchmarks._common import RESULTS

        print(matrix_table(json.loads((RESULTS / "pool_sim.json").read_text())))
        return
    run_all(ns)


def matrix_table(results: dict[str, Any]) -> str:
    """The matrix's rows (``results["matrix"]["rows"]``) as a Markdown table."""
    lines = [
        (
            "| workers | input | run | inputs | dilation | ideal (goal's) | all outcomes durable "
            "| ratio | goal met | request latency p50 / p99 | operation p50 / p99 "
            "| Class A / input (listings) | reads / input | 429s | dup. / disagree |"
        ),
        "|" + "---|" * 15,
    ]
    rows = results.get("matrix", {}).get("rows", {})
    order = {"steady": 0, "killed": 1}
    for key, row in sorted(
        rows.items(),
        key=lambda kv: (kv[1]["workers"], kv[1]["input_ms"], order[kv[0].split("_")[0]],
                        -kv[1]["lease_s"]),
    ):  # fmt: skip
        run = "steady" if key.startswith("steady") else f"killed, lease {row['lease_s']:g} s"
        lat = row.get("latency_ms", {})
        lines.append(
            f"| {row['workers']:,} | {row['input_ms']:g} ms | {run} | {row['inputs']:,} "
            f"| {row['dilation']:g} | {row['ideal_with_lease_s']:.2f} s "
            f"| {row['elapsed_s']:.2f} s | {row['goal_ratio']:.2f}x "
            f"| {'**yes**' if row['within_bound'] else 'no'} "
            f"| {lat.get('request_p50')} / {lat.get('request_p99')} ms "
            f"| {lat.get('operation_p50')} / {lat.get('operation_p99')} ms "
            f"| {row['writes_per_input']:.3f} ({row['listings_per_input']:.3f}) "
            f"| {row['reads_per_input']:.3f} | {sum(row['refused_by_limit'].values())} "
            f"| {row['duplicated']} / {row['readers_may_disagree']} |"
        )
    return "\n".join(lines)


def _point(ns: argparse.Namespace, point: str) -> argparse.Namespace:
    """``ns`` for one point of the matrix."""
    workers, ms = (int(v) for v in point.split("x"))
    per_worker, dilate, procs = MATRIX[point]
    return argparse.Namespace(
        **{**vars(ns), "workers": workers, "input_ms": float(ms), "inputs": workers * per_worker,
           "dilate": dilate, "procs": procs}
    )  # fmt: skip


def run_all(ns: argparse.Namespace) -> None:
    from benchmarks._common import RESULTS, machine, write_results

    overrides = {k: float(v) for k, v in (o.split("=", 1) for o in ns.override)}
    names = [r for r in ns.runs.split(",") if r]
    if ns.matrix is not None:
        plan = [(_point(ns, pt), name) for pt in ns.matrix.split(",") for name in names]
    else:
        plan = [(ns, name) for name in names]
    runs: dict[str, Any] = {}
    with Storage(ns.shards) as storage:
        for point, name in plan:
            lease = PRODUCTION_LEASE_S if name != "killed" else ns.lease_s
            if ns.matrix is not None:
                key = f"{name.rstrip('0123456789')}_{point.workers}w_{point.input_ms:g}ms"
                key += f"_lease{lease:g}" if name != "steady" else ""
            else:
                key = f"{name}_{point.workers}"
                key += f"_skew{point.input_skew:g}" if point.input_skew else ""
            key += "_coordinated" if ns.engine == "coord" else ""  # (_coord: the model, stop 48)
            key += f"_restart{ns.kill_coordinator:g}" if ns.kill_coordinator is not None else ""
            runs[key] = one_run(
                point, name, storage, engine=ns.engine, inputs=point.inputs, lease_s=lease,
                kill=point.kill if name != "steady" else 0.0, overrides=overrides, tree=None,
                cap_s=ns.cap_s,
            )  # fmt: skip
            runs[key].update(procs=point.procs, shards=ns.shards, machine=machine())
            runs[key]["input_skew"] = point.input_skew
            if ns.kill_coordinator is not None:
                runs[key].update(coordinator_killed_at=ns.kill_coordinator, restart_s=ns.restart_s)
            runs[key]["overrides"] = overrides
            # The coordinator's model is compared beside the matrix, not in its rows.
            save(RESULTS, write_results, runs, matrix=ns.matrix is not None and ns.engine == "span")
        if ns.before is not None:
            runs[f"before_{ns.workers}"] = one_run(
                ns, "before", storage, engine="before", inputs=ns.before_inputs,
                lease_s=30.0, kill=0.0, overrides={}, tree=ns.before, cap_s=ns.before_cap_s,
            )  # fmt: skip
            save(RESULTS, write_results, runs, matrix=False)


def save(results: Path, write_results: Any, runs: dict[str, Any], *, matrix: bool) -> None:
    """Write the runs into ``pool_sim.json``: rows of earlier invocations stay (each says
    how it was run), replaced by name; the matrix's rows under ``matrix``."""
    try:
        kept = json.loads((results / "pool_sim.json").read_text())
    except (OSError, ValueError):
        kept = {}
    old_runs = kept.get("runs", {})
    old_matrix = kept.get("matrix", {}).get("rows", {})
    path = write_results(
        "pool_sim",
        {
            "limits": {"bucket_writes_per_s": 1000, "bucket_reads_per_s": 5000,
                       "object_writes_per_s": 1, "bucket_burst_s": BURST_S,
                       "latency_ms": list(LATENCY_MS), "listings": "read limit; Class A"},
            "bound": BOUND,
            "runs": old_runs if matrix else {**old_runs, **runs},
            "matrix": {
                "goal": f"steady: elapsed <= {BOUND} x ideal; killed: elapsed <= {BOUND} x "
                        "(the survivors' ideal + one lease)",
                "points": {k: {"inputs_per_worker": v[0], "dilation": v[1], "procs": v[2]}
                           for k, v in MATRIX.items()},
                "rows": {**old_matrix, **runs} if matrix else old_matrix,
            },
        },
    )  # fmt: skip
    print(f"wrote {path}")


class Storage:
    """fake-gcs-servers making one bucket, and the limiter in front (started again for
    each dilation)."""

    def __init__(self, shards: int) -> None:
        self.shards = shards
        self.limiter: subprocess.Popen[str] | None = None
        self.dilate: float | None = None

    def __enter__(self) -> Self:
        from benchmarks.bench_data_upload import start_emulator

        def stop(signum: int, frame: Any) -> None:
            raise SystemExit(f"stopped by signal {signum}")  # the servers are ended below

        signal.signal(signal.SIGTERM, stop)
        self.servers = [start_emulator() for _ in range(self.shards)]
        self.fake_urls = [url for _, url in self.servers]
        self.shard_pids = [proc.pid for proc, _ in self.servers]
        return self

    def limiter_url(self, dilate: float) -> str:
        if self.dilate != dilate:
            self._stop_limiter()
            self.limiter, self.url = start_limiter(self.fake_urls, dilate, lifetime=7200)
            self.dilate = dilate
            print(f"{self.shards} fake-gcs-servers (one bucket, objects by name hash) behind "
                  f"the limiter {self.url}: 1,000 writes/s, 5,000 reads/s per bucket (burst "
                  f"{BURST_S:g} s), 1 write/s per object name, {LATENCY_MS[0]:g}-"
                  f"{LATENCY_MS[1]:g} ms a request; time dilated {dilate:g}x")  # fmt: skip
        return self.url

    def _stop_limiter(self) -> None:
        if self.limiter is not None:
            self.limiter.terminate()
            self.limiter.wait(10)
            self.limiter = None

    def __exit__(self, *exc: object) -> None:
        self._stop_limiter()
        for proc, _ in self.servers:
            proc.terminate()
            proc.wait(10)


@dataclass(frozen=True)
class RunSpec:
    """One run: its name, engine, size and clocks (times in simulated seconds)."""

    name: str
    engine: str
    inputs: int
    workers: int
    input_s: float
    ideal: float
    lease_s: float
    chunk: int
    cap_s: float
    dilate: float


def one_run(
    ns: argparse.Namespace,
    name: str,
    storage: Storage,
    *,
    engine: str,
    inputs: int,
    lease_s: float,
    kill: float,
    overrides: dict[str, float],
    tree: Path | None,
    cap_s: float | None,
) -> dict[str, Any]:
    dilate = ns.dilate
    input_s = ns.input_ms / 1000.0  # simulated time; the workers sleep input_s * dilate
    workers, procs = ns.workers, ns.procs
    ideal = inputs * input_s / workers
    if cap_s is None:  # past the goal, with room to tell by how much
        cap_s = 1.6 * (ideal + (lease_s if kill else 0.0)) + 5.0
    limiter_url = storage.limiter_url(dilate)
    fake_urls = storage.fake_urls
    bucket = create_bucket(fake_urls)
    os.environ["STORAGE_EMULATOR_HOST"] = limiter_url
    limiter_call(limiter_url, "/_limiter/reset?limits=off", "POST")  # setting up: not measured
    chunk = asyncio.run(record_batch(bucket, inputs, workers, lease_s * dilate))
    spec = RunSpec(name, engine, inputs, workers, input_s, ideal, lease_s, chunk, cap_s, dilate)
    limiter_call(limiter_url, "/_limiter/reset", "POST")
    rng = random.Random(27)
    dead = sorted(rng.sample(range(workers), round(workers * kill)))
    # A third killed while an input runs, a third during a write, a third paused.
    how = {w: ("input", "write", "pause")[k % 3] for k, w in enumerate(dead)}
    kill_at = {w: rng.uniform(0.1, ns.kill_window) * ideal * dilate for w in dead}
    children = []
    env = dict(os.environ, STORAGE_EMULATOR_HOST=limiter_url)
    coordinator = None
    token = os.urandom(16).hex()  # the batch's (its Secret's, in a cluster)
    config = {"bucket": bucket, "dilate": dilate, "token": token}

    def start_coordinator() -> subprocess.Popen[str]:
        argv = [sys.executable, str(Path(__file__).resolve()), "--coordinator", json.dumps(config)]
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if line != "ready":
            process.kill()
            raise SystemExit(f"the coordinator's process did not start: {line!r}")
        return process

    if engine == "coord":  # started with the workers, as its pod
        coordinator = start_coordinator()
    for p in range(procs):
        mine = list(range(p, workers, procs))
        cfg = {
            "engine": engine, "bucket": bucket, "input_s": input_s * dilate,
            "skew": ns.input_skew, "inputs": inputs,
            "cap_s": cap_s * dilate, "dilate": dilate, "lease_s": lease_s * dilate,
            "latency_hi_s": LATENCY_MS[1] / 1000 * dilate,
            "kill_by": ns.kill_window * ideal * dilate,
            "names": [f"sim-{w:04d}" for w in mine], "overrides": overrides, "workers": workers,
            "kills": {str(k): [kill_at[w], how[w]] for k, w in enumerate(mine) if w in how},
            "token": token,
        }  # fmt: skip
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)]
        if tree is not None:
            argv += [_TREE_FLAG, str(tree.resolve())]
        children.append(
            subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
        )
    for child in children:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line != "ready":
            for c in children:
                c.kill()
            raise SystemExit(f"a worker process did not start: {line!r}")
    shards_cpu = sum(proc_cpu(pid) for pid in storage.shard_pids)
    started = time.time() + 0.5
    for child in children + ([coordinator] if coordinator is not None else []):
        assert child.stdin is not None
        child.stdin.write(f"{started}\n")
        child.stdin.flush()
    watch = Watch(limiter_url, bucket, inputs, grace=2.0 * dilate) if engine == "span" else None
    try:
        if coordinator is not None and ns.kill_coordinator is not None:
            time.sleep(max(0.0, started + ns.kill_coordinator * ideal * dilate - time.time()))
            coordinator.send_signal(signal.SIGKILL)  # a process of ours, by its pid
            coordinator.wait()
            time.sleep(ns.restart_s * dilate)
            coordinator = start_coordinator()  # its Job's next pod: the next epoch
            assert coordinator.stdin is not None
            coordinator.stdin.write(f"{started}\n")
            coordinator.stdin.flush()
        if coordinator is not None:  # it ends once every outcome is durable; then the workers
            outs = collect([coordinator], started + cap_s * dilate + 15)
            outs += collect(children, time.time() + 2.0 * dilate)  # a paused one: stopped
        else:
            outs = collect(children, started + cap_s * dilate + 15, watch)
    finally:
        for child in children + ([coordinator] if coordinator is not None else []):
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)  # a process of ours, by its pid
                child.wait()
    row = finish(spec, outs, limiter_url, bucket, storage.shard_pids, shards_cpu, started)
    row["stopped_after_last_outcome"] = bool(watch and watch.stopped)
    return row


class Watch:
    """Whether every input has a burst (the limiter's names, uncounted): then the
    workers are stopped ``grace`` seconds later — their exit (idle workers learning that
    the batch is done) is not what is measured, and on 2 CPUs it takes minutes."""

    def __init__(self, url: str, bucket: str, inputs: int, grace: float) -> None:
        self.url, self.bucket, self.inputs, self.grace = url, bucket, inputs, grace
        self.done_at: float | None = None
        self.stopped = False

    def due(self) -> bool:
        """True once the workers should be stopped."""
        from runner import protocol

        if self.done_at is None:
            prefix = protocol.group_bursts_prefix(GROUP)
            names = limiter_call(self.url, f"/_limiter/names?bucket={self.bucket}&prefix={prefix}")
            covered: list[tuple[int, int]] = []
            for name in names:
                parsed = protocol.parse_burst_name(name.removeprefix(prefix))
                if parsed is not None:
                    covered.append(parsed[:2])
            at = 0
            for first, end in sorted(covered):
                if first > at:
                    break
                at = max(at, end)
            if at >= self.inputs:
                self.done_at = time.time()
        return self.done_at is not None and time.time() >= self.done_at + self.grace


def collect(
    children: list[subprocess.Popen[str]], deadline: float, watch: Watch | None = None
) -> list[dict[str, Any]]:
    """Each worker process's figures (a process past ``deadline``, or still running once
    ``watch`` says so, is stopped: it reports what it saw)."""
    while watch is not None and time.time() < deadline:
        if all(child.poll() is not None for child in children):
            break
        if watch.due():
            watch.stopped = True
            deadline = time.time()
            break
        time.sleep(2.0)
    outs: list[dict[str, Any]] = []
    for child in children:
        try:
            out, _ = child.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGTERM)  # a process of ours, by its pid: it reports
            try:
                out, _ = child.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGKILL)
                out, _ = child.communicate()
        found = [line for line in out.splitlines() if line.startswith("result ")]
        outs.append(json.loads(found[-1][len("result ") :]) if found else {})
    return outs


def finish(
    spec: RunSpec,
    outs: list[dict[str, Any]],
    limiter_url: str,
    bucket: str,
    shard_pids: list[int],
    shards_cpu: float,
    started: float,
) -> dict[str, Any]:
    """Read the limiter's counts and the outcomes back; the run's figures."""
    stats = limiter_call(limiter_url, "/_limiter/stats")
    finished = max(0.0, stats["last_outcome_wall"] - started)
    cpu = {
        "workers": sum(out.get("cpu_s", 0.0) for out in outs),
        "limiter": stats["cpu_s"] - stats["cpu_s_at_reset"],
        "fake_gcs": sum(proc_cpu(pid) for pid in shard_pids) - shards_cpu,
        "wall": time.time() - started,
    }
    cpu["share_of_cpus"] = (cpu["workers"] + cpu["limiter"] + cpu["fake_gcs"]) / (
        cpu["wall"] * (os.cpu_count() or 1)
    )
    limiter_call(limiter_url, "/_limiter/reset?limits=off", "POST")
    hold = spec.lease_s * spec.dilate  # the readers' hold is the batch's lease (wall)
    if spec.engine == "coord":
        from benchmarks.pool_coordinated_sim import check_commits

        check = asyncio.run(
            check_commits(bucket, spec.inputs, stats["landed"], started, spec.dilate)
        )
    else:
        check = asyncio.run(check_outcomes(bucket, spec.inputs, hold, stats["landed"]))
        check["durable_per_s"] = durable_per_second(stats["landed"], started, spec.dilate)
    return summarise(spec, outs, stats, check, cpu, finished)


def durable_per_second(landed: dict[str, float], started: float, dilate: float) -> list[int]:
    """Inputs whose first record landed in each simulated second of the run (the
    timeline of outcomes: start-up, the bulk, the tail)."""
    from runner import protocol

    prefix = protocol.group_bursts_prefix(GROUP)
    first: dict[int, float] = {}
    for name, at in landed.items():
        parsed = protocol.parse_burst_name(name.removeprefix(prefix))
        if parsed is not None:
            for index in range(parsed[0], parsed[1]):
                first[index] = min(first.get(index, at), at)
    counts: Counter[int] = Counter(int(max(0.0, at - started) / dilate) for at in first.values())
    return [counts.get(s, 0) for s in range(max(counts, default=-1) + 1)]


def percentile(histogram: dict[Any, int], q: float, scale: float = 1.0) -> float | None:
    """The ``q`` quantile of a histogram (value -> count), divided by ``scale``."""
    items = sorted((float(k), v) for k, v in histogram.items())
    total = sum(v for _, v in items)
    if not total:
        return None
    seen = 0
    for value, count in items:
        seen += count
        if seen >= q * total:
            return round(value / scale, 1)
    return round(items[-1][0] / scale, 1)


def summarise(
    spec: RunSpec,
    outs: list[dict[str, Any]],
    stats: dict[str, Any],
    check: dict[str, Any],
    cpu: dict[str, float],
    finished: float,
) -> dict[str, Any]:
    """The run's figures, times in simulated seconds (wall seconds / ``dilate``), rates
    per simulated second."""
    name, engine, inputs, workers = spec.name, spec.engine, spec.inputs, spec.workers
    input_s, ideal, lease_s, dilate = spec.input_s, spec.ideal, spec.lease_s, spec.dilate
    runs: Counter[int] = Counter()
    ops: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    exits: Counter[str] = Counter()
    kills: Counter[str] = Counter()
    op_ms: Counter[str] = Counter()
    killed_at: list[float] = []
    paused: list[tuple[float, float]] = []
    ended = 0
    between: Counter[str] = Counter()
    for out in outs:
        runs.update(Counter(out.get("runs", [])))
        ops.update(out.get("ops", {}))
        errors.update(out.get("storage_errors", {}))
        exits.update(out.get("exits", {}))
        kills.update(out.get("kills", {}))
        op_ms.update(out.get("op_ms", {}))
        killed_at += out.get("killed_at", [])
        paused += [(at / dilate, length / dilate) for at, length in out.get("paused_at", [])]
        ended += out.get("ended", 0)
        between.update(out.get("between_ms", {}))
    # Done: the last outcome durable (what the client waits for); the workers' exit after.
    elapsed = finished / dilate
    exited = max((out.get("last_exit", 0.0) for out in outs), default=0.0) / dilate
    killed_at = [t / dilate for t in killed_at]
    with_lease = ideal
    if killed_at or paused:
        ideal = survivors_ideal(inputs * input_s, workers, killed_at, paused)
        with_lease = ideal + lease_s
    by_kind: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    for key, count in stats["requests"].items():
        kind, area, status = key.split(" ")
        if status == "429":
            refused[f"{kind} {area}"] += count
        else:
            by_kind[f"{kind} {area}"] += count
    done = check["outcomes"] - check["duplicated"]
    capped = check["lost"] > 0

    def per_input(kinds: tuple[str, ...]) -> float:
        return round(sum(v for k, v in by_kind.items() if k.split()[0] in kinds) / inputs, 4)

    goal_ratio = elapsed / with_lease if with_lease else None
    row: dict[str, Any] = {
        "engine": engine,
        "inputs": inputs,
        "workers": workers,
        "input_ms": input_s * 1000,
        "lease_s": lease_s,
        "lease_scaled": lease_s != PRODUCTION_LEASE_S,
        "chunk_size": spec.chunk,
        "ideal_s": round(ideal, 3),
        "elapsed_s": round(elapsed, 3),
        "ratio": round(elapsed / ideal, 3) if ideal else None,
        "ideal_with_lease_s": round(with_lease, 3),
        "ratio_with_lease": round(goal_ratio, 3) if goal_ratio else None,
        "goal_ratio": round(goal_ratio, 3) if goal_ratio else None,
        "within_bound": bool(
            ideal
            and not capped
            and goal_ratio is not None
            and goal_ratio <= BOUND
            and check["wrong_values"] == check["readers_may_disagree"] == 0
            and set(check["states"]) == {"succeeded"}
        ),
        "last_worker_exit_s": round(exited, 3),
        "stopped_at_cap_s": spec.cap_s if capped else None,
        "inputs_per_s": round(done / elapsed, 1) if elapsed else None,
        "lost": check["lost"],
        "duplicated": check["duplicated"],
        "readers_may_disagree": check["readers_may_disagree"],
        "wrong_values": check["wrong_values"],
        "states": check["states"],
        "objects": check["objects"],
        "run_more_than_once": sum(1 for c in runs.values() if c > 1),
        "runs": sum(runs.values()),
        "inputs_ended": ended,
        "killed_workers": len(killed_at),
        "kills": dict(kills),
        "paused_workers": len(paused),
        "paused_s": [[round(at, 2), round(length, 2)] for at, length in paused],
        "killed_at_s": sorted(round(t, 2) for t in killed_at),
        "exits": dict(exits),
        "requests": dict(sorted(by_kind.items())),
        "requests_per_input": {k: round(v / inputs, 4) for k, v in sorted(by_kind.items())},
        # GCS bills a listing as a Class A operation, with writes.
        "writes_per_input": per_input(("create", "write", "delete", "list")),
        "writes_per_input_excl_listings": per_input(("create", "write", "delete")),
        "listings_per_input": per_input(("list",)),
        "reads_per_input": per_input(("read", "stat")),
        "latency_ms": {
            "request_p50": percentile(stats["latency_ms"], 0.5, dilate),
            "request_p99": percentile(stats["latency_ms"], 0.99, dilate),
            "operation_p50": percentile(op_ms, 0.5),
            "operation_p99": percentile(op_ms, 0.99),
        },
        "cut_in_flight": stats["cut"],
        "landed_unanswered": stats["unanswered"],
        "refused_429": dict(sorted(refused.items())),
        "requests_by_status": dict(sorted(stats["requests"].items())),
        "refused_by_limit": stats["refused"],
        "failed_after_retries": dict(errors),
        "peak_writes_per_s": max(per_second(stats["writes_per_s"], dilate), default=0),
        "peak_reads_per_s": max(per_second(stats["reads_per_s"], dilate), default=0),
        "writes_per_s": per_second(stats["writes_per_s"], dilate),
        "reads_per_s": per_second(stats["reads_per_s"], dilate),
        "refused_per_s": per_second(stats["refused_per_s"], dilate),
        "durable_per_s": check["durable_per_s"],
        "worker_ops": dict(ops),
        # Seconds a worker ran no input on average, by what it did (the run's first
        # input to the last outcome, and the workers' exit after).
        "between_inputs_s_per_worker": {
            k: round(v / 1000 / workers, 3) for k, v in between.most_common()
        },
        "dilation": dilate,
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
    }
    report(name, row)
    return row


def survivors_ideal(
    work: float, workers: int, killed_at: list[float], paused: list[tuple[float, float]]
) -> float:
    """The survivors' ideal: when ``work`` seconds of inputs are done by the capacity the
    pool had — a dead worker's until it died (``killed_at``), a paused one's less the part
    of its pause (``(start, length)``) before that time. A dead worker's span is then
    taken over once its lease ends: the goal adds a lease to this."""
    alive = workers - len(killed_at)
    end = (work - sum(killed_at)) / alive
    for _ in range(100):  # the fixed point: pauses count only up to the end
        lost = sum(min(length, max(0.0, end - at)) for at, length in paused)
        done = sum(min(at, end) for at in killed_at)
        end, before = (work - done + lost) / alive, end
        if abs(end - before) < 1e-6:
            break
    return end


def per_second(counts: list[int], dilate: float) -> list[float]:
    """Requests in each simulated second, from counts per wall second."""
    size = int(dilate)
    return [sum(counts[i : i + size]) for i in range(0, len(counts), size)] if size > 1 else counts


def report(name: str, row: dict[str, Any]) -> None:
    lease = f"lease {row['lease_s']:g} s"
    print(
        f"\n== {name}: {row['inputs']:,} inputs x {row['input_ms']:g} ms on {row['workers']:,} workers, {lease}"
    )
    if row["stopped_at_cap_s"]:
        print(
            f"  stopped at its cap, {row['stopped_at_cap_s']:g} s: {row['inputs'] - row['lost']:,} inputs done ({row['inputs_per_s']} inputs/s)"
        )
    verdict = "PASS" if row["within_bound"] else "MISS"
    if row["killed_workers"] or row["paused_workers"]:
        verdict = (
            f"{row['ratio_with_lease']}x of {row['ideal_with_lease_s']:.2f} s, the survivors' "
            f"ideal + the lease: {verdict}"
        )
    print(
        f"  every outcome durable after {row['elapsed_s']:.2f} s (workers exited by "
        f"{row['last_worker_exit_s']:.2f} s), ideal {row['ideal_s']:.2f} s: {row['ratio']}x (bound {BOUND}x: {verdict})"
    )
    print(
        f"  lost {row['lost']}, in more than one object {row['duplicated']} (readers may "
        f"disagree on {row['readers_may_disagree']}), wrong values {row['wrong_values']}, states {row['states']}; "
        f"run more than once {row['run_more_than_once']} (killed {row['kills']}, paused {row['paused_workers']}; "
        f"writes cut in flight {row['cut_in_flight']}, landed unanswered {row['landed_unanswered']})"
    )
    print(
        f"  429s: {sum(row['refused_by_limit'].values())} {row['refused_by_limit']}; failed after the client's retries: {sum(row['failed_after_retries'].values())}"
    )
    print(
        f"  latency (ms): {row['latency_ms']}; peak writes/s {row['peak_writes_per_s']} (limit 1000), peak reads/s {row['peak_reads_per_s']} (limit 5000)"
    )
    print(
        f"  CPU seconds {row['cpu_s']}; time dilated {row['dilation']}x "
        "(figures are in simulated seconds)"
    )
    print(
        f"  per input: {row['writes_per_input']} Class A ({row['writes_per_input_excl_listings']} "
        f"writes, {row['listings_per_input']} listings), {row['reads_per_input']} reads; by kind:"
    )
    for key, per in row["requests_per_input"].items():
        print(f"    {key:28s} {row['requests'][key]:8d}  {per:.4f}/input")
    print("  seconds a worker ran no input, on average, by what it did:")
    for key, seconds in row["between_inputs_s_per_worker"].items():
        print(f"    {key:28s} {seconds:8.3f}")


if __name__ == "__main__":
    main()
