"""A fast model of a GKE batch pool at scale: the real workers' machines, GCS's limits,
a simulated clock.

Run from the repository root: ``.venv/bin/python benchmarks/pool_model.py`` (about two
minutes for 1,000 workers and 100,000 inputs on one core; ``--help`` for the knobs).

:mod:`benchmarks.bench_pool_sim` runs the workers against fake-gcs-server in real
(dilated) time and takes 15 minutes of both CPUs a run; this model replays the same
:class:`runner.pool.machine.WorkerMachine` s without IO, over the in-memory store of
``tests/unit/pool_driver.py``, adding what the simulation's limiter enforces — 1,000
writes and 5,000 reads a second per bucket (token buckets with 0.05 s of burst), one
write a second per object name (a create-if-absent is never refused for its name), a
listing costing a read per page of 1,000 names — and what a 429 costs its worker: the
storage client's back-off (``GCSStorage``: up to 0.25 s × 2^attempt, plus 1 s after a
429). A storage operation takes ``--io-ms LO HI`` (uniform: GCS's 30–80 ms by
default); an input its ``--ms`` ± 10%. A listing is reported with the writes, as GCS
bills it (Class A). It is a tool
to try protocol changes quickly; the figures quoted in ``benchmarks/README.md`` as
measured come from the simulation. Not modelled: the storage client's own limit of 4
attempts (the model retries without end, as the simulation's shell does), CPU.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner.pool.limits import PAGE
from runner.pool.machine import WorkerMachine
from runner.pool.ops import Create, List, Op, Read, Replace, Write
from runner.pool.options import PoolOptions
from tests.unit.pool_driver import GID, Pool, ok

BUCKET_WRITES, BUCKET_READS = 1000.0, 5000.0


class TokenBucket:
    def __init__(self, rate: float, burst_s: float = 0.05) -> None:
        self.rate, self.burst = rate, rate * burst_s
        self.level, self.stamp = self.burst, 0.0

    def take(self, now: float, n: int = 1) -> bool:
        self.level = min(max(self.burst, n), self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.level >= n:
            self.level -= n
            return True
        return False


def area(key: str) -> str:
    return key.removeprefix(f"_groups/{GID}/").split("/")[0] or "?"


class LimitedPool(Pool):
    """:class:`Pool` whose storage operations meet GCS's starting limits."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.writes, self.reads = TokenBucket(BUCKET_WRITES), TokenBucket(BUCKET_READS)
        self.changed: dict[str, float] = {}  # object name -> when it last changed
        self.refused: Counter[str] = Counter()
        self.served: Counter[str] = Counter()
        self.attempts: Counter[str] = Counter()
        self.waiting: dict[str, Op] = {}  # refused operations, tried again after back-off
        self.last_outcome = self.now
        self.io_range = (self.io_s, self.io_s)

    def _admit(self, op: Op) -> bool:
        now = self.now
        if isinstance(op, List):
            names = sum(1 for k in self.store.objects if k.startswith(op.prefix))
            kind, ok_ = f"list {area(op.prefix)}", self.reads.take(now, max(1, -(-names // PAGE)))
        elif isinstance(op, Read):
            kind, ok_ = f"read {area(op.key)}", self.reads.take(now)
        elif isinstance(op, (Create, Write, Replace)):
            kind = f"{type(op).__name__.lower()} {area(op.key)}"
            fresh = isinstance(op, Create) or now - self.changed.get(op.key, -math.inf) >= 1.0
            ok_ = fresh and self.writes.take(now)
            if ok_:
                self.changed[op.key] = now
        else:
            return True
        (self.served if ok_ else self.refused)[kind] += 1
        return ok_

    def _next_op(self, name: str, machine: WorkerMachine) -> Op:
        held = self.waiting.pop(name, None)
        return held if held is not None else super()._next_op(name, machine)

    def _perform(self, name: str, machine: WorkerMachine, op: Op) -> None:
        self.io_s = self.rng.uniform(*self.io_range)  # this operation's latency
        if not self._admit(op):  # 429: the client backs off, then sends it again
            self.waiting[name] = op
            self.attempts[name] += 1
            back = self.rng.uniform(0, min(8.0, 0.25 * 2 ** self.attempts[name])) + 1.0
            self._at(self.now + back, name)
            return
        self.attempts[name] = 0
        if isinstance(op, Write) and area(op.key) == "bursts":
            self.last_outcome = self.now
        super()._perform(name, machine, op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--ms", type=float, default=50.0, help="an input's time")
    parser.add_argument(
        "--io-ms", type=float, nargs=2, default=(30.0, 80.0), metavar=("LO", "HI"),
        help="a storage operation's time, uniform",
    )  # fmt: skip
    parser.add_argument("--kill", type=float, default=0.0, help="share of workers killed")
    parser.add_argument("--lease-s", type=float, default=30.0)
    parser.add_argument("--no-ordinals", action="store_true", help="workers pick at random")
    parser.add_argument("--cap-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    ns = parser.parse_args()
    workers, inputs, input_s = ns.workers, ns.inputs, ns.ms / 1000
    options = PoolOptions(total=inputs, chunk_size=1000, workers=workers, lease_s=ns.lease_s)
    rng = random.Random(ns.seed)
    pool = LimitedPool(
        options, lambda i, a: (input_s * rng.uniform(0.9, 1.1), *ok(i)), seed=ns.seed,
        io_s=ns.io_ms[0] / 1000,
    )  # fmt: skip
    pool.io_range = (ns.io_ms[0] / 1000, ns.io_ms[1] / 1000)
    t0 = pool.now
    for w in range(workers):  # pods start within 0.2 s of each other
        at = t0 + rng.uniform(0, 0.2)
        pool.start(f"w{w:04d}", at=at, ordinal=None if ns.no_ordinals else w)
    ideal = inputs * input_s / workers
    dead = rng.sample(range(workers), round(workers * ns.kill))
    kills = sorted((t0 + rng.uniform(0.1, 0.5) * ideal, f"w{w:04d}") for w in dead)
    started = time.monotonic()
    for at, name in kills:
        pool.step_until(at, max_steps=10**9)
        pool.kill(name)
    pool.step_until(t0 + ns.cap_s, max_steps=10**9)
    found = pool.store.outcomes()
    elapsed = pool.last_outcome - t0
    print(
        f"{workers:,} workers, {inputs:,} inputs of {ns.ms:g} ms, lease {ns.lease_s:g} s, "
        f"{len(kills)} killed: every outcome durable after {elapsed:.2f} s, ideal "
        f"{ideal:.2f} s: {elapsed / ideal:.2f}x"
    )
    if kills:
        times = [at - t0 for at, _ in kills]
        survivors = (inputs * input_s - sum(times)) / (workers - len(kills))
        with_lease = max(survivors, max(times) + ns.lease_s + input_s)
        print(f"  against the last kill + the lease + one input ({with_lease:.2f} s): "
              f"{elapsed / with_lease:.2f}x")  # fmt: skip
    print(
        f"  lost {inputs - len(found)}, duplicated {sum(len(v) > 1 for v in found.values())}, "
        f"429s {sum(pool.refused.values())} {dict(pool.refused.most_common(4))}; "
        f"{time.monotonic() - started:.0f} s to compute"
    )
    writes = sum(v for k, v in pool.served.items() if k.split()[0] in ("create", "write"))
    listings = sum(v for k, v in pool.served.items() if k.split()[0] == "list")
    reads = sum(pool.served.values()) - writes - listings
    print(f"  per input: {(writes + listings) / inputs:.4f} Class A ({writes / inputs:.4f} "
          f"writes, {listings / inputs:.4f} listings), {reads / inputs:.4f} reads; by kind:")  # fmt: skip
    for kind, count in sorted(pool.served.items()):
        print(f"    {kind:20s} {count:8d}  {count / inputs:.4f}/input")


if __name__ == "__main__":
    main()
