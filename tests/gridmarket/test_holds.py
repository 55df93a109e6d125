"""gridmarket.holds: the hold a scheduler offers and the check an agent makes, with the
deployment's margin (both sides read the same file, so an honest offer always passes)."""

from __future__ import annotations

import pytest

from gridmarket.holds import HOLD_MARGIN_S, MAX_HOLD_FOR, hold_for, hold_problem, margin_of


def test_the_margin_is_the_deployments_or_the_default() -> None:
    assert margin_of({"hold_margin_s": 5}) == 5
    assert margin_of({}) == margin_of(None) == HOLD_MARGIN_S
    for bad in (-1, True, "5", 2**32, 1.5):  # hostile or broken files fall back
        assert margin_of({"hold_margin_s": bad}) == HOLD_MARGIN_S


@pytest.mark.parametrize("margin", [5, 300, 600])
@pytest.mark.parametrize("timeout", [1, 60, 600, 3600, 7 * 24 * 3600])
def test_an_offer_with_the_same_margin_always_passes(timeout: int, margin: int) -> None:
    offered = hold_for(timeout, margin)
    assert offered >= timeout + margin
    assert offered >= timeout + timeout // 10
    assert hold_problem(offered, timeout, now=0, deadline=10**9, margin_s=margin) is None


def test_a_short_hold_is_refused_naming_what_it_needs() -> None:
    problem = hold_problem(64, 60, now=0, deadline=10**9, margin_s=5)
    assert problem == (
        "the hold of 64 s does not cover the run: 60 s of timeout and 5 s to post the result "
        "need 65 s"
    )
    # reaching the deadline is enough: nothing counts after it
    assert hold_problem(30, 60, now=100, deadline=130, margin_s=5) is None
    assert hold_problem(29, 60, now=100, deadline=130, margin_s=5) is not None


def test_out_of_range_values_are_refused() -> None:
    assert (
        hold_problem(MAX_HOLD_FOR + 1, 60, 0, 10**9)
        == f"holdFor {MAX_HOLD_FOR + 1} is not a uint32"
    )
    assert hold_for(10**10, 0) == MAX_HOLD_FOR
    with pytest.raises(ValueError, match="negative"):
        hold_for(-1)
