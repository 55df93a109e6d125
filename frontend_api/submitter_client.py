"""The submitter CLI's plumbing: the front end's JSON API (:class:`Frontend`), the local wallet
(password, keystore), and the checks and signature a prepared transaction gets before the front
end relays it. Errors are :class:`CliError`, one line for the user."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gridmarket.cmdline import prompt_password

CREATE_JOB_SIGNATURE = "createJob(bytes32,string,uint40,address,address,uint96,uint8,uint8)"
"""``createJob(salt, specCid, deadline, expectedOperator, mediator, collateral, flags,
replicas)`` (JobEscrow version 5: a replicated ETH job too, with ``replicas`` 2..5)."""
CREATE_JOB_WITH_SIGNATURE = (
    "createJobWith(address,uint256,bytes32,string,uint40,address,address,uint96,uint8,uint8)"
)
PERMIT_TOKEN_SIGNATURE = "permitToken(address,uint256,uint256,uint8,bytes32,bytes32)"  # noqa: S105
JOB_TUPLE = (
    "(address,uint96,address,uint40,uint40,uint16,uint16,bytes32,address,address,uint96,uint40,"
    "uint8,address,uint40)"
)
"""``IJobEscrow.Job`` as the ABI spells it in a function signature (version 5: ``holdUntil``
last)."""
RESOLVE_SIGNATURE = f"resolve(bytes32,{JOB_TUPLE}[])"
"""``resolve(groupId, seats)``: how the submitter cancels a replicated job."""


def job_call_signature(fn_name: str) -> str:
    """``cancel(bytes32,(…))``: the signature of a job call taking the id and the struct."""
    return f"{fn_name}(bytes32,{JOB_TUPLE})"


class CliError(RuntimeError):
    """A problem to report in one line (exit status 1)."""


@dataclass
class Options:
    url: str
    keystore: Path
    password_file: Path | None
    ipfs_api: str | None


class Frontend:
    """The front end's JSON API; errors become :class:`CliError` with the server's sentence."""

    def __init__(self, url: str, timeout: float = 120.0) -> None:
        self.url = url
        self._http = httpx.Client(base_url=url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the front end at {self.url}: {exc}") from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text[:300]
            raise CliError(str(detail))
        return response

    def stream(self, method: str, path: str, **kwargs: Any) -> Any:
        """A streamed response (a context manager), as ``httpx.Client.stream``."""
        return self._http.stream(method, path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs).json()

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs).json()


def read_password(opts: Options, confirm: bool = False) -> str:
    env = os.environ.get("GRIDMARKET_PASSWORD")
    if env:
        return env
    if opts.password_file is not None:
        try:
            return opts.password_file.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise CliError(f"cannot read the password file {opts.password_file}: {exc}") from None
    password = prompt_password(confirm=confirm)
    if password is None:
        raise CliError("no password: set GRIDMARKET_PASSWORD or --password-file")
    return password


def unlock_account(opts: Options) -> Any:
    from gridmarket.keystore import load_account

    return load_account(opts.keystore, read_password(opts))


def wallet_address(opts: Options) -> str:
    from gridmarket.keystore import keystore_address

    return keystore_address(opts.keystore)


def _check_operator(got: str, terms: dict[str, Any] | None) -> None:
    """The funding's ``expectedOperator`` must be the operator the user was shown."""
    if terms is None or not terms.get("operator"):
        return
    if str(got).lower() != str(terms["operator"]).lower():
        raise CliError(
            f"the transaction expects operator {got}, not {terms['operator']} (the one shown)"
        )


