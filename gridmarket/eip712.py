"""EIP-712 typed data for results a provider signs so a relayer can submit them (no gas)."""

from __future__ import annotations

from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount

DOMAIN_NAME = "GridMarket JobEscrow"
DOMAIN_VERSION = "1"
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
    account: LocalAccount, chain_id: int, escrow: str, job_id: bytes, attempt: int, output_cid: str
) -> bytes:
    """Sign a result; the 65-byte ``r || s || v`` signature ``submitResultFor`` takes."""
    message = encode_typed_data(
        full_message=result_typed_data(chain_id, escrow, job_id, attempt, output_cid)
    )
    return bytes(account.sign_message(message).signature)


def recover_result_signer(
    signature: bytes, chain_id: int, escrow: str, job_id: bytes, attempt: int, output_cid: str
) -> str:
    """The address that signed a result (the scheduler checks it before relaying)."""
    message = encode_typed_data(
        full_message=result_typed_data(chain_id, escrow, job_id, attempt, output_cid)
    )
    return str(Account.recover_message(message, signature=signature))
