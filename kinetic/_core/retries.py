"""Retries (``kinetic.run(retries=...)``, ``run_async_map(retries=...)``): the public
shape and its record. Pure.

Where retries live: in the job's runner, in the job's own process. A failed attempt
whose exception matches ``on`` is run again after a delay (``initial_delay``, times
``backoff`` for each later one), with the same unpickled function and arguments, so a
retry costs no submission, no new process and no client: a job retries even when its
submitter is gone. The job keeps one id and one handle across its attempts. The runner
records every failed attempt (number, start and end times, error and its type) in
``{job_id}/attempts.json`` while it runs, and in the final record (``status.json``:
``attempt``, the one that settled it, and ``attempts``, the earlier ones), which
``status_report()`` and ``kinetic jobs status`` show.

What is retried: an exception of the function (phase ``execute``) whose type is, or
derives from, one of ``on`` (by qualified name: the runner has the exception, not the
caller's classes). Never: a failure before the function runs (fetch, install, ...: the
same again), a run-time limit (``timeout=``), a cancel, ``SystemExit`` or
``KeyboardInterrupt`` unless named in ``on``. Every runner applies the one rule of
:mod:`runner.retry_rule`.

Batches: each input retries alike. ``run(retries=)`` is the default of the function's
batches, ``run_async_map(retries=)`` overrides it: a :class:`Retries` is recorded in the
manifest's ``options`` (``retries``, the count every reader takes, and ``retry_rule``),
and every batch runner applies it (:mod:`runner.retry_rule`): the local batch engine
runs a failed input again after its delay without holding a worker meanwhile; a GKE
pool's worker waits the delay in place, holding the input's span; a pod per input waits
it in the retry's pod. A plain number there keeps its older meaning: that many extra
attempts, at once, for any failure (a worker's death included).

A single GKE job whose pod is lost mid-attempt (preempted, evicted) goes on in a new
pod, that attempt counted as failed whatever ``on`` names (:mod:`runner.preemption`).

Not yet: multi-host (pathways) jobs are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kinetic._exceptions import ConfigError
from runner import protocol

__all__ = ["Retries", "check_retries", "retries_record"]


@dataclass(frozen=True)
class Retries:
    """How a failed job is run again: ``kinetic.run(retries=Retries(3, on=(IOError,)))``.

    :param count: extra attempts after the first (``retries=N`` is ``Retries(N)``).
    :param backoff: each delay is the previous one times this (``>= 1``).
    :param initial_delay: seconds before the first retry (``>= 0``).
    :param on: exception types retried (and their subclasses); default every
        ``Exception``. Matched by qualified name (``module.QualName``) in the job.
    """

    count: int
    backoff: float = 2.0
    initial_delay: float = 1.0
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ConfigError(f"Retries count must be a non-negative integer, got {self.count!r}")
        if not _number(self.backoff) or not self.backoff >= 1:
            raise ConfigError(f"Retries backoff must be a number >= 1, got {self.backoff!r}")
        if not _number(self.initial_delay) or not self.initial_delay >= 0:
            raise ConfigError(
                f"Retries initial_delay must be a number of seconds >= 0, "
                f"got {self.initial_delay!r}"
            )
        on = self.on
        if isinstance(on, type):
            on = (on,)
            object.__setattr__(self, "on", on)
        if not isinstance(on, tuple) or not on:
            raise ConfigError(f"Retries on must be a tuple of exception types, got {on!r}")
        for kind in on:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise ConfigError(f"Retries on must hold exception types, got {kind!r}")

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1 for the first)."""
        return float(self.initial_delay * self.backoff ** (retry - 1))


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def check_retries(value: Any) -> Retries | None:
    """``run(retries=)``: None or 0 (no retries), a count, or a :class:`Retries`.

    :raises ConfigError: anything else (a negative count, a string).
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return None
    if isinstance(value, Retries):
        return value if value.count else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"retries must be a number of extra attempts or a kinetic.Retries, got {value!r}"
        )
    return Retries(value)


def type_name(kind: type[BaseException]) -> str:
    """A type's qualified name, as the runner records an exception's (``error_type``)."""
    return f"{kind.__module__}.{kind.__qualname__}"


def retries_record(retries: Retries) -> protocol.RetriesRecord:
    """What the job's spec says of its retries (the runner applies them)."""
    return {
        "count": retries.count,
        "backoff": float(retries.backoff),
        "initial_delay": float(retries.initial_delay),
        "on": [type_name(kind) for kind in retries.on],
    }