def check_create_job(
    tx: dict[str, str],
    info: dict[str, Any],
    spec_cid: str,
    deadline: int,
    bounty: int,
    terms: dict[str, Any] | None = None,
) -> None:
    """Refuse a ``createJob`` transaction that is not the one asked for: another contract or
    chain, another function, spec, deadline or value, or other terms than ``terms``
    (``mediator``, ``collateral_wei``, ``flags``: what the user asked for, the defaults filled
    in; ``operator``: the operator shown, which ``expectedOperator`` must name), so a front end
    cannot redirect funds or change who rules or assigns. With ``terms["replicas"]`` = k it
    must fund k seats (``bounty`` is then the whole value); without, a single job."""
    from eth_abi.abi import decode
    from eth_utils.crypto import keccak

    if tx["to"].lower() != str(info["escrow"]).lower():
        raise CliError(f"the transaction goes to {tx['to']}, not to the escrow {info['escrow']}")
    if int(tx["chainId"], 16) != int(info["chain_id"]):
        raise CliError(f"the transaction is for chain {int(tx['chainId'], 16)}")
    data = bytes.fromhex(tx["data"][2:])
    replicas = int((terms or {}).get("replicas") or 0)
    if data[:4] != keccak(text=CREATE_JOB_SIGNATURE)[:4]:
        raise CliError("the transaction does not call createJob")
    _, cid, got_deadline, operator, mediator, collateral, flags, seats = decode(
        ["bytes32", "string", "uint40", "address", "address", "uint96", "uint8", "uint8"],
        data[4:],
    )
    if int(seats) != replicas:
        raise CliError(f"the transaction funds {seats} seats, not {replicas}")
    if cid != spec_cid or got_deadline != deadline or int(tx["value"], 16) != bounty:
        raise CliError("the transaction's spec, deadline or bounty is not the one prepared")
    if terms is not None:
        _check_operator(operator, terms)
        if str(mediator).lower() != str(terms["mediator"]).lower():
            raise CliError(f"the transaction names mediator {mediator}, not {terms['mediator']}")
        if int(collateral) != int(terms["collateral_wei"]) or int(flags) != int(terms["flags"]):
            raise CliError("the transaction's collateral or payment mode is not the one asked")


def check_resolve(
    tx: dict[str, str], info: dict[str, Any], group_id: str, seat_ids: list[str]
) -> None:
    """A replicated job's cancel: ``resolve(group_id, seats)`` to the escrow on this chain,
    no ETH sent, with one struct per seat (the escrow checks each is the seat's current one)."""
    from eth_abi.abi import decode
    from eth_utils.crypto import keccak

    if tx["to"].lower() != str(info["escrow"]).lower():
        raise CliError(f"the transaction goes to {tx['to']}, not to the escrow {info['escrow']}")
    if int(tx["chainId"], 16) != int(info["chain_id"]):
        raise CliError(f"the transaction is for chain {int(tx['chainId'], 16)}")
    if int(tx["value"], 16) != 0:
        raise CliError(f"the transaction sends {int(tx['value'], 16)} wei, not 0")
    data = bytes.fromhex(tx["data"][2:])
    if data[:4] != keccak(text=RESOLVE_SIGNATURE)[:4]:
        raise CliError(f"the transaction is not resolve of {group_id}")
    try:
        got_group, seats = decode(["bytes32", JOB_TUPLE + "[]"], data[4:])
    except Exception:  # eth-abi raises several types for malformed data
        raise CliError("the transaction's resolve does not decode") from None
    if "0x" + bytes(got_group).hex() != group_id.lower():
        raise CliError(f"the transaction is not resolve of {group_id}")
    if len(seats) != len(seat_ids):
        raise CliError(f"the transaction resolves {len(seats)} seats, not {len(seat_ids)}")


def _multicall(data: bytes) -> list[bytes]:
    """The calls of a ``multicall(bytes[])`` transaction's data; :class:`CliError` otherwise."""
    from eth_abi.abi import decode
    from eth_utils.crypto import keccak

    if data[:4] != keccak(text="multicall(bytes[])")[:4]:
        raise CliError("the transaction is not a multicall of the escrow")
    try:
        (calls,) = decode(["bytes[]"], data[4:])
    except Exception:  # eth-abi raises several types for malformed data
        raise CliError("the transaction's multicall does not decode") from None
    return [bytes(c) for c in calls]


def _check_permit_call(call: bytes, token: str, least: int) -> None:
    """``call`` must be ``permitToken(token, value >= least, ...)``."""
    from eth_abi.abi import decode
    from eth_utils.crypto import keccak

    if call[:4] != keccak(text=PERMIT_TOKEN_SIGNATURE)[:4]:
        raise CliError("the transaction's first call is not permitToken")
    got_token, value = decode(
        ["address", "uint256", "uint256", "uint8", "bytes32", "bytes32"], call[4:]
    )[:2]
    if str(got_token).lower() != token.lower() or int(value) < least:
        raise CliError("the transaction's permit is not for this token and amount")


