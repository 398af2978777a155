"""What is known of a batch run by a worker pool, and what a worker does next. Pure.

Shared by the workers (:mod:`runner.pool`) and the processes that follow the batch
(:mod:`kinetic._core.pool_plan`, whose docstring tells the whole protocol). Standard
library only, no IO, no clock: times are passed in.

Per input, storage holds at most an outcome (``results/{index}.res``: done) and claims
(``claims/{index}.{n}``, each holding until the wall-clock time it carries). An input is
*done* with an outcome; *running* while its latest claim holds; *expired* when that
claim's lease ran out (its worker died): claim ``n + 1`` takes it over, unless it had
``max_claims`` claims already — then it is failed, not run again; *free* otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner import protocol

LEASE_WAIT_MAX = 5.0
"""Longest a waiting worker sleeps before it looks at storage again."""


@dataclass(frozen=True)
class PoolOptions:
    """What the manifest says about running the batch.

    :ivar total: number of inputs.
    :ivar chunk_size: inputs per stored chunk.
    :ivar workers: pods in the pool (``max_concurrent``).
    :ivar retries: extra attempts of an input that failed (run by the same worker).
    :ivar fail_fast: stop the batch after the first final failure.
    :ivar cancel_running_on_fail: with ``fail_fast``, end the running inputs too.
    :ivar lease_s: seconds a claim holds without renewal.
    :ivar max_claims: claims of one input after which it is failed, not run again.
    """

    total: int
    chunk_size: int
    workers: int = 1
    retries: int = 0
    fail_fast: bool = False
    cancel_running_on_fail: bool = False
    lease_s: float = protocol.POOL_LEASE_SECONDS
    max_claims: int = 3

    @classmethod
    def from_manifest(cls, manifest: protocol.BatchManifest) -> PoolOptions:
        options = manifest["options"]
        retries = int(options["retries"])
        gke = manifest.get("gke")
        lease_s = gke.get("lease_s") if gke is not None else None
        max_claims = gke.get("max_claims") if gke is not None else None
        return cls(
            total=int(manifest["total"]),
            chunk_size=max(1, int(manifest["chunk_size"])),
            workers=max(1, int(options["max_concurrent"])),
            retries=retries,
            fail_fast=bool(options["fail_fast"]),
            cancel_running_on_fail=bool(options["cancel_running_on_fail"]),
            lease_s=float(lease_s or protocol.POOL_LEASE_SECONDS),
            max_claims=int(max_claims or retries + 1 + protocol.POOL_MAX_CLAIMS_EXTRA),
        )


@dataclass(frozen=True)
class Claim:
    """The latest claim of an input: number ``number`` (0 first), held by ``worker``
    until ``expires`` (wall clock)."""

    index: int
    number: int
    worker: str
    expires: float


def stop_kills(stop: protocol.StopRecord, options: PoolOptions) -> bool:
    """Whether a stop record ends running inputs too (else they finish first)."""
    reason = stop.get("reason")
    return reason != "fail_fast" or options.cancel_running_on_fail


class PoolBook:
    """What is known of one pool batch's inputs (see the module docstring).

    Only grows: an outcome, a claim or the stop record, once learned, is never
    forgotten (storage never takes them back while the batch lives).
    """

    def __init__(self, options: PoolOptions) -> None:
        self.options = options
        self.outcomes: dict[int, str] = {}
        self.claims: dict[int, Claim] = {}
        self.stop: protocol.StopRecord | None = None
        self.changes = 0
        """How many facts were learned: a follower's measure of progress."""
        n_chunks = -(-options.total // options.chunk_size)
        # Free inputs per chunk: neither claimed nor done, as far as we know.
        self._free: dict[int, set[int]] = {
            c: set(range(c * options.chunk_size, min(options.total, (c + 1) * options.chunk_size)))
            for c in range(n_chunks)
        }
        self._free_chunks = {c for c, free in self._free.items() if free}

    # -- learning ----------------------------------------------------------------------

    def _take(self, index: int) -> None:
        chunk = index // self.options.chunk_size
        free = self._free.get(chunk)
        if free is not None:
            free.discard(index)
            if not free:
                self._free_chunks.discard(chunk)

    def learn_outcome(self, index: int, state: str) -> bool:
        """Record that input ``index`` ended in ``state``; True when that is news."""
        if index in self.outcomes or not 0 <= index < self.options.total:
            return False
        self.outcomes[index] = state
        self.claims.pop(index, None)
        self._take(index)
        self.changes += 1
        return True

    def learn_claim(self, claim: Claim) -> bool:
        """Record a claim (kept if it is the input's latest); True when that is news."""
        if claim.index in self.outcomes or not 0 <= claim.index < self.options.total:
            return False
        known = self.claims.get(claim.index)
        if known is not None and (known.number, known.expires) >= (claim.number, claim.expires):
            return False
        self.claims[claim.index] = claim
        self._take(claim.index)
        self.changes += 1
        return True

    def learn_stop(self, record: protocol.StopRecord) -> None:
        if self.stop is None:
            self.stop = record.copy()  # a copy: the caller's may change

    # -- reading -----------------------------------------------------------------------

    @property
    def settled(self) -> bool:
        """Every input has an outcome."""
        return len(self.outcomes) >= self.options.total

    def running(self, wall: float) -> list[int]:
        """Inputs whose latest claim holds at ``wall`` and that have no outcome."""
        return sorted(i for i, c in self.claims.items() if c.expires > wall)

    def expired(self, wall: float) -> list[Claim]:
        """Latest claims whose lease ran out at ``wall``, of inputs with no outcome."""
        return sorted((c for c in self.claims.values() if c.expires <= wall), key=lambda c: c.index)

    def free_in(self, chunk: int) -> int | None:
        """The lowest free input of ``chunk``, or None."""
        free = self._free.get(chunk)
        return min(free) if free else None

    def free_chunks(self) -> list[int]:
        """Chunks with free inputs, in order."""
        return sorted(self._free_chunks)


# --- the worker's step ---------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Create claim ``number`` of input ``index`` (0: a free input; more: a takeover of an
    expired claim); if that wins, run the input, else learn the claim and step again."""

    index: int
    number: int


@dataclass(frozen=True)
class GiveUp:
    """Create claim ``number`` of input ``index`` and, if that wins, record its failure
    without running it: ``reason`` says why."""

    index: int
    number: int
    reason: str


@dataclass(frozen=True)
class Wait:
    """Nothing to take now: look at storage again after ``seconds``."""

    seconds: float


@dataclass(frozen=True)
class Exit:
    """Nothing is left for this worker: ``reason`` is ``"done"`` or ``"stopped"``."""

    reason: str


WorkerAction = Run | GiveUp | Wait | Exit


def worker_step(book: PoolBook, *, wall: float, chunk: int | None, pick: float) -> WorkerAction:
    """What a worker does next.

    :param wall: the wall-clock time now.
    :param chunk: the chunk the worker holds in memory (its inputs come first), or None.
    :param pick: a number in [0, 1) chosen at random by the caller: which chunk to move
        to when its own has nothing free (spreads workers over chunks).
    """
    if book.stop is not None:
        return Exit("stopped")
    if book.settled:
        return Exit("done")
    if chunk is not None:
        index = book.free_in(chunk)
        if index is not None:
            return Run(index, 0)
    chunks = book.free_chunks()
    if chunks:
        target = chunks[min(len(chunks) - 1, int(pick * len(chunks)))]
        index = book.free_in(target)
        assert index is not None
        return Run(index, 0)
    expired = book.expired(wall)
    if expired:
        claim = expired[min(len(expired) - 1, int(pick * len(expired)))]
        number = claim.number + 1
        if number >= book.options.max_claims:
            return GiveUp(
                claim.index,
                number,
                f"input {claim.index} lost its worker {number} times "
                f"(last: {claim.worker}); not run again",
            )
        return Run(claim.index, number)
    # Every unsettled input is held by a live claim: wait for the first lease to end.
    soonest = min((c.expires for c in book.claims.values()), default=wall)
    return Wait(max(0.0, min(LEASE_WAIT_MAX, soonest - wall)))


def claim_record(worker: str, expires: float) -> bytes:
    """The bytes of a claim object."""
    record: protocol.ClaimRecord = {"worker": worker, "expires": expires}
    return protocol.dump_json(record)


def parse_claim(index: int, number: int, data: bytes) -> Claim:
    """A claim from its object's bytes. Writes are atomic, so an unreadable object is
    not ours: it counts as an expired claim (taken over, never trusted)."""
    try:
        record = protocol.load_json(data)
        return Claim(index, number, str(record["worker"]), float(record["expires"]))
    except (ValueError, KeyError, TypeError):
        return Claim(index, number, "?", 0.0)
