"""The operations a worker's machine (:class:`runner.pool.machine.WorkerMachine`) hands
its shell, and the answers each one waits for. Pure data.

A shell asks the machine for the next operation, performs it and answers::

    while True:
        op = machine.next(wall=time.time(), mono=time.monotonic(), pick=random.random())
        # List(prefix)      -> machine.listed(prefix, keys)
        # Read(key)         -> machine.read(key, data, generation)  (None, None: missing)
        # Create(key, data) -> machine.created(key, generation or None)  (if absent)
        # Write(key, data)  -> machine.written(key)
        # Replace(key, data, generation) -> machine.replaced(key, new generation or None)
        # Run(index, n)     -> machine.ran(index, record, payload, output, seconds)
        # Kill(index)       -> end the running input, then machine.ended(index)
        # Sleep(seconds)    -> sleep (an input that ends meanwhile may be fed at once)
        # Exit(reason)      -> stop

Exactly one operation is outstanding at a time (``Sleep`` and ``Exit`` need no answer);
a failed operation (storage down) is the shell's to retry. The shells: the pod's worker
(:mod:`runner.pool.worker`), the simulations in ``benchmarks/``, the tests' drivers.
The protocol as a whole is told in ``docs/pool-protocol.md``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class List:
    prefix: str


@dataclass(frozen=True)
class Read:
    key: str


@dataclass(frozen=True)
class Create:
    key: str
    data: bytes


@dataclass(frozen=True)
class Write:
    """Write a burst: a name of its own, written once (the shell writes it ``fresh``)."""

    key: str
    data: bytes


@dataclass(frozen=True)
class Replace:
    """Replace ``key`` with ``data`` if it is still at ``generation`` (the answer, its
    new generation or None, goes to :meth:`~runner.pool.machine.WorkerMachine.replaced`)."""

    key: str
    data: bytes
    generation: int


@dataclass(frozen=True)
class Run:
    """Run attempt ``attempt`` (0 first) of input ``index``."""

    index: int
    attempt: int


@dataclass(frozen=True)
class Kill:
    index: int


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Exit:
    """``reason``: ``"done"`` (every input has an outcome) or ``"stopped"``."""

    reason: str


Op = List | Read | Create | Write | Replace | Run | Kill | Sleep | Exit
Storage = List | Read | Create | Write | Replace
"""The operations that wait for an answer."""
