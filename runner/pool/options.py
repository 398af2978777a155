"""What the manifest says about running a pool batch, the constants that size its
work, and how many inputs a worker claims next. Pure, standard library only.

The protocol as a whole is told in ``docs/pool-protocol.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runner import protocol
from runner.retry_rule import RetryRule

LEASE_WAIT_MAX = 5.0
"""Longest a waiting worker sleeps before it looks at storage again."""
SPAN_SECONDS = 2.0
"""Work a span holds at most, by the worker's measure of its inputs: a longer span
would make the batch's tail wait on one worker."""
FIRST_SPAN = 4
"""The first span of a worker (it knows nothing of its inputs' speed yet); each span it
finishes doubles the next one's limit."""
MAX_SPAN = 4096
BURST_MAX = 512
"""Outcomes in one burst at most."""
BURST_SECONDS = 1.0
"""A burst is written this long after its first outcome, give or take
:data:`BURST_SPREAD` of it."""
BURST_SPREAD = 0.25
"""The share of :data:`BURST_SECONDS` by which a worker's pick moves its bursts: a pool's
workers start together, and their bursts would all be due at once, past the bucket's
write limit."""
LARGE_RESULT = 1 << 20
"""Payloads above this many bytes get an object of their own instead of a burst record."""
OBJECT_GAP_S = 1.0
"""Seconds between two writes of one object at least: GCS refuses more than one write a
second per object name (a claim renewed again right after a late renewal landed)."""
START_SPREAD_WORKERS = 80
"""Workers up to which a pool's start is not spread (:meth:`PoolOptions.start_wait`):
their first reads and creates pass within the bucket's burst and its next tenth of a
second."""
CLAIMS_PER_S = 400
"""Claims a second that a whole pool should create at most, and likewise bursts: a
bucket takes about 1,000 writes a second at first, and a 429 costs its worker a second
or more of back-off. A pool so large that :data:`SPAN_SECONDS` and
:data:`BURST_SECONDS` would ask more stretches both (:attr:`PoolOptions.span_seconds`,
:attr:`PoolOptions.burst_seconds`): 2.5 s at 1,000 workers, 25 s at 10,000."""


