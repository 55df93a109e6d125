"""EIP-712 typed data a provider signs: its acceptance of a job's terms for one assignment
(``assign`` needs it) and its results (a relayer submits them; no gas).

Signing and recovering are :mod:`gridmarket.ethsig`'s (no eth-account in the agent's daemon,
byte-identical signatures; a signer is recovered under the escrow's own rules).
"""

from __future__ import annotations

from typing import Any

from gridmarket.escrow import Job
from gridmarket.ethsig import Signer, hash_typed_data, recover_digest, sign_typed_data


def _recover(full_message: dict[str, Any], signature: bytes) -> str:
    """The signer of an EIP-712 message, under the escrow's rules (``v`` 27 or 28, low ``s``:
    a signature ``assign`` or ``submitResultFor`` would refuse is refused here, ValueError)."""
    return recover_digest(hash_typed_data(full_message), signature)


DOMAIN_NAME = "GridMarket JobEscrow"
DOMAIN_VERSION = "4"
"""The escrow's signing version: "4" since JobEscrow version 4 added the job's token to
``Acceptance`` (docs/trust.md); registrations use the same domain."""
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
]


def acceptance_typed_data(
    chain_id: int, escrow: str, job_id: bytes, attempt: int, job: Job
) -> dict[str, Any]:
    """The EIP-712 message a provider signs to accept assignment ``attempt`` of ``job_id`` on
    the terms of ``job`` (the job's struct as it is before that assignment; ``attempt`` is
    ``job.attempt + 1``)."""
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
        },
    }


def sign_acceptance(
    account: Signer, chain_id: int, escrow: str, job_id: bytes, attempt: int, job: Job
) -> bytes:
    """Sign an acceptance; the 65-byte ``r || s || v`` signature ``assign`` takes."""
    return sign_typed_data(account, acceptance_typed_data(chain_id, escrow, job_id, attempt, job))


def recover_acceptance_signer(
    signature: bytes, chain_id: int, escrow: str, job_id: bytes, attempt: int, job: Job
) -> str:
    """The address that signed an acceptance (the scheduler checks it before relaying)."""
    return _recover(acceptance_typed_data(chain_id, escrow, job_id, attempt, job), signature)