def check_create_job_with(
    tx: dict[str, str],
    info: dict[str, Any],
    token: str,
    spec_cid: str,
    deadline: int,
    amount: int,
    terms: dict[str, Any],
) -> None:
    """Refuse a token job's funding that is not the one asked for: to the escrow on this chain,
    no ETH sent, ``createJobWith(token, amount, ...)`` with this spec, deadline, terms (the
    operator shown as ``expectedOperator``) and seat count, alone or after
    ``permitToken(token, amount, ...)`` in one ``multicall``."""
    from eth_abi.abi import decode
    from eth_utils.crypto import keccak

    if tx["to"].lower() != str(info["escrow"]).lower():
        raise CliError(f"the transaction goes to {tx['to']}, not to the escrow {info['escrow']}")
    if int(tx["chainId"], 16) != int(info["chain_id"]):
        raise CliError(f"the transaction is for chain {int(tx['chainId'], 16)}")
    if int(tx["value"], 16) != 0:
        raise CliError("the transaction sends ETH with a token job")
    data = bytes.fromhex(tx["data"][2:])
    selector = keccak(text=CREATE_JOB_WITH_SIGNATURE)[:4]
    if data[:4] != selector:
        calls = _multicall(data)
        if len(calls) != 2:
            raise CliError(f"the transaction's multicall makes {len(calls)} calls, not 2")
        _check_permit_call(calls[0], token, amount)
        data = calls[1]
        if data[:4] != selector:
            raise CliError("the transaction does not call createJobWith")
    got_token, got_amount, _, cid, got_deadline, operator, mediator, collateral, flags, seats = (
        decode(
            [
                "address",
                "uint256",
                "bytes32",
                "string",
                "uint40",
                "address",
                "address",
                "uint96",
                "uint8",
                "uint8",
            ],
            data[4:],
        )
    )
    if str(got_token).lower() != token.lower() or int(got_amount) != amount:
        raise CliError(f"the transaction pays {got_amount} of {got_token}, not {amount} of {token}")
    if cid != spec_cid or got_deadline != deadline:
        raise CliError("the transaction's spec or deadline is not the one prepared")
    if int(seats) != int(terms.get("replicas") or 0):
        raise CliError(f"the transaction funds {seats} seats, not {terms.get('replicas') or 0}")
    _check_operator(operator, terms)
    if str(mediator).lower() != str(terms["mediator"]).lower():
        raise CliError(f"the transaction names mediator {mediator}, not {terms['mediator']}")
    if int(collateral) != int(terms["collateral_wei"]) or int(flags) != int(terms["flags"]):
        raise CliError("the transaction's collateral or payment mode is not the one asked")


def check_token_dispute(
    tx: dict[str, str], info: dict[str, Any], token: str, job_id: str, deposit: int
) -> None:
    """A token job's dispute: ``dispute(job_id, ...)`` with no ETH, alone or after
    ``permitToken(token, deposit, ...)`` in one ``multicall``."""
    from eth_utils.crypto import keccak

    data = bytes.fromhex(tx["data"][2:])
    selector = keccak(text=job_call_signature("dispute"))[:4]
    if data[:4] != selector:
        calls = _multicall(data)
        if len(calls) != 2:
            raise CliError(f"the transaction's multicall makes {len(calls)} calls, not 2")
        _check_permit_call(calls[0], token, deposit)
        tx = {**tx, "data": "0x" + calls[1].hex()}
    check_job_call(tx, info, job_call_signature("dispute"), job_id, 0)


def dispute_value(tx: dict[str, str], info: dict[str, Any]) -> tuple[int, int]:
    """``(value, deposit)`` of a dispute: the ETH it must send and what it deposits
    (``depositOf``: the job's bounty, for an ETH job at least the escrow's ``disputeDeposit``,
    ``dispute_deposit`` in ``/api/info``), read from the job the call itself passes: the escrow
    refuses the call unless that struct is the job's current state, and any value but exactly
    the deposit. A spot job's deposit was locked at funding: its dispute sends nothing
    (:func:`gridmarket.escrow.dispute_value`)."""
    from eth_abi.abi import decode

    from gridmarket.escrow import deposit_of
    from gridmarket.escrow import dispute_value as value_of

    try:
        _, job = decode(["bytes32", JOB_TUPLE], bytes.fromhex(tx["data"][2:])[4:])
    except Exception:  # eth-abi raises several types for malformed data
        raise CliError("the transaction is not a dispute of a job") from None
    bounty, token, flags = int(job[1]), str(job[13]), int(job[12])
    floor = int(info["params"].get("dispute_deposit", 0))
    return value_of(bounty, token, floor, flags), deposit_of(bounty, token, floor, flags)


