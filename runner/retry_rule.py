"""Whether a failed attempt runs again, and after what delay: one rule for every runner. Pure.

A single job's runner (:mod:`runner._main`, the spec's ``retries``) and the local batch
engine (:mod:`runner.batch`, the manifest's ``options``) ask the same
:class:`RetryRule`; nothing here sleeps, reads a clock or touches storage: the runner
that asks does the waiting.

The rule is asked about failures of the function only (phase ``execute``): a failure
before the function runs (fetch, install, ...) would fail the same way again, and a
cancel ends the input or job, never a retry. Then:

* an attempt is retried while retries are left (``count`` extra attempts in all);
* never after its run-time limit (:class:`~runner.time_limit.TimeLimitExceeded`);
* with ``on`` (a ``kinetic.Retries``), only when the exception's type, or one of its
  bases, is named there by qualified name (``module.QualName``): the runner has the
  exception, not the caller's classes. A process that died without an exception (a
  batch worker killed mid-input) is no match;
* without ``on`` (a batch's plain ``retries=N``, as recorded before ``kinetic.Retries``
  reached batches), every failure is retried, a dead worker's input included, at once.

Retry ``n`` (1 for the first) waits ``initial_delay * backoff ** (n - 1)`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner import protocol
from runner.time_limit import TimeLimitExceeded

__all__ = ["NO_RETRIES", "RetryRule", "type_names"]


@dataclass(frozen=True)
class RetryRule:
    """How a failed attempt is run again (module docstring).

    :ivar count: extra attempts after the first.
    :ivar backoff: each delay is the previous one times this.
    :ivar initial_delay: seconds before the first retry.
    :ivar on: qualified names of the exception types retried (their subclasses too);
        None: every failure (a plain count).
    """

    count: int
    backoff: float = 1.0
    initial_delay: float = 0.0
    on: frozenset[str] | None = None

    @classmethod
    def of_record(cls, record: protocol.RetriesRecord | None) -> RetryRule:
        """The rule a job's spec (``retries``) or a batch's options (``retry_rule``) say."""
        if record is None:
            return NO_RETRIES
        return cls(
            count=int(record["count"]),
            backoff=float(record["backoff"]),
            initial_delay=float(record["initial_delay"]),
            on=frozenset(record["on"]),
        )

    @classmethod
    def of_batch(cls, options: protocol.MapOptionsRecord) -> RetryRule:
        """A batch's rule: its ``retry_rule`` when recorded, else the plain count
        ``retries`` (every manifest has it; older ones have nothing else)."""
        record = options.get("retry_rule")
        if record is not None:
            return cls.of_record(record)
        return cls(count=int(options["retries"]))

    def delay_after(self, retries_made: int, error: BaseException | None) -> float | None:
        """Seconds to wait before running again an attempt that failed with ``error``
        (None: its process died without one) after ``retries_made`` retries (0 after
        the first attempt); None when it is not run again: its failure is final."""
        return self.delay_after_types(
            retries_made, None if error is None else type_names(type(error))
        )

    def delay_after_types(self, retries_made: int, types: frozenset[str] | None) -> float | None:
        """:meth:`delay_after` for an error known by :func:`type_names` of its type (where
        the attempt ran in another process: a pool batch's input); None: no exception."""
        if retries_made >= self.count or (types is not None and TIME_LIMIT in types):
            return None
        if self.on is not None and (types is None or types.isdisjoint(self.on)):
            return None
        return self.delay(retries_made + 1)

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1 for the first)."""
        return float(self.initial_delay * self.backoff ** (retry - 1))


TIME_LIMIT = f"{TimeLimitExceeded.__module__}.{TimeLimitExceeded.__qualname__}"
"""The qualified name of a run-time limit's exception: never retried."""

NO_RETRIES = RetryRule(count=0)
"""A job or batch that does not retry."""


type_names = protocol.exception_type_names
"""The qualified names of a type and its bases: what ``on`` is matched against."""
