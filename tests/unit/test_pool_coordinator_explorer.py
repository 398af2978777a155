"""The coordinated pool's coordinator under the seeded fault explorer
(tests/unit/coordinator_explorer.py): workers killed and paused, connections dropped,
the coordinator crashed and restarted from its commits, commit answers lost, cancels
of the batch and of one input (a reader's object of its own, listed later by the
coordinator), and ``fail_fast``; the invariants checked after every step and at the end.

``KINETIC_COORDINATOR_SEEDS`` sets how many seeds run (default 2,000); a failing seed
is named, and ``explore(seed)`` replays it exactly.
"""

from __future__ import annotations

import os

from tests.unit.coordinator_explorer import explore

SEEDS = int(os.environ.get("KINETIC_COORDINATOR_SEEDS", "2000"))


def test_every_seed_keeps_the_invariants() -> None:
    failures: list[str] = []
    crashes = restarts = late = stopped = reruns = cancels = 0
    for seed in range(SEEDS):
        try:
            run = explore(seed)
        except AssertionError as exc:
            failures.append(str(exc))
            continue
        crashes += run.crashes
        restarts += run.coordinator_crashes
        late += run.late_commits
        stopped += run.stopped is not None
        reruns += any(n > 1 for n in run.runs.values())
        cancels += len(run.cancelled)
    assert not failures, "\n".join(failures[:20])
    # The faults were met, not dodged.
    assert crashes >= SEEDS // 5
    assert restarts >= SEEDS // 4
    assert late >= SEEDS // 50
    assert stopped >= SEEDS // 20
    assert reruns >= SEEDS // 10
    assert cancels >= SEEDS // 10


def test_a_seed_replays_exactly() -> None:
    first, again = explore(7), explore(7)
    assert first.commits == again.commits
    assert first.runs == again.runs
