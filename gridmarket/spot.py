"""Spot checks: the submitter's hidden draw, committed in the job spec and sealed to the mediator.

A spot job (``JobSpec.spot``, escrow ``FLAG_SPOT``) is re-run by a second provider with
probability ``p`` per attempt, and the provider that runs it cannot know whether its attempt is
the one checked (docs/trust.md, "Spot checks"):

- at funding the submitter's client draws a 32-byte **seed**, puts ``commit = keccak256(
  "gridmarket.spot.v1" || submitter || seed)`` in the spec (whose CID is bound into the job id
  and emitted in ``JobCreated``: the commitment is on-chain with the job), and **seals** the
  seed to the job's mediator (ECIES on secp256k1: only the mediator's key opens it; the
  submitter's address is authenticated with it);
- both name the submitter, so a copy of another submitter's commitment and sealed seed in one's
  own spec neither opens nor matches: nobody can claim a victim's draw to have it skipped;
- attempt ``a`` is checked iff ``keccak256("gridmarket.spot.v1/draw" || seed || a) mod 10,000 <
  p_bps``: each attempt is drawn afresh, so a check (or its absence) seen on one attempt tells
  nothing about the next;
- when a result is posted the mediator opens the seed, and for a checked attempt opens a check
  (``dispute``, funded by the check deposit locked at funding); the seed is **revealed** once the
  job is settled, and anyone can then recompute every attempt's draw against the commitment.

The arithmetic (:func:`min_collateral`): a cheater skips compute worth at most the bounty B and
is caught with probability p, losing its collateral C; its expected profit ``(1 - p) B - p C``
is negative iff ``C > B (1 - p) / p``.
"""

from __future__ import annotations

import hmac
import os
from fractions import Fraction
from hashlib import sha256

from gridmarket.ethsig import keccak, to_checksum_address

DOMAIN = b"gridmarket.spot.v1"
"""Prefix of the commitment (and, with suffixes, of the draw and the sealing key)."""
P_SCALE = 10_000
"""``p`` is in basis points: 1..10,000."""
SEED_BYTES = 32
SEALED_BYTES = 33 + 12 + SEED_BYTES + 16
"""A sealed seed: the ephemeral public key (compressed), the AES-GCM nonce, the ciphertext, the
tag."""


class SpotError(ValueError):
    """A seed, commitment, sealed seed or key that does not fit; the message says which."""


def new_seed() -> bytes:
    """A fresh 32-byte seed from the OS's CSPRNG (never reuse one: its reveal opens every job
    committed to it)."""
    return os.urandom(SEED_BYTES)


def commit_of(seed: bytes, submitter: str) -> bytes:
    """``keccak256("gridmarket.spot.v1" || submitter || seed)`` (the submitter's 20 address
    bytes): what the spec carries."""
    _need(seed, SEED_BYTES, "seed")
    return keccak(DOMAIN + _address_bytes(submitter) + seed)


def _address_bytes(address: str) -> bytes:
    try:
        raw = bytes.fromhex(address.removeprefix("0x").removeprefix("0X"))
    except (ValueError, AttributeError) as exc:
        raise SpotError(f"submitter must be a 0x address, got {address!r}") from exc
    if len(raw) != 20:
        raise SpotError(f"submitter must be a 0x address, got {address!r}")
    return raw


def checked(seed: bytes, attempt: int, p_bps: int) -> bool:
    """Whether attempt ``attempt`` (1 for the first assignment) is checked."""
    _need(seed, SEED_BYTES, "seed")
    if not 1 <= p_bps <= P_SCALE:
        raise SpotError(f"p must be 1..{P_SCALE} basis points, got {p_bps}")
    if not 0 <= attempt < 2**16:
        raise SpotError(f"attempt must fit in 16 bits, got {attempt}")
    draw = keccak(DOMAIN + b"/draw" + seed + attempt.to_bytes(2, "big"))
    return int.from_bytes(draw, "big") % P_SCALE < p_bps


def min_collateral(bounty: int, p_bps: int) -> int:
    """The least collateral that makes cheating on a spot job unprofitable in expectation: the
    smallest integer C with ``C > B (1 - p) / p``, i.e. ``p C > (1 - p) B`` (1 at p = 1)."""
    if not 1 <= p_bps <= P_SCALE:
        raise SpotError(f"p must be 1..{P_SCALE} basis points, got {p_bps}")
    if bounty < 0:
        raise SpotError(f"bounty must not be negative, got {bounty}")
    return bounty * (P_SCALE - p_bps) // p_bps + 1


