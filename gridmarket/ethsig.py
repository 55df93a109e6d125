"""Ethereum keys, addresses and EIP-712 signatures without eth-account and eth-utils.

The provider agent's daemon signs three EIP-712 structs (its registration, each acceptance and
each result) and checksums a few addresses; eth-account and eth-utils, which it used for that,
bring eth-typing, eth-abi, cytoolz, rlp, hexbytes and more: ~12 MB of resident memory in a
process whose goal is 60 MB (docs/agent.md, "Footprint"). This module does the same with what
those libraries use underneath: keccak-256 from pycryptodome and ECDSA over secp256k1 from
coincurve (libsecp256k1, the backend eth-keys picks when coincurve is installed).

The results are byte-identical to eth-account's and eth-utils'
(tests/gridmarket/test_ethsig.py compares them over many random keys and messages):
deterministic RFC 6979 signatures with a low ``s``, ``r || s || v`` with ``v`` 27 or 28, as
``LocalAccount.sign_message(encode_typed_data(...))`` gives; EIP-55 checksums with eth-utils'
errors for what is not an address; transactions (:func:`sign_transaction`: EIP-1559 and
legacy EIP-155) as ``LocalAccount.sign_transaction`` signs them, byte for byte (the daemon's
on-chain duties, :mod:`gridmarket.lightchain`). Recovering a signer (the scheduler's side,
:func:`recover_digest`) follows the escrow's stricter rules (``v`` 27 or 28, low ``s``).

What :func:`hash_typed_data` encodes: the atomic types (``uint<N>``, ``int<N>``, ``address``,
``bool``, ``bytes<N>``), ``string`` and ``bytes``, and nested struct types; not arrays (no
message of this project has one: ValueError).
"""

from __future__ import annotations

import functools
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from Crypto.Hash import keccak as _keccak

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

__all__ = [
    "KeyAccount",
    "SignedTx",
    "Signer",
    "as_local_account",
    "decrypt_keystore",
    "hash_typed_data",
    "is_hex_address",
    "keccak",
    "recover_digest",
    "rlp_encode",
    "sign_digest",
    "sign_transaction",
    "sign_typed_data",
    "to_checksum_address",
]


class Signer(Protocol):
    """What signs for a wallet: its checksummed ``address`` and its 32-byte private ``key``.

    eth-account's ``LocalAccount`` is one; so is :class:`KeyAccount`."""

    @property
    def address(self) -> str: ...

    @property
    def key(self) -> bytes: ...


def keccak(data: bytes) -> bytes:
    """Keccak-256 (Ethereum's hash, not NIST SHA3-256) of ``data``."""
    return _keccak.new(digest_bits=256, data=bytes(data)).digest()


# --------------------------------------------------------------------------- addresses

_HEX_ADDRESS = re.compile("(0x)?[0-9a-f]{40}", re.IGNORECASE | re.ASCII)
_HEX = re.compile("(0[xX])?[0-9a-fA-F]*")


def is_hex_address(value: object) -> bool:
    """Whether ``value`` is a str of 40 hex digits, ``0x`` optional (eth-utils' test)."""
    return isinstance(value, str) and _HEX_ADDRESS.fullmatch(value) is not None


def _normalized(value: str | bytes) -> str:
    """``0x`` and 40 lower-case hex digits, or eth-utils' ValueError / TypeError."""
    if isinstance(value, str):
        bare = value[2:] if value.startswith(("0x", "0X")) else value
        if bare and _HEX.fullmatch(value) is None:
            raise ValueError(f"when sending a str, it must be a hex string. Got: {value!r}")
        lowered = value.lower()
        hex_address = lowered if lowered.startswith("0x") else "0x" + lowered
    elif isinstance(value, bytes | bytearray | memoryview):
        hex_address = "0x" + bytes(value).hex()
    else:
        raise TypeError(f"Value must be any string, instead got type {type(value)}")
    if _HEX_ADDRESS.fullmatch(hex_address) is None:
        raise ValueError(f"Unknown format {value!r}, attempted to normalize to {hex_address!r}")
    return hex_address


def to_checksum_address(value: str | bytes) -> str:
    """The EIP-55 form of an address given as hex (any case, ``0x`` optional) or 20 bytes;
    ValueError (TypeError for another type) as eth-utils' ``to_checksum_address`` raises.

    Text is remembered for the last 16,384 distinct addresses (a keccak in Python each: the
    chain watcher checksums the same few wallets in every event); a refusal is not."""
    if isinstance(value, str):
        return _checksum_text(value)
    return _checksum(value)


