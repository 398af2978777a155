"""Which outcome of a pool batch's input stands, when it has several (runner.pool.outcomes;
docs/pool-protocol.md, "Which outcome of an input stands"): the rule and when a reader reports."""

from __future__ import annotations

import itertools

import pytest

from runner import protocol
from runner.pool.book import PoolBook
from runner.pool.options import PoolOptions
from runner.pool.outcomes import OWN_OUTCOME, OutcomeChoice, outcome_rank

FIRST = protocol.burst_name(0, 8, 0, 0)  # claim 0 of the span [0, 8): input 3 failed
TAKEOVER = protocol.burst_name(3, 8, 0, 1)  # claim 1 took it over from input 3
SLOT = protocol.burst_name(6, 8, 6, 0)  # a slot of the takeover's hole, [6, 8)


def test_the_earliest_claim_stands_and_an_object_of_its_own_over_every_burst() -> None:
    ranks = [outcome_rank(name) for name in (FIRST, TAKEOVER, SLOT)]
    assert OWN_OUTCOME < ranks[0] < ranks[1] < ranks[2]
    # Of two bursts of one claim (never written, but the rule is total): the name.
    assert outcome_rank(protocol.burst_name(0, 4, 0, 0)) < outcome_rank(FIRST)
    with pytest.raises(ValueError, match="not a burst"):
        outcome_rank("junk")


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_the_order_records_are_offered_in_does_not_matter(order: tuple[int, ...]) -> None:
    records = [
        (outcome_rank(TAKEOVER), "succeeded", False),
        (outcome_rank(FIRST), "failed", True),
        (outcome_rank(SLOT), "succeeded again", False),
    ]
    choice: OutcomeChoice[str] = OutcomeChoice(hold=10.0)
    for i in order:
        rank, value, first = records[i]
        choice.offer(3, rank, value, first=first, seen=0.0)
    assert choice.release(0.0) == [(3, "failed")]
    assert choice.held == 0


def test_a_later_claims_record_waits_for_the_hold() -> None:
    choice: OutcomeChoice[str] = OutcomeChoice(hold=10.0)
    choice.offer(3, outcome_rank(TAKEOVER), "succeeded", first=False, seen=100.0)
    assert choice.release(105.0) == []
    assert choice.known(3)
    assert choice.next_due() == 110.0
    # The first claim's late burst lands within the hold: it stands, reported at once.
    choice.offer(3, outcome_rank(FIRST), "failed", first=True, seen=106.0)
    assert choice.release(106.0) == [(3, "failed")]
    assert choice.next_due() is None


def test_a_reported_outcome_is_never_changed() -> None:
    choice: OutcomeChoice[str] = OutcomeChoice(hold=10.0)
    choice.offer(3, outcome_rank(TAKEOVER), "succeeded", first=False, seen=0.0)
    assert choice.release(10.0) == [(3, "succeeded")]
    choice.offer(3, outcome_rank(FIRST), "failed", first=True, seen=20.0)  # too late
    choice.offer(3, OWN_OUTCOME, "cancelled", first=True, seen=20.0)
    choice.offer(3, outcome_rank(SLOT), "again", first=False, seen=20.0)  # stands under
    assert choice.release(1e9) == []
    assert choice.reported == {3: outcome_rank(TAKEOVER)}
    assert choice.late == 2


def test_an_object_of_its_own_is_reported_at_once() -> None:
    choice: OutcomeChoice[str] = OutcomeChoice(hold=10.0)
    choice.offer(3, outcome_rank(TAKEOVER), "succeeded", first=False, seen=0.0)
    choice.offer(3, OWN_OUTCOME, "cancelled", first=True, seen=1.0)
    assert choice.release(1.0) == [(3, "cancelled")]


def test_a_first_claim_is_claim_0_of_a_span_in_no_hole() -> None:
    book = PoolBook(PoolOptions(total=16, chunk_size=16, workers=2))  # regions [0, 8), [8, 16)
    for start, number in ((0, 0), (8, 0), (12, 0)):
        book.learn_listed(start, number)
    assert book.first_claim(0, 0)
    assert not book.first_claim(0, 1)
    assert book.first_claim(8, 0)
    assert book.first_claim(12, 0)
    book.learn_listed(0, 1)  # a takeover of [0, ...): the spans after it may be its slots
    book.learn_listed(6, 0)
    assert book.first_claim(0, 0)
    assert not book.first_claim(6, 0)
    assert book.first_claim(12, 0)  # another region
