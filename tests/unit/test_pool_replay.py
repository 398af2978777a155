"""A replay of the pool workers' operations: seeded pool runs (the pure driver of
tests/unit/pool_driver.py and the fault explorer of tests/unit/pool_explorer.py), every
worker's operations recorded, in order, with the simulated times they were handed out
at, and checked against a golden file (``tests/unit/replay/pool_ops.json``: a SHA-256
of each scenario's operations, and the first operations of one scenario in clear text,
so that a diff shows where a change begins).

A pure refactor of the pool's worker (``runner/pool/``) must leave every digest
identical. A change of behaviour changes them: regenerate the golden on purpose, with
``KINETIC_REPLAY_RECORD=1 pytest tests/unit/test_pool_replay.py``, and say why in the
commit.

The scenarios cover pool sizes from one worker to a large pool (whose write rate binds:
spread bursts, quick looks, holes, ``holes/settled``), with and without ordinals, slow
and fast and mixed inputs, a worker killed and taken over, one stalled past its lease,
an input that kills its worker until ``max_claims``, retries, ``fail_fast`` (with and
without ending the running inputs), cancels, a stop record, a large result, and
explorer seeds (delayed and lost requests, paused, crashed and terminated workers,
skewed clocks).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from runner import protocol
from runner.pool.machine import WorkerMachine
from runner.pool.ops import Op
from runner.pool.options import LARGE_RESULT, PoolOptions
from tests.unit.pool_driver import GID, Pool, Runner, ok
from tests.unit.pool_explorer import explore

GOLDEN = Path(__file__).parent / "replay" / "pool_ops.json"
SHOWN = "death-takeover"
"""The scenario whose first operations the golden file holds in clear text."""
SHOWN_OPS = 300
EXPLORER_SEEDS = 120
RECORD = os.environ.get("KINETIC_REPLAY_RECORD") == "1"
"""Read at import: the tests' own environment is cleared of ``KINETIC_*`` (fix_env)."""


def recording(log: list[str]) -> type[WorkerMachine]:
    """A machine class that appends each operation it hands out to ``log``."""

    class Recording(WorkerMachine):
        def next(self, *, wall: float, mono: float, pick: float) -> Op:
            op = super().next(wall=wall, mono=mono, pick=pick)
            log.append(f"{wall!r} {mono!r} {self.worker} {describe(op)}")
            return op

    return Recording


def describe(op: Op) -> str:
    parts = [type(op).__name__]
    for each in fields(op):
        value = getattr(op, each.name)
        if isinstance(value, bytes):
            value = f"{len(value)}:{hashlib.sha256(value).hexdigest()[:16]}"
        parts.append(f"{each.name}={value!r}" if not isinstance(value, str) else value)
    return " ".join(parts)


def options(total: int, workers: int, **kw: Any) -> PoolOptions:
    return PoolOptions(total=total, chunk_size=64, workers=workers, **{"lease_s": 30.0, **kw})


