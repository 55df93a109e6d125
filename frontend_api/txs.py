"""Unsigned transactions for the visitor's wallet, and relaying the ones it signed.

The front end never holds a key. A page (or the CLI) asks for a transaction; it gets
``{from, to, data, value, chainId, gas, gasPrice, nonce}`` (quantities as 0x hex, as EIP-1193
wallets and ``eth_account`` expect), after the call was run against the chain from that sender: a
transaction that would revert is refused here with the contract's decoded error, before anything
is signed or sent. A signed raw transaction can be relayed (:meth:`TxBuilder.relay`): only to
this escrow, on this chain, and only if it would not revert.
"""

from __future__ import annotations

import re
from typing import Any, cast

import rlp
from eth_account import Account
from eth_account._utils.legacy_transactions import Transaction as LegacyTransaction
from eth_account.typed_transactions.typed_transaction import TypedTransaction
from eth_typing import ChecksumAddress
from eth_utils.address import to_checksum_address
from hexbytes import HexBytes
from web3.exceptions import (
    ContractCustomError,
    ContractLogicError,
    TimeExhausted,
    TransactionNotFound,
    Web3RPCError,
)
from web3.types import TxParams

from gridmarket.chain import EscrowClient, rpc_error_message
from gridmarket.escrow import JobState, Terms
from gridmarket.token import ERC20_ABI, TokenClient

from .records import ChainEvent, hexstr

MAX_RAW_TX_BYTES = 128 * 1024

CREATE_JOB_ERROR_FIELDS = (
    ("JobEscrowMediatorNotListed", "mediator"),
    ("JobEscrowConflictOfInterest", "mediator"),
    ("JobEscrowCollateralTooLow", "collateral"),
    ("JobEscrowBadFlags", "payment"),
    ("JobEscrowBountyTooLow", "bounty"),
    ("JobEscrowBountyTooHigh", "bounty"),
    ("JobEscrowDeadlineOutOfRange", "deadline"),
    ("JobEscrowBadReplicas", "verification"),
    ("JobEscrowBountyNotDivisible", "bounty"),
    ("JobEscrowTokenNotAllowed", "currency"),
    ("JobEscrowTokenAmountMismatch", "currency"),
    ("JobEscrowTokenTransferFailed", "bounty"),
    ("JobEscrowPermitFailed", "permit"),
    ("JobEscrowOperatorChanged", "operator"),
)
"""``createJob``'s and ``createJobWith``'s custom errors and the input each is about
(``from`` for anything else)."""


def _named(exc: TxError, names: dict[str, str]) -> TxError:
    """``exc`` on the input its custom error is about (``names`` maps the inputs to the
    request's field names)."""
    for error, key in CREATE_JOB_ERROR_FIELDS:
        if error in exc.message:
            return TxError(names.get(key, key), exc.message)
    return exc


_OPERATOR_CHANGED = re.compile(
    r"JobEscrowOperatorChanged\(expected=(0x[0-9a-fA-F]{40}), operator=(0x[0-9a-fA-F]{40})\)"
)


def explain(reason: str) -> str:
    """A decoded revert (``Name(arg=value, ...)``, :meth:`EscrowClient.decode_error`) with the
    words a submitter needs where the bare error would not say what to do; else ``reason``."""
    found = _OPERATOR_CHANGED.search(reason)
    if found:
        expected, operator = (to_checksum_address(a) for a in found.groups())
        return (
            f"the escrow's operator changed: you approved {expected}, but the owner has put "
            f"{operator} in office since, and the escrow refuses to fund a job for an operator "
            f"you did not approve. Nothing was funded; review the terms with the new operator "
            f"and fund again ({reason})"
        )
    return reason


PERMIT_TTL_S = 3600
"""How long a permit the page or the CLI is asked to sign stays valid."""

_DOMAIN_ABI: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": name,
        "stateMutability": "view",
        "inputs": [],
        "outputs": [{"name": "", "type": "string"}],
    }
    for name in ("name", "version")
]
"""``name()`` and ``version()``: what an EIP-2612 token's EIP-712 domain is made of (not
every token has ``version()``: "1" is then assumed, and checked against DOMAIN_SEPARATOR)."""

