"""The one amount parser (gridmarket/amounts.py) and the request guard's input checks
(gridmarket/input_checks.py) on the hostile inputs of issue 32: short numbers with huge
exponents, long digit strings, NaN and Infinity, JSON nested thousands deep. Each is refused
with a message naming the field, and within a millisecond or so (``int(Decimal("1e300000") *
10**18)`` took 4 s)."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from agent.errors import CliError
from agent.signup import stake_wei
from frontend_api.format import parse_eth
from gridmarket.amounts import MAX_UNITS, AmountError, parse_units, parse_whole
from gridmarket.input_checks import check_json, check_query
from gridmarket.token import Token

TUSD = Token("tUSD", "0x" + "11" * 20, 6)

HOSTILE = ["1e300000", "1e999999999", "-1e300000", "9" * 5000, "NaN", "Infinity", "-Infinity"]


@pytest.mark.parametrize(
    ("text", "wei"),
    [
        ("0.01", 10**16),
        ("1e-3", 10**15),
        (" 2 ETH", 2 * 10**18),
        ("0", 0),
        ("-0", 0),
        ("1.000000000000000001", 10**18 + 1),
        ("+.5", 5 * 10**17),
        ("1E2", 100 * 10**18),
        ("1e59", 10**77),
    ],
)
def test_amounts_in_bounds_parse_exactly(text: str, wei: int) -> None:
    assert parse_eth(text, "bounty_eth") == wei


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("1e300000", "too large: an amount is at most 2**256 - 1 wei"),
        ("1e999999999", "too large"),
        ("1e60", "too large"),
        ("-1e300000", "is negative"),
        ("9" * 5000, "too long for an amount of ETH (at most 100 characters)"),
        ("0." + "0" * 98 + "1", "too long"),
        ("1e-999999999", "more than 18 decimals"),
        ("0.0000000000000000001", "more than 18 decimals"),
        ("NaN", "is not an amount of ETH"),
        ("Infinity", "is not an amount of ETH"),
        ("1_000", "is not an amount of ETH"),
        ("\u0661", "is not an amount of ETH"),  # an Arabic-Indic one: Decimal() took it
        ("", "is not an amount of ETH"),
        (".", "is not an amount of ETH"),
    ],
)
def test_bad_amounts_are_refused_quickly_naming_the_field(text: str, words: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(AmountError) as caught:
        parse_eth(text, "bounty_eth")
    assert time.perf_counter() - t0 < 0.05
    assert str(caught.value).startswith("bounty_eth: ") and words in str(caught.value)
    assert caught.value.field == "bounty_eth"


@pytest.mark.parametrize("text", HOSTILE, ids=lambda t: t[:12])
def test_every_entry_point_refuses_the_hostile_amounts(text: str) -> None:
    """The token's units (API bounties, agent config and unstake), ETH (API, CLI), the agent's
    --stake and the whole-unit fields (``*_wei``) all go through the bounded parser."""
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"tUSD|units of tUSD"):
        TUSD.to_units(text)
    with pytest.raises(CliError, match="--stake: "):
        stake_wei(text)
    with pytest.raises(AmountError, match="bounty_wei: "):
        parse_whole(text, field="bounty_wei")
    with pytest.raises(ValueError):
        TUSD.to_units(Decimal(text))  # what the agent's config holds (pydantic's Decimal)
    assert time.perf_counter() - t0 < 0.05


def test_tokens_and_other_types() -> None:
    assert TUSD.to_units("1.5") == 1_500_000
    assert TUSD.to_units(Decimal("0.000001")) == 1
    assert TUSD.to_units(7) == 7_000_000
    with pytest.raises(ValueError, match=r"0\.0000001 tUSD has more than 6 decimals"):
        TUSD.to_units(Decimal("0.0000001"))
    with pytest.raises(ValueError, match="'-1' is not an amount of tUSD"):
        TUSD.to_units("-1")
    assert parse_units(1e16, 0) == 10**16
    with pytest.raises(AmountError):
        parse_units(float("nan"), 18)
    with pytest.raises(AmountError):
        parse_units(True, 18)
    assert parse_whole(str(MAX_UNITS)) == MAX_UNITS
    with pytest.raises(AmountError, match="too large"):
        parse_whole(str(MAX_UNITS + 1))
    with pytest.raises(AmountError, match="negative"):
        parse_whole("-5", field="bounty_wei")
    with pytest.raises(AmountError, match="too large"):
        parse_whole(10**5000)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"[" * 1000 + b"]" * 1000, "[0]" * 32),
        (b"[" * 5000 + b"]" * 5000, "[0]" * 32),
        (b"[" * 5000, "[0]" * 32),  # never closed: the parser would recurse all the same
        (b'{"a":' * 1000 + b"1" + b"}" * 1000, ".".join("a" * 32)),
        (
            b'{"nodes": [{"x": 1}, {"y": ' + b"[" * 40 + b"]" * 40 + b"}]}",
            "nodes[1].y" + "[0]" * 29,
        ),
        (b'{"duration_s": 1e300000}', "duration_s"),
        (b'{"a": {"b": [1, -1e999999999]}}', "a.b[1]"),
        (b'{"bounty_wei": ' + b"9" * 5000 + b"}", "bounty_wei"),
        (b'{"x": NaN}', "x"),
        (b'{"x": [1, {"y": -Infinity}]}', "x[1].y"),
        (b'{"x": 1e999}', "x"),
    ],
    ids=lambda v: repr(v)[:24],
)
def test_json_too_deep_or_with_unbounded_numbers_names_the_field(body: bytes, field: str) -> None:
    t0 = time.perf_counter()
    problem = check_json(body)
    assert time.perf_counter() - t0 < 0.1
    assert problem is not None and problem.field == field, problem
    assert field in problem.detail


@pytest.mark.parametrize(
    "body",
    [
        b'{"spec": {"a": [[[[1]]]]}, "id": "0xe1234e5678", "n": 1e308, "m": -1e-999}',
        b'{"note": "' + b"[" * 5000 + b'1e300000"}',  # in a string: the app's to judge
        b'{"n": ' + b"9" * 100 + b"}",
        b"[" * 32 + b"]" * 32,
    ],
    ids=lambda v: repr(v)[:24],
)
def test_json_within_bounds_passes(body: bytes) -> None:
    assert check_json(body) is None


def test_query_numbers_are_bounded_naming_the_parameter() -> None:
    for raw in (
        b"bounty_eth=1e300000",
        b"x=1&bounty_eth=-1e%2B999999999",
        b"bounty_eth=" + b"9" * 200,
    ):
        problem = check_query(raw)
        assert problem is not None and problem.field == "bounty_eth", raw
        assert problem.detail.startswith("query parameter bounty_eth: the number ")
    for raw in (b"bounty_eth=0.01", b"submitter=0xe12345e67890", b"q=1e300000abc", b""):
        assert check_query(raw) is None, raw
