"""The caller's event loop never waits on Kinetic: asyncio debug mode as the referee.

Every public coroutine a user awaits inside an async application (``run_async``,
``result``, ``status``, ``logs``, ``cancel``, ``attach``, ``list_jobs``,
``run_async_map`` and its ``as_completed``) runs under ``loop.set_debug(True)`` with
``slow_callback_duration = 0.02``, beside a 5 ms heartbeat task. asyncio then logs
every loop step that held the loop for 20 ms or more; :class:`LoopStallGuard` keeps
those that name a Kinetic frame and were not simply preempted:

* *names a Kinetic frame*: the step's task is suspended inside a Kinetic coroutine
  when the warning is logged, or a sample of the loop thread's stack taken during the
  step shows a frame of ``kinetic/`` or ``runner/``;
* *not preempted*: the kernel's run-queue wait of the loop thread during the step
  (``/proc/thread-self/schedstat``, read as the step starts and as it is judged) is
  subtracted, so a shared, overloaded machine does not make an innocent step look
  slow, while a blocking call (sleep, file IO, a process launch) still counts. Also
  subtracted: the time the loop thread, off a CPU and not preempted, waited while the
  process's other threads ran (the GIL held by the worker threads that do what belongs
  off the loop, bounded by their limiter), and the time the cyclic garbage collector
  ran during the step (``gc.callbacks``): its pauses grow with the whole process's
  heap, whichever step happens to allocate;
* *with evidence*: a stack sample inside Kinetic's code during the step (a blocking
  call releases the GIL, so the sampler sees it), or CPU time of the step's own (a long
  C call that keeps the GIL). A thread that slept holding the GIL (a page fault on a
  loaded disk, or waiting for the GIL while the thread that holds it waits for a CPU)
  shows neither: that is the machine, not the code. When it wakes, the sampler may
  catch it in Kinetic's pure Python before the GIL changes hands, so the samples inside
  Kinetic must span half the threshold: a blocking call lets the sampler run
  throughout.

Debug mode's own cost is kept small: it records where every future was created, and
the ``stat`` of each source file that :func:`linecache.checkcache` makes for that is
skipped while the guard runs (on a busy disk those alone took tens of milliseconds).
What is left of it — the stack walks themselves, which a loop out of debug mode never
makes — is the referee's, not Kinetic's: the share of a step's stack samples caught
inside them (``traceback``, ``asyncio.format_helpers``) is taken off its CPU time, as
the collector's is (on a loaded machine a step of one storage request spent a third of
its 21 ms there).

:func:`test_guard_catches_a_blocking_step` shows the guard fails on a blocking call in
a guarded coroutine, :func:`test_guard_catches_a_step_that_holds_the_gil` on a long C
call, and :func:`test_guard_counts_only_the_steps_own_cpu_time` that the CPU time of
the steps before is not a slow step's evidence; the module's own tests are the
regression guard for Kinetic.
"""

from __future__ import annotations

import asyncio
import gc
import linecache
import logging
import os
import random
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Self

import anyio
import anyio.lowlevel
import pytest

import kinetic
import runner
from kinetic import aio

pytestmark = pytest.mark.local

SLOW = 0.02
HERE = str(Path(__file__).resolve())
TRACING = tuple(
    "innermost " + str(Path(module.__file__).resolve())
    for module in (traceback, asyncio.format_helpers)
)
"""A stack sample whose innermost frame is in one of these files caught debug mode
recording where a future or a callback was created."""
KINETIC_DIRS = tuple(str(Path(pkg.__file__).resolve().parent) + os.sep for pkg in (kinetic, runner))


@aio.run()
def double(x: int) -> int:
    print(f"doubling {x}")
    return 2 * x


@aio.run()
def sizes(items: list[int], blob: bytes) -> tuple[int, int]:
    return len(items), len(blob)


@aio.run()
def total(items: list[int]) -> int:
    return sum(items)


@aio.run()
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@dataclass
class Stall:
    """One loop step that held the loop, and what it names."""

    seconds: float
    preempted: float
    on_cpu: float
    collecting: float
    gil: float
    tracing: float  # debug mode's own stack walks, by the samples' share
    faults: int  # the loop thread's major page faults during the step
    what: str
    frames: list[str]