@functools.lru_cache(maxsize=16_384)
def _checksum_text(value: str) -> str:
    return _checksum(value)


def _checksum(value: str | bytes) -> str:
    normalized = _normalized(value)[2:]
    digest = keccak(normalized.encode("ascii")).hex()
    return "0x" + "".join(
        c.upper() if int(h, 16) > 7 else c for c, h in zip(normalized, digest, strict=False)
    )


def _address_bytes(value: object) -> bytes:
    """An ABI ``address`` value as 20 bytes (hex in any case, or 20 raw bytes: eth-abi's rule)."""
    if isinstance(value, bytes | bytearray) and len(value) == 20:
        return bytes(value)
    if is_hex_address(value):
        assert isinstance(value, str)
        return bytes.fromhex(value[2:] if value[:2] in ("0x", "0X") else value)
    raise ValueError(f"not an address: {value!r}")


# --------------------------------------------------------------------------- EIP-712

Types = Mapping[str, Sequence[Mapping[str, str]]]

_DOMAIN_FIELDS = {
    "name": "string",
    "version": "string",
    "chainId": "uint256",
    "verifyingContract": "address",
    "salt": "bytes32",
}
"""EIP712Domain's fields, in the order the domain type lists those present (eth-account builds
the domain's type from the domain's keys, whatever the message's ``EIP712Domain`` says)."""


def _int_word(type_: str, value: object) -> bytes:
    signed = type_.startswith("int")
    bits = int(type_[3 if signed else 4 :] or 256)
    if isinstance(value, str):
        value = int(value, 16) if value.startswith("0x") else int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{type_} takes an int, not {value!r}")
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else (0, 2**bits)
    if not low <= value < high:
        raise ValueError(f"{value} is out of range for {type_}")
    return value.to_bytes(32, "big", signed=signed)


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        if value.startswith("0x") and _HEX.fullmatch(value):
            digits = value[2:]
            return bytes.fromhex("0" + digits if len(digits) % 2 else digits)
        return value.encode("utf-8")
    raise TypeError(f"a bytes field takes bytes or a 0x string, not {value!r}")


def _field_word(types: Types, name: str, type_: str, value: object) -> bytes:
    """The 32-byte word ``encodeData`` puts for one field (EIP-712, eth-account's reading)."""
    if type_ in types:
        if value is None:
            return b"\x00" * 32
        if not isinstance(value, Mapping):
            raise TypeError(f"field {name!r} of type {type_} takes a mapping")
        return keccak(_encode_data(types, type_, value))
    if type_.endswith("]"):
        raise ValueError(f"field {name!r}: array types are not supported ({type_})")
    if type_ in ("string", "bytes") and value is None:
        return b"\x00" * 32
    if value is None:
        raise ValueError(f"Missing value for field `{name}` of type `{type_}`")
    if type_ == "string":
        if not isinstance(value, str):
            raise TypeError(f"field {name!r} of type string takes a str, not {value!r}")
        return keccak(value.encode("utf-8"))
    if type_ == "bytes":
        return keccak(_as_bytes(value))
    if type_.startswith("bytes"):
        size = int(type_[5:])
        raw = _as_bytes(value)
        if not 1 <= size <= 32 or len(raw) > size:
            raise ValueError(f"field {name!r}: {len(raw)} bytes do not fit {type_}")
        return raw.ljust(32, b"\x00")
    if type_ == "address":
        return _address_bytes(value).rjust(32, b"\x00")
    if type_ == "bool":
        false = not value or value in ("False", "false", "0")
        return (0 if false else 1).to_bytes(32, "big")
    if type_.startswith(("uint", "int")):
        return _int_word(type_, value)
    raise ValueError(f"field {name!r}: unknown type {type_}")


def _dependencies(types: Types, type_: str, found: set[str]) -> set[str]:
    base = type_.split("[", 1)[0]
    if base in found or base not in types:
        return found
    found.add(base)
    for field in types[base]:
        _dependencies(types, field["type"], found)
    return found


def _encode_type(types: Types, type_: str) -> str:
    deps = _dependencies(types, type_, set())
    deps.discard(type_)
    parts = []
    for name in [type_, *sorted(deps)]:
        members = ",".join(field["type"] + " " + field["name"] for field in types[name])
        parts.append(f"{name}({members})")
    return "".join(parts)


def _encode_data(types: Types, type_: str, data: Mapping[str, Any]) -> bytes:
    words = [keccak(_encode_type(types, type_).encode())]
    words += [_field_word(types, f["name"], f["type"], data.get(f["name"])) for f in types[type_]]
    return b"".join(words)


