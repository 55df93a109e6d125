"""EIP-712 typed data a provider signs: its acceptance of a job's terms for one assignment
(``assign`` needs it) and its results (a relayer submits them; no gas).

Signing and recovering are :mod:`gridmarket.ethsig`'s (no eth-account in the agent's daemon,
byte-identical signatures; a signer is recovered under the escrow's own rules).
"""

from __future__ import annotations

import functools
from typing import Any

from gridmarket.escrow import Job
from gridmarket.ethsig import (
    Signer,
    hash_typed_data,
    is_hex_address,
    keccak,
    recover_digest,
    sign_digest,
    sign_typed_data,
)


def _recover(full_message: dict[str, Any], signature: bytes) -> str:
    """The signer of an EIP-712 message, under the escrow's rules (``v`` 27 or 28, low ``s``:
    a signature ``assign`` or ``submitResultFor`` would refuse is refused here, ValueError)."""
    return recover_digest(hash_typed_data(full_message), signature)


DOMAIN_NAME = "GridMarket JobEscrow"
DOMAIN_VERSION = "5"
"""The escrow's signing version: "5" since JobEscrow version 5 added ``holdFor``, the time the
provider is given, to ``Acceptance`` (docs/trust.md); registrations use the same domain."""
DOMAIN_TYPE = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]
"""The EIP712Domain fields every message of this project uses (results, registrations)."""


def result_typed_data(
    chain_id: int, escrow: str, job_id: bytes, attempt: int, output_cid: str
) -> dict[str, Any]:
    """The full EIP-712 message (as wallets take it) for ``Result(jobId, attempt, outputCid)``."""
    return {
        "types": {
            "EIP712Domain": DOMAIN_TYPE,
            "Result": [
                {"name": "jobId", "type": "bytes32"},
                {"name": "attempt", "type": "uint16"},
                {"name": "outputCid", "type": "string"},
            ],
        },
        "primaryType": "Result",
        "domain": {
            "name": DOMAIN_NAME,
            "version": DOMAIN_VERSION,
            "chainId": chain_id,
            "verifyingContract": escrow,
        },
        "message": {"jobId": job_id, "attempt": attempt, "outputCid": output_cid},
    }


def sign_result(
    account: Signer, chain_id: int, escrow: str, job_id: bytes, attempt: int, output_cid: str
) -> bytes:
    """Sign a result; the 65-byte ``r || s || v`` signature ``submitResultFor`` takes."""
    return sign_typed_data(
        account, result_typed_data(chain_id, escrow, job_id, attempt, output_cid)
    )


def recover_result_signer(
    signature: bytes, chain_id: int, escrow: str, job_id: bytes, attempt: int, output_cid: str
) -> str:
    """The address that signed a result (the scheduler checks it before relaying)."""
    return _recover(result_typed_data(chain_id, escrow, job_id, attempt, output_cid), signature)


ACCEPTANCE_TYPE = [
    {"name": "jobId", "type": "bytes32"},
    {"name": "attempt", "type": "uint16"},
    {"name": "bounty", "type": "uint96"},
    {"name": "feeBps", "type": "uint16"},
    {"name": "deadline", "type": "uint40"},
    {"name": "collateral", "type": "uint96"},
    {"name": "mediator", "type": "address"},
    {"name": "flags", "type": "uint8"},
    {"name": "token", "type": "address"},
    {"name": "holdFor", "type": "uint32"},
]