def cheater_profit(bounty: int, collateral: int, p_bps: int) -> Fraction:
    """A cheater's expected profit per job, in the bounty's units (exact), when it skips all of
    the work: paid the bounty unless checked, losing its collateral when checked."""
    p = Fraction(p_bps, P_SCALE)
    return (1 - p) * bounty - p * collateral


# ---------------------------------------------------------------------- sealing (ECIES)
def public_key_of(private_key: bytes) -> bytes:
    """The compressed secp256k1 public key (33 bytes) of a 32-byte private key."""
    from coincurve import PrivateKey

    _need(private_key, 32, "private key")
    return bytes(PrivateKey(private_key).public_key.format(compressed=True))


def address_of(public_key: bytes) -> str:
    """The checksummed address of a secp256k1 public key (compressed or not)."""
    from coincurve import PublicKey

    try:
        raw = PublicKey(public_key).format(compressed=False)
    except Exception as exc:
        raise SpotError(f"not a secp256k1 public key: {exc}") from exc
    return to_checksum_address(keccak(raw[1:])[-20:])


def check_public_key(public_key: bytes, address: str) -> bytes:
    """``public_key`` (compressed) if it is ``address``'s key; SpotError otherwise. A key served
    by anyone is checked this way before a seed is sealed to it."""
    from coincurve import PublicKey

    if address_of(public_key) != to_checksum_address(address):
        raise SpotError(f"public key {public_key.hex()} is not the key of {address}")
    return bytes(PublicKey(public_key).format(compressed=True))


def _key(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    return sha256(DOMAIN + b"/seal" + shared + ephemeral + recipient).digest()


def seal(seed: bytes, recipient_public_key: bytes, submitter: str) -> bytes:
    """The seed encrypted to ``recipient_public_key``: ECDH with a fresh ephemeral key, then
    AES-256-GCM (the ephemeral key, the recipient's key and the submitter's address
    authenticated with it: it opens only for a job of that submitter)."""
    from coincurve import PrivateKey, PublicKey
    from Crypto.Cipher import AES

    _need(seed, SEED_BYTES, "seed")
    owner = _address_bytes(submitter)
    try:
        recipient = PublicKey(recipient_public_key).format(compressed=True)
    except Exception as exc:
        raise SpotError(f"not a secp256k1 public key: {exc}") from exc
    ephemeral = PrivateKey()
    eph_pub = ephemeral.public_key.format(compressed=True)
    key = _key(ephemeral.ecdh(recipient), eph_pub, recipient)
    nonce = os.urandom(12)
    cipher = AES.new(key, AES.MODE_GCM, nonce=nonce)
    cipher.update(eph_pub + recipient + owner)
    body, tag = cipher.encrypt_and_digest(seed)
    return eph_pub + nonce + body + tag


def unseal(sealed: bytes, private_key: bytes, submitter: str, commit: bytes | None = None) -> bytes:
    """The seed in ``sealed``, opened with the recipient's ``private_key`` for a job of
    ``submitter``; with ``commit``, also checked against it. SpotError if it was sealed to
    another key or for another submitter, altered, or does not match the commitment."""
    from coincurve import PrivateKey
    from Crypto.Cipher import AES

    _need(sealed, SEALED_BYTES, "sealed seed")
    _need(private_key, 32, "private key")
    owner = _address_bytes(submitter)
    eph_pub, nonce = sealed[:33], sealed[33:45]
    body, tag = sealed[45 : 45 + SEED_BYTES], sealed[45 + SEED_BYTES :]
    me = PrivateKey(private_key)
    recipient = me.public_key.format(compressed=True)
    try:
        key = _key(me.ecdh(eph_pub), eph_pub, recipient)
        cipher = AES.new(key, AES.MODE_GCM, nonce=nonce)
        cipher.update(eph_pub + recipient + owner)
        seed = cipher.decrypt_and_verify(body, tag)
    except Exception as exc:
        raise SpotError(
            f"the sealed seed does not open with this key for submitter {submitter}: {exc}"
        ) from exc
    if commit is not None and not hmac.compare_digest(commit_of(seed, submitter), commit):
        raise SpotError("the sealed seed does not match the spec's commitment")
    return seed


def verify_reveal(seed: bytes, commit: bytes, submitter: str) -> bool:
    """Whether a revealed seed is the one ``submitter``'s spec committed to."""
    return len(seed) == SEED_BYTES and hmac.compare_digest(commit_of(seed, submitter), commit)


def _need(value: bytes, size: int, what: str) -> None:
    if not isinstance(value, bytes | bytearray) or len(value) != size:
        got = len(value) if isinstance(value, bytes | bytearray) else type(value).__name__
        raise SpotError(f"{what} must be {size} bytes, got {got}")