@dataclass(frozen=True)
class PoolOptions:
    """What the manifest says about running the batch.

    :ivar total: number of inputs.
    :ivar chunk_size: inputs per stored chunk.
    :ivar workers: pods in the pool (``max_concurrent``).
    :ivar retries: extra attempts of an input that failed (run by the same worker).
    :ivar retry_rule: a ``kinetic.Retries`` (its delays and exception types), else None:
        the plain count, any failure run again at once (:attr:`rule`).
    :ivar fail_fast: stop the batch after the first final failure.
    :ivar cancel_running_on_fail: with ``fail_fast``, end the running inputs too.
    :ivar lease_s: seconds a claim holds without renewal.
    :ivar max_claims: claims of one input after which it is failed, not run again.
    :ivar reuse_process: run inputs in the worker's own process instead of a fork each.
    :ivar burst_max: outcomes per burst at most; :ivar burst_s: seconds a burst waits.
    :ivar span_s: seconds of work per span at most.
    :ivar claims_per_s: claims (and bursts) a second the whole pool aims to stay under
        (:data:`CLAIMS_PER_S`; a simulation that dilates time lowers it).
    :ivar object_gap_s: seconds between two writes of one claim at least
        (:data:`OBJECT_GAP_S`; a simulation that dilates time lengthens it).
    """

    total: int
    chunk_size: int
    workers: int = 1
    retries: int = 0
    fail_fast: bool = False
    cancel_running_on_fail: bool = False
    lease_s: float = protocol.POOL_LEASE_SECONDS
    max_claims: int = 3
    reuse_process: bool = False
    burst_max: int = BURST_MAX
    burst_s: float = BURST_SECONDS
    span_s: float = SPAN_SECONDS
    claims_per_s: float = CLAIMS_PER_S
    object_gap_s: float = OBJECT_GAP_S
    retry_rule: RetryRule | None = None

    @classmethod
    def from_manifest(cls, manifest: protocol.BatchManifest) -> PoolOptions:
        options = manifest["options"]
        retries = int(options["retries"])
        rule = options.get("retry_rule")
        gke = manifest.get("gke")
        lease_s = gke.get("lease_s") if gke is not None else None
        max_claims = gke.get("max_claims") if gke is not None else None
        reuse = gke.get("reuse_process") if gke is not None else None
        return cls(
            total=int(manifest["total"]),
            chunk_size=max(1, int(manifest["chunk_size"])),
            workers=max(1, int(options["max_concurrent"])),
            retries=retries,
            fail_fast=bool(options["fail_fast"]),
            cancel_running_on_fail=bool(options["cancel_running_on_fail"]),
            lease_s=float(lease_s or protocol.POOL_LEASE_SECONDS),
            max_claims=int(max_claims or retries + 1 + protocol.POOL_MAX_CLAIMS_EXTRA),
            reuse_process=bool(reuse),
            retry_rule=None if rule is None else RetryRule.of_record(rule),
        )

    @classmethod
    def of_pool_size(cls, workers: int) -> PoolOptions:
        """The options a worker knows before it reads the manifest: its pool's size
        (``KINETIC_POOL_WORKERS``, the Job's) and the constants; enough for
        :meth:`start_wait`, not for claiming."""
        return cls(total=0, chunk_size=1, workers=max(1, workers))

    def start_wait(self, ordinal: int | None, pick: float, rate: float | None = None) -> float:
        """How long a worker waits after its pod starts before its first storage request
        (the batch's manifest, stop record, function and context, then its first claim).

        A pool's workers start together: their reads in the same tenth of a second
        would meet the bucket's read limit (at 1,000 workers, 600 of the 1,000 manifest
        reads were refused), their first creates its write limit, and a 429 costs a
        worker a second or more of back-off. Up to :data:`START_SPREAD_WORKERS` workers
        no wait; else spread over ``workers / (2 x claims_per_s)`` (0.375 s at 300
        workers, 1.25 s at 1,000): no outcome is due yet, so the first claims take the
        bursts' share of the rate too, and the second claims and first bursts come
        after the first wave (:attr:`first_span`). Worker ``k`` of an Indexed Job waits
        ``(k + pick) / workers`` of it, so the pool's requests come evenly paced; a
        worker with no ordinal waits ``pick`` of it.

        :param ordinal: the worker's completion index, or None.
        :param pick: a random number in [0, 1).
        :param rate: workers a second the start admits; default ``2 x claims_per_s``
            (a coordinated pool's start costs a worker one read:
            :data:`runner.pool.coordinator.worker.START_PER_S`).
        """
        if not self.spread_start:
            return 0.0
        slot = pick if ordinal is None else (ordinal % self.workers + pick) / self.workers
        return slot * self.workers / (2 * self.claims_per_s if rate is None else rate)

    @property
    def first_span(self) -> int:
        """The first span's limit (the ramp's start, while the inputs' speed is
        unknown): :data:`FIRST_SPAN`, four times that in a pool whose start is spread
        (:meth:`start_wait`). Its second claims and first bursts would come four quick
        inputs after the first claims, within the same wave (at 300 workers of 50 ms
        inputs, 170 refused writes and a worker stalled a second behind each)."""
        return 4 * FIRST_SPAN if self.spread_start else FIRST_SPAN

    @property
    def spread_start(self) -> bool:
        """Whether the pool's start is spread (:meth:`start_wait`): it has more than
        :data:`START_SPREAD_WORKERS` workers."""
        return self.workers > START_SPREAD_WORKERS

    @property
    def rule(self) -> RetryRule:
        """Whether, and when, a failed input runs again (:mod:`runner.retry_rule`)."""
        return self.retry_rule if self.retry_rule is not None else RetryRule(self.retries)

    @property
    def span_seconds(self) -> float:
        """Work a span holds at most: :attr:`span_s`, longer in a pool so large that its
        spans would ask more than :attr:`claims_per_s` claims a second."""
        return max(self.span_s, self.workers / self.claims_per_s)

    @property
    def burst_seconds(self) -> float:
        """How long a burst waits at most: :attr:`burst_s`, longer in a pool so large
        that its bursts would be more than :attr:`claims_per_s` writes a second."""
        return max(self.burst_s, self.workers / self.claims_per_s)

    @property
    def large(self) -> bool:
        """A pool whose write rate binds: first spans are a share of their region, not
        :data:`FIRST_SPAN` (a thousand workers claiming again after 4 quick inputs would
        all meet the bucket's limit at once)."""
        return self.workers / self.claims_per_s > self.span_s

    @property
    def regions(self) -> int:
        return max(1, min(self.workers, self.total))

    def region(self, r: int) -> tuple[int, int]:
        """Inputs ``[lo, hi)`` of region ``r``."""
        n, total = self.regions, self.total
        return r * total // n, (r + 1) * total // n

    def region_of(self, index: int) -> int:
        """The region input ``index`` lies in."""
        # Inline arithmetic: an idle worker's look asks this a few thousand times.
        n, total = self.regions, self.total
        r = min(n - 1, index * n // max(1, total))
        while r * total // n > index:  # integer rounding: at most one step either way
            r -= 1
        while (r + 1) * total // n <= index:
            r += 1
        return r


def span_size(
    options: PoolOptions,
    *,
    ramp: int,
    mean_s: float | None,
    free: int,
    region_left: int,
) -> int:
    """How many inputs a worker claims next (at least one).

    :param ramp: the worker's current limit (:data:`FIRST_SPAN`, doubled per span).
    :param mean_s: seconds the worker's inputs took on average, or None (none yet).
    :param free: inputs no claim covers, as far as the worker knows (whole batch).
    :param region_left: inputs left in the region the span would start in.

    In a :attr:`~PoolOptions.large` pool a worker's first span is its whole region: a
    thousand workers claiming again after a few quick inputs would all meet the
    bucket's write limit at once (and a 429 costs a worker a second or more).
    """
    if mean_s is None and options.large:
        return max(1, region_left)
    size = min(ramp, MAX_SPAN, region_left)
    paced = (
        mean_s is not None
        and mean_s > 0
        and (options.large or options.workers > options.claims_per_s * mean_s)
    )
    if mean_s is not None and mean_s > 0:
        if paced:
            # Once the speed is known, not so short a span that the pool would claim
            # faster than its claim rate (its workers each claiming every ``size x
            # mean_s`` s), whatever the ramp: 300 workers of 50 ms inputs claiming
            # every 4 inputs would be 1,500 creates a second.
            size = max(size, math.ceil(options.workers / (options.claims_per_s * mean_s)))
        size = min(size, int(options.span_seconds / mean_s), region_left)
    # Guided self-scheduling: never more than a share of what is left, so the last
    # spans are short and every worker finishes near the same time.
    share = -(-free // (2 * options.workers))
    if paced and mean_s is not None:
        # ... but, where the claim rate binds, not so short that the spans left would
        # be claimed faster than it: ``free / size`` claims in ``size * mean_s`` s.
        share = max(share, math.ceil(math.sqrt(free / (options.claims_per_s * mean_s))))
    size = min(size, share)
    return max(1, min(size, region_left))
