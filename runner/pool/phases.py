"""Where a worker out of work stands in its search for more (:mod:`runner.pool.search`).
Pure.

The protocol as a whole is told in ``docs/pool-protocol.md`` ("Looking for work").
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    """Where a worker out of work stands in its search for more."""

    UNLISTED = "unlisted"
    """It won a claim last (or just started), and the claims were not listed since: out
    of its region, it lists them first (in a large pool its first look waits)."""
    WALKING = "walking"
    """The claims are listed: it walks other regions' chains for a span to claim; a
    full look follows once none offers one."""
    RESTED = "rested"
    """It slept with nothing to claim (or waited to spread a large pool's first looks,
    or finished a dead worker's rest): its next step is a look, a quick one while its
    last full look is recent."""
    LOOKED = "looked"
    """A full look (bursts, outcomes and claims listed): it takes over an expired claim,
    reads a sample of claims that may have expired, else sleeps."""
    QUICK = "quick"
    """A quick look (the holes listed): it joins a hole, takes over an expired claim,
    reads a claim that may have expired, else sleeps."""
