"""The coordinated pool: one writer per batch that hands out spans and commits outcomes.

Issue 38 measured two designs of the GKE pool on the same simulated runs
(``benchmarks/README.md``, "Stop 48"; ``docs/pool-protocol.md``, "The coordinator's
design, compared"): the leaderless pool of :mod:`runner.pool` and a coordinator's. The
coordinator met the goal at every size with four knobs against about seventeen. This
package builds it, in layers:

* :mod:`.queue`: which inputs are left to hand out, and how many at a time (pure);
* :mod:`.ledger`: the outcomes heard, which are durable, whom to acknowledge (pure);
* :mod:`.commits`: the names and bytes of the commit objects in storage (pure);
* :mod:`.core`: the coordinator's decisions as a sans-IO state machine, tying the
  three together; its invariants are told there and checked by a seeded explorer
  (``tests/unit/test_pool_coordinator_explorer.py``).

Nothing is imported here.
"""
