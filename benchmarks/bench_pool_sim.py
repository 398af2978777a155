"""A GKE batch pool at scale, simulated: 1,000 workers against a rate-limited bucket.

Run from the repository root: ``.venv/bin/python benchmarks/bench_pool_sim.py``
(a few minutes on 2 cores; ``--help`` for the knobs).

What runs (issue 27, item 5)
----------------------------
* **Storage**: fake-gcs-server (memory backend) behind :mod:`benchmarks.gcs_limiter`, a
  loopback proxy that enforces GCS's starting rates — 1,000 writes/s and 5,000 reads/s
  per bucket, 1 write/s per object name — and answers 429 past them.
* **Workers**: ``--workers`` (1,000) pool workers as asyncio tasks in ``--procs`` (4)
  processes. Each is the real sans-IO worker, :class:`runner.pool_machine.WorkerMachine`
  over the real :class:`runner.pool_book.PoolBook`, driven by a small async shell
  (:func:`drive`) that performs its operations with Kinetic's real storage client,
  :class:`kinetic._storage.gcs.GCSStorage` (one per worker, as one per pod), retries and
  back-off on 429 included. An input is ``await anyio.sleep(--input-ms)`` whose value
  (its index squared) is pickled by the runner's own :func:`runner.job.build_success`.
  What is not simulated: the pod's process per input, its log, the Kubernetes Job.
* **The batch**: ``--inputs`` (100,000) inputs recorded as a submission records them
  (the manifest and cloudpickled chunks of :func:`kinetic._core.inputs.chunk_size`),
  written straight to fake-gcs-server (submission is not what is measured).

Runs
----
1. **steady**: every worker lives. Elapsed from the start signal (all processes ready,
   nothing read yet) to the last worker's exit, against the ideal ``inputs × input time
   ÷ workers``; bound 1.2×.
2. **killed**: ``--kill`` (10%) of the workers, chosen at random, are cancelled mid-span
   (while an input of theirs runs) at a random time in the first ``--kill-window`` of
   the ideal — a pod killed: no further write. Their spans are taken over once the
   lease ends, so the lease is scaled down (``--lease-s``, 6 s instead of 30 s; the
   output says so). Its ideal counts the work the dead workers could no longer do:
   ``(inputs × input time + Σ dead workers' remaining time to the steady ideal) ÷
   workers``, i.e. the lost capacity is not charged to the protocol.
3. with ``--before TREE`` (a checkout of the engine before issue 27, e.g. ``git
   archive``), **before**: that tree's blocking worker (:class:`runner.pool.Worker`, one
   claim and one outcome object per input) in threads, ``--before-inputs`` inputs,
   stopped after ``--before-cap-s`` — the figure the span/burst design is measured
   against.

Checked after each run, reading storage straight from fake-gcs-server: every input has
exactly one outcome (the bursts read back with :func:`runner.results_log.scan`; an
input in two bursts is *duplicated*, in none *lost*), its value is right, and no input
failed. Printed and written to ``benchmarks/results/pool_sim.json``: elapsed, ideal,
ratio; lost, duplicated; inputs run more than once (a dead worker's unwritten outcomes
run again: expected when workers die); the limiter's 429s by limit, and how many
operations still failed after the client's retries; requests per input by kind
(claim creates, claim rewrites = renewals, burst writes, listings, reads) and the peak
writes and reads per second against the limits.
"""

from __future__ import annotations

import argparse
import asyncio
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
from typing import Any

HERE = Path(__file__).resolve().parent
_TREE_FLAG = "--tree"
if _TREE_FLAG in sys.argv:  # a child running another tree's engine imports it first
    sys.path.insert(0, sys.argv[sys.argv.index(_TREE_FLAG) + 1])
sys.path.insert(1 if _TREE_FLAG in sys.argv else 0, str(HERE.parent))

from benchmarks.gcs_limiter import area_of

GROUP = "grp-poolsim"
BOUND = 1.2


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


