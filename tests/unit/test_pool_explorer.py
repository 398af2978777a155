"""The pool protocol under the seeded fault explorer (tests/unit/pool_explorer.py): real
worker machines over a store with generations, their requests delayed past leases,
answers lost, workers paused and crashed, clocks skewed, every write refused in 429
storms; the invariants checked after every step and at the end.

``KINETIC_POOL_SEEDS`` sets how many seeds run (default 2,000: seconds); a failing seed
is named, and ``explore(seed)`` replays it exactly.
"""

from __future__ import annotations

import os

from tests.unit.pool_explorer import explore

SEEDS = int(os.environ.get("KINETIC_POOL_SEEDS", "2000"))


def test_every_seed_keeps_the_invariants() -> None:
    failures: list[str] = []
    crashes = takeovers = storms = storm_kills = 0
    for seed in range(SEEDS):
        try:
            run = explore(seed)
        except AssertionError as exc:
            failures.append(f"{exc} (replay: explore({seed}))")
            continue
        crashes += run.crashes
        takeovers += run.takeovers()
        storms += bool(run.storm_writes)
        storm_kills += run.storm_kills
    assert not failures, "\n".join(failures[:20])
    # The faults were met, not dodged: workers died, and others took their spans over.
    assert crashes >= SEEDS // 2
    assert takeovers >= SEEDS // 2
    # 429 storms refused writes in many runs, and outlasted some workers' patience.
    assert storms >= SEEDS // 10
    assert storm_kills >= SEEDS // 100


def test_a_seed_replays_exactly() -> None:
    first, again = explore(7), explore(7)
    assert first.objects == again.objects
    assert first.log == again.log
