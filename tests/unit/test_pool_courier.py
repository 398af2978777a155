"""The pool worker's courier (runner/pool/courier.py): upkeep requests sent from a helper
thread, their answers applied in the caller's thread, failures raised there."""

from __future__ import annotations

import select
import threading

import pytest

from runner.pool.courier import Answer, Courier
from runner.pool.ops import Op, Read, Write


def test_the_caller_goes_on_while_a_request_is_under_way_and_applies_its_answer() -> None:
    release = threading.Event()
    applied: list[tuple[str, str]] = []

    def request(op: Op) -> Answer:
        assert isinstance(op, Read)
        release.wait(10)
        return lambda: applied.append((op.key, threading.current_thread().name))

    courier = Courier(request)
    try:
        courier.send(Read("a"))
        assert courier.busy
        assert not courier.collect()  # not answered yet: the caller goes on
        with pytest.raises(RuntimeError, match="under way"):
            courier.send(Read("b"))  # one at a time
        release.set()
        assert select.select([courier.fd], [], [], 10)[0]  # readable once answered
        assert courier.collect()
        assert not courier.busy
        # Applied in the caller's thread, never in the helper's.
        assert applied == [("a", threading.current_thread().name)]
        courier.send(Read("c"))
        courier.settle()  # waits for the answer
        assert [key for key, _ in applied] == ["a", "c"]
        courier.settle()  # nothing under way: returns at once
    finally:
        courier.close()


def test_a_failed_request_is_raised_in_the_callers_thread() -> None:
    def request(op: Op) -> Answer:
        raise OSError(f"the store gave up on {op!r}")

    courier = Courier(request)
    try:
        courier.send(Write("bursts/x", b"data"))
        with pytest.raises(OSError, match="gave up"):
            courier.settle()
        assert not courier.busy  # and the next request can go out
    finally:
        courier.close()