class Chunks:
    """The input chunks a worker has read (the pod's reads: each chunk once per worker)."""

    def __init__(self, store: Any, chunk_size: int, timeout: float) -> None:
        self.store, self.chunk_size, self.timeout = store, chunk_size, timeout
        self.items: dict[int, list[Any]] = {}

    async def get(self, index: int) -> Any:
        import cloudpickle

        from runner import protocol

        chunk, offset = divmod(index, self.chunk_size)
        if chunk not in self.items:
            self.items = {
                chunk: cloudpickle.loads(
                    await _retry(
                        self.store.read,
                        protocol.group_inputs_key(GROUP, chunk),
                        timeout=self.timeout,
                    )
                )
            }
        return self.items[chunk][offset]


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

    ``state["running"]`` is set while an input runs (a kill waits for that); ``timeout``
    bounds each storage operation (the client's default, dilated)."""
    from kinetic._exceptions import ObjectNotFoundError
    from runner.job import build_success
    from runner.pool import ops as pm

    rng = random.Random()
    while True:
        op = machine.next(wall=time.time(), mono=time.monotonic(), pick=rng.random())
        stats.ops[type(op).__name__] += 1
        if isinstance(op, pm.List):

            async def keys(prefix: str = op.prefix, *, timeout: float) -> list[str]:
                return [k async for k in store.list(prefix, timeout=timeout)]

            machine.listed(op.prefix, await _retry(keys, timeout=timeout, stats=stats))
        elif isinstance(op, pm.Read):
            try:
                data, generation = await _retry(
                    store.read_versioned, op.key, timeout=timeout, stats=stats
                )
            except ObjectNotFoundError:
                machine.read(op.key, None, None)
            else:
                machine.read(op.key, data, generation)
        elif isinstance(op, pm.Create):
            machine.created(
                op.key,
                await _retry(store.create_versioned, op.key, op.data, timeout=timeout, stats=stats),
            )
        elif isinstance(op, pm.Write):
            await _retry(store.write, op.key, op.data, timeout=timeout, stats=stats)
            machine.written(op.key)
        elif isinstance(op, pm.Replace):
            machine.replaced(
                op.key,
                await _retry(
                    store.replace_if, op.key, op.data, op.generation, timeout=timeout, stats=stats
                ),
            )
        elif isinstance(op, pm.Run):
            args, _kwargs = await chunks.get(op.index)
            state["running"].set()
            started = time.monotonic()
            await asyncio.sleep(input_s)
            state["running"].clear()
            stats.runs[op.index] += 1
            payload, record = build_success(args[0] * args[0])
            machine.ran(op.index, record, payload, b"", time.monotonic() - started)
        elif isinstance(op, pm.Kill):
            machine.ended(op.index)
        elif isinstance(op, pm.Sleep):
            await asyncio.sleep(op.seconds)
        elif isinstance(op, pm.Exit):
            return str(op.reason)
        else:
            raise TypeError(f"unknown operation {op!r}")


TIMES = ("lease_s", "burst_s", "span_s")
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
    from kinetic._storage.base import DEFAULT_TIMEOUT
    from kinetic._storage.gcs import GCSStorage
    from runner import protocol
    from runner.pool import machine as pool_machine
    from runner.pool.machine import WorkerMachine
    from runner.pool.options import PoolOptions

    stats = WorkerStats()
    names = cfg["names"]
    dilate = cfg["dilate"]
    stores = [GCSStorage(cfg["bucket"], **dilated_client(dilate)) for _ in names]
    timeout = DEFAULT_TIMEOUT * dilate
    kills = {int(k): float(t) for k, t in cfg["kills"].items()}
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def one(i: int, name: str) -> None:
        store = stores[i]
        state: dict[str, Any] = {"running": asyncio.Event()}
        manifest = protocol.load_manifest(
            await _retry(
                store.read, protocol.group_manifest_key(GROUP), timeout=timeout, stats=stats
            )
        )
        options = PoolOptions.from_manifest(manifest)  # its lease_s is dilated already
        options = replace(
            options,
            burst_s=options.burst_s * dilate,
            span_s=options.span_s * dilate,
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
            ordinal=int(name.removeprefix("sim-")),  # an Indexed Job's completion index
        )
        machine.stop_every *= dilate  # its default follows the pool's size
        chunks = Chunks(store, options.chunk_size, timeout)
        work = asyncio.ensure_future(
            drive(machine, store, chunks, cfg["input_s"], stats, state, timeout)
        )
        if i in kills:
            await asyncio.wait([work], timeout=max(0.0, start_at + kills[i] - time.time()))
            running = asyncio.ensure_future(state["running"].wait())
            await asyncio.wait([work, running], return_when=asyncio.FIRST_COMPLETED)
            running.cancel()
            if not work.done():
                work.cancel()  # a pod killed mid-span: nothing more is written
                stats.killed += 1
                stats.killed_at.append(time.time() - start_at)
                stats.exits["killed"] += 1
                return
        reason = await work
        stats.exits[reason] += 1
        stats.last_exit = max(stats.last_exit, time.time() - start_at)

    everyone = asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
    # Stopped at the run's cap (SIGTERM): what was seen is reported all the same.
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


def child_main(cfg: dict[str, Any]) -> None:
    profile = os.environ.get("POOLSIM_PROFILE")  # a file: where the first process's profile goes
    if profile and cfg["names"][0].endswith("0000"):
        import cProfile

        with cProfile.Profile() as prof:
            stats = asyncio.run(span_process(cfg))
        prof.dump_stats(profile)
    else:
        stats = before_process(cfg) if cfg["engine"] == "before" else asyncio.run(span_process(cfg))
    out = {
        "runs": sorted(stats.runs.elements()),
        "ops": dict(stats.ops),
        "storage_errors": dict(stats.storage_errors),
        "exits": dict(stats.exits),
        "killed": stats.killed,
        "killed_at": stats.killed_at,
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
    """The limiter, its rates GCS's divided by ``dilate`` (its burst: 1 s, dilated)."""
    argv = [sys.executable, str(HERE / "gcs_limiter.py"), "--lifetime", str(lifetime),
            "--write-rate", str(1000 / dilate), "--read-rate", str(5000 / dilate),
            "--object-rate", str(1 / dilate), "--burst", str(dilate)]  # fmt: skip
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
        await store.write(protocol.group_manifest_key(GROUP), protocol.dump_json(manifest))
    return size


async def check_outcomes(bucket: str, n: int) -> dict[str, Any]:
    """Every outcome in storage, read back: lost, duplicated, wrong, failed."""
    import cloudpickle

    from kinetic._storage.gcs import GCSStorage
    from runner import protocol, results_log

    seen: Counter[int] = Counter()
    states: Counter[str] = Counter()
    wrong = 0
    async with GCSStorage(bucket) as store:
        prefix = f"_groups/{GROUP}/"
        keys = [k async for k in store.list(prefix)]
        bursts = [k for k in keys if k.startswith(prefix + "bursts/")]
        singles = [k for k in keys if k.startswith(prefix + "results/")]
        sem = asyncio.Semaphore(32)

        async def get(key: str) -> bytes:
            async with sem:
                data: bytes = await store.read(key)
                return data

        datas = await asyncio.gather(*(get(k) for k in bursts + singles))
    for key, data in zip(bursts + singles, datas, strict=True):
        items: list[tuple[int, bytes, bytes]] = []
        if "/bursts/" in key:
            if not data.startswith(protocol.BURST_MAGIC):
                raise SystemExit(f"{key} is not a burst")
            found, end = results_log.scan(data, len(protocol.BURST_MAGIC))
            if end != len(data):
                raise SystemExit(f"{key} is torn at byte {end} of {len(data)}")
            for index, head, body, length in found:
                items.append((index, head, data[body + len(head) + 1 : body + length]))
        else:
            header, payload = protocol.decode_outcome(data)
            index = protocol.parse_outcome_name(key.rsplit("/", 1)[1])
            assert index is not None
            items.append((index, json.dumps(header).encode(), payload))
        for index, head, payload in items:
            seen[index] += 1
            state = json.loads(head)["state"]
            states[state] += 1
            if state == "succeeded":
                wrong += cloudpickle.loads(payload)["result"] != index * index
    return {
        "objects": {"bursts": len(bursts), "singles": len(singles), "all": len(keys)},
        "outcomes": sum(seen.values()),
        "lost": sum(1 for i in range(n) if seen[i] == 0),
        "duplicated": sum(1 for c in seen.values() if c > 1),
        "states": dict(states),
        "wrong_values": wrong,
    }


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
        "--lease-s", type=float, default=6.0, help="the killed run's lease (renewed every third)"
    )
    parser.add_argument("--kill", type=float, default=0.10)
    parser.add_argument("--kill-window", type=float, default=0.5)
    parser.add_argument("--runs", default="steady,killed")
    parser.add_argument("--override", action="append", default=[], help="PoolOptions field=value")
    parser.add_argument("--before", type=Path, help="a tree with the engine before issue 27")
    parser.add_argument("--before-inputs", type=int, default=10_000)
    parser.add_argument("--before-cap-s", type=float, default=60.0)
    parser.add_argument("--cap-s", type=float, default=40.0, help="a run is stopped after this")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(_TREE_FLAG, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        child_main(json.loads(ns.child))
        return
    run_all(ns)


def run_all(ns: argparse.Namespace) -> None:
    from benchmarks._common import RESULTS, machine, write_results
    from benchmarks.bench_data_upload import start_emulator

    overrides = {k: float(v) for k, v in (o.split("=", 1) for o in ns.override)}

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(f"stopped by signal {signum}")  # the servers are ended below

    signal.signal(signal.SIGTERM, stop)
    servers = [start_emulator() for _ in range(ns.shards)]
    fake_urls = [url for _, url in servers]
    shard_pids = [proc.pid for proc, _ in servers]
    limiter, limiter_url = start_limiter(fake_urls, ns.dilate, lifetime=3600)
    print(f"{ns.shards} fake-gcs-servers (one bucket, objects by name hash) behind the limiter "
          f"{limiter_url}: 1,000 writes/s, 5,000 reads/s per bucket, 1 write/s per object name")  # fmt: skip
    runs: dict[str, Any] = {}
    try:
        for name in [r for r in ns.runs.split(",") if r]:
            killed = name == "killed"
            runs[f"{name}_{ns.workers}"] = one_run(
                ns, name, fake_urls, limiter_url, engine="span", inputs=ns.inputs,
                lease_s=ns.lease_s if killed else 30.0, kill=ns.kill if killed else 0.0,
                overrides=overrides, tree=None, cap_s=ns.cap_s, shard_pids=shard_pids,
            )  # fmt: skip
        if ns.before is not None:
            runs[f"before_{ns.workers}"] = one_run(
                ns, "before", fake_urls, limiter_url, engine="before", inputs=ns.before_inputs,
                lease_s=30.0, kill=0.0, overrides={}, tree=ns.before, cap_s=ns.before_cap_s,
                shard_pids=shard_pids,
            )  # fmt: skip
    finally:
        for proc in [limiter, *(p for p, _ in servers)]:
            proc.terminate()
            proc.wait(10)
    # Runs of earlier invocations stay (each row says how it was run), replaced by name.
    try:
        kept = json.loads((RESULTS / "pool_sim.json").read_text())["runs"]
    except (OSError, ValueError, KeyError):
        kept = {}
    for row in runs.values():
        row.update(procs=ns.procs, shards=ns.shards, machine=machine(), overrides=overrides)
    path = write_results(
        "pool_sim",
        {
            "limits": {"bucket_writes_per_s": 1000, "bucket_reads_per_s": 5000,
                       "object_writes_per_s": 1, "bucket_burst_s": 1.0},
            "bound": BOUND,
            "runs": {**kept, **runs},
        },
    )  # fmt: skip
    print(f"wrote {path}")


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
    fake_urls: list[str],
    limiter_url: str,
    *,
    engine: str,
    inputs: int,
    lease_s: float,
    kill: float,
    overrides: dict[str, float],
    tree: Path | None,
    cap_s: float,
    shard_pids: list[int],
) -> dict[str, Any]:
    dilate = ns.dilate
    input_s = ns.input_ms / 1000.0  # simulated time; the workers sleep input_s * dilate
    workers, procs = ns.workers, ns.procs
    ideal = inputs * input_s / workers
    bucket = create_bucket(fake_urls)
    os.environ["STORAGE_EMULATOR_HOST"] = limiter_url
    limiter_call(limiter_url, "/_limiter/reset?limits=off", "POST")  # setting up: not measured
    chunk = asyncio.run(record_batch(bucket, inputs, workers, lease_s * dilate))
    spec = RunSpec(name, engine, inputs, workers, input_s, ideal, lease_s, chunk, cap_s, dilate)
    limiter_call(limiter_url, "/_limiter/reset", "POST")
    rng = random.Random(27)
    dead = set(rng.sample(range(workers), round(workers * kill)))
    kill_at = {w: rng.uniform(0.1, ns.kill_window) * ideal * dilate for w in dead}
    children = []
    env = dict(os.environ, STORAGE_EMULATOR_HOST=limiter_url)
    for p in range(procs):
        mine = list(range(p, workers, procs))
        cfg = {
            "engine": engine, "bucket": bucket, "input_s": input_s * dilate,
            "cap_s": cap_s * dilate, "dilate": dilate,
            "names": [f"sim-{w:04d}" for w in mine], "overrides": overrides,
            "kills": {str(k): kill_at[w] for k, w in enumerate(mine) if w in dead},
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
    shards_cpu = sum(proc_cpu(pid) for pid in shard_pids)
    started = time.time() + 0.5
    for child in children:
        assert child.stdin is not None
        child.stdin.write(f"{started}\n")
        child.stdin.flush()
    try:
        outs = collect(children, started + cap_s * dilate + 15)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)  # a process of ours, by its pid
                child.wait()
    return finish(spec, outs, limiter_url, bucket, shard_pids, shards_cpu, started)


def collect(children: list[subprocess.Popen[str]], deadline: float) -> list[dict[str, Any]]:
    """Each worker process's figures (a process past ``deadline`` is killed)."""
    outs: list[dict[str, Any]] = []
    for child in children:
        try:
            out, _ = child.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGTERM)  # a process of ours, by its pid: it reports
            try:
                out, _ = child.communicate(timeout=20)
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
    check = asyncio.run(check_outcomes(bucket, spec.inputs))
    return summarise(spec, outs, stats, check, cpu, finished)


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
    killed_at: list[float] = []
    for out in outs:
        runs.update(out.get("runs", []))
        ops.update(out.get("ops", {}))
        errors.update(out.get("storage_errors", {}))
        exits.update(out.get("exits", {}))
        killed_at += out.get("killed_at", [])
    # Done: the last outcome durable (what the client waits for); the workers' exit after.
    elapsed = finished / dilate
    exited = max((out.get("last_exit", 0.0) for out in outs), default=0.0) / dilate
    killed_at = [t / dilate for t in killed_at]
    with_lease = ideal
    if killed_at:  # the surviving workers' ideal: what the dead ones did not do is theirs
        ideal = (inputs * input_s - sum(killed_at)) / (workers - len(killed_at))
        # A dead worker's span is taken over once its lease ends, not before: the bound is
        # checked against that too (the lease is how a death is noticed).
        with_lease = max(ideal, max(killed_at) + lease_s + input_s)
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
    row: dict[str, Any] = {
        "engine": engine,
        "inputs": inputs,
        "workers": workers,
        "input_ms": input_s * 1000,
        "lease_s": lease_s,
        "lease_scaled": lease_s != 30.0,
        "chunk_size": spec.chunk,
        "ideal_s": round(ideal, 3),
        "elapsed_s": round(elapsed, 3),
        "ratio": round(elapsed / ideal, 3) if ideal else None,
        "ideal_with_lease_s": round(with_lease, 3),
        "ratio_with_lease": round(elapsed / with_lease, 3),
        "within_bound": bool(
            ideal
            and not capped
            and elapsed / with_lease <= BOUND
            and check["duplicated"] == check["wrong_values"] == 0
            and set(check["states"]) == {"succeeded"}
        ),
        "last_worker_exit_s": round(exited, 3),
        "stopped_at_cap_s": spec.cap_s if capped else None,
        "inputs_per_s": round(done / elapsed, 1) if elapsed else None,
        "lost": check["lost"],
        "duplicated": check["duplicated"],
        "wrong_values": check["wrong_values"],
        "states": check["states"],
        "objects": check["objects"],
        "run_more_than_once": sum(1 for c in runs.values() if c > 1),
        "runs": sum(runs.values()),
        "killed_workers": len(killed_at),
        "exits": dict(exits),
        "requests": dict(sorted(by_kind.items())),
        "requests_per_input": {k: round(v / inputs, 4) for k, v in sorted(by_kind.items())},
        "writes_per_input": round(
            sum(v for k, v in by_kind.items() if k.split()[0] in ("create", "write", "delete"))
            / inputs,
            4,
        ),
        "reads_per_input": round(
            sum(v for k, v in by_kind.items() if k.split()[0] in ("read", "stat", "list")) / inputs,
            4,
        ),
        "refused_429": dict(sorted(refused.items())),
        "requests_by_status": dict(sorted(stats["requests"].items())),
        "refused_by_limit": stats["refused"],
        "failed_after_retries": dict(errors),
        "peak_writes_per_s": max(per_second(stats["writes_per_s"], dilate), default=0),
        "peak_reads_per_s": max(per_second(stats["reads_per_s"], dilate), default=0),
        "writes_per_s": per_second(stats["writes_per_s"], dilate),
        "reads_per_s": per_second(stats["reads_per_s"], dilate),
        "worker_ops": dict(ops),
        "dilation": dilate,
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
    }
    report(name, row)
    return row


