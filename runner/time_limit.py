"""A job's run-time limit (``kinetic.run(timeout=SECONDS)``), enforced by its runner.

The limit bounds phase ``execute``: the user's function, from its call to its return.
Fetching, installing and unpacking before it are not counted (on GKE a backstop
counts them too: the Job's ``activeDeadlineSeconds``, see
:func:`kinetic._core.k8s_spec.job_manifest`).

How it is enforced, in two steps:

1. At the limit, ``SIGALRM`` (an interval timer of this process) raises
   :class:`TimeLimitExceeded` in the main thread, where the function runs. It derives
   from ``BaseException``, as ``KeyboardInterrupt`` does, so the function's
   ``except Exception`` does not swallow it; a blocking system call (``sleep``, a
   read, ``wait``) is interrupted. The runner records the failure in phase
   ``execute``, naming the limit (:func:`runner.protocol.time_limit_error`), uploads
   the logs, and kills its process group (:meth:`TimeLimit.end_group`): the job's own
   child processes end with it.
2. If the function is not unwound :data:`HARD_GRACE_S` seconds later (it caught the
   exception, or sits in native code that never returns to Python), a watchdog thread
   records the same failure itself and kills the process group at once.

Exactly one outcome is recorded: the main thread and the watchdog each
:meth:`~TimeLimit.claim` it, and only the first one may record. What cannot be
enforced here: native code that holds the GIL for ever keeps both steps from running;
on GKE the Job's deadline still ends it (``DeadlineExceeded``, which the client
reports as the same failure).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from runner.protocol import EXIT_USER_ERROR, time_limit_message

HARD_GRACE_S = 10.0
"""Seconds the function has to unwind after :class:`TimeLimitExceeded` before the
watchdog records the failure and kills the process group."""

_reached = False


def reached() -> bool:
    """Whether a limit of this process was reached: its runner then kills its process
    group once the failure and the logs are recorded (a runner runs one job)."""
    return _reached


def _mark_reached() -> None:
    global _reached
    _reached = True


class TimeLimitExceeded(BaseException):
    """Raised in the job's main thread when its run-time limit is reached."""


class TimeLimit:
    """The run-time limit of one job's execute phase (module docstring).

    :param seconds: the limit.
    :param on_hard_expiry: what the watchdog does when the function did not unwind in
        time: record the failure (it is called at most once, and only when the outcome
        was not claimed by the main thread); the process group is killed after it.
    """

    def __init__(self, seconds: float, on_hard_expiry: Callable[[], None]) -> None:
        self.seconds = seconds
        self._on_hard_expiry = on_hard_expiry
        self._lock = threading.Lock()
        self._claimed = False
        self._done = threading.Event()
        self._previous: Callable[[int, FrameType | None], object] | int | None = None
        self._watchdog: threading.Thread | None = None

    def start(self) -> None:
        """Arm the limit. Call from the main thread, right before the function runs."""
        self._previous = signal.signal(signal.SIGALRM, self._alarm)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        self._watchdog = threading.Thread(
            target=self._watch, name="kinetic-time-limit", daemon=True
        )
        self._watchdog.start()

    def _alarm(self, signum: int, frame: FrameType | None) -> None:
        _mark_reached()
        raise self.error()

    def error(self) -> TimeLimitExceeded:
        """The exception that says this limit was reached."""
        return TimeLimitExceeded(time_limit_message(self.seconds))

    def _watch(self) -> None:
        if self._done.wait(self.seconds + HARD_GRACE_S):
            return
        _mark_reached()
        if not self.claim():
            return  # the main thread records the outcome
        with contextlib.suppress(BaseException):
            self._on_hard_expiry()
        self.end_group()

    def claim(self) -> bool:
        """Take the right to record the job's outcome: True for the first caller only.

        The main thread calls it once the function returned or raised; a False answer
        means the watchdog records the failure and is about to kill the process (the
        caller then waits for that, :meth:`wait_for_end`).
        """
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def stop(self) -> None:
        """Disarm the timer (the function returned or raised); the watchdog ends."""
        signal.setitimer(signal.ITIMER_REAL, 0)
        if self._previous is not None:
            signal.signal(signal.SIGALRM, self._previous)
        self._done.set()

    @staticmethod
    def wait_for_end() -> None:
        """Block until the watchdog's kill ends this process."""
        threading.Event().wait()

    @staticmethod
    def end_group() -> None:
        """Kill this process's group (the job and every process it started), this
        process with it. A pod's PID 1 survives its own SIGKILL: it exits then."""
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(EXIT_USER_ERROR)


def call_limited(
    limit: TimeLimit | None, fn: Callable[..., Any], args: Any, kwargs: Any
) -> tuple[bool, Any]:
    """Call the job's function once under ``limit`` (None: none): ``(True, value)`` or
    ``(False, exception)``, the traceback of which is printed; a
    :class:`TimeLimitExceeded` when the limit was reached, whatever the function made of
    its exception (caught it and returned, or raised another). Call from the main thread.
    """
    try:
        try:
            if limit is not None:
                limit.start()
            value = fn(*args, **kwargs)
        finally:
            if limit is not None:
                limit.stop()
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: it must not skip the record
        import traceback

        if limit is not None:
            limit.stop()  # again: the limit may have been reached inside the first stop
            if not limit.claim():
                limit.wait_for_end()
        traceback.print_exc()
        if limit is not None and reached() and not isinstance(exc, TimeLimitExceeded):
            return False, limit.error()
        return False, exc
    if limit is not None:
        if not limit.claim():
            limit.wait_for_end()
        if reached():  # it caught the exception and returned: the limit was still passed
            return False, limit.error()
    return True, value


class InputTimeLimits:
    """Per-input limits of a worker that runs many inputs in its own process (a local
    batch's, :mod:`runner.batch`): the same two steps as :class:`TimeLimit`, at a cost per
    input of two ``setitimer`` calls. The ``SIGALRM`` handler and the watchdog thread are
    set up once for the worker's life; the watchdog kills the worker (not its process
    group: the batch's supervisor shares it) when an input is not unwound in time, and
    the supervisor reports the input as the worker's death.

    Call :meth:`start` right before an input's function and :meth:`stop` right after it
    (in a ``finally``); :attr:`reached` says whether that input's limit was reached.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.reached = False
        self._hard_at: float | None = None  # monotonic; None between inputs
        signal.signal(signal.SIGALRM, self._alarm)
        threading.Thread(target=self._watch, name="kinetic-time-limit", daemon=True).start()

    def start(self) -> None:
        self.reached = False
        self._hard_at = time.monotonic() + self.seconds + HARD_GRACE_S
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        self._hard_at = None

    def error(self) -> TimeLimitExceeded:
        return TimeLimitExceeded(time_limit_message(self.seconds))

    def _alarm(self, signum: int, frame: FrameType | None) -> None:
        self.reached = True
        raise self.error()

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            hard_at = self._hard_at
            if hard_at is not None and time.monotonic() > hard_at:
                print(
                    f"kinetic runner: an input ran past its time limit of {self.seconds:g} s "
                    f"and did not stop: ending this worker",
                    file=sys.stderr,
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGKILL)
