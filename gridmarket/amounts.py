"""Amounts people type (``0.01`` ETH, ``1.5`` tUSD, ``1e-3``, ``250000`` wei) as whole units,
parsed within fixed bounds: the one parser every amount goes through (query, form, JSON, CLI,
job file, agent config).

An amount is at most :data:`MAX_AMOUNT_CHARS` characters of ASCII decimal (a sign, digits, one
point, an exponent) and at most :data:`MAX_UNITS` smallest units (a ``uint256``). Both are
checked before any conversion, and the conversion is exact integer arithmetic on those few
digits, so no input costs more than a few microseconds. (``Decimal("1e300000")`` is cheap, but
``int()`` of it builds a 300,000-digit integer: seconds of CPU, quadratic in the exponent.)
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

MAX_AMOUNT_CHARS = 100
"""The longest amount accepted: a ``uint256`` has 78 digits; room for a point and zeros."""
MAX_UNITS = 2**256 - 1
"""The largest amount in smallest units: what a ``uint256`` holds."""
_MAX_DIGITS = len(str(MAX_UNITS))
_CEILING = "an amount is at most 2**256 - 1"

_NUMBER = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?", re.ASCII)
_WHOLE = re.compile(r"([+-]?)([0-9]+)", re.ASCII)


class AmountError(ValueError):
    """An amount that cannot be parsed: ``field`` (None when the caller names it) and why."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def _shown(text: str) -> str:
    """The input as a message quotes it: at most 24 characters of it."""
    return repr(text) if len(text) <= 24 else repr(text[:24]) + f"... ({len(text)} characters)"


def parse_units(
    amount: str | int | float | Decimal,
    decimals: int,
    *,
    field: str | None = None,
    unit: str = "ETH",
    smallest: str = "wei",
) -> int:
    """``amount`` of ``unit`` (which has ``decimals`` decimals) in its smallest units:
    ``parse_units("0.01", 18) == 10**16``. :class:`AmountError` (naming ``field``) for anything
    that is not a non-negative decimal, is longer than :data:`MAX_AMOUNT_CHARS`, has more
    decimals than ``unit`` or is over :data:`MAX_UNITS` ``smallest``."""
    if isinstance(amount, bool):
        raise AmountError(field, f"{amount!r} is not an amount of {unit}")
    if isinstance(amount, Decimal):
        text = _decimal_text(amount, field, unit)
    elif isinstance(amount, int):
        if amount.bit_length() > 260:
            raise AmountError(field, f"the amount is too large: {_CEILING} {smallest}")
        text = str(amount)
    elif isinstance(amount, float):
        if not math.isfinite(amount):
            raise AmountError(field, f"{amount!r} is not an amount of {unit}")
        text = repr(amount)
    else:
        text = str(amount).strip()
    if len(text) > MAX_AMOUNT_CHARS:
        raise AmountError(
            field,
            f"{_shown(text)} is too long for an amount of {unit} "
            f"(at most {MAX_AMOUNT_CHARS} characters)",
        )
    match = _NUMBER.fullmatch(text)
    if match is None or not (match.group(2) or match.group(3)):
        raise AmountError(field, f"{_shown(text)} is not an amount of {unit}")
    sign, whole, frac, exp = match.group(1), match.group(2), match.group(3) or "", match.group(4)
    digits = (whole + frac).lstrip("0")
    if not digits:
        return 0
    if sign == "-":
        raise AmountError(field, f"{_shown(text)} is not an amount of {unit}: it is negative")
    significant = digits.rstrip("0")
    # amount = significant x 10**shift smallest units; exp has at most 100 digits: cheap
    shift = int(exp or 0) - len(frac) + decimals + (len(digits) - len(significant))
    if shift < 0:
        raise AmountError(field, f"{text} {unit} has more than {decimals} decimals")
    if len(significant) + shift > _MAX_DIGITS:
        raise AmountError(field, f"{_shown(text)} is too large: {_CEILING} {smallest}")
    units = int(significant) * int(10**shift)  # shift >= 0: exact
    if units > MAX_UNITS:
        raise AmountError(field, f"{_shown(text)} is too large: {_CEILING} {smallest}")
    return units


def parse_whole(amount: str | int, *, field: str | None = None, smallest: str = "wei") -> int:
    """A whole number of smallest units (``bounty_wei``): ASCII digits, at most
    :data:`MAX_AMOUNT_CHARS` of them, at most :data:`MAX_UNITS`; :class:`AmountError` naming
    ``field`` otherwise (a negative one too)."""
    if isinstance(amount, bool):
        raise AmountError(field, f"{amount!r} is not a whole number of {smallest}")
    if isinstance(amount, int):
        units = amount
        if units.bit_length() > 260:
            raise AmountError(field, f"the amount is too large: {_CEILING} {smallest}")
    else:
        text = str(amount).strip()
        if len(text) > MAX_AMOUNT_CHARS:
            raise AmountError(
                field,
                f"{_shown(text)} is too long for a whole number of {smallest} "
                f"(at most {MAX_AMOUNT_CHARS} characters)",
            )
        match = _WHOLE.fullmatch(text)
        if match is None:
            raise AmountError(field, f"{_shown(text)} is not a whole number of {smallest}")
        units = int(text)
    if units < 0:
        raise AmountError(field, f"{units} {smallest} is negative")
    if units > MAX_UNITS:
        raise AmountError(field, f"{_shown(str(units))} is too large: {_CEILING} {smallest}")
    return units


def _decimal_text(value: Decimal, field: str | None, unit: str) -> str:
    """A Decimal as the text :func:`parse_units` reads, built from its digits and exponent
    (``format(value, "f")`` would write out every zero of ``1e300000``)."""
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):  # NaN, sNaN, Infinity
        raise AmountError(field, f"{str(value)!r} is not an amount of {unit}")
    if len(digits) > MAX_AMOUNT_CHARS:
        raise AmountError(
            field,
            f"an amount of {unit} of {len(digits)} digits is too long (at most {MAX_AMOUNT_CHARS})",
        )
    if -40 <= exponent <= 0:
        return format(value, "f")  # as it was written: 0.0000001, not 1E-7
    return f"{'-' if sign else ''}{''.join(map(str, digits))}e{exponent}"
