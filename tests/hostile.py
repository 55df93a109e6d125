"""What an attacker sends to the chain, for the tests of everything that reads it: escrow calls
whose ``string`` arguments are raw bytes (invalid UTF-8 and the like, which ``eth_abi`` refuses
to encode as a string but the contract takes), and :file:`contracts/test/EventForger.sol`, which
emits the escrow's events with anything, even what JobEscrow refuses, and logs that do not
decode. Everything here runs against a real anvil."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, cast

from eth_abi.abi import encode as abi_encode
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils.abi import function_abi_to_4byte_selector
from web3 import Web3

from gridmarket.build import load_artifacts
from gridmarket.chain import ChainError, Deployment, EscrowClient, Sent

INVALID_UTF8 = b"bafy\xff\xfe\xc3\x28poison"
"""Not UTF-8: 0xff never appears in UTF-8, and 0xc3 0x28 is a broken two-byte sequence."""
ODD_128 = ("\u202e" * 42).encode() + b"xy"
"""128 bytes of valid UTF-8 (right-to-left overrides) that no CID is spelled with."""


def _types(abi: dict[str, Any]) -> list[str]:
    return ["bytes" if i["type"] == "string" else _canon(i) for i in abi["inputs"]]


def _canon(param: dict[str, Any]) -> str:
    kind = str(param["type"])
    if kind.startswith("tuple"):
        inner = ",".join(_canon(c) for c in param["components"])
        return f"({inner}){kind[len('tuple') :]}"
    return kind


def call_data(abi: list[dict[str, Any]], fn_name: str, *args: Any) -> bytes:
    """Calldata for ``fn_name(*args)`` with every ``string`` parameter given as raw bytes (the
    ABI encodes ``string`` and ``bytes`` alike)."""
    (fn,) = [f for f in abi if f["type"] == "function" and f["name"] == fn_name]
    return function_abi_to_4byte_selector(fn) + abi_encode(_types(fn), list(args))  # type: ignore[arg-type]


def send_raw_call(w3: Web3, account: LocalAccount, to: str, data: bytes, value: int = 0) -> Sent:
    """Sign and send ``data`` to ``to``; the mined transaction (ChainError if it reverted)."""
    params: dict[str, Any] = {"from": account.address, "to": to, "value": value, "data": data}
    params["gas"] = w3.eth.estimate_gas(cast(Any, params)) + 50_000
    tx = {
        **params,
        "nonce": w3.eth.get_transaction_count(account.address, "pending"),
        "gasPrice": w3.eth.gas_price,
        "chainId": w3.eth.chain_id,
    }
    del tx["from"]
    signed = account.sign_transaction(cast(Any, tx))
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(signed.raw_transaction)
    )
    if receipt["status"] != 1:
        raise ChainError(f"{data[:4].hex()} reverted")
    return Sent(
        tx_hash="0x" + bytes(receipt["transactionHash"]).hex(),
        gas_used=int(receipt["gasUsed"]),
        block=int(receipt["blockNumber"]),
        events=[],
    )


def escrow_call(
    client: EscrowClient, account: LocalAccount, fn_name: str, *args: Any, value: int = 0
) -> Sent:
    """``fn_name(*args)`` on the escrow, strings as raw bytes; its events as the client decodes
    them."""
    data = call_data(client.deployment.abi, fn_name, *args)
    sent = send_raw_call(client.w3, account, client.address, data, value)
    receipt = client.w3.eth.get_transaction_receipt(cast(Any, sent.tx_hash))
    return replace(sent, events=client.decode_logs(receipt["logs"]))


def create_job_raw(
    client: EscrowClient, submitter: LocalAccount, spec_cid: bytes, deadline: int, bounty: int
) -> Sent:
    """``createJob`` with ``spec_cid`` as raw bytes (the deployment's default terms)."""
    t = client.default_terms(bounty, submitter.address)
    return escrow_call(
        client,
        submitter,
        "createJob",
        os.urandom(32),
        spec_cid,
        deadline,
        client.expected_operator(t),
        t.mediator,
        t.collateral,
        t.flags,
        0,  # replicas: a single job
        value=bounty,
    )


class Forger:
    """A deployed EventForger and an :class:`EscrowClient` that reads it as if it were the
    escrow (same event ABI)."""

    def __init__(self, w3: Web3, deployer: LocalAccount, escrow: Deployment) -> None:
        artifact = load_artifacts(include_tests=True)["EventForger"]
        self.abi = artifact.abi
        factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
        tx = factory.constructor().build_transaction(
            {
                "from": deployer.address,
                "nonce": w3.eth.get_transaction_count(deployer.address, "pending"),
                "chainId": w3.eth.chain_id,
            }
        )
        signed = deployer.sign_transaction(cast(Any, tx))
        receipt = w3.eth.wait_for_transaction_receipt(
            w3.eth.send_raw_transaction(signed.raw_transaction)
        )
        self.w3 = w3
        self.address = cast(ChecksumAddress, receipt["contractAddress"])
        self.client = EscrowClient(
            w3,
            replace(escrow, escrow=self.address, block=int(receipt["blockNumber"])),
        )

    def call(self, account: LocalAccount, fn_name: str, *args: Any) -> Sent:
        return send_raw_call(self.w3, account, self.address, call_data(self.abi, fn_name, *args))
