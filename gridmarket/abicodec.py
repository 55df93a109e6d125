"""The Solidity ABI encoding (calls, return values, event data) without eth-abi.

The provider agent's daemon reads and writes the escrow through :mod:`gridmarket.lightchain`;
eth-abi, with web3, eth-account and their dependencies, cost ~28 MB of resident memory in a
process whose goal is 60 MB (docs/agent.md, "Footprint"). This module covers what the escrow's
ABI uses: ``uint<N>``, ``int<N>``, ``address``, ``bool``, ``bytes<N>``, ``bytes``, ``string``,
tuples ``(T1,T2,...)`` and arrays ``T[]`` and ``T[k]`` of any of them.

Values are eth-abi's (tests/gridmarket/test_abicodec.py compares both over many random values):
:func:`encode` takes ints, addresses as hex strings (any case) or 20 bytes, ``bytes<N>`` and
``bytes`` as bytes, strings as str, tuples and arrays as sequences, and gives the same bytes;
:func:`decode` gives ints, addresses as ``0x`` and 40 lower-case hex digits (as eth-abi 5
does: checksum them where it matters), bools, bytes, str and tuples (arrays too).

Decoding is strict, as eth-abi's is: data too short, an offset or a length pointing outside the
data, non-zero padding, a bool other than 0 or 1 or a string that is not UTF-8 raise
:class:`AbiDecodeError` (a ValueError) naming what was wrong: event data is hostile.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gridmarket.ethsig import keccak

__all__ = [
    "AbiDecodeError",
    "canonical_type",
    "decode",
    "encode",
    "parameter_types",
    "selector",
    "signature",
    "topic",
]

WORD = 32
MAX_ARRAY = 1 << 20
"""The most elements a decoded dynamic array may claim (more is refused before reading them)."""


class AbiDecodeError(ValueError):
    """Bytes that are not a valid ABI encoding of the types asked for."""


# --------------------------------------------------------------------------- types


@dataclass(frozen=True, slots=True)
class _Type:
    kind: (
        str  # "uint", "int", "address", "bool", "fixed_bytes", "bytes", "string", "tuple", "array"
    )
    size: int = 0  # bits of an int, bytes of a fixed_bytes, length of a fixed array (-1: dynamic)
    items: tuple[_Type, ...] = ()  # a tuple's components, an array's one element type

    @property
    def dynamic(self) -> bool:
        if self.kind in ("bytes", "string"):
            return True
        if self.kind == "array":
            return self.size < 0 or self.items[0].dynamic
        if self.kind == "tuple":
            return any(t.dynamic for t in self.items)
        return False

    @property
    def head_size(self) -> int:
        """Bytes this type takes in its enclosing head (a static type is inlined)."""
        if self.dynamic:
            return WORD
        if self.kind == "tuple":
            return sum(t.head_size for t in self.items)
        if self.kind == "array":
            return self.size * self.items[0].head_size
        return WORD


_ATOM = re.compile(r"(uint|int)(\d*)|address|bool|string|bytes(\d*)", re.ASCII)


def _split_top(inner: str) -> list[str]:
    """``a,(b,c),d[]`` -> ``["a", "(b,c)", "d[]"]``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return parts


@lru_cache(maxsize=512)
def _parse(text: str) -> _Type:
    text = text.strip()
    if text.endswith("]"):
        base, _, length = text[:-1].rpartition("[")
        if not base:
            raise ValueError(f"not an ABI type: {text!r}")
        if length and not length.isdigit():
            raise ValueError(f"not an ABI type: {text!r}")
        return _Type("array", int(length) if length else -1, (_parse(base),))
    if text.startswith("(") and text.endswith(")"):
        inner = text[1:-1]
        items = tuple(_parse(p) for p in _split_top(inner)) if inner else ()
        return _Type("tuple", 0, items)
    match = _ATOM.fullmatch(text)
    if match is None:
        raise ValueError(f"not an ABI type: {text!r}")
    if match.group(1):
        bits = int(match.group(2) or 256)
        if not (8 <= bits <= 256 and bits % 8 == 0) or match.group(2) in ("0",):
            raise ValueError(f"not an ABI type: {text!r}")
        return _Type(match.group(1), bits)
    if text.startswith("bytes") and text != "bytes":
        size = int(match.group(3))
        if not 1 <= size <= 32:
            raise ValueError(f"not an ABI type: {text!r}")
        return _Type("fixed_bytes", size)
    return _Type(text)