def _primary_type(types: Types) -> str:
    """The struct no other struct refers to (eth-account's rule; ``primaryType`` is ignored)."""
    referred = {
        f["type"].split("[", 1)[0]
        for name, fields in types.items()
        for f in fields
        if f["type"].split("[", 1)[0] != name
    }
    primary = [name for name in types if name not in referred]
    if len(primary) != 1:
        raise ValueError("Unable to determine primary type")
    return primary[0]


def hash_typed_data(full_message: Mapping[str, Any]) -> bytes:
    """The 32-byte digest a wallet signs for an EIP-712 message given in full (``types``,
    ``domain``, ``message``): ``keccak256(0x1901 || domainSeparator || hashStruct(message))``,
    the hash eth-account signs for ``encode_typed_data(full_message=...)``."""
    domain = full_message["domain"]
    unknown = [k for k in domain if k not in _DOMAIN_FIELDS]
    if unknown:
        raise ValueError(f"Invalid domain key: `{unknown[0]}`")
    declared = full_message["types"].get("EIP712Domain")
    if declared is not None and {f["name"] for f in declared} != set(domain):
        raise ValueError("the fields of `domain` do not match those of `types.EIP712Domain`")
    domain_types = {
        "EIP712Domain": [{"name": k, "type": t} for k, t in _DOMAIN_FIELDS.items() if k in domain]
    }
    types = {k: v for k, v in full_message["types"].items() if k != "EIP712Domain"}
    primary = _primary_type(types)
    if full_message.get("primaryType", primary) != primary:
        raise ValueError(f"primaryType is not the derived primary type {primary!r}")
    separator = keccak(_encode_data(domain_types, "EIP712Domain", domain))
    struct = keccak(_encode_data(types, primary, full_message["message"]))
    return keccak(b"\x19\x01" + separator + struct)


# --------------------------------------------------------------------------- signing


def sign_digest(key: bytes, digest: bytes) -> bytes:
    """The 65-byte ``r || s || v`` signature (``v`` 27 or 28) of a 32-byte digest: RFC 6979
    nonce, low ``s`` (libsecp256k1), as eth-account signs a message hash."""
    from coincurve import PrivateKey

    if len(digest) != 32:
        raise ValueError("the digest must be 32 bytes")
    rsv = PrivateKey(bytes(key)).sign_recoverable(bytes(digest), hasher=None)
    return rsv[:64] + bytes([rsv[64] + 27])


SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
"""The order of secp256k1's group."""


def recover_digest(digest: bytes, signature: bytes) -> str:
    """The checksummed address whose key made ``signature`` (65 bytes, ``r || s || v``) of the
    32-byte ``digest``, under the escrow's rules (``JobEscrow._recover``): ``v`` 27 or 28,
    ``s`` in the lower half of the curve order, ``r`` and ``s`` not zero. eth-account's
    recovery is looser (``v`` 0 or 1, a high ``s``): a signature it would take and the
    contract would not is refused here, with ValueError naming the rule."""
    from coincurve import PublicKey

    if len(digest) != 32:
        raise ValueError("the digest must be 32 bytes")
    if len(signature) != 65:
        raise ValueError(f"a signature is 65 bytes (r || s || v), not {len(signature)}")
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:64], "big")
    v = signature[64]
    if v not in (27, 28):
        raise ValueError(f"v must be 27 or 28, not {v}")
    if not 0 < r < SECP256K1_N or not 0 < s <= SECP256K1_N // 2:
        raise ValueError("r must be in [1, n) and s in [1, n/2] (a low-s signature)")
    try:
        key = PublicKey.from_signature_and_message(
            bytes(signature[:64]) + bytes([v - 27]), bytes(digest), hasher=None
        )
    except Exception as exc:  # libsecp256k1 found no key for it
        raise ValueError(f"the signature recovers no key: {exc}") from None
    return to_checksum_address(keccak(key.format(compressed=False)[1:])[-20:])


def sign_typed_data(signer: Signer, full_message: Mapping[str, Any]) -> bytes:
    """``signer``'s 65-byte signature of an EIP-712 message (:func:`hash_typed_data`)."""
    return sign_digest(signer.key, hash_typed_data(full_message))


# --------------------------------------------------------------------------- transactions

RlpItem = bytes | Sequence["RlpItem"]


def rlp_encode(item: RlpItem) -> bytes:
    """Recursive-length-prefix encoding of bytes and (nested) lists of them."""
    if isinstance(item, bytes | bytearray):
        raw = bytes(item)
        if len(raw) == 1 and raw[0] < 0x80:
            return raw
        return _rlp_length(len(raw), 0x80) + raw
    body = b"".join(rlp_encode(x) for x in item)
    return _rlp_length(len(body), 0xC0) + body