@dataclass
class LoopStallGuard:
    """Collects the slow steps of the running loop that name a frame under ``dirs``."""

    dirs: tuple[str, ...] = KINETIC_DIRS
    threshold: float = SLOW
    stalls: list[Stall] = field(default_factory=list)
    steps: int = 0  # slow steps seen at all (for the report)

    def __post_init__(self) -> None:
        self._samples: deque[tuple[float, tuple[str, ...]]] = deque(maxlen=20_000)
        # When the current step of the loop started, and the loop thread's counters then.
        self._step: tuple[float, tuple[int, int, int, int]] | None = None
        self._collections: deque[tuple[float, float]] = deque(maxlen=10_000)
        self._gc_start: float | None = None
        self._stop = threading.Event()
        self._tid = threading.get_ident()
        self._native = threading.get_native_id()

    def _ours(self, code: CodeType) -> bool:
        return code.co_filename.startswith(self.dirs)

    def _where(self, code: CodeType, line: int | None) -> str:
        return f"{code.co_filename}:{line}:{code.co_name}"

    def _stack(self, frame: FrameType | None) -> tuple[str, ...]:
        """The judged frames of a stack, innermost first; the innermost frame of all as
        ``innermost <where>`` (it says what a step was busy with, for the report)."""
        out = []
        if frame is not None:
            out.append("innermost " + self._where(frame.f_code, frame.f_lineno))
        while frame is not None:
            if self._ours(frame.f_code):
                out.append(self._where(frame.f_code, frame.f_lineno))
            frame = frame.f_back
        return tuple(out)

    def _schedstat(self) -> tuple[int, int, int, int]:
        """(ns on a CPU, ns waiting on a run queue) of the loop's thread so far, the ns on
        a CPU of the whole process (every thread), and the loop thread's major page
        faults so far (``majflt``, the tenth field after the name in ``stat``)."""
        run, wait = os.pread(self._schedstat_fd, 128, 0).split()[:2]
        stat = os.pread(self._stat_fd, 1024, 0)
        majflt = int(stat[stat.rindex(b")") + 2 :].split()[9])
        return int(run), int(wait), time.process_time_ns(), majflt

    def _run_step(self, handle: asyncio.Handle) -> None:
        """``Handle._run`` while the guard is on: the loop thread's counters are read as
        each of its steps starts. A baseline from the sampler instead could be tens of
        milliseconds old on a loaded machine (the sampler thread waits for a CPU too),
        and the CPU time of the steps before would then count as the judged step's."""
        if threading.get_ident() == self._tid:
            self._step = (time.monotonic(), self._schedstat())
        self._handle_run(handle)

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            frame = sys._current_frames().get(self._tid)
            self._samples.append((time.monotonic(), self._stack(frame)))

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != self._tid:
            return
        if phase == "start":
            self._gc_start = time.monotonic()
        elif self._gc_start is not None:
            self._collections.append((self._gc_start, time.monotonic()))
            self._gc_start = None

    def _collecting(self, start: float, end: float) -> float:
        """Seconds the garbage collector ran on the loop's thread between start and end."""
        return sum(
            max(0.0, min(b, end) - max(a, start)) for a, b in list(self._collections) if b >= start
        )

    def _task_frames(self, handle: Any) -> list[str]:
        callback = getattr(handle, "_callback", None)
        target = getattr(callback, "__self__", None)
        frames: list[str] = []
        if isinstance(target, asyncio.Task):
            coro: Any = target.get_coro()
            while coro is not None:
                frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                if frame is not None and self._ours(frame.f_code):
                    frames.append(self._where(frame.f_code, frame.f_lineno))
                coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        else:
            code = getattr(getattr(callback, "__func__", callback), "__code__", None)
            if isinstance(code, CodeType) and self._ours(code):
                frames.append(self._where(code, None))
        return frames

    def on_slow_step(self, loop: asyncio.AbstractEventLoop, record: logging.LogRecord) -> None:
        """Judge one "Executing ... took X seconds" warning, on the loop's thread."""
        if not (isinstance(record.args, tuple) and len(record.args) == 2):
            return
        what, seconds = str(record.args[0]), float(record.args[1])
        self.steps += 1
        end = time.monotonic()
        run, wait, process, majflt = self._schedstat()
        # The step that entered the guard started before the guard: its baseline is the
        # guard's entry.
        start, (run0, wait0, process0, majflt0) = self._step or self._entered
        samples = list(self._samples)  # one C-level copy: the sampler appends meanwhile
        during = [s for s in samples if start <= s[0] <= end]
        on_cpu = (run - run0) / 1e9
        preempted = (wait - wait0) / 1e9
        # Off a CPU yet not preempted while the process's other threads ran: the loop
        # thread waited for the GIL they held (worker threads doing what belongs off the
        # loop), not for something the step itself blocked on.
        others = (process - process0) / 1e9 - on_cpu
        gil = max(0.0, min(others, seconds - on_cpu - preempted))
        collecting = self._collecting(start, end)
        frames = self._task_frames(getattr(loop, "_current_handle", None))
        busy: list[str] = []
        ours: list[float] = []
        traced = 0
        for when, stack in during:
            if stack and stack[0].startswith(TRACING):
                traced += 1  # debug mode's bookkeeping, not the step's own work
                continue
            if len(stack) > 1:
                ours.append(when)
            frames.extend(f for f in stack[1:] if f not in frames)
            busy.extend(stack[:1])
        tracing = on_cpu * traced / len(during) if during else 0.0
        # Evidence that Kinetic's code held the loop: stack samples inside it during the
        # step, spanning half the threshold (a blocking call releases the GIL, so the
        # sampler runs throughout), or CPU time of its own (a long C call that keeps the
        # GIL). A thread that slept holding the GIL or waiting for it (a page fault, or
        # the GIL's holder waiting for a CPU) gives the sampler one look at most as it
        # wakes, often in pure Python: the machine, not the code.
        # The collector's time on a CPU is not the step's own: its pauses are discounted.
        sampled_ours = len(ours) > 1 and ours[-1] - ours[0] >= self.threshold / 2
        evidence = sampled_ours or on_cpu - collecting - tracing >= self.threshold / 2
        blocked = seconds - preempted - collecting - gil - tracing
        if frames and evidence and blocked >= self.threshold:
            stall = Stall(
                seconds,
                preempted,
                on_cpu,
                collecting,
                gil,
                tracing,
                majflt - majflt0,
                what[:300],
                frames[:12] + busy[:8],
            )
            self.stalls.append(stall)

    def report(self) -> str:
        lines = [f"{len(self.stalls)} of {self.steps} slow loop steps name Kinetic:"]
        for s in self.stalls:
            lines.append(
                f"  {s.seconds * 1e3:.1f} ms ({s.on_cpu * 1e3:.1f} ms on a CPU, "
                f"{s.preempted * 1e3:.1f} ms preempted, {s.collecting * 1e3:.1f} ms in gc, "
                f"{s.gil * 1e3:.1f} ms waiting for other threads' GIL, "
                f"{s.tracing * 1e3:.1f} ms in debug mode's tracebacks, "
                f"{s.faults} major page faults)"
            )
            lines.append(f"    {s.what}")
            lines.extend(f"    at {f}" for f in s.frames)
        return "\n".join(lines)

    def __enter__(self) -> Self:
        loop = asyncio.get_running_loop()
        self._loop, self._debug = loop, loop.get_debug()
        self._slow = loop.slow_callback_duration
        loop.set_debug(True)
        loop.slow_callback_duration = self.threshold
        guard = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.msg.startswith("Executing") if isinstance(record.msg, str) else False:
                    guard.on_slow_step(loop, record)

        self._handler = _Handler(logging.WARNING)
        log = logging.getLogger("asyncio")
        self._propagate = log.propagate
        log.addHandler(self._handler)
        log.propagate = False  # debug mode's other chatter is not this test's business
        self._checkcache = linecache.checkcache
        linecache.checkcache = _no_check  # type: ignore[assignment]
        self._schedstat_fd = os.open(f"/proc/self/task/{self._native}/schedstat", os.O_RDONLY)
        self._stat_fd = os.open(f"/proc/self/task/{self._native}/stat", os.O_RDONLY)
        self._entered = (time.monotonic(), self._schedstat())
        self._handle_run = asyncio.Handle._run

        def run_step(handle: asyncio.Handle) -> None:
            guard._run_step(handle)

        asyncio.Handle._run = run_step  # type: ignore[method-assign]
        gc.callbacks.append(self._on_gc)
        self._thread = threading.Thread(target=self._sample, name="loop-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        asyncio.Handle._run = self._handle_run  # type: ignore[method-assign]
        os.close(self._schedstat_fd)
        os.close(self._stat_fd)
        gc.callbacks.remove(self._on_gc)
        linecache.checkcache = self._checkcache  # type: ignore[assignment]
        log = logging.getLogger("asyncio")
        log.removeHandler(self._handler)
        log.propagate = self._propagate
        self._loop.set_debug(self._debug)
        self._loop.slow_callback_duration = self._slow


def _no_check(filename: str | None = None) -> None:
    """``linecache.checkcache`` without its stats: source files do not change mid-test."""


@dataclass
class Heartbeat:
    """A 5 ms ticker beside the work: the worst lag any other request would see."""

    lags: list[float] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            t = time.monotonic()
            await anyio.sleep(0.005)
            self.lags.append(time.monotonic() - t - 0.005)


async def _warm_up() -> None:
    # First use pays one-time costs (imports, the context archive, the launcher): not
    # what an application sees per call, and not what this test is about.
    job = await double.run_async(0)
    assert await job.result() == 0
    batch = await double.run_async_map([1, 2])
    assert await batch.results() == [2, 4]


async def test_submit_and_collect_never_stall_the_loop() -> None:
    await _warm_up()
    items, blob = list(range(400_000)), b"x" * (8 << 20)  # built here, not in a guarded step
    beat = Heartbeat()
    async with anyio.create_task_group() as tg:
        tg.start_soon(beat.run)
        with LoopStallGuard() as g:
            jobs = [None] * 20

            async def submit(i: int) -> None:
                jobs[i] = await double.run_async(i)

            async with anyio.create_task_group() as submits:
                for i in range(20):
                    submits.start_soon(submit, i)
            # Large arguments: walking them for kinetic.Data, pickling and hashing them
            # take tens of milliseconds, which must not be spent on the loop.
            big = await sizes.run_async(items, blob)
            handles = [j for j in jobs if j is not None]
            values: dict[str, int] = {}

            async def collect(h: aio.JobHandle) -> None:
                values[h.job_id] = await h.result(cleanup=False)

            async with anyio.create_task_group() as results:
                for h in handles:
                    results.start_soon(collect, h)
            for h in handles[:5]:
                assert await h.status() is aio.JobStatus.SUCCEEDED
                assert "doubling" in str(await h.logs())
                again = await aio.attach(h.job_id)
                assert again.job_id == h.job_id
            assert len(await aio.list_jobs()) >= 20
            for h in handles:
                await h.cleanup()
            assert await big.result() == (400_000, 8 << 20)
        tg.cancel_scope.cancel()
    assert sorted(values.values()) == [2 * i for i in range(20)]
    assert not g.stalls, g.report()


async def test_cancel_never_stalls_the_loop() -> None:
    await _warm_up()
    beat = Heartbeat()
    async with anyio.create_task_group() as tg:
        tg.start_soon(beat.run)
        with LoopStallGuard() as g:
            sleepers = [await nap.run_async(60) for _ in range(5)]
            for h in sleepers:  # started: cancel must reach a running process group
                for _ in range(500):
                    if await h.status() is not aio.JobStatus.PENDING:
                        break
                    await anyio.sleep(0.02)
            async with anyio.create_task_group() as cancels:
                for h in sleepers:
                    cancels.start_soon(h.cancel)
            for h in sleepers:
                with pytest.raises(kinetic.JobCancelledError):
                    await h.result()
        tg.cancel_scope.cancel()
    assert not g.stalls, g.report()


async def test_batch_submit_and_as_completed_never_stall_the_loop() -> None:
    await _warm_up()
    inputs = [[i] * 50 for i in range(2000)]
    beat = Heartbeat()
    async with anyio.create_task_group() as tg:
        tg.start_soon(beat.run)
        with LoopStallGuard() as g:
            # 2,000 inputs of 50 numbers: every input is looked at (for its call shape,
            # for kinetic.Data), which takes tens of milliseconds in all.
            batch = await total.run_async_map(inputs, input_mode="single")
            seen = []
            async for h in batch.as_completed():
                seen.append(await h.result())
            await batch.cleanup()
        tg.cancel_scope.cancel()
    assert sorted(seen) == [50 * i for i in range(2000)]
    assert not g.stalls, g.report()


async def _blocking_step() -> None:
    await anyio.lowlevel.checkpoint()
    time.sleep(0.05)  # noqa: ASYNC251 - what a blocking call in a Kinetic coroutine does
    await anyio.sleep(0.01)


async def test_guard_catches_a_blocking_step() -> None:
    # The guard judged against this file instead of Kinetic's packages: a blocking call
    # in one of its coroutines must be reported, with the frame that made it.
    here = HERE
    with LoopStallGuard(dirs=(here,)) as g:
        await _blocking_step()
    assert g.stalls, "a 50 ms blocking step went unnoticed"
    assert any("_blocking_step" in f for s in g.stalls for f in s.frames), g.report()
    # and a step that blocks outside the judged files is not blamed on them
    with LoopStallGuard(dirs=(here + ".nothing",)) as g2:
        await _blocking_step()
    assert not g2.stalls, g2.report()


async def _busy_step(numbers: list[int]) -> None:
    await anyio.lowlevel.checkpoint()
    sorted(numbers)  # one C call: the GIL stays held, so no stack sample is taken
    await anyio.sleep(0.01)


async def test_guard_catches_a_step_that_holds_the_gil() -> None:
    numbers = list(range(1_000_000))
    random.Random(7).shuffle(numbers)
    with LoopStallGuard(dirs=(HERE,)) as g:
        await _busy_step(numbers)
    assert any(s.on_cpu >= g.threshold for s in g.stalls), g.report()


def _created_deep(loop: asyncio.AbstractEventLoop, depth: int) -> None:
    if depth:
        _created_deep(loop, depth - 1)
    else:
        loop.create_future()  # debug mode walks the whole stack to say where


async def _tracing_step(python_only: bool) -> None:
    await anyio.lowlevel.checkpoint()
    loop, deadline = asyncio.get_running_loop(), time.monotonic() + 0.06
    while time.monotonic() < deadline:
        if python_only:
            sum(range(200))
        else:
            _created_deep(loop, 40)
    await anyio.sleep(0.01)


async def test_guard_takes_debug_modes_own_tracebacks_off_a_step() -> None:
    # 60 ms of futures created deep in this file's frames: nearly all of it is debug
    # mode recording where each was created (a loop out of debug mode makes no such
    # walk), so the step is not this file's stall; 60 ms of this file's own Python is.
    with LoopStallGuard(dirs=(HERE,)) as g:
        await _tracing_step(python_only=False)
    assert g.steps >= 1, g.report()
    assert not g.stalls, g.report()
    with LoopStallGuard(dirs=(HERE,)) as g2:
        await _tracing_step(python_only=True)
    assert g2.stalls, "60 ms of Python on the loop went unnoticed"
    assert all(s.tracing < g2.threshold / 2 for s in g2.stalls), g2.report()


async def test_guard_counts_only_the_steps_own_cpu_time() -> None:
    # A loaded machine keeps the sampler thread off a CPU for tens of milliseconds at
    # times (it waits for one too): stopped here, so that no sample can speak for the
    # step. The busy step comes first and names no judged frame; the judged step then
    # sleeps, off a CPU. The CPU time of the busy one is not the judged one's evidence.
    numbers = list(range(1_000_000))
    random.Random(7).shuffle(numbers)
    with LoopStallGuard(dirs=(HERE,)) as g:
        g._stop.set()
        g._thread.join()
        asyncio.get_running_loop().call_soon(sorted, numbers)
        await _blocking_step()
    assert g.steps >= 2, g.report()  # both were slow: the busy one is no sample's doing
    assert not g.stalls, g.report()
