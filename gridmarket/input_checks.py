"""The checks :mod:`gridmarket.http_guard` makes of a request's JSON body, query string and form
fields before the app parses any of it.

* **Depth**: JSON nested deeper than :data:`MAX_JSON_DEPTH` arrays and objects is refused
  (Python's parser recurses per level: a 2 KB body of ``[`` nested 1,000 deep raised
  ``RecursionError``, a 500).
* **Numbers**: a number longer than :data:`MAX_NUMBER_CHARS` characters or with an exponent over
  :data:`MAX_EXPONENT` is refused, in a JSON body and in a query or form value that is a number
  (``1e300000`` is eight characters; turning it into an integer is seconds of CPU).
* **Strict JSON**: ``NaN``, ``Infinity``, numbers that overflow to infinity, lone UTF-16
  surrogates and bytes that are not UTF-8 (Python's ``json`` accepts them all).

Each problem is a :class:`Problem`: a message and the field it is in (``nodes[0].resources``,
a query parameter's name; ``body`` for the body as a whole). The common case costs a few passes
of C code over the text (``str.count``, one regular expression); the field is found by walking
the tokens only once a problem is known to be there.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import accumulate
from typing import Any
from urllib.parse import parse_qsl, unquote_plus

MAX_JSON_DEPTH = 32
"""Arrays and objects nested at most this deep (the APIs' own models use fewer than 8)."""
MAX_NUMBER_CHARS = 100
"""The longest number accepted (a ``uint256`` has 78 digits)."""
MAX_EXPONENT = 999
"""The largest exponent accepted (a float is at most about ``1.8e308``)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a request is refused (400), and the field it is in."""

    detail: str
    field: str = "body"


class JsonProblemError(ValueError):
    """A JSON body that the app must not see (names what is wrong)."""


def _bad_constant(name: str) -> Any:
    raise JsonProblemError(f"{name} is not a JSON number (use a finite number or null)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonProblemError(f"the number {text[:40]} is out of range")
    return value


_STRICT = json.JSONDecoder(parse_constant=_bad_constant, parse_float=_finite)
"""``json.loads(text, parse_constant=..., parse_float=...)`` built once: ``json.loads`` with
those arguments builds a decoder (and its scanner) per call, most of the check's cost."""

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_BAD_NUMBER = re.compile(
    rf"(?<![-+.0-9eE])[-+.0-9eE]{{{MAX_NUMBER_CHARS + 1}}}"
    rf"|[eE][-+]?0*+[1-9][0-9]{{{len(str(MAX_EXPONENT))}}}"
)
"""Somewhere a number is too long or its exponent too large (or, in raw text, a string that
looks so: confirmed with the strings taken out). A run is tried from its start only, so the
search stays linear."""
_EXPONENT = re.compile(r"[eE][-+]?0*([0-9]+)$")
_NUMBERISH = re.compile(r"\s*[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\s*", re.ASCII)
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]|[^\s"\[\]{}:,]+', re.DOTALL)


def number_problem(token: str) -> str | None:
    """Why the number ``token`` is refused (too long, too large an exponent), or None."""
    shown = token if len(token) <= 24 else f"{token[:24]}... ({len(token)} characters)"
    if len(token) > MAX_NUMBER_CHARS:
        return f"the number {shown} is longer than {MAX_NUMBER_CHARS} characters"
    exponent = _EXPONENT.search(token)
    if exponent is not None and len(exponent.group(1)) > len(str(MAX_EXPONENT)):
        return f"the number {shown} has an exponent over {MAX_EXPONENT}"
    return None


def check_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> Problem | None:
    """What makes ``body`` unacceptable as JSON for the apps; None if it is fine or not JSON at
    all (syntax errors are the app's to report)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Problem(
            f"request body is not UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start})"
        )
    bare: str | None = None  # the text with its strings emptied, made when needed
    suspect = False
    if text.count("[") + text.count("{") > max_depth:
        bare = _STRING.sub('""', text)
        steps = map(_DEPTH_STEP.__getitem__, _NOT_BRACKET.sub("", bare))
        suspect = max(accumulate(steps), default=0) > max_depth
    if not suspect and _BAD_NUMBER.search(text) is not None:
        bare = bare if bare is not None else _STRING.sub('""', text)
        suspect = _BAD_NUMBER.search(bare) is not None
    if suspect and (problem := _locate(text, max_depth)) is not None:
        return problem
    try:
        value = _STRICT.decode(text)
    except JsonProblemError as exc:
        return _locate(text, max_depth, strict=True) or Problem(f"request body: {exc}")
    except RecursionError:  # not reached within max_depth; never a 500 if it were
        return Problem("request body: nested too deeply")
    except ValueError:
        return None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        point = ord(exc.object[exc.start])
        return Problem(f"request body holds a lone UTF-16 surrogate (\\u{point:04x}) in a string")
    return None


def _locate(text: str, max_depth: int, *, strict: bool = False) -> Problem | None:
    """The first container past ``max_depth`` or bad number in ``text`` (with ``strict``, or
    ``NaN``, ``Infinity`` or a number out of a float's range), with its path: a walk over the
    tokens, made only once :func:`check_json` knows one is there."""
    stack: list[list[Any]] = []  # [is_object, the current key or index]
    for match in _TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first in "[{":
            if len(stack) >= max_depth:
                where = _path(stack)
                return Problem(
                    f"request body: {where} is nested deeper than {max_depth} arrays and objects",
                    where,
                )
            stack.append([first == "{", None if first == "{" else 0])
        elif first in "]}":
            if stack:
                stack.pop()
        elif first == ",":
            if stack:
                top = stack[-1]
                top[1] = None if top[0] else top[1] + 1
        elif first == '"':
            if stack and stack[-1][0] and stack[-1][1] is None:
                stack[-1][1] = token[1:-1][:40]
        elif first != ":":
            why = number_problem(token) or (_strict_problem(token) if strict else None)
            if why is not None:
                where = _path(stack)
                return Problem(f"request body: {where}: {why}", where)
    return None


def _strict_problem(token: str) -> str | None:
    """Why strict JSON refuses the (short) scalar ``token``: NaN, Infinity, overflow."""
    try:
        _STRICT.decode(token)
    except JsonProblemError as exc:
        return str(exc)
    except ValueError:
        pass
    return None


def _path(stack: list[list[Any]]) -> str:
    """``nodes[0].resources``: where the walk is; ``body`` at the top."""
    parts: list[str] = []
    for is_object, key in stack:
        if is_object:
            parts.append(f".{key}" if parts else str(key))
        else:
            parts.append(f"[{key}]")
    path = "".join(parts) or "body"
    return path if len(path) <= 200 else f"{path[:200]}..."


def check_query(raw: bytes, kind: str = "query parameter") -> Problem | None:
    """A query string's (or an urlencoded form's) value that is a number too long or with too
    large an exponent: refused naming the parameter. Other values are the app's to check."""
    if not raw:
        return None
    text = raw.decode("latin-1")
    if _BAD_NUMBER.search(unquote_plus(text)) is None:
        return None
    for name, value in parse_qsl(text, keep_blank_values=True):
        if _NUMBERISH.fullmatch(value) is not None:
            why = number_problem(value.strip())
            if why is not None:
                field = name[:100] or "query"  # a parameter without a name: ?=1e300000
                return Problem(f"{kind} {field}: {why}", field)
    return None
