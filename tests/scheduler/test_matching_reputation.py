"""Reputation: decayed Beta posterior, weights, exclusion (scheduler.matching.reputation)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.matching.reputation import (
    DEFAULT_POLICY,
    Outcome,
    ReputationPolicy,
    ReputationState,
    decayed,
    is_excluded,
    record,
    score,
)

DAY = 24 * 3600.0
WEEK = 7 * DAY


def history(*outcomes: Outcome, start: float = 0.0, step: float = 0.0) -> ReputationState:
    state = ReputationState(at=start)
    for i, outcome in enumerate(outcomes):
        state = record(state, outcome, start + i * step)
    return state


def test_new_node_scores_the_prior_mean() -> None:
    assert score(ReputationState(), 0.0) == pytest.approx(2 / 3)
    assert not is_excluded(ReputationState(), 0.0)


def test_successes_raise_and_failures_lower_the_score() -> None:
    good = history(*[Outcome.SUCCESS] * 10)
    bad = history(*[Outcome.FAILURE] * 2)
    assert score(good, good.at) == pytest.approx(12 / 13)
    assert score(bad, bad.at) == pytest.approx(2 / 5)


def test_outcome_weights() -> None:
    failure = score(history(Outcome.FAILURE), 0)
    timeout = score(history(Outcome.TIMEOUT), 0)
    rejected = score(history(Outcome.REJECTED), 0)
    assert failure > timeout > rejected
    assert timeout == pytest.approx(2 / (3 + 1.5))
    assert rejected == pytest.approx(2 / (3 + 3.0))


def test_evidence_halves_every_half_life() -> None:
    state = history(*[Outcome.FAILURE] * 4)  # bad evidence 4
    later = decayed(state, state.at + WEEK, DEFAULT_POLICY)
    assert later.bad == pytest.approx(2.0)
    assert score(state, state.at + WEEK) == pytest.approx(2 / (3 + 2.0))
    # long after, the score returns to the prior: a node can recover
    assert score(state, state.at + 52 * WEEK) == pytest.approx(2 / 3, abs=1e-6)


def test_recent_outcomes_weigh_more_than_old_ones() -> None:
    old_failures = record(
        record(history(Outcome.FAILURE, Outcome.FAILURE), Outcome.SUCCESS, 4 * WEEK),
        Outcome.SUCCESS,
        4 * WEEK + 1,
    )
    recent_failures = record(
        record(history(Outcome.SUCCESS, Outcome.SUCCESS), Outcome.FAILURE, 4 * WEEK),
        Outcome.FAILURE,
        4 * WEEK + 1,
    )
    now = 4 * WEEK + 2
    assert score(old_failures, now) > score(recent_failures, now)


def test_half_life_is_configurable() -> None:
    quick = ReputationPolicy(half_life_s=DAY)
    state = record(ReputationState(), Outcome.FAILURE, 0.0, quick)
    assert decayed(state, DAY, quick).bad == pytest.approx(0.5)


def test_exclusion_after_consecutive_failures_then_cooldown() -> None:
    state = history(Outcome.SUCCESS, Outcome.FAILURE, Outcome.TIMEOUT)
    assert not is_excluded(state, state.at)
    state = record(state, Outcome.FAILURE, state.at + 60)
    assert state.streak == 3
    assert is_excluded(state, state.at)
    assert is_excluded(state, state.at + DAY - 1)
    assert not is_excluded(state, state.at + DAY)  # cooldown over: probation
    assert record(state, Outcome.SUCCESS, state.at + 1).streak == 0


def test_exclusion_on_a_low_score_with_enough_evidence() -> None:
    # alternate so the streak rule never fires: 1 success per 3 failures
    outcomes = [Outcome.FAILURE, Outcome.FAILURE, Outcome.SUCCESS] * 4
    state = history(*outcomes)
    assert state.streak == 0
    assert score(state, state.at) < 0.5
    policy = ReputationPolicy(exclude_below=0.45, min_evidence=5.0)
    assert is_excluded(state, state.at, policy)
    assert not is_excluded(state, state.at, ReputationPolicy(exclude_below=0.45, min_evidence=50))
    # evidence decays below min_evidence: the exclusion lifts
    assert not is_excluded(state, state.at + 2 * WEEK, policy)


def test_out_of_order_event_does_not_undo_decay() -> None:
    state = history(Outcome.SUCCESS, start=1000.0)
    assert decayed(state, 0.0, DEFAULT_POLICY) == state
    assert record(state, Outcome.FAILURE, 500.0).bad == 1.0


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="half_life"):
        ReputationPolicy(half_life_s=0)
    with pytest.raises(ValueError, match="prior"):
        ReputationPolicy(prior_beta=0)
    with pytest.raises(ValueError, match="weights"):
        ReputationPolicy(timeout_weight=-1)
    with pytest.raises(ValueError, match="consecutive"):
        ReputationPolicy(max_consecutive_failures=0)


@given(
    st.lists(st.tuples(st.sampled_from(list(Outcome)), st.floats(0, 30 * DAY)), max_size=40),
    st.floats(0, 60 * DAY),
)
def test_score_stays_in_unit_interval(events: list[tuple[Outcome, float]], later: float) -> None:
    state = ReputationState()
    now = 0.0
    for outcome, gap in events:
        now += gap
        state = record(state, outcome, now)
        assert 0.0 < score(state, now) < 1.0
    assert 0.0 < score(state, now + later) < 1.0
