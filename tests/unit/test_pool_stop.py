"""How soon a pool's workers see its stop record (runner.pool.limits.STOP_EVERY): after
a failure with ``fail_fast``, no input starts more than a period and a half after the
record is durable, whatever the pool's size. Pure: the machines over the in-memory store
of tests/unit/pool_driver.py, on its simulated clock."""

from __future__ import annotations

import pytest

from runner import protocol
from runner.pool.limits import STOP_EVERY
from runner.pool.machine import WorkerMachine
from runner.pool.options import PoolOptions
from tests.unit.pool_driver import GID, Pool, ok

INPUT_S = 0.05


@pytest.mark.parametrize("workers", [4, 1_000, 10_000])
def test_no_input_starts_later_than_a_period_and_a_half_after_a_failure(workers: int) -> None:
    """A pool of ``workers`` (up to 8 of them stepped here: the period is each worker's
    own, from the options): 400 inputs of 50 ms per region, 20 s of work. Another worker
    fails an input 5 s in and writes the stop record; each worker finishes the input it
    runs (no ``cancel_running_on_fail``) and starts none after it has read the record.
    A period that grew with the pool (``workers / 500`` s) let each worker of a pool of
    10,000 start inputs for 20 s after a failure (400 of them, 50 ms each)."""
    starts: list[float] = []

    def run(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        starts.append(pool.now)
        return (INPUT_S, *ok(index))

    options = PoolOptions(
        total=400 * workers, chunk_size=64, workers=workers, fail_fast=True, lease_s=30.0
    )
    pool = Pool(options, run)
    for k in range(min(8, workers)):
        pool.start(f"w{k}", ordinal=k, spread_start=False)  # 8 of them: no herd
    failed_at = pool.now + 5.0
    pool.step_until(failed_at)
    record = protocol.stop_record("fail_fast", "input 99 failed")
    pool.store.objects[protocol.group_stop_key(GID)] = protocol.dump_json(record)
    pool.step_until()
    assert set(pool.exits.values()) == {"stopped"}
    assert max(starts) - failed_at <= 1.5 * STOP_EVERY
    # The cost: a read a second per worker, whatever the pool's size (0.05 per 50 ms
    # input; the few claims read count here too).
    reads = sum(m.counts.get("Read", 0) for m in pool.machines.values())
    assert reads / len(starts) <= 0.1


@pytest.mark.parametrize("workers", [1, 500, 2_000, 10_000])
def test_every_worker_reads_the_stop_record_once_a_period_whatever_the_pools_size(
    workers: int,
) -> None:
    machine = WorkerMachine(PoolOptions(total=100_000, chunk_size=64, workers=workers), GID, "w")
    assert machine.stop_every == STOP_EVERY == 1.0
