"""Fresh provider wallets on a devnet: funded from a dev account, registered and staked."""

from __future__ import annotations

import secrets
from typing import Any, cast

from eth_account import Account
from eth_account.signers.local import LocalAccount

from gridmarket.chain import EscrowClient


def new_providers(
    escrow: EscrowClient,
    funder: LocalAccount,
    count: int,
    *,
    fund_wei: int = 10**18,
    stake_wei: int | None = None,
    metadata_cid: str = "bafkreidevnetprovider",
) -> list[LocalAccount]:
    """``count`` new random wallets, each sent ``fund_wei`` by ``funder`` (pipelined) and then
    registered as a provider with ``stake_wei`` (default: the escrow's ``minStake``)."""
    w3 = escrow.w3
    accounts = [Account.from_key(secrets.token_bytes(32)) for _ in range(count)]
    nonce = w3.eth.get_transaction_count(funder.address, "pending")
    gas_price = w3.eth.gas_price
    hashes = []
    for i, acct in enumerate(accounts):
        tx = {
            "to": acct.address,
            "value": fund_wei,
            "gas": 21000,
            "gasPrice": gas_price,
            "nonce": nonce + i,
            "chainId": w3.eth.chain_id,
        }
        raw = funder.sign_transaction(cast(Any, tx)).raw_transaction
        hashes.append(w3.eth.send_raw_transaction(raw))
    for h in hashes:
        w3.eth.wait_for_transaction_receipt(h)
    stake = int(escrow.call("minStake")) if stake_wei is None else stake_wei
    for acct in accounts:
        escrow.send(acct, "registerProvider", metadata_cid, value=stake)
    return accounts
