"""The rates a pool's workers keep to, and the rations that keep them there: a bucket
takes about 5,000 reads and 1,000 writes a second at first (more as its load stays),
and a 429 stalls its worker a second or more. The writes' rate (claims and bursts) is
:data:`runner.pool.options.CLAIMS_PER_S`'s; the reads' is here. The cost per input is
told in ``docs/pool-protocol.md``.
"""

STOP_EVERY = 1.0
"""Seconds between two reads of the stop record by a worker, whatever the pool's size:
the bound on how late a stop (``fail_fast``, a cancel) is seen. A worker reads it
before it starts an input once the period is over, so no input starts later than
1.5 periods after the record is durable (the first period is spread from a half to one
and a half), one period once the worker has read it before, plus a read's time — 1.5 s
at 4 workers as at 10,000. The cost is a read a second per worker: ``input time /
STOP_EVERY`` reads per input (0.05 for 50 ms inputs), and a pool of ``W`` workers reads
the record ``W`` times a second, a fifth of a bucket's starting read rate (about
5,000/s) at 1,000 workers; a larger pool leans on the rate GCS grants a bucket as its
load grows. (A period that grew with the pool kept its reads flat, but let a pool of
10,000 workers start inputs for 20 s after a failure.)"""
SAMPLE = 4
"""Claims a worker with nothing to do reads per look, to find one whose lease ran out
(a sample: a thousand idle workers must not each read every claim)."""
WALK_READS = 4000
"""Claims the whole pool may read in one look each for work outside their regions (to
learn where a region's chain of spans ends): a worker reads ``WALK_READS / workers``
per look, at least :data:`SAMPLE`, then sleeps. At a batch's tail a thousand idle
workers would otherwise each walk every region's chain while the work left is a few
spans, past the bucket's 5,000 reads a second."""
IDLE_READS_PER_S = 2000
"""Reads a second (a listing costs one per page of :data:`PAGE` names) that the pool's
idle workers make at most together: two fifths of what a bucket takes at first. An idle
worker sleeps ``workers x its reads since it last slept idle / IDLE_READS_PER_S`` (at
most :data:`~runner.pool.options.LEASE_WAIT_MAX`; a worker just out of work counts its
spans' upkeep reads too, so its first idle sleep is the longer): at a large batch's
tail, hundreds of idle workers looking every quarter second would starve the reads of
the workers still running, and a 429 stalls those for a second or more. A dead worker's span is still
found soon: each look reads a few claims that may have expired (:data:`SAMPLE`), and
with hundreds of idle workers one of them looks every few milliseconds."""
PAGE = 1000
"""Names in a page of a listing (the storage's)."""
QUICK_VISITS = 1
"""Holes whose claims an idle worker of a :attr:`~runner.pool.options.PoolOptions.large`
pool lists in a *quick* look. Such a worker lists every claim, burst and outcome (a
*full* look, which also reads :data:`SAMPLE` claims that may have expired) only as
often as half of :data:`IDLE_READS_PER_S` allows. In between it makes quick looks,
rationed by the other half: a listing of the cut takeovers (``holes/``, a few names
that tell each hole's slots and age), then the claims of one hole with slots not known
to be claimed (the newest mostly) and a claim of one of its free slots, else
:data:`QUICK_SAMPLE` claims that may have expired. A look that cheap comes several
times as often as a full one: a dead worker's rest is joined within a second, and its
expired claim found as soon; and ``holes/settled`` there tells that the batch is done."""
FIRST_LOOK_READS = 8
"""Reads budgeted for each worker's first look when a large pool runs out of work: a
worker that ran inputs waits ``pick x workers x FIRST_LOOK_READS /``
:data:`IDLE_READS_PER_S` seconds (at most :data:`~runner.pool.options.LEASE_WAIT_MAX`: 4 s
at 1,000 workers) before it looks. A first look lists every claim, burst and outcome
(pages of :data:`PAGE` names) and reads a few claims, a dozen reads or more; a thousand
of them within a second are three times the reads a bucket takes at first, and a 429
stalls each worker still running for a second or more."""
QUICK_SAMPLE = 1
"""Claims that may have expired read in a quick look."""
HOLE_SLOTS = 8
"""Parts a large pool's takeover cuts a dead worker's rest into at least (its own part
and its hole's slots, each at most ``rest / HOLE_SLOTS``, rounded up). Sized as a fresh
span alone they held a second of work or more (a worker's outcomes known as of its last
full look make the work left look large), and the takeovers of the spans whose leases
end last run while every other worker is idle: the batch ended a slot's time after
them."""
IDLE_FIRST = 0.25
"""Seconds a worker with nothing to do first sleeps before it looks again (doubling)."""