def canonical_type(param: dict[str, Any]) -> str:
    """The canonical type of an ABI JSON parameter, tuples spelled out: ``(address,uint96)[]``."""
    kind = str(param["type"])
    if kind.startswith("tuple"):
        inner = ",".join(canonical_type(c) for c in param["components"])
        return f"({inner}){kind[len('tuple') :]}"
    return kind


def signature(entry: dict[str, Any]) -> str:
    """``name(type1,type2,...)`` of an ABI JSON function, event or error."""
    return f"{entry['name']}({','.join(canonical_type(i) for i in entry.get('inputs', []))})"


def parameter_types(sig: str) -> list[str]:
    """The parameter types of a signature: ``f(address,(uint8,bytes)[])`` ->
    ``["address", "(uint8,bytes)[]"]``."""
    open_at = sig.find("(")
    if open_at < 1 or not sig.endswith(")"):
        raise ValueError(f"not a signature: {sig!r}")
    inner = sig[open_at + 1 : -1]
    return _split_top(inner) if inner else []


def selector(entry: dict[str, Any]) -> bytes:
    """The 4-byte selector of an ABI JSON function or error."""
    return keccak(signature(entry).encode())[:4]


def topic(entry: dict[str, Any]) -> bytes:
    """The 32-byte topic of an ABI JSON event (its signature's keccak)."""
    return keccak(signature(entry).encode())


# --------------------------------------------------------------------------- encoding


def encode(types: Sequence[str], values: Sequence[Any]) -> bytes:
    """``abi.encode(values...)`` of ``types`` (eth-abi's ``encode``)."""
    if len(types) != len(values):
        raise ValueError(f"{len(types)} types but {len(values)} values")
    return _encode_tuple([_parse(t) for t in types], list(values))


def _encode_tuple(types: Sequence[_Type], values: Sequence[Any]) -> bytes:
    heads: list[bytes] = []
    tails: list[bytes] = []
    offset = sum(t.head_size for t in types)
    for t, v in zip(types, values, strict=True):
        body = _encode(t, v)
        if t.dynamic:
            heads.append(offset.to_bytes(WORD, "big"))
            tails.append(body)
            offset += len(body)
        else:
            heads.append(body)
    return b"".join(heads) + b"".join(tails)


def _padded(raw: bytes) -> bytes:
    return raw + b"\x00" * (-len(raw) % WORD)


def _encode(t: _Type, value: Any) -> bytes:
    kind = t.kind
    if kind in ("uint", "int"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{kind}{t.size} takes an int, not {value!r}")
        signed = kind == "int"
        low, high = (-(1 << (t.size - 1)), 1 << (t.size - 1)) if signed else (0, 1 << t.size)
        if not low <= value < high:
            raise ValueError(f"{value} is out of range for {kind}{t.size}")
        return value.to_bytes(WORD, "big", signed=signed)
    if kind == "address":
        return _address(value).rjust(WORD, b"\x00")
    if kind == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"bool takes a bool, not {value!r}")
        return (1 if value else 0).to_bytes(WORD, "big")
    if kind == "fixed_bytes":
        raw = _bytes(value, f"bytes{t.size}")
        if len(raw) > t.size:
            raise ValueError(f"{len(raw)} bytes do not fit bytes{t.size}")
        return raw.ljust(WORD, b"\x00")
    if kind in ("bytes", "string"):
        if kind == "string":
            if not isinstance(value, str):
                raise TypeError(f"string takes a str, not {value!r}")
            raw = value.encode("utf-8")
        else:
            raw = _bytes(value, "bytes")
        return len(raw).to_bytes(WORD, "big") + _padded(raw)
    if kind == "tuple":
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise TypeError(f"a tuple takes a sequence, not {value!r}")
        if len(value) != len(t.items):
            raise ValueError(
                f"a tuple of {len(t.items)} takes {len(t.items)} values, not {len(value)}"
            )
        return _encode_tuple(t.items, list(value))
    if kind == "array":
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise TypeError(f"an array takes a sequence, not {value!r}")
        items = list(value)
        body = _encode_tuple([t.items[0]] * len(items), items)
        if t.size < 0:
            return len(items).to_bytes(WORD, "big") + body
        if len(items) != t.size:
            raise ValueError(f"an array of {t.size} takes {t.size} values, not {len(items)}")
        return body
    raise ValueError(f"cannot encode {kind}")