def fast(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
    return (0.01, *ok(index))


def failed(seconds: float = 0.01) -> tuple[float, protocol.FinalRecord, bytes]:
    record: protocol.FinalRecord = {
        "state": "failed",
        "phase": "execute",
        "error": "E",
        "error_type": None,
    }
    return seconds, record, pickle.dumps({"success": False})


def mixed(seed: int, fails: frozenset[int] = frozenset()) -> Runner:
    """Inputs of seeded durations, from milliseconds to a lease and more; those in
    ``fails`` fail."""

    def run(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        rng = random.Random(seed * 1_000_003 + index)
        roll = rng.random()
        seconds = rng.uniform(0.001, 0.05) if roll < 0.9 else rng.uniform(1.0, 45.0)
        return failed(seconds) if index in fails else (seconds, *ok(index))

    return run


def pool_run(
    log: list[str],
    opts: PoolOptions,
    run: Runner,
    workers: int,
    *,
    seed: int = 0,
    ordinals: bool = False,
    setup: Callable[[Pool], None] | None = None,
    script: Callable[[Pool], None] | None = None,
) -> None:
    pool = Pool(opts, run, seed=seed, machine_type=recording(log))
    if setup is not None:
        setup(pool)
    for w in range(workers):
        pool.start(f"w{w}", ordinal=w if ordinals else None)
    if script is not None:
        script(pool)
    pool.step_until()
    outcomes = pool.store.outcomes()
    log.append(f"exits {sorted(pool.exits.items())} outcomes {len(outcomes)}")


def death(pool: Pool) -> None:
    pool.step_until(1000.6)
    pool.kill("w0")
    pool.start("heir", at=pool.now + 1)


def stall(pool: Pool) -> None:
    pool.step_until(1000.2)
    pool.pause("w0", pool.now + 40)
    pool.start("other", at=pool.now + 35)


def stop(pool: Pool) -> None:
    pool.step_until(1000.5)
    record = protocol.stop_record("cancelled", "the batch was cancelled")
    pool.store.objects[protocol.group_stop_key(GID)] = protocol.dump_json(record)


def cancel(pool: Pool) -> None:
    """Input 1 cancelled before it ran, input 2 while it runs."""
    cancelled = protocol.encode_outcome(protocol.cancelled_header(), b"")
    pool.store.objects[protocol.group_outcome_key(GID, 1)] = cancelled
    pool.step_until(1000.5)  # input 2 runs (2 s): cancelled, it is ended
    pool.store.objects[protocol.group_outcome_key(GID, 2)] = cancelled


def deaths(times: list[float], names: list[str]) -> Callable[[Pool], None]:
    """Kill each named worker at its time; the Job controller starts another a second
    later."""

    def script(pool: Pool) -> None:
        for at, name in zip(times, names, strict=True):
            pool.step_until(at)
            pool.kill(name)
            pool.start(f"{name}+", at=pool.now + 1.0)

    return script


def scenarios() -> dict[str, Callable[[list[str]], None]]:
    """Each scenario's recorder, by name."""

    def bad_two(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        return failed() if index == 2 else fast(index, attempt)

    def flaky(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        if index == 3 or (index == 1 and attempt == 0):
            return failed()
        return fast(index, attempt)

    def large_result(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        if index == 5:
            return 0.01, ok(index)[0], b"x" * (LARGE_RESULT + 1)
        return fast(index, attempt)

    def slow_three(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        return (60.0 if index == 3 else 0.01, *ok(index))

    def slow_two(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        return (2.0 if index == 2 else 0.01, *ok(index))

    def doom(pool: Pool) -> None:
        pool.doom = {4}

    def slow(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        return (5.0, *ok(index))

    out: dict[str, Callable[[list[str]], None]] = {
        "one-worker": lambda log: pool_run(log, options(40, 1), fast, 1),
        "four-workers": lambda log: pool_run(log, options(2000, 4), fast, 4, seed=1),
        "eight-ordinals": lambda log: pool_run(
            log, options(2000, 8), fast, 8, seed=2, ordinals=True
        ),
        "slow-inputs": lambda log: pool_run(log, options(40, 4), slow, 4, seed=3),
        "death-takeover": lambda log: pool_run(
            log, options(400, 1, burst_s=0.05), fast, 1, script=death
        ),
        "stalled-past-lease": lambda log: pool_run(
            log, options(300, 2), fast, 1, seed=4, script=stall
        ),
        "max-claims": lambda log: pool_run(log, options(10, 1, max_claims=3), fast, 1, setup=doom),
        "retries": lambda log: pool_run(log, options(6, 2, retries=1), flaky, 1),
        "fail-fast": lambda log: pool_run(log, options(200, 2, fail_fast=True), bad_two, 2, seed=5),
        "fail-fast-ends-running": lambda log: pool_run(
            log,
            options(200, 3, fail_fast=True, cancel_running_on_fail=True),
            mixed(6, frozenset({150})),
            3,
            seed=6,
        ),
        "cancels": lambda log: pool_run(
            log, options(30, 1, lease_s=3.0), slow_two, 1, script=cancel
        ),
        "stop-record": lambda log: pool_run(log, options(100, 1), slow_three, 1, script=stop),
        "large-result": lambda log: pool_run(log, options(20, 2), large_result, 2, seed=7),
        "mixed-with-deaths": lambda log: pool_run(
            log,
            options(3000, 16),
            mixed(8),
            16,
            seed=8,
            script=deaths([1002.0, 1010.0, 1030.0], ["w3", "w7", "w11"]),
        ),
        "large-pool": lambda log: pool_run(
            log,
            options(4000, 40, claims_per_s=10.0),
            mixed(9),
            40,
            seed=9,
            ordinals=True,
            script=deaths([1005.0, 1020.0, 1040.0, 1041.0], ["w1", "w9", "w20", "w30"]),
        ),
        "large-pool-no-ordinals": lambda log: pool_run(
            log,
            options(2000, 24, claims_per_s=6.0, retries=1),
            mixed(10),
            24,
            seed=10,
            script=deaths([1003.0, 1025.0], ["w2", "w5"]),
        ),
    }

    def exploration(seed: int) -> Callable[[list[str]], None]:
        def record(log: list[str]) -> None:
            run = explore(seed, machine_type=recording(log), storms=False)
            log.extend(run.log)

        return record

    for seed in range(EXPLORER_SEEDS):
        out[f"explorer-{seed}"] = exploration(seed)
    return out


def record_all() -> dict[str, list[str]]:
    logs: dict[str, list[str]] = {}
    for name, scenario in scenarios().items():
        logs[name] = log = []
        scenario(log)
    return logs


def digest(log: list[str]) -> str:
    return hashlib.sha256("\n".join(log).encode()).hexdigest()


def test_the_workers_operations_replay_as_recorded() -> None:
    logs = record_all()
    found = {name: {"ops": len(log), "sha256": digest(log)} for name, log in logs.items()}
    if RECORD:
        GOLDEN.parent.mkdir(exist_ok=True)
        golden = {
            "about": "tests/unit/test_pool_replay.py: a pure refactor leaves this identical",
            "scenarios": found,
            "shown": {"scenario": SHOWN, "ops": logs[SHOWN][:SHOWN_OPS]},
        }
        GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    shown = golden["shown"]
    assert logs[shown["scenario"]][: len(shown["ops"])] == shown["ops"]
    differ = sorted(name for name in found if found[name] != golden["scenarios"].get(name))
    assert sorted(found) == sorted(golden["scenarios"]), "scenarios added or gone"
    assert not differ, f"operations changed in {differ} (see this module's docstring)"
