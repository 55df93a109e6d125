"""How amounts, addresses and times read on the pages (Jinja filters) and in the CLI."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import ROUND_DOWN, Decimal

from gridmarket.amounts import parse_units

WEI_PER_ETH = 10**18


def eth(wei: int | str | None, places: int = 6) -> str:
    """``0.0125 ETH``: wei as ETH, at most ``places`` decimals, trailing zeros dropped."""
    if wei is None or wei == "":
        return "-"
    value = int(wei)
    if value == 0:
        return "0 ETH"
    amount = Decimal(value) / WEI_PER_ETH
    shown = amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_DOWN)
    if shown == 0:
        return f"<{Decimal(1).scaleb(-places)} ETH"
    text = format(shown.normalize(), "f")
    return f"{text} ETH"


def parse_eth(text: str, field_name: str = "amount") -> int:
    """Wei from a decimal ETH amount (``"0.01"``, ``"1e-3"``, ``"0.5 ETH"``), bounded
    (:func:`gridmarket.amounts.parse_units`); an ``AmountError`` (a ValueError) naming the
    field."""
    text = str(text).strip().removesuffix("ETH").removesuffix("eth")
    return parse_units(text, 18, field=field_name, unit="ETH", smallest="wei")


def short(value: str | None, head: int = 6, tail: int = 4) -> str:
    """``0x1234…abcd``: a long hex string shortened for tables (full value in the title)."""
    if not value:
        return "-"
    if len(value) <= head + tail + 1:
        return value
    return f"{value[:head]}…{value[-tail:]}"


def when(ts: float | int | None) -> str:
    """``2025-01-31 12:00:03 UTC``."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(ts: float | int | None, now: float | None = None) -> str:
    """``12 s ago``, ``3 min ago``, ``in 2 h``: a time relative to now."""
    if not ts:
        return "-"
    delta = (now if now is not None else time.time()) - float(ts)
    future = delta < 0
    delta = abs(delta)
    if delta < 60:
        text = f"{int(delta)} s"
    elif delta < 3600:
        text = f"{int(delta // 60)} min"
    elif delta < 86400:
        text = f"{delta / 3600:.1f} h"
    else:
        text = f"{delta / 86400:.1f} d"
    return f"in {text}" if future else f"{text} ago"


def mib(value: int | None) -> str:
    """``512 MiB`` or ``24 GiB``."""
    if value is None:
        return "-"
    if value >= 1024 and value % 1024 == 0:
        return f"{value // 1024} GiB"
    return f"{value} MiB"


def size(n: int | None) -> str:
    """A byte count for people: ``1.5 KiB``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def duration(seconds: int | None) -> str:
    """``1 h``, ``10 min``, ``3 d``: a window's length for people."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400 and s % 86400 == 0:
        return f"{s // 86400} d"
    if s >= 3600 and s % 3600 == 0:
        return f"{s // 3600} h"
    if s >= 60 and s % 60 == 0:
        return f"{s // 60} min"
    return f"{s} s"


STATE_LABELS = {
    "verifying": "integrity check",
    "verified": "integrity-checked",
    "pending_spec": "pending spec",
    "handed_back": "handed back",
}
"""How a state reads for people: the scheduler's check of a result is an integrity check (the
output exists and hashes to its CID), not a verification that it is correct."""


def state_label(state: str | None) -> str:
    """``verifying`` -> ``integrity check``; other states with spaces for underscores."""
    if not state:
        return "-"
    return STATE_LABELS.get(str(state), str(state).replace("_", " "))