def acceptance_typed_data(
    chain_id: int, escrow: str, job_id: bytes, attempt: int, job: Job, hold_for: int
) -> dict[str, Any]:
    """The EIP-712 message a provider signs to accept assignment ``attempt`` of ``job_id`` on
    the terms of ``job`` (the job's struct as it is before that assignment; ``attempt`` is
    ``job.attempt + 1``), given ``hold_for`` seconds: nobody but the provider can take the job
    back before they pass (``holdUntil``)."""
    return {
        "types": {"EIP712Domain": DOMAIN_TYPE, "Acceptance": ACCEPTANCE_TYPE},
        "primaryType": "Acceptance",
        "domain": {
            "name": DOMAIN_NAME,
            "version": DOMAIN_VERSION,
            "chainId": chain_id,
            "verifyingContract": escrow,
        },
        "message": {
            "jobId": job_id,
            "attempt": attempt,
            "bounty": job.bounty,
            "feeBps": job.fee_bps,
            "deadline": job.deadline,
            "collateral": job.collateral,
            "mediator": job.mediator,
            "flags": job.flags,
            "token": job.token,
            "holdFor": hold_for,
        },
    }


_ACCEPTANCE_TYPEHASH = keccak(
    b"Acceptance(bytes32 jobId,uint16 attempt,uint96 bounty,uint16 feeBps,uint40 deadline,"
    b"uint96 collateral,address mediator,uint8 flags,address token,uint32 holdFor)"
)
_DOMAIN_TYPEHASH = keccak(
    b"EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)


@functools.lru_cache(maxsize=64)
def domain_separator(chain_id: int, escrow: str) -> bytes:
    """The escrow's EIP-712 domain separator (from the fields its ``eip712Domain()`` returns)."""
    return keccak(
        _DOMAIN_TYPEHASH
        + keccak(DOMAIN_NAME.encode())
        + keccak(DOMAIN_VERSION.encode())
        + _uint(chain_id, 256)
        + _address(escrow)
    )


def _uint(value: int, bits: int) -> bytes:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << bits:
        raise ValueError(f"{value!r} is not a uint{bits}")
    return value.to_bytes(32, "big")


def _address(value: str) -> bytes:
    if not is_hex_address(value):
        raise ValueError(f"{value!r} is not a hex address")
    return bytes(12) + bytes.fromhex(value[-40:])


def acceptance_digest(
    chain_id: int, escrow: str, job_id: bytes, attempt: int, job: Job, hold_for: int
) -> bytes:
    """The EIP-712 digest of :func:`acceptance_typed_data`'s message, with the type hash and
    the domain separator computed once: what ``assign`` recovers the provider from. Equal to
    ``hash_typed_data(acceptance_typed_data(...))`` (tests/gridmarket/test_ethsig.py) at a
    sixth of its cost; every signature and recovery of an acceptance goes through it (the
    scheduler recovers one per claim)."""
    if not isinstance(job_id, bytes) or len(job_id) != 32:
        raise ValueError(f"job id {job_id!r} is not 32 bytes")
    struct = keccak(
        _ACCEPTANCE_TYPEHASH
        + job_id
        + _uint(attempt, 16)
        + _uint(job.bounty, 96)
        + _uint(job.fee_bps, 16)
        + _uint(job.deadline, 40)
        + _uint(job.collateral, 96)
        + _address(job.mediator)
        + _uint(job.flags, 8)
        + _address(job.token)
        + _uint(hold_for, 32)
    )
    return keccak(b"\x19\x01" + domain_separator(chain_id, escrow.lower()) + struct)


def sign_acceptance(
    account: Signer,
    chain_id: int,
    escrow: str,
    job_id: bytes,
    attempt: int,
    job: Job,
    hold_for: int,
) -> bytes:
    """Sign an acceptance; the 65-byte ``r || s || v`` signature ``assign`` takes."""
    return sign_digest(
        account.key, acceptance_digest(chain_id, escrow, job_id, attempt, job, hold_for)
    )


def recover_acceptance_signer(
    signature: bytes,
    chain_id: int,
    escrow: str,
    job_id: bytes,
    attempt: int,
    job: Job,
    hold_for: int,
) -> str:
    """The address that signed an acceptance (the scheduler checks it before relaying), under
    the escrow's rules (``v`` 27 or 28, low ``s``; ValueError otherwise)."""
    return recover_digest(
        acceptance_digest(chain_id, escrow, job_id, attempt, job, hold_for), signature
    )