def _address(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray) and len(value) == 20:
        return bytes(value)
    if isinstance(value, str):
        bare = value[2:] if value[:2] in ("0x", "0X") else ""
        if len(bare) == 40:
            try:
                return bytes.fromhex(bare)
            except ValueError:
                pass
    raise ValueError(f"not an address: {value!r}")


def _bytes(value: Any, name: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{name} takes bytes, not {value!r}")


# --------------------------------------------------------------------------- decoding


def decode(types: Sequence[str], data: bytes) -> tuple[Any, ...]:
    """The values ``data`` encodes as ``types`` (eth-abi's ``decode``); :class:`AbiDecodeError`
    when it is not a valid encoding."""
    parsed = [_parse(t) for t in types]
    data = bytes(data)
    need = sum(t.head_size for t in parsed)
    if len(data) < need:
        raise AbiDecodeError(f"{len(data)} bytes of data, the types need at least {need}")
    return _decode_tuple(parsed, data, 0)


def _decode_tuple(types: Sequence[_Type], data: bytes, start: int) -> tuple[Any, ...]:
    out = []
    pos = start
    for t in types:
        if t.dynamic:
            offset = _uint_at(data, pos, "offset")
            if offset > len(data) - start:
                raise AbiDecodeError(f"an offset ({offset}) points past the end of the data")
            out.append(_decode(t, data, start + offset))
        else:
            out.append(_decode(t, data, pos))
        pos += t.head_size
    return tuple(out)


def _word(data: bytes, pos: int) -> bytes:
    if pos < 0 or pos + WORD > len(data):
        raise AbiDecodeError(f"the data ends before the word at byte {pos}")
    return data[pos : pos + WORD]


def _uint_at(data: bytes, pos: int, what: str) -> int:
    value = int.from_bytes(_word(data, pos), "big")
    if value > len(data):
        raise AbiDecodeError(f"a {what} ({value}) is larger than the data ({len(data)} bytes)")
    return value


def _decode(t: _Type, data: bytes, pos: int) -> Any:
    kind = t.kind
    if kind == "uint":
        value = int.from_bytes(_word(data, pos), "big")
        if value >> t.size:
            raise AbiDecodeError(f"a uint{t.size} with bits set above its size")
        return value
    if kind == "int":
        value = int.from_bytes(_word(data, pos), "big", signed=True)
        if not -(1 << (t.size - 1)) <= value < 1 << (t.size - 1):
            raise AbiDecodeError(f"an int{t.size} whose padding is not its sign")
        return value
    if kind == "address":
        word = _word(data, pos)
        if any(word[:12]):
            raise AbiDecodeError("an address with non-zero padding")
        return "0x" + word[12:].hex()
    if kind == "bool":
        value = int.from_bytes(_word(data, pos), "big")
        if value > 1:
            raise AbiDecodeError(f"a bool of {value}, not 0 or 1")
        return value == 1
    if kind == "fixed_bytes":
        word = _word(data, pos)
        if any(word[t.size :]):
            raise AbiDecodeError(f"a bytes{t.size} with non-zero padding")
        return word[: t.size]
    if kind in ("bytes", "string"):
        length = _uint_at(data, pos, "length")
        body = pos + WORD
        end = body + length
        padded_end = body + length + (-length % WORD)
        if padded_end > len(data):
            raise AbiDecodeError(f"a {kind} of {length} bytes runs past the end of the data")
        if any(data[end:padded_end]):
            raise AbiDecodeError(f"a {kind} with non-zero padding")
        raw = data[body:end]
        if kind == "bytes":
            return raw
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AbiDecodeError(f"a string that is not UTF-8: {exc}") from None
    if kind == "tuple":
        return _decode_tuple(t.items, data, pos)
    if kind == "array":
        item = t.items[0]
        if t.size >= 0:
            return _decode_tuple([item] * t.size, data, pos)
        count = int.from_bytes(_word(data, pos), "big")
        if count > MAX_ARRAY or pos + WORD + count * item.head_size > len(data):
            raise AbiDecodeError(f"an array of {count} elements runs past the end of the data")
        return _decode_tuple([item] * count, data, pos + WORD)
    raise AbiDecodeError(f"cannot decode {kind}")