PERMIT_TYPES = {
    "EIP712Domain": [
        {"name": "name", "type": "string"},
        {"name": "version", "type": "string"},
        {"name": "chainId", "type": "uint256"},
        {"name": "verifyingContract", "type": "address"},
    ],
    "Permit": [
        {"name": "owner", "type": "address"},
        {"name": "spender", "type": "address"},
        {"name": "value", "type": "uint256"},
        {"name": "nonce", "type": "uint256"},
        {"name": "deadline", "type": "uint256"},
    ],
}
"""EIP-2612's typed data (gridmarket.token.PERMIT_TYPEHASH), for ``eth_signTypedData_v4``."""


class TxError(ValueError):
    """A transaction that cannot be built or relayed; ``field`` names the input at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TxBuilder:
    """Builds escrow transactions for a given sender and relays signed ones."""

    def __init__(self, escrow: EscrowClient) -> None:
        self.escrow = escrow
        self.w3 = escrow.w3

    # ------------------------------------------------------------------ building
    def unsigned(
        self, sender: str, fn_name: str, *args: Any, value: int = 0, field: str = "from"
    ) -> dict[str, str]:
        """``fn_name(*args)`` from ``sender`` with ``value`` wei, ready for a wallet to sign.

        The gas estimate runs the call: a revert raises :class:`TxError` naming ``field`` (the
        input most likely at fault) with the decoded custom error.
        """
        data = self.escrow.encode(fn_name, *args)
        call: TxParams = {
            "from": cast(ChecksumAddress, sender),
            "to": cast(ChecksumAddress, self.escrow.address),
            "value": cast(Any, value),
            "data": data,
        }
        gas = self._estimate(call, fn_name, field)
        nonce = self.w3.eth.get_transaction_count(cast(ChecksumAddress, sender), "pending")
        return {
            "from": sender,
            "to": self.escrow.address,
            "data": hexstr(data),
            "value": hex(value),
            "chainId": hex(self.escrow.deployment.chain_id),
            "gas": hex(gas + gas // 5 + 10_000),
            "gasPrice": hex(int(self.w3.eth.gas_price)),
            "nonce": hex(nonce),
        }

    def _estimate(self, call: TxParams, fn_name: str, field: str) -> int:
        try:
            return int(self.w3.eth.estimate_gas(call))
        except (ContractCustomError, ContractLogicError) as exc:
            reason = explain(self.escrow.decode_error(exc))
            raise TxError(field, f"{fn_name} would revert: {reason}") from None
        except Web3RPCError as exc:
            message = rpc_error_message(exc)
            if "insufficient funds" in message or "lack of funds" in message:
                raise TxError(
                    field, f"{call.get('from')!s} has not enough ETH for {fn_name} (value plus gas)"
                ) from None
            raise TxError(field, f"{fn_name} cannot be sent: {message}") from None

    def create_job(
        self,
        sender: str,
        salt: bytes,
        spec_cid: str,
        deadline: int,
        bounty: int,
        terms: Terms,
        fields: dict[str, str] | None = None,
        replicas: int = 0,
    ) -> dict[str, str]:
        """``createJob(salt, specCid, deadline, expectedOperator, mediator, collateral, flags,
        replicas)`` with the job's funding as value (``terms.funding``: the bounty, twice it
        for a spot job; a replicated job's whole bounty, ``replicas`` equal shares, each seat
        backed by ``terms.collateral``). ``expectedOperator`` is ``terms.operator`` (the one the
        submitter approved), or the one in office now when that is zero. A revert names the
        input at fault: ``fields`` maps ``mediator``, ``collateral``, ``payment``, ``bounty``,
        ``deadline`` and ``operator`` to the request's field names (``verification`` for the
        seat count)."""
        names = fields or {}
        try:
            return self.unsigned(
                sender,
                "createJob",
                salt,
                spec_cid,
                deadline,
                self.escrow.expected_operator(terms),
                terms.mediator,
                terms.collateral,
                terms.flags,
                replicas,
                value=terms.funding(bounty),
            )
        except TxError as exc:
            raise _named(exc, names) from None

    def resolve_cancel(self, sender: str, group_id: bytes, seats: list[JobState]) -> dict[str, str]:
        """``resolve(groupId, seats)`` from the submitter while every seat is Funded: the way
        to cancel a replicated job (``cancel`` refuses a seat); every seat is refunded."""
        return self.unsigned(sender, "resolve", group_id, [s.job.as_tuple() for s in seats])

    # ------------------------------------------------------------------ tokens
    def token_state(self, token: str, owner: str) -> tuple[int, int]:
        """``(balance, allowance for the escrow)`` of ``owner`` in ``token``."""
        client = TokenClient(self.w3, token)
        return client.balance_of(owner), client.allowance(owner, self.escrow.address)

    def approve_tx(self, sender: str, token: str, amount: int) -> dict[str, str]:
        """``token.approve(escrow, amount)`` from ``sender``: the way to fund for a wallet that
        cannot sign typed data (a permit); sent before the escrow call that pulls it."""
        contract = self.w3.eth.contract(address=cast(Any, token), abi=ERC20_ABI)
        data = bytes(HexBytes(contract.encode_abi("approve", args=[self.escrow.address, amount])))
        call: TxParams = {
            "from": cast(ChecksumAddress, sender),
            "to": cast(ChecksumAddress, token),
            "value": cast(Any, 0),
            "data": data,
        }
        gas = self._estimate(call, "approve", "from")
        nonce = self.w3.eth.get_transaction_count(cast(ChecksumAddress, sender), "pending")
        return {
            "from": sender,
            "to": token,
            "data": hexstr(data),
            "value": "0x0",
            "chainId": hex(self.escrow.deployment.chain_id),
            "gas": hex(gas + gas // 5 + 10_000),
            "gasPrice": hex(int(self.w3.eth.gas_price)),
            "nonce": hex(nonce),
        }

    def permit_request(
        self, token: str, owner: str, value: int, now: int
    ) -> tuple[dict[str, Any] | None, str | None]:
        """The EIP-2612 typed data ``owner`` signs (``eth_signTypedData_v4``) to let the escrow
        pull ``value`` of ``token`` until ``now + PERMIT_TTL_S``, and None; or None and why
        when the token's domain cannot be rebuilt (its ``DOMAIN_SEPARATOR`` is not the standard
        one over ``name()``, ``version()``): approve instead."""
        from eth_abi.abi import encode
        from eth_utils.crypto import keccak

        contract = self.w3.eth.contract(address=cast(Any, token), abi=ERC20_ABI + _DOMAIN_ABI)
        try:
            name = str(contract.functions.name().call())
            separator = bytes(contract.functions.DOMAIN_SEPARATOR().call())
            nonce = int(contract.functions.nonces(owner).call())
        except Exception as exc:  # no permit support (or a hostile token): approve instead
            return None, f"the token has no EIP-2612 permit ({type(exc).__name__})"
        try:
            version = str(contract.functions.version().call())
        except Exception:  # most EIP-2612 tokens have no version(): "1" is the convention
            version = "1"
        chain_id = self.escrow.deployment.chain_id
        domain = keccak(
            encode(
                ["bytes32", "bytes32", "bytes32", "uint256", "address"],
                [
                    keccak(
                        text="EIP712Domain(string name,string version,uint256 chainId,"
                        "address verifyingContract)"
                    ),
                    keccak(text=name),
                    keccak(text=version),
                    chain_id,
                    token,
                ],
            )
        )
        if domain != separator:
            return None, "the token's permit domain is not the standard one: approve instead"
        deadline = now + PERMIT_TTL_S
        return {
            "types": PERMIT_TYPES,
            "primaryType": "Permit",
            "domain": {
                "name": name,
                "version": version,
                "chainId": chain_id,
                "verifyingContract": token,
            },
            "message": {
                "owner": owner,
                "spender": self.escrow.address,
                "value": str(value),
                "nonce": str(nonce),
                "deadline": str(deadline),
            },
        }, None

    def create_job_with(
        self,
        sender: str,
        token: str,
        amount: int,
        salt: bytes,
        spec_cid: str,
        deadline: int,
        replicas: int,
        terms: Terms,
        permit: tuple[int, int, int, bytes, bytes] | None,
        fields: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """``createJobWith(token, amount, salt, specCid, deadline, expectedOperator, mediator,
        collateral, flags, replicas)`` (``expectedOperator`` as :meth:`create_job`'s); with
        ``permit`` (value, deadline, v, r, s)
        one ``multicall([permitToken(...), createJobWith(...)])``. Dry-run from ``sender``
        (without a permit the allowance must be there); a revert names the input at fault."""
        names = fields or {}
        args = (
            token,
            amount,
            salt,
            spec_cid,
            deadline,
            self.escrow.expected_operator(terms),
            terms.mediator,
            terms.collateral,
            terms.flags,
            replicas,
        )
        try:
            if permit is None:
                return self.unsigned(sender, "createJobWith", *args)
            create = self.escrow.encode("createJobWith", *args)
            value, permit_deadline, v, r, s = permit
            allow = self.escrow.encode("permitToken", token, value, permit_deadline, v, r, s)
            return self.unsigned(sender, "multicall", [allow, create])
        except TxError as exc:
            raise _named(exc, names) from None

    def dispute_with_permit(
        self, sender: str, state: JobState, permit: tuple[int, int, int, bytes, bytes]
    ) -> dict[str, str]:
        """``multicall([permitToken(...), dispute(jobId, job)])``: a token job's dispute with
        the deposit (``depositOf``: its bounty, in its token) allowed by the submitter's permit."""
        value, permit_deadline, v, r, s = permit
        allow = self.escrow.encode("permitToken", state.job.token, value, permit_deadline, v, r, s)
        dispute = self.escrow.encode("dispute", state.job_id, state.job.as_tuple())
        try:
            return self.unsigned(sender, "multicall", [allow, dispute])
        except TxError as exc:
            if "JobEscrowPermitFailed" in exc.message:
                raise TxError("permit", exc.message) from None
            raise

    def job_call(
        self, sender: str, fn_name: str, state: JobState, value: int = 0
    ) -> dict[str, str]:
        """``cancel``, ``refund``, ``release``, ``dispute`` (``value``: the deposit of an ETH
        job, ``depositOf``: its bounty, at least the escrow's ``disputeDeposit``) or
        ``finalize`` of a job, with its struct as the events tell."""
        return self.unsigned(sender, fn_name, state.job_id, state.job.as_tuple(), value=value)

    # ------------------------------------------------------------------ relaying
    def decode_raw(self, raw_tx: str) -> tuple[bytes, dict[str, Any]]:
        """The bytes and fields (``from`` recovered) of a signed raw transaction."""
        text = raw_tx.strip() if isinstance(raw_tx, str) else ""
        if not text.startswith("0x") or len(text) < 4:
            raise TxError("raw_tx", "must be the signed transaction as 0x-prefixed hex")
        try:
            raw = bytes.fromhex(text[2:])
        except ValueError:
            raise TxError("raw_tx", "is not valid hex") from None
        if len(raw) > MAX_RAW_TX_BYTES:
            raise TxError("raw_tx", f"is {len(raw)} bytes, more than {MAX_RAW_TX_BYTES}")
        try:
            if raw[0] <= 0x7F:
                fields = dict(TypedTransaction.from_bytes(HexBytes(raw)).as_dict())
            else:
                legacy = rlp.decode(raw, LegacyTransaction).as_dict()
                v = int(legacy["v"])
                legacy["chainId"] = (v - 35) // 2 if v >= 35 else None
                fields = dict(legacy)
            sender = Account.recover_transaction(raw)
        except Exception as exc:  # rlp, eth-account and eth-keys each raise their own types
            raise TxError("raw_tx", f"is not a signed Ethereum transaction ({exc})") from None
        fields["from"] = to_checksum_address(sender)
        return raw, fields

    def relay(self, raw_tx: str, *, wait_s: float = 0) -> dict[str, Any]:
        """Send a signed transaction to the escrow. Refused (:class:`TxError` on ``raw_tx``)
        when it is for another contract or chain, or would revert. With ``wait_s`` the receipt
        is waited for and its escrow events decoded."""
        raw, fields = self.decode_raw(raw_tx)
        to = fields.get("to")
        if not to:
            raise TxError("raw_tx", "creates a contract: only calls to the escrow are relayed")
        to = to_checksum_address(to)
        if to != self.escrow.address:
            raise TxError(
                "raw_tx",
                f"is sent to {to}, not to the escrow {self.escrow.address}: only "
                "escrow transactions are relayed",
            )
        chain_id = fields.get("chainId")
        if chain_id is None:
            raise TxError("raw_tx", "has no chain id (not EIP-155 replay-protected): refused")
        if int(chain_id) != self.escrow.deployment.chain_id:
            raise TxError(
                "raw_tx",
                f"is signed for chain {chain_id}, this escrow is on chain "
                f"{self.escrow.deployment.chain_id}",
            )
        call: TxParams = {
            "from": fields["from"],
            "to": to,
            "value": cast(Any, int(fields.get("value", 0))),
            "data": bytes(HexBytes(fields.get("data", b""))),
        }
        try:
            self.w3.eth.call(call)
        except (ContractCustomError, ContractLogicError) as exc:
            reason = explain(self.escrow.decode_error(exc))
            raise TxError("raw_tx", f"would revert: {reason}") from None
        except Web3RPCError as exc:
            raise TxError("raw_tx", f"would fail: {rpc_error_message(exc)}") from None
        try:
            tx_hash = hexstr(bytes(self.w3.eth.send_raw_transaction(raw)))
        except Web3RPCError as exc:
            raise TxError("raw_tx", f"the node refused it: {rpc_error_message(exc)}") from None
        out: dict[str, Any] = {"tx_hash": tx_hash, "from": fields["from"], "status": "pending"}
        if wait_s > 0:
            try:
                receipt = self.w3.eth.wait_for_transaction_receipt(
                    HexBytes(tx_hash), timeout=wait_s
                )
            except TimeExhausted:
                return out
            out.update(self.receipt_view(receipt))
        return out

    def receipt_of(self, tx_hash: str) -> dict[str, Any] | None:
        """Status, block and decoded escrow events of a mined transaction; None while it is
        not mined (one quick RPC call: callers wait between calls without holding a thread)."""
        try:
            receipt = self.w3.eth.get_transaction_receipt(HexBytes(tx_hash))
        except TransactionNotFound:
            return None
        return self.receipt_view(receipt)

    def receipt_view(self, receipt: Any) -> dict[str, Any]:
        events = []
        for n, e in enumerate(self.escrow.decode_logs(receipt["logs"])):
            args, problems = dict(e.args), dict(e.problems)
            events.append(
                ChainEvent(n, e.name, args, e.block, 0, e.tx_hash, e.log_index, problems).to_json()
            )
        view: dict[str, Any] = {
            "status": "success" if receipt["status"] == 1 else "reverted",
            "block": int(receipt["blockNumber"]),
            "events": events,
        }
        if receipt["status"] != 1:
            view["error"] = self.revert_reason(receipt)
        return view

    def revert_reason(self, receipt: Any) -> str | None:
        """Why a mined transaction to the escrow reverted, in words (:func:`explain`): the
        transaction run again on the state its block left (a reverted transaction changed
        nothing, so what made it revert is still there); None when the run no longer reverts
        or the transaction is not the escrow's."""
        try:
            tx = self.w3.eth.get_transaction(receipt["transactionHash"])
        except (TransactionNotFound, Web3RPCError):
            return None
        to = tx.get("to")
        if not to or to_checksum_address(to) != self.escrow.address:
            return None
        call: TxParams = {
            "from": tx["from"],
            "to": to,
            "value": cast(Any, tx.get("value", 0)),
            "data": bytes(HexBytes(tx.get("input", b""))),
        }
        try:
            self.w3.eth.call(call, int(receipt["blockNumber"]))
        except (ContractCustomError, ContractLogicError) as exc:
            return explain(self.escrow.decode_error(exc))
        except Web3RPCError as exc:
            return rpc_error_message(exc)
        return None
