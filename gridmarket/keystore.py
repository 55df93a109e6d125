"""A wallet key kept in an encrypted Ethereum keystore file (eth-account, v3 JSON): the provider
agent's (it signs registrations and results) and the submitter CLI's (it funds jobs).

The key never leaves this file unencrypted; it is held decrypted in memory only while signing.
Files are written atomically with mode ``0600`` in a ``0700`` directory, and an existing keystore
is never replaced unless asked to (``force``): losing a funded key by a careless ``init`` is
worse than an extra flag.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gridmarket.ethsig import KeyAccount, decrypt_keystore, to_checksum_address

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

__all__ = ["KeystoreError", "create_keystore", "keystore_address", "load_account", "load_signer"]

Kdf = Literal["scrypt", "pbkdf2"]


class KeystoreError(ValueError):
    """The keystore is missing, unreadable, already there, or the password is wrong."""


def create_keystore(
    path: Path,
    password: str,
    *,
    private_key: str | bytes | None = None,
    force: bool = False,
    kdf: Kdf = "scrypt",
    iterations: int | None = None,
) -> str:
    """Write a keystore for ``private_key`` (a new random key when ``None``); its address.

    ``iterations`` tunes the KDF's cost (scrypt ``n``, a power of two; pbkdf2 rounds): the
    defaults are eth-account's (scrypt n=2**18, ~0.5 s and 256 MiB to unlock), lower only for
    tests. Raises :class:`KeystoreError` when ``path`` exists and ``force`` is false, when the
    password is empty or the key malformed.
    """
    path = path.expanduser()
    if not password:
        raise KeystoreError("the keystore password must not be empty")
    if path.exists() and not force:
        raise KeystoreError(
            f"{path} already exists: refusing to overwrite a key (use --force to replace it)"
        )
    if path.exists() and not path.is_file():
        raise KeystoreError(f"{path} exists and is not a file")
    from eth_account import Account

    try:
        account = Account.create() if private_key is None else Account.from_key(private_key)
    except (ValueError, TypeError) as exc:
        raise KeystoreError(f"not a valid private key: {_first_line(exc)}") from None
    document = Account.encrypt(account.key, password, kdf=kdf, iterations=iterations)
    _write_private(path, json.dumps(document, indent=2) + "\n")
    return str(account.address)


def load_account(path: Path, password: str) -> LocalAccount:
    """Decrypt the keystore at ``path``; KeystoreError saying why it cannot. An eth-account
    ``LocalAccount``: what web3 transactions take (the CLI's on-chain commands)."""
    from eth_account import Account

    account: LocalAccount = Account.from_key(load_signer(path, password).key)
    return account


def load_signer(path: Path, password: str) -> KeyAccount:
    """Decrypt the keystore at ``path`` without loading eth-account (the agent's daemon signs
    with it: :mod:`gridmarket.ethsig`); KeystoreError saying why it cannot."""
    document = _read(path)
    try:
        return KeyAccount(decrypt_keystore(document, password))
    except ValueError as exc:
        if "MAC mismatch" in str(exc):
            raise KeystoreError(f"wrong password for keystore {path}") from None
        raise KeystoreError(f"keystore {path} is not a valid keystore: {exc}") from None
    except (KeyError, TypeError) as exc:  # a field missing or of the wrong type
        raise KeystoreError(
            f"keystore {path} is not a valid keystore: {type(exc).__name__}: {exc}"
        ) from None


def keystore_address(path: Path) -> str:
    """The checksummed address a keystore holds, read without the password."""
    document = _read(path)
    raw = document.get("address")
    if not isinstance(raw, str):
        raise KeystoreError(f"keystore {path} does not record its address")
    return to_checksum_address(raw if raw.startswith("0x") else "0x" + raw)


def _read(path: Path) -> dict[str, Any]:
    path = path.expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KeystoreError(
            f"no keystore at {path}: create one with `gridmarket-agent init`"
        ) from None
    except OSError as exc:
        raise KeystoreError(f"cannot read keystore {path}: {exc.strerror}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KeystoreError(f"keystore {path} is not JSON: {exc}") from None
    if not isinstance(document, dict) or "crypto" not in {k.lower() for k in document}:
        raise KeystoreError(f"keystore {path} is not an Ethereum keystore (no crypto section)")
    return document


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by the owner only."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