def _rlp_length(length: int, offset: int) -> bytes:
    if length < 56:
        return bytes([offset + length])
    raw = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([offset + 55 + len(raw)]) + raw


def _quantity(tx: Mapping[str, Any], name: str) -> bytes:
    """A transaction's integer field as RLP wants it: big-endian, no leading zeros."""
    value = tx.get(name)
    if isinstance(value, str):
        value = int(value, 16) if value[:2] in ("0x", "0X") else int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**256:
        raise ValueError(f"transaction field {name!r} must be an int in 0..2**256-1: {value!r}")
    return value.to_bytes((value.bit_length() + 7) // 8, "big")


def _tx_bytes(value: object, name: str) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        if _HEX.fullmatch(value) is None:
            raise ValueError(f"transaction field {name!r} is not hex: {value!r}")
        digits = value[2:] if value[:2] in ("0x", "0X") else value
        return bytes.fromhex("0" + digits if len(digits) % 2 else digits)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"transaction field {name!r} takes bytes or hex, not {value!r}")


def _access_list(tx: Mapping[str, Any]) -> list[RlpItem]:
    out: list[RlpItem] = []
    for entry in tx.get("accessList") or []:
        keys: list[RlpItem] = [
            _tx_bytes(k, "storageKeys").rjust(32, b"\x00") for k in entry["storageKeys"]
        ]
        out.append([_address_bytes(entry["address"]), keys])
    return out


class SignedTx(Protocol):
    """What :func:`sign_transaction` returns (eth-account's ``SignedTransaction`` has both)."""

    @property
    def raw_transaction(self) -> bytes: ...

    @property
    def hash(self) -> bytes: ...


class _Signed:
    __slots__ = ("hash", "raw_transaction")

    def __init__(self, raw: bytes) -> None:
        self.raw_transaction = raw
        self.hash = keccak(raw)

    def __repr__(self) -> str:
        return f"SignedTx(0x{self.hash.hex()})"


_TX_FIELDS = {
    2: {
        "type",
        "chainId",
        "nonce",
        "maxPriorityFeePerGas",
        "maxFeePerGas",
        "gas",
        "to",
        "value",
        "data",
        "accessList",
    },
    0: {"type", "chainId", "nonce", "gasPrice", "gas", "to", "value", "data"},
}


