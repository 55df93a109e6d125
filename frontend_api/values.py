"""Parsers for the values people type: addresses and 32-byte ids (light to import: the CLI uses
them before it needs web3)."""

from __future__ import annotations

from eth_utils.address import is_hex_address, to_checksum_address


def parse_address(value: str, field_name: str = "address") -> str:
    """The checksummed form of a 0x address; ValueError naming ``field_name`` otherwise."""
    if not isinstance(value, str) or not is_hex_address(value.strip()):
        raise ValueError(f"{field_name}: {value!r} is not a 0x address of 40 hex digits")
    return str(to_checksum_address(value.strip()))


def parse_bytes32(value: str, field_name: str = "job_id") -> bytes:
    """32 bytes from ``0x`` and 64 hex digits; ValueError naming ``field_name`` otherwise."""
    text = value.strip().lower() if isinstance(value, str) else ""
    if not (text.startswith("0x") and len(text) == 66):
        raise ValueError(f"{field_name}: {value!r} must be 0x and 64 hex digits")
    try:
        return bytes.fromhex(text[2:])
    except ValueError:
        raise ValueError(f"{field_name}: {value!r} must be 0x and 64 hex digits") from None