def check_job_call(
    tx: dict[str, str], info: dict[str, Any], fn_signature: str, job_id: str, value: int = 0
) -> None:
    """Refuse a job transaction that is not ``fn_signature`` on ``job_id`` to the escrow with
    exactly ``value`` wei (a dispute's deposit, or nothing)."""
    from eth_utils.crypto import keccak

    if tx["to"].lower() != str(info["escrow"]).lower():
        raise CliError(f"the transaction goes to {tx['to']}, not to the escrow {info['escrow']}")
    if int(tx["chainId"], 16) != int(info["chain_id"]):
        raise CliError(f"the transaction is for chain {int(tx['chainId'], 16)}")
    data = bytes.fromhex(tx["data"][2:])
    if data[:4] != keccak(text=fn_signature)[:4] or data[4:36].hex() != job_id[2:].lower():
        raise CliError(f"the transaction is not {fn_signature.partition('(')[0]} of {job_id}")
    if int(tx["value"], 16) != value:
        raise CliError(f"the transaction sends {int(tx['value'], 16)} wei, not {value}")


def sign_permit(
    account: Any, typed_data: dict[str, Any], spender: str, value: int
) -> dict[str, Any]:
    """Sign the EIP-2612 permit a prepare answered with (``funding.permit``), after checking it
    lets only ``spender`` (the escrow) take only ``value`` from this wallet: the ``permit`` a
    second prepare takes (``{value, deadline, signature}``)."""
    from eth_account import Account

    message = typed_data.get("message") or {}
    if str(message.get("owner", "")).lower() != account.address.lower():
        raise CliError(f"the permit is for {message.get('owner')}, not {account.address}")
    if str(message.get("spender", "")).lower() != spender.lower():
        raise CliError(f"the permit lets {message.get('spender')} spend, not the escrow")
    if int(message.get("value", -1)) != value:
        raise CliError(f"the permit is for {message.get('value')} units, not {value}")
    uints = ("value", "nonce", "deadline")
    full = {
        **typed_data,
        "domain": {**typed_data["domain"], "chainId": int(typed_data["domain"]["chainId"])},
        "message": {k: int(v) if k in uints else v for k, v in message.items()},
    }
    signed = Account.sign_typed_data(account.key, full_message=full)
    return {
        "value": str(value),
        "deadline": int(message["deadline"]),
        "signature": "0x" + bytes(signed.signature).hex(),
    }


def sign_tx(account: Any, tx: dict[str, str]) -> str:
    signed = account.sign_transaction(
        {
            "to": tx["to"],
            "data": tx["data"],
            "value": int(tx["value"], 16),
            "gas": int(tx["gas"], 16),
            "gasPrice": int(tx["gasPrice"], 16),
            "nonce": int(tx["nonce"], 16),
            "chainId": int(tx["chainId"], 16),
        }
    )
    return "0x" + bytes(signed.raw_transaction).hex()


def relay(fe: Frontend, raw: str) -> dict[str, Any]:
    result: dict[str, Any] = fe.post("/api/tx/relay", json={"raw_tx": raw, "wait_s": 120})
    if result.get("status") != "success":
        why = f": {result['error']}" if result.get("error") else ""
        raise CliError(f"transaction {result.get('tx_hash')} {result.get('status')}{why}")
    return result


def parse_job_id(value: str) -> str:
    text = value.strip().lower()
    if not (text.startswith("0x") and len(text) == 66):
        raise CliError(f"{value!r} is not a job id (0x and 64 hex digits)")
    return text


def tx_link(info: dict[str, Any], url: str, tx_hash: str) -> str:
    explorer = info.get("explorer_url")
    return f"{explorer}/tx/{tx_hash}" if explorer else f"{url}/tx/{tx_hash}"