def sign_transaction(signer: Signer, tx: Mapping[str, Any]) -> SignedTx:
    """``signer``'s signed transaction, as ``LocalAccount.sign_transaction(tx)`` gives it
    (``raw_transaction``, ``hash``): an EIP-1559 transaction (type 2: ``maxFeePerGas``,
    ``maxPriorityFeePerGas``, optional ``accessList``), or a legacy EIP-155 one (``gasPrice``).
    Every field is required but ``to`` (None or absent: a contract creation), ``value`` (0),
    ``data`` (empty) and ``accessList``; an unknown field is a ValueError."""
    kind = 2 if "maxFeePerGas" in tx or tx.get("type") in (2, "0x2") else 0
    unknown = set(tx) - _TX_FIELDS[kind]
    if unknown:
        raise ValueError(f"unknown transaction fields for type {kind}: {sorted(unknown)}")
    if "type" in tx and tx["type"] not in (kind, hex(kind)):
        raise ValueError(f"transaction type {tx['type']!r} does not match its fields")
    to = tx.get("to")
    to_raw = b"" if to is None else _address_bytes(to)
    body = {**tx, "value": tx.get("value", 0)}
    chain_id = _quantity(body, "chainId")
    head: list[RlpItem]
    if kind == 2:
        head = [
            chain_id,
            _quantity(body, "nonce"),
            _quantity(body, "maxPriorityFeePerGas"),
            _quantity(body, "maxFeePerGas"),
            _quantity(body, "gas"),
            to_raw,
            _quantity(body, "value"),
            _tx_bytes(body.get("data", b""), "data"),
            _access_list(body),
        ]
        rsv = sign_digest(signer.key, keccak(b"\x02" + rlp_encode(head)))
        parity = rsv[64] - 27
        tail = [parity.to_bytes(1, "big") if parity else b"", *_rs(rsv)]
        return _Signed(b"\x02" + rlp_encode([*head, *tail]))
    head = [
        _quantity(body, "nonce"),
        _quantity(body, "gasPrice"),
        _quantity(body, "gas"),
        to_raw,
        _quantity(body, "value"),
        _tx_bytes(body.get("data", b""), "data"),
    ]
    rsv = sign_digest(signer.key, keccak(rlp_encode([*head, chain_id, b"", b""])))
    v = rsv[64] - 27 + 35 + 2 * int.from_bytes(chain_id, "big")
    return _Signed(rlp_encode([*head, v.to_bytes((v.bit_length() + 7) // 8, "big"), *_rs(rsv)]))


def _rs(rsv: bytes) -> list[RlpItem]:
    return [rsv[:32].lstrip(b"\x00"), rsv[32:64].lstrip(b"\x00")]


class KeyAccount:
    """A wallet from its private key: its checksummed ``address`` and its ``key``. Signs what a
    ``LocalAccount`` signs (:func:`sign_typed_data`) without loading eth-account; transactions
    are eth-account's (:func:`as_local_account`)."""

    __slots__ = ("_address", "_key")

    def __init__(self, key: bytes) -> None:
        from coincurve import PrivateKey

        raw = bytes(key)
        if len(raw) != 32:
            raise ValueError(f"a private key is 32 bytes, not {len(raw)}")
        public = PrivateKey(raw).public_key.format(compressed=False)[1:]  # ValueError if 0 or >= n
        self._key = raw
        self._address = to_checksum_address(keccak(public)[-20:])

    @property
    def address(self) -> str:
        return self._address

    @property
    def key(self) -> bytes:
        return self._key

    def __repr__(self) -> str:  # never the key
        return f"KeyAccount({self._address})"


def as_local_account(signer: Signer) -> LocalAccount:
    """``signer`` as eth-account's ``LocalAccount`` (web3 transactions need one): itself when it
    is one, else one made from its key (loads eth-account)."""
    from eth_account import Account
    from eth_account.signers.local import LocalAccount  # at run time

    if isinstance(signer, LocalAccount):
        return signer
    local: LocalAccount = Account.from_key(signer.key)
    return local


# --------------------------------------------------------------------------- keystores


def decrypt_keystore(document: Mapping[str, Any], password: str) -> bytes:
    """The private key in a version 3 keystore (JSON as a mapping; keys in any case), as
    eth-account's ``Account.decrypt`` gives it: ValueError("MAC mismatch") for a wrong password.

    Handled here: scrypt or PBKDF2-HMAC and AES-128-CTR, which every v3 keystore of this project
    (and of geth, eth-account, MetaMask) uses; anything else goes to eth-account itself."""
    doc = _lower_keys(document)
    crypto = doc.get("crypto")
    if (
        doc.get("version") != 3
        or not isinstance(crypto, dict)
        or crypto.get("kdf") not in ("scrypt", "pbkdf2")
        or crypto.get("cipher") != "aes-128-ctr"
    ):
        from eth_account import Account

        return bytes(Account.decrypt(json.loads(json.dumps(document)), password))
    secret = password.encode("utf-8")
    params = crypto["kdfparams"]
    salt = bytes.fromhex(_bare(params["salt"]))
    if crypto["kdf"] == "pbkdf2":
        import hashlib

        prf, _, hash_name = params["prf"].partition("-")
        if prf != "hmac":
            raise ValueError(f"unsupported PBKDF2 PRF {params['prf']!r}")
        derived = hashlib.pbkdf2_hmac(hash_name, secret, salt, params["c"], params["dklen"])
    else:
        from Crypto.Protocol.KDF import scrypt

        derived = scrypt(  # type: ignore[assignment]  # one key: bytes
            secret,  # type: ignore[arg-type]  # pycryptodome takes bytes too
            salt=salt,  # type: ignore[arg-type]
            key_len=params["dklen"],
            N=params["n"],
            r=params["r"],
            p=params["p"],
            num_keys=1,
        )
    ciphertext = bytes.fromhex(_bare(crypto["ciphertext"]))
    if not hmac.compare_digest(
        keccak(derived[16:32] + ciphertext), bytes.fromhex(_bare(crypto["mac"]))
    ):
        raise ValueError("MAC mismatch")
    from Crypto.Cipher import AES
    from Crypto.Util import Counter

    iv = int.from_bytes(bytes.fromhex(_bare(crypto["cipherparams"]["iv"])), "big")
    counter = Counter.new(128, initial_value=iv, allow_wraparound=True)
    return bytes(AES.new(derived[:16], AES.MODE_CTR, counter=counter).decrypt(ciphertext))


def _bare(hex_text: str) -> str:
    return hex_text[2:] if hex_text[:2] in ("0x", "0X") else hex_text


def _lower_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {(k.lower() if isinstance(k, str) else k): _lower_keys(v) for k, v in value.items()}
    return value
