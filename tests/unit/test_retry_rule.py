"""The one retry rule of every runner (:mod:`runner.retry_rule`), how a batch records it
(``options.retries`` and ``options.retry_rule``), and a failure known only by its type's
names (a pool input's, from its own process). Pure: no loop, no process."""

from __future__ import annotations

from typing import Any

import pytest

import kinetic
from kinetic._core.inputs import MapOptions
from kinetic._core.retries import Retries, retries_record
from runner import protocol
from runner._main import _retried
from runner.retry_rule import NO_RETRIES, RetryRule, type_names
from runner.time_limit import TimeLimitExceeded


class Flaky(ConnectionError):
    pass


def _rule(retries: Retries) -> RetryRule:
    return RetryRule.of_record(retries_record(retries))


# --- the rule --------------------------------------------------------------------------


def test_a_matching_exception_is_retried_while_retries_are_left() -> None:
    rule = _rule(Retries(2, backoff=3.0, initial_delay=0.5, on=(ConnectionError,)))
    assert rule.delay_after(0, ConnectionError("x")) == 0.5
    assert rule.delay_after(1, ConnectionError("x")) == 1.5
    assert rule.delay_after(2, ConnectionError("x")) is None  # count spent


def test_on_matches_subclasses_by_qualified_name() -> None:
    rule = _rule(Retries(1, on=(OSError,)))
    assert rule.on == frozenset({"builtins.OSError"})
    assert rule.delay_after(0, Flaky("a subclass")) == 1.0
    assert rule.delay_after(0, ValueError("not named")) is None
    assert f"{__name__}.Flaky" in type_names(Flaky)
    # A class of the caller's project is named, not compared: a copy of it matches too.
    named = RetryRule(count=1, on=frozenset({f"{__name__}.Flaky"}))
    assert named.delay_after(0, Flaky()) == 0.0


def test_a_time_limit_and_a_death_under_on_are_never_retried() -> None:
    rule = _rule(Retries(3, on=(BaseException,)))
    assert rule.delay_after(0, TimeLimitExceeded("limit")) is None
    assert rule.delay_after(0, None) is None  # a dead process: no exception to match
    assert rule.delay_after(0, KeyboardInterrupt()) == 1.0  # named (as a base) in on


def test_the_default_on_leaves_system_exit_alone() -> None:
    rule = _rule(Retries(3))
    assert rule.delay_after(0, RuntimeError()) == 1.0
    assert rule.delay_after(0, SystemExit(1)) is None


def test_a_plain_count_retries_every_failure_at_once() -> None:
    rule = RetryRule(count=2)
    assert [rule.delay_after(n, SystemExit(1)) for n in (0, 1, 2)] == [0.0, 0.0, None]
    assert rule.delay_after(0, None) == 0.0  # a dead worker's input too
    assert rule.delay_after(0, TimeLimitExceeded("limit")) is None


def test_no_record_is_no_retries() -> None:
    assert RetryRule.of_record(None) is NO_RETRIES
    assert NO_RETRIES.delay_after(0, RuntimeError()) is None


def test_the_single_job_runner_asks_the_rule() -> None:
    """``runner._main`` numbers attempts from 1: attempt n is followed by retry n."""
    record = retries_record(Retries(2, initial_delay=0, on=(ConnectionError,)))
    assert _retried(record, Flaky(), 1)
    assert _retried(record, Flaky(), 2)
    assert not _retried(record, Flaky(), 3)
    assert not _retried(record, ValueError(), 1)
    assert not _retried(record, TimeLimitExceeded("limit"), 1)
    assert not _retried(None, Flaky(), 1)


# --- the batch's record ------------------------------------------------------------------


def _options(**kwargs: Any) -> protocol.MapOptionsRecord:
    return MapOptions(**kwargs).record(default_concurrency=4)


def test_a_plain_count_is_recorded_as_before() -> None:
    options = _options(retries=3)
    assert options["retries"] == 3
    assert "retry_rule" not in options
    assert RetryRule.of_batch(options) == RetryRule(count=3)


def test_a_retries_is_recorded_with_its_count_kept_for_old_readers() -> None:
    retries = Retries(2, backoff=1.5, initial_delay=0.25, on=(Flaky,))
    options = _options(retries=retries)
    assert options["retries"] == 2
    assert options["retry_rule"] == retries_record(retries)
    loaded = protocol.load_json(protocol.dump_json(options))
    assert RetryRule.of_batch(loaded) == RetryRule(
        count=2, backoff=1.5, initial_delay=0.25, on=frozenset({f"{__name__}.Flaky"})
    )


def test_an_old_manifest_reads_as_a_plain_count() -> None:
    old = {
        "input_mode": "auto",
        "max_concurrent": 2,
        "retries": 1,
        "fail_fast": False,
        "cancel_running_on_fail": False,
    }
    assert RetryRule.of_batch(protocol.load_json(protocol.dump_json(old))) == RetryRule(1)


def test_no_retries_record_nothing() -> None:
    assert MapOptions(retries=Retries(0)).retries == 0
    assert _options(retries=Retries(0)) == _options()
    with pytest.raises(kinetic.ConfigError, match=r"kinetic\.Retries"):
        MapOptions(retries="2")  # type: ignore[arg-type]


def test_a_failure_known_by_its_type_names_is_ruled_as_the_exception_itself() -> None:
    rule = _rule(Retries(2, initial_delay=1.0, on=(ConnectionError,)))
    for error in (Flaky("x"), KeyError("x"), TimeLimitExceeded("limit")):
        names = protocol.exception_type_names(type(error))
        assert rule.delay_after_types(0, names) == rule.delay_after(0, error)
    assert rule.delay_after_types(0, None) is None  # no exception: nothing on names
    assert RetryRule(count=1).delay_after_types(0, None) == 0.0  # a plain count: any failure