def per_second(counts: list[int], dilate: float) -> list[float]:
    """Requests in each simulated second, from counts per wall second."""
    size = int(dilate)
    return [sum(counts[i : i + size]) for i in range(0, len(counts), size)] if size > 1 else counts


def report(name: str, row: dict[str, Any]) -> None:
    lease = f"lease {row['lease_s']:g} s" + (
        " (scaled down from 30 s)" if row["lease_scaled"] else ""
    )
    print(
        f"\n== {name}: {row['inputs']:,} inputs x {row['input_ms']:g} ms on {row['workers']:,} workers, {lease}"
    )
    if row["stopped_at_cap_s"]:
        print(
            f"  stopped at its cap, {row['stopped_at_cap_s']:g} s: {row['inputs'] - row['lost']:,} inputs done ({row['inputs_per_s']} inputs/s)"
        )
    verdict = "PASS" if row["within_bound"] else "MISS"
    if row["killed_workers"]:
        verdict = (
            f"{row['ratio_with_lease']}x of {row['ideal_with_lease_s']:.2f} s, the last kill "
            f"+ the lease + one input: {verdict}"
        )
    print(
        f"  every outcome durable after {row['elapsed_s']:.2f} s (workers exited by "
        f"{row['last_worker_exit_s']:.2f} s), ideal {row['ideal_s']:.2f} s: {row['ratio']}x (bound {BOUND}x: {verdict})"
    )
    print(
        f"  lost {row['lost']}, duplicated {row['duplicated']}, wrong values {row['wrong_values']}, states {row['states']}; "
        f"run more than once {row['run_more_than_once']} (killed workers: {row['killed_workers']})"
    )
    print(
        f"  429s: {sum(row['refused_by_limit'].values())} {row['refused_by_limit']}; failed after the client's retries: {sum(row['failed_after_retries'].values())}"
    )
    print(
        f"  peak writes/s {row['peak_writes_per_s']} (limit 1000), peak reads/s {row['peak_reads_per_s']} (limit 5000)"
    )
    print(
        f"  CPU seconds {row['cpu_s']}; time dilated {row['dilation']}x "
        "(figures are in simulated seconds)"
    )
    print(
        f"  per input: {row['writes_per_input']} writes, {row['reads_per_input']} reads; by kind:"
    )
    for key, per in row["requests_per_input"].items():
        print(f"    {key:28s} {row['requests'][key]:8d}  {per:.4f}/input")


if __name__ == "__main__":
    main()
