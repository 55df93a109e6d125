"""What a job is paid in, as the pages, the API and the CLI show it: ETH or a listed ERC-20.

The deployment file names the listed tokens (``tokens``: symbol -> address and decimals,
:func:`gridmarket.token.tokens_of`). Every amount of a job (bounty, fee, payout, collateral,
refund, slash, dispute deposit) is in its job's token, so every amount shown goes with its
currency: a :class:`Currency` turns smallest units into ``5 tUSD`` or ``0.01 ETH``. A token the
deployment file does not name (listed on-chain later, or hostile) is shown by its address with
its raw units: its decimals are not known, so no decimal point is guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from eth_utils.address import is_hex_address, to_checksum_address

from gridmarket.escrow import ZERO_ADDRESS
from gridmarket.token import ETH, Token, tokens_of

from .format import eth, short


@dataclass(frozen=True, slots=True)
class Currency:
    """A job's currency: its token (ETH at the zero address), and whether it is listed in the
    deployment file (``known``; an unknown token has no trusted symbol or decimals)."""

    token: Token
    known: bool = True

    @property
    def address(self) -> str:
        return self.token.address

    @property
    def symbol(self) -> str:
        return self.token.symbol if self.known else short(self.token.address)

    @property
    def is_eth(self) -> bool:
        return self.token.is_eth

    def fmt(self, units: int | str | None) -> str:
        """``5 tUSD``, ``0.01 ETH``; ``12345 units of 0xAbCd…1234`` for an unknown token."""
        if units is None or units == "":
            return "-"
        value = int(units)
        if self.is_eth:
            return eth(value)
        if not self.known:
            return f"{value} units of {short(self.token.address)}"
        return self.token.fmt(value)

    def decimal(self, units: int | str) -> str:
        """The amount without the symbol (``5``, ``0.25``); raw units for an unknown token."""
        value = int(units)
        if not self.known:
            return str(value)
        text = format(Decimal(value) / (Decimal(10) ** self.token.decimals), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "symbol": self.symbol,
            "decimals": self.token.decimals if self.known else None,
            "known": self.known,
        }


ETH_CURRENCY = Currency(Token(ETH, ZERO_ADDRESS, 18))


def money(units: int | str | None, currency: dict[str, Any] | None) -> str:
    """``units`` in the currency an API answer names (its ``currency`` JSON; None: ETH), for
    the CLI: ``5 tUSD``, ``0.01 ETH``."""
    if not currency or str(currency.get("address", ZERO_ADDRESS)) == ZERO_ADDRESS:
        return ETH_CURRENCY.fmt(units)
    decimals = currency.get("decimals")
    known = bool(currency.get("known")) and isinstance(decimals, int) and 0 <= decimals <= 77
    address = to_checksum_address(str(currency["address"]))
    symbol = str(currency.get("symbol") or address)[:32]
    token = Token(symbol, address, int(decimals) if known and decimals is not None else 0)
    return Currency(token, known=known).fmt(units)


class Currencies:
    """The currencies of one deployment: ETH and the tokens its file lists."""

    def __init__(self, listed: dict[str, Any] | None) -> None:
        self._by_symbol = {s.lower(): Currency(t) for s, t in tokens_of(listed or {}).items()}
        self._by_address = {c.address: c for c in self._by_symbol.values()}

    def all(self) -> list[Currency]:
        """ETH first, then the listed tokens by symbol."""
        rest = sorted((c for c in self._by_symbol.values() if not c.is_eth), key=lambda c: c.symbol)
        return [ETH_CURRENCY, *rest]

    def of(self, address: Any) -> Currency:
        """The currency at ``address`` (a job's ``token``); an unlisted one by its address.
        ValueError for something that is not an address."""
        if not isinstance(address, str) or not is_hex_address(address):
            raise ValueError(f"token: {address!r} is not an address")
        checksummed = to_checksum_address(address)
        found = self._by_address.get(checksummed)
        if found is not None:
            return found
        return Currency(Token(checksummed, checksummed, 0), known=False)

    def parse(self, text: Any, field_name: str = "currency") -> Currency:
        """A currency a person named: ``ETH``, a listed symbol (any case) or a listed token's
        address. ValueError naming ``field_name`` for anything else."""
        value = str(text if text is not None else ETH).strip()
        if value == "":
            value = ETH
        found = self._by_symbol.get(value.lower())
        if found is None and is_hex_address(value):
            found = self._by_address.get(to_checksum_address(value))
        if found is None:
            choices = ", ".join(c.symbol for c in self.all())
            raise ValueError(
                f"{field_name}: {value[:60]!r} is not a currency of this escrow (choose {choices})"
            )
        return found

    def to_json(self) -> list[dict[str, Any]]:
        return [c.to_json() for c in self.all()]
