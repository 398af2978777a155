"""The sync facade's engine room: one private event loop on one long-lived thread.

Strategy: Kinetic has one implementation, written async. The blocking API
runs those coroutines on a private loop thread through an anyio blocking
portal, started on first use and kept for the life of the process.

- A blocking call made *from that loop thread* would deadlock; it raises
  :class:`~kinetic.BlockingCallError` instead.
- A blocking call from a thread whose own event loop is running (Jupyter, or
  a coroutine calling the sync API by mistake) works, because the work runs
  on our loop, not the caller's; it warns, since it stalls the caller's loop.
- Ctrl-C (KeyboardInterrupt) while blocked cancels the underlying task and
  re-raises; for ``result()`` that cancels the wait, never the job.
- After ``fork()`` the child starts a fresh loop thread on first use (the
  parent's thread does not exist in the child).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from kinetic._exceptions import BlockingCallError, KineticBlockingWarning

T = TypeVar("T")


class LoopThread:
    """Owns the private loop thread and its portal."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._portal: BlockingPortal | None = None
        self._thread: threading.Thread | None = None
        self._loop_ident: int | None = None

    def _reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._portal = None
        self._thread = None
        self._loop_ident = None

    def _ensure_portal(self) -> BlockingPortal:
        portal = self._portal
        if portal is not None:
            return portal
        with self._lock:
            if self._portal is None:
                ready = threading.Event()
                started: list[BlockingPortal] = []

                async def serve() -> None:
                    async with BlockingPortal() as p:
                        self._loop_ident = threading.get_ident()
                        started.append(p)
                        ready.set()
                        await p.sleep_until_stopped()

                thread = threading.Thread(
                    target=anyio.run, args=(serve,), name="kinetic-loop", daemon=True
                )
                thread.start()
                ready.wait()
                self._thread = thread
                self._portal = started[0]
            return self._portal

    def check_caller(self) -> None:
        """Refuse calls from the loop thread; warn once for a caller running its own loop."""
        if threading.get_ident() == self._loop_ident:
            raise BlockingCallError(
                "a blocking kinetic call was made from kinetic's own event loop thread "
                "(inside an async callback?); it would deadlock: use the kinetic.aio API "
                "and await it"
            )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        # Shown once per call site by the warnings machinery's default filter.
        warnings.warn(
            "a blocking kinetic call was made from a thread that runs an event loop; it works, "
            "but blocks that loop meanwhile: prefer `await fn.aio(...)` and kinetic.aio",
            KineticBlockingWarning,
            stacklevel=_user_stacklevel(),
        )

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` on the loop thread and block for its result.

        :raises BlockingCallError: when called from the loop thread itself.
        :raises KeyboardInterrupt: after cancelling the task, on Ctrl-C.
        """
        self.check_caller()
        return _cross(self._ensure_portal(), fn, *args)

    def iterate(self, make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
        """Drive an async iterator from blocking code, one item per crossing.

        Callers whose iterator yields chunks (lists of ready items, log chunks) pay
        one crossing per chunk, not per item.
        """
        self.check_caller()
        portal = self._ensure_portal()
        agen = make()
        sentinel: Any = object()

        async def step() -> Any:
            try:
                return await agen.__anext__()
            except StopAsyncIteration:
                return sentinel

        try:
            while True:
                item = _cross(portal, step)
                if item is sentinel:
                    return
                yield item
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and self._portal is portal:
                _cross(portal, aclose)

    def stop(self) -> None:
        """Stop the loop thread (at interpreter exit), cancelling what still runs there."""
        portal, thread = self._portal, self._thread
        if portal is None or thread is None or os.getpid() != _PID[0]:
            return
        with contextlib.suppress(Exception):  # shutting down anyway: close connections
            from kinetic._engine import runtime

            portal.call(runtime.aclose_backends)
        with contextlib.suppress(Exception):
            portal.call(portal.stop, True)
        thread.join(timeout=5)
        self._portal = None


SIGNAL_CHECK_S = 0.25
"""Longest a blocked call goes without looking for a Ctrl-C (see :func:`wait_future`)."""


def wait_future(future: Future[T]) -> T:
    """Block for ``future``; on Ctrl-C cancel it (cancelling its task) and re-raise.

    The wait wakes every :data:`SIGNAL_CHECK_S` seconds. Python acts on a signal in the
    main thread only, and a main thread blocked on a lock is woken by one only when the
    kernel delivers it to that thread; it may deliver a process's SIGINT to any thread
    that does not block it, the loop thread included. Waking lets a Ctrl-C that landed
    elsewhere be acted on. (Blocking the signal in the loop thread instead would leave
    it blocked in every process that thread starts: local jobs, builds.)
    """
    try:
        while True:
            try:
                return future.result(timeout=SIGNAL_CHECK_S)
            except TimeoutError:
                if future.done():  # the outcome itself is a TimeoutError (or just came)
                    return future.result()
    except KeyboardInterrupt:
        future.cancel()
        raise


def _cross(portal: BlockingPortal, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """One crossing: run ``fn(*args)`` as a task on the loop and block for its outcome.

    The future is ours and exists before the task is spawned, so a Ctrl-C (raised in
    this thread wherever the signal lands: inside ``start_task_soon``, which itself
    blocks until the loop has spawned the task, or just before the wait) still
    cancels the task. With the portal's own future, a KeyboardInterrupt raised while
    spawning lost the future, and the task ran on, unseen (a ``result()`` would go
    on waiting and clean up the job's artifacts once it ended).
    """
    future: Future[T] = Future()
    try:
        portal.start_task_soon(_linked, future, fn, args)
        return wait_future(future)
    except KeyboardInterrupt:
        future.cancel()  # a no-op if done or already cancelled by wait_future
        raise


async def _linked(
    future: Future[T], fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]
) -> None:
    """Run ``fn(*args)`` for :func:`_cross`: settle ``future`` with its outcome, and stop
    when ``future`` is cancelled (also when it was cancelled before this task started)."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    scope = anyio.CancelScope()

    def on_done(f: Future[T]) -> None:
        if not f.cancelled():
            return
        if threading.get_ident() == loop_thread:
            scope.cancel()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to cancel
                loop.call_soon_threadsafe(scope.cancel)

    try:
        with scope:
            future.add_done_callback(on_done)  # called at once if cancelled already
            value = await fn(*args)
    except anyio.get_cancelled_exc_class():
        # Cancelled from outside (the portal stopping): the waiter sees CancelledError.
        future.cancel()
        future.set_running_or_notify_cancel()
        raise
    except BaseException as exc:
        if future.set_running_or_notify_cancel():
            future.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
        return
    if scope.cancelled_caught:
        return  # the waiter cancelled the future and has moved on
    if future.set_running_or_notify_cancel():  # False: cancelled as the value arrived
        future.set_result(value)


_PID = [os.getpid()]
LOOP = LoopThread()


def _after_fork_in_child() -> None:
    _PID[0] = os.getpid()
    LOOP._reset_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(LOOP.stop)


def call(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run a coroutine function on Kinetic's loop thread; see :meth:`LoopThread.call`."""
    return LOOP.call(fn, *args)


def iterate(make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """Drive an async iterator on Kinetic's loop thread; see :meth:`LoopThread.iterate`."""
    return LOOP.iterate(make)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning name the first frame outside Kinetic (the
    user's line), however deep the facade's call path is. Counted from our caller."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level
