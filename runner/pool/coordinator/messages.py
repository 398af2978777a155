"""What a coordinated pool's workers and coordinator say to each other. Pure.

Each worker holds one connection to the coordinator; its first message on every
connection is a :class:`Hello`. Messages on one connection arrive in order or not at all
(the connection drops), so everything that must survive a drop is said again in the
next hello: the inputs the worker holds and the outcomes not acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    """Input ``index`` ended. ``record`` is its outcome record
    (:func:`runner.results_log.encode`), or None when the worker wrote it as an object
    of its own (a large result) before saying so; ``failed``: a final failure;
    ``seconds``: how long it ran (the coordinator's pace)."""

    index: int
    record: bytes | None
    failed: bool
    seconds: float


@dataclass(frozen=True)
class Hello:
    """A worker (re)connected. ``holding``: the inputs handed to it that it has not
    ended; ``wants``: it has no input left to start after the one it runs (it asks for
    a span). The outcomes it reported that were not acknowledged follow the hello, said
    again (the coordinator they were said to may have died)."""

    worker: str
    holding: tuple[int, ...] = ()
    wants: bool = True


@dataclass(frozen=True)
class More:
    """The worker starts the last input it holds: it asks for the next span."""


@dataclass(frozen=True)
class Beat:
    """The worker lives (sent while a long input runs)."""


@dataclass(frozen=True)
class Assign:
    """Run these inputs, in order (a span)."""

    indices: tuple[int, ...]


@dataclass(frozen=True)
class Drop:
    """These inputs, which the worker said it holds, are no longer its: another worker
    ran them or holds them since it went silent."""

    indices: tuple[int, ...]


@dataclass(frozen=True)
class Ack:
    """These outcomes are durable: the worker may forget them."""

    indices: tuple[int, ...]


@dataclass(frozen=True)
class Exit:
    """Start nothing more and exit once the outcomes said are acknowledged.
    ``reason``: ``done`` (every input has an outcome), else the stop's reason;
    ``kill``: end the inputs that run now (a cancel), else let them end."""

    reason: str
    kill: bool = False


@dataclass(frozen=True)
class Read:
    """Send the batch's object ``key``: its manifest, function, context archive or an
    input chunk, objects that never change (:mod:`runner.pool.coordinator.shelf`)."""

    key: str


@dataclass(frozen=True)
class Data:
    """The answer to :class:`Read`: object ``key``'s bytes, or None when the
    coordinator does not serve it (not one of the batch's objects that never change,
    too large, or storage failed): the worker reads it from storage itself."""

    key: str
    data: bytes | None


ToCoordinator = Hello | Outcome | More | Beat
ToWorker = Assign | Drop | Ack | Exit
"""The messages of the protocol. :class:`Read` and :class:`Data` travel on the same
connections but are the shelf's, not the protocol's: neither end's state depends on them."""
