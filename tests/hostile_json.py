"""What an attacker sends to the HTTP APIs (issue 32), as Hypothesis strategies for the fuzz
tests: JSON nested far deeper than the request guard allows, numbers with huge exponents or
thousands of digits, NaN and Infinity, and the same amounts as strings (which only the amount
parser can judge). :func:`hostile_request` splices one into a schemathesis case: as a field of
its body, or as a query parameter."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from gridmarket.input_checks import MAX_JSON_DEPTH

DEPTHS = st.integers(MAX_JSON_DEPTH + 1, 6000)

HOSTILE_NUMBERS = st.one_of(
    st.tuples(
        st.sampled_from(["", "-"]),
        st.integers(1, 9),
        st.sampled_from(["e", "E", "e+", "e-"]),
        st.integers(1000, 10**9),
    ).map(lambda t: f"{t[0]}{t[1]}{t[2]}{t[3]}"),
    st.integers(101, 6000).map(lambda n: "9" * n),
    st.integers(101, 6000).map(lambda n: "0." + "0" * n + "1"),
)
"""Numbers the guard refuses wherever they are (JSON, query): ``1e300000``, ``-9E-999999999``,
5,000 digits."""

HOSTILE_JSON = st.one_of(
    DEPTHS.map(lambda n: "[" * n + "]" * n),
    DEPTHS.map(lambda n: '{"a": ' * n + "1" + "}" * n),
    DEPTHS.map(lambda n: "[" * n),  # never closed
    HOSTILE_NUMBERS,
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"]),
)
"""JSON values the guard refuses (400 naming the field)."""

HOSTILE_AMOUNTS = st.one_of(HOSTILE_NUMBERS, st.sampled_from(["NaN", "Infinity", "1e300000ETH"]))
"""Amounts as strings: an app's parser must refuse them (4xx), at once."""


def splice(body: Any, key: str, fragment: str) -> bytes:
    """``body`` (a case's, JSON-able) as JSON text with the raw JSON ``fragment`` as its ``key``
    (an object body), or as the whole body otherwise."""
    if not isinstance(body, dict):
        return fragment.encode()
    rest = json.dumps({k: v for k, v in body.items() if k != key})[1:-1]
    return ("{" + json.dumps(key) + ": " + fragment + (", " + rest if rest else "") + "}").encode()


def hostile_request(case: Any, data: st.DataObject) -> tuple[dict[str, str], bytes | None, bool]:
    """``(query, body, guarded)`` for ``case`` with something hostile drawn into it: a field of
    its body (when it has an object body or none), or a query parameter. ``guarded``: the
    request guard must refuse it (400 naming the field); else it is an amount as a string."""
    query = {str(k): str(v) for k, v in dict(case.query or {}).items()}
    body = case.body if isinstance(case.body, dict) else None
    where = data.draw(st.sampled_from(["query", "body"] if body is not None else ["query"]))
    if where == "query":
        name = data.draw(st.sampled_from(sorted(query) or ["x"]), label="parameter")
        query[name] = data.draw(HOSTILE_NUMBERS, label="value")
        return query, None if body is None else json.dumps(body).encode(), True
    assert body is not None
    key = data.draw(st.sampled_from(sorted(body) or ["x"]), label="field")
    if data.draw(st.booleans(), label="as a string"):
        fragment = json.dumps(data.draw(HOSTILE_AMOUNTS, label="amount"))
        return query, splice(body, key, fragment), False
    return query, splice(body, key, data.draw(HOSTILE_JSON, label="value")), True
