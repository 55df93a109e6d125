"""The escrow over plain JSON-RPC: what the provider agent's daemon does on-chain, without web3.

:class:`gridmarket.chain.EscrowClient` is built on web3, which with eth-abi, eth-account and
their dependencies put ~28 MB of resident memory into the agent's daemon when it had an
``rpc_url`` (docs/agent.md, "Footprint"; the goal is 60 MB for the whole process).
:class:`LightEscrowClient` does the daemon's part of it with what the daemon loads anyway:
httpx (:mod:`gridmarket.jsonrpc`), the ABI encoding (:mod:`gridmarket.abicodec`) and
transactions signed with coincurve (:func:`gridmarket.ethsig.sign_transaction`, byte-identical
to eth-account's). Its methods and errors are EscrowClient's, on the same contract:

* reads: :meth:`~LightEscrowClient.call` (views), :meth:`~LightEscrowClient.events` and
  :meth:`~LightEscrowClient.job_state` (the job rebuilt from its events with the shared
  :func:`gridmarket.escrow.apply_event`), :meth:`~LightEscrowClient.free_collateral_of`, the
  head block and its time, a token balance;
* transactions from the provider's wallet (``submitResult``, ``finalize``, ``resolve``,
  ``stakeToken`` with its EIP-2612 permit): :meth:`~LightEscrowClient.send` estimates gas (a
  revert is a :class:`ChainError` naming the contract's custom error with its arguments, before
  anything is sent), signs an EIP-1559 transaction (legacy EIP-155 on a chain without a base
  fee), keeps a nonce cache that a "nonce too low" answer refreshes once, waits for the receipt
  and decodes the escrow's events in it; a revert in a mined transaction is replayed on its
  block and decoded the same way.

Transport failures (the node unreachable, a timeout, an HTTP error) stay httpx's exceptions and
a non-revert JSON-RPC error is a :class:`gridmarket.jsonrpc.RpcError`: callers retry those, as
they retried web3's. Event data is hostile (the contract takes any bytes as a ``string``):
decoded as :class:`gridmarket.chain.EscrowClient` decodes it (:func:`decode_event`, shared).

The scheduler, the mediator, the CLIs and the tests keep :mod:`gridmarket.chain`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gridmarket import abicodec
from gridmarket.deployment import ChainError, Deployment
from gridmarket.escrow import (
    JOB_EVENTS,
    PROSE_FIELDS,
    ZERO_ADDRESS,
    InvalidText,
    JobState,
    apply_event,
    decode_prose,
    decode_text,
    fold_events,
)
from gridmarket.ethsig import Signer, keccak, sign_digest, sign_transaction, to_checksum_address
from gridmarket.jsonrpc import BadAnswerError, JsonRpc, RpcError
from gridmarket.token import PERMIT_TYPEHASH

__all__ = [
    "Event",
    "LightEscrowClient",
    "ReceiptTimeoutError",
    "Sent",
    "UndecodableLogError",
    "decode_event",
    "is_already_known",
    "is_nonce_too_low",
    "revert_reason",
]

log = logging.getLogger(__name__)

ERROR_STRING = bytes.fromhex("08c379a0")
"""The selector of Solidity's ``Error(string)`` (``require`` with a message)."""
PANIC = bytes.fromhex("4e487b71")
"""The selector of Solidity's ``Panic(uint256)`` (an assertion, an overflow, ...)."""


@dataclass(frozen=True)
class Event:
    """A decoded escrow event with where it happened.

    ``problems`` names each ``string`` argument that did not decode to a usable value (field ->
    why); such an argument is a :class:`gridmarket.escrow.InvalidText` in ``args``.
    """

    name: str
    args: dict[str, Any]
    block: int
    tx_hash: str
    log_index: int
    problems: dict[str, str] = field(default_factory=dict)


class UndecodableLogError(ValueError):
    """A log of the escrow's address that does not decode as the event its topic names."""


@dataclass(frozen=True)
class Sent:
    """A mined transaction."""

    tx_hash: str
    gas_used: int
    block: int
    events: list[Event]


class ReceiptTimeoutError(TimeoutError):
    """A sent transaction was not mined in time (it may still be: the caller retries)."""


def is_already_known(message: str) -> bool:
    """The node already holds this exact transaction (geth: 'already known', anvil: 'transaction
    already imported')."""
    return "already known" in message or "already imported" in message


def is_nonce_too_low(message: str) -> bool:
    """The nonce was used by a mined or pooled transaction (or the pool holds another transaction
    with it: 'replacement transaction underpriced')."""
    return "nonce too low" in message or "replacement transaction underpriced" in message


Decoder = Callable[[Sequence[str], bytes], tuple[Any, ...]]


def decode_event(
    abi: Mapping[str, Any], topics: Sequence[bytes], data: bytes, decode: Decoder
) -> tuple[dict[str, Any], dict[str, str]]:
    """The arguments of one log of the event ``abi`` (``topics`` without the event's own) and
    the problems of its ``string`` arguments; :class:`UndecodableLogError` when it does not
    decode. ``decode`` is eth-abi's ``decode`` (:mod:`gridmarket.chain`) or
    :func:`gridmarket.abicodec.decode` (here): the same rules either way.

    Strings are read as bytes (eth-abi would raise on invalid UTF-8) and checked by
    :func:`gridmarket.escrow.decode_text` (:func:`~gridmarket.escrow.decode_prose` for prose
    fields); an indexed dynamic value is its topic (a hash); addresses are checksummed."""
    inputs = abi["inputs"]
    indexed = [i for i in inputs if i.get("indexed")]
    plain = [i for i in inputs if not i.get("indexed")]
    if len(topics) != len(indexed):
        raise UndecodableLogError(
            f"{abi['name']}: {len(topics)} topics for {len(indexed)} indexed arguments"
        )
    args: dict[str, Any] = {}
    problems: dict[str, str] = {}
    try:
        for param, topic in zip(indexed, topics, strict=True):
            kind = str(param["type"])
            if kind in ("string", "bytes") or kind.endswith("]") or kind.startswith("tuple"):
                args[param["name"]] = bytes(topic)  # a dynamic value's topic is its hash
            else:
                (args[param["name"]],) = decode([kind], bytes(topic))
        types = ["bytes" if p["type"] == "string" else abicodec.canonical_type(p) for p in plain]
        values = decode(types, bytes(data))
    except Exception as exc:
        raise UndecodableLogError(f"{abi['name']}: {exc}") from exc
    for param, value in zip(plain, values, strict=True):
        name = str(param["name"])
        if param["type"] == "string" and name in PROSE_FIELDS:
            value = decode_prose(value)
        elif param["type"] == "string":
            value = decode_text(name, value)
            if isinstance(value, InvalidText):
                problems[name] = value.problem
        args[name] = value
    for param in inputs:
        if param["type"] == "address":
            args[param["name"]] = to_checksum_address(args[param["name"]])
    return args, problems


def revert_reason(errors: Mapping[bytes, Mapping[str, Any]], data: object) -> str | None:
    """``Name(arg=value, ...)`` for revert ``data`` (0x hex) of one of the contract's custom
    ``errors`` (selector -> ABI), ``execution reverted: <reason>`` for ``Error(string)``,
    ``Panic error 0x..`` for a panic; None when the data says nothing decodable."""
    if not isinstance(data, str) or not data.startswith("0x") or len(data) < 10:
        return None
    try:
        raw = bytes.fromhex(data[2:])
    except ValueError:
        return None
    try:
        if raw[:4] == ERROR_STRING:
            (text,) = abicodec.decode(["string"], raw[4:])
            return f"execution reverted: {text}"
        if raw[:4] == PANIC:
            (code,) = abicodec.decode(["uint256"], raw[4:])
            return f"Panic error 0x{code:02x}"
        abi = errors.get(raw[:4])
        if abi is None:
            return None
        types = [abicodec.canonical_type(i) for i in abi["inputs"]]
        values = abicodec.decode(types, raw[4:])
    except abicodec.AbiDecodeError:
        return None
    parts = [f"{i['name']}={_fmt(v)}" for i, v in zip(abi["inputs"], values, strict=True)]
    return f"{abi['name']}({', '.join(parts)})"


def _is_revert(exc: RpcError) -> bool:
    """Whether a JSON-RPC error is the call reverting (code 3, or a node that says so)."""
    return exc.code == 3 or "revert" in exc.message.lower()


NO_STATE = re.compile(
    r"BlockOutOfRange|out of range|missing trie node|header not found|historical state|"
    r"pruned|state (?:is )?not available|state unavailable|unknown block",
    re.IGNORECASE,
)
"""How nodes say they keep no state at a past block: anvil ``--prune-history``
(``BlockOutOfRangeError``), geth and its forks past their 128 recent states (``missing trie
node``, ``header not found``), Erigon, Reth and hosted RPCs (``historical state ... not
available``, ``pruned``)."""


def is_state_unavailable(message: str) -> bool:
    """Whether a node's error says it keeps no state at the block asked for (:data:`NO_STATE`)."""
    return NO_STATE.search(message) is not None


class LightEscrowClient:
    """A deployed JobEscrow over JSON-RPC (module docstring); thread-safe."""

    def __init__(self, rpc: JsonRpc, deployment: Deployment) -> None:
        self.rpc = rpc
        self.deployment = deployment
        self.address = deployment.escrow
        abi = deployment.abi
        self._events = {
            keccak(abicodec.signature(e).encode()): e for e in abi if e["type"] == "event"
        }
        self._errors = {abicodec.selector(e): e for e in abi if e["type"] == "error"}
        self._fns: dict[str, tuple[bytes, list[str], list[str]]] = {
            f["name"]: (
                abicodec.selector(f),
                [abicodec.canonical_type(i) for i in f["inputs"]],
                [abicodec.canonical_type(o) for o in f["outputs"]],
            )
            for f in abi
            if f["type"] == "function"
        }
        self._nonces: dict[str, int] = {}
        self._lock = threading.Lock()
        self.undecodable_logs = 0
        """Logs of the escrow that could not be decoded at all and were skipped (each logged)."""

    @classmethod
    def connect(
        cls, rpc_url: str, deployment: Deployment, timeout: float = 30
    ) -> LightEscrowClient:
        """A client of the node at ``rpc_url``; :class:`ChainError` when it is another chain
        than the deployment's (the node unreachable: httpx's error)."""
        rpc = JsonRpc(rpc_url, timeout)
        try:
            chain_id = _int(rpc.request("eth_chainId", []))
        except Exception:
            rpc.close()
            raise
        if chain_id != deployment.chain_id:
            rpc.close()
            raise ChainError(
                f"{rpc_url} is chain {chain_id} but the deployment is for chain "
                f"{deployment.chain_id}"
            )
        return cls(rpc, deployment)

    def close(self) -> None:
        self.rpc.close()

    # ------------------------------------------------------------------ reads
    def block_number(self) -> int:
        """The head block's number."""
        return _int(self.rpc.request("eth_blockNumber", []))

    def block(self, block: int | str = "latest") -> dict[str, Any]:
        """A block's header fields (JSON-RPC's: hex quantities)."""
        tag = hex(block) if isinstance(block, int) else block
        found = self.rpc.request("eth_getBlockByNumber", [tag, False])
        if not isinstance(found, dict):
            raise BadAnswerError(f"eth_getBlockByNumber({tag}): no block")
        return found

    def timestamp(self, block: int | str = "latest") -> int:
        """A block's timestamp (the latest's: the contract's clock)."""
        return _int(self.block(block)["timestamp"])

    def encode(self, fn_name: str, *args: Any) -> bytes:
        """Calldata for ``fn_name(*args)``."""
        try:
            selector, types, _ = self._fns[fn_name]
        except KeyError:
            raise ChainError(f"JobEscrow has no function {fn_name!r}") from None
        return selector + abicodec.encode(types, list(args))

    def call(self, fn_name: str, *args: Any) -> Any:
        """Run a view function; one value is returned bare, several as a tuple. A revert is a
        :class:`ChainError` with the decoded custom error."""
        raw = self._eth_call(self.address, self.encode(fn_name, *args), fn_name)
        _, _, outputs = self._fns[fn_name]
        values = abicodec.decode(outputs, raw)
        return values[0] if len(values) == 1 else values

    def call_at(self, to: str, sig: str, args: Sequence[Any], outputs: Sequence[str]) -> Any:
        """Run the view ``sig`` (``name(type,...)``) of another contract (a token)."""
        types = abicodec.parameter_types(sig)
        data = keccak(sig.encode())[:4] + abicodec.encode(types, list(args))
        values = abicodec.decode(outputs, self._eth_call(to, data, sig))
        return values[0] if len(values) == 1 else values

    def _eth_call(self, to: str, data: bytes, what: str, block: int | str = "latest") -> bytes:
        tag = hex(block) if isinstance(block, int) else block
        try:
            result = self.rpc.request("eth_call", [{"to": to, "data": "0x" + data.hex()}, tag])
        except RpcError as exc:
            if _is_revert(exc):
                reason = self.decode_error(exc)
                raise ChainError(f"{what} reverted: {reason}", reason) from None
            raise
        return _hex_bytes(result)

    def free_collateral_of(self, provider: str, token: str = ZERO_ADDRESS) -> int:
        """``freeCollateralIn(provider, token)``: the stake in ``token`` no job locks. Raises
        :class:`ChainError` when the node does not answer it."""
        data = self.encode("freeCollateralIn", provider, token)
        try:
            raw = self._eth_call(self.address, data, f"freeCollateralOf({provider})")
        except ChainError:
            raise
        except Exception as exc:
            raise ChainError(f"freeCollateralOf({provider}): {exc}", "Unavailable") from exc
        if len(raw) != 32:
            raise ChainError(f"freeCollateralOf({provider}): {raw.hex()}", "BadAnswer")
        return int.from_bytes(raw, "big")

    def token_balance_of(self, token: str, owner: str) -> int:
        """``owner``'s balance of the ERC-20 ``token`` (outside the escrow)."""
        return int(self.call_at(token, "balanceOf(address)", [owner], ["uint256"]))

    # ------------------------------------------------------------------ events
    def events(
        self, from_block: int, to_block: int | str = "latest", topics: Sequence[Any] | None = None
    ) -> list[Event]:
        """Every escrow event in the block range, in chain order."""
        flt: dict[str, Any] = {
            "address": self.address,
            "fromBlock": hex(from_block),
            "toBlock": hex(to_block) if isinstance(to_block, int) else to_block,
        }
        if topics is not None:
            flt["topics"] = list(topics)
        logs = self.rpc.request("eth_getLogs", [flt])
        if not isinstance(logs, list):
            raise BadAnswerError(f"eth_getLogs: not a list of logs: {str(logs)[:200]}")
        return self.decode_logs(logs)

    def decode_logs(self, logs: Iterable[Mapping[str, Any]]) -> list[Event]:
        """The escrow's events among ``logs``, each decoded on its own; a log that does not
        decode at all is skipped, logged and counted in :attr:`undecodable_logs`."""
        out: list[Event] = []
        for entry in logs:
            try:
                event = self.decode_log(entry)
            except Exception as exc:
                with self._lock:
                    self.undecodable_logs += 1
                where = entry.get("transactionHash") if isinstance(entry, Mapping) else None
                index = entry.get("logIndex") if isinstance(entry, Mapping) else None
                log.error(
                    "skipping an escrow log that does not decode (tx %s, log %s): %s",
                    where,
                    index,
                    _short(repr(exc)),
                )
                continue
            if event is not None:
                out.append(event)
        return out

    def decode_log(self, entry: Mapping[str, Any]) -> Event | None:
        """One JSON-RPC log as an escrow :class:`Event`; None if it is another contract's or an
        unknown topic's. Raises :class:`UndecodableLogError` when it does not decode."""
        topics = [_hex_bytes(t) for t in entry["topics"]]
        if to_checksum_address(entry["address"]) != self.address or not topics:
            return None
        abi = self._events.get(topics[0])
        if abi is None:
            return None
        args, problems = decode_event(abi, topics[1:], _hex_bytes(entry["data"]), abicodec.decode)
        return Event(
            name=str(abi["name"]),
            args=args,
            block=_int(entry["blockNumber"]),
            tx_hash="0x" + _hex_bytes(entry["transactionHash"]).hex(),
            log_index=_int(entry["logIndex"]),
            problems=problems,
        )

    def job_state(self, job_id: bytes) -> JobState:
        """Rebuild one job's state from its events (jobId is the first indexed topic)."""
        state: JobState | None = None
        for event in self.events(self.deployment.block, "latest", [None, "0x" + job_id.hex()]):
            if event.name in JOB_EVENTS:
                state = apply_event(state, event.name, event.args)
        if state is None:
            raise ChainError(f"no job 0x{job_id.hex()} on this escrow")
        return state

    # ------------------------------------------------------------------ transactions
    def decode_error(self, exc: RpcError) -> str:
        """``Name(arg=value, ...)`` for a custom-error revert, else the node's message."""
        return revert_reason(self._errors, exc.data) or exc.message

    def prepare(self, account: Signer, fn_name: str, *args: Any, value: int = 0) -> dict[str, Any]:
        """The transaction for ``fn_name(*args)`` from ``account``, gas estimated with a margin
        (nonce and fees are left for :meth:`send`). Raises :class:`ChainError` with the decoded
        custom error when the call would revert (the estimate runs it)."""
        params = {
            "from": account.address,
            "to": self.address,
            "value": hex(value),
            "data": "0x" + self.encode(fn_name, *args).hex(),
        }
        try:
            gas = _int(self.rpc.request("eth_estimateGas", [params]))
        except RpcError as exc:
            if _is_revert(exc):
                reason = self.decode_error(exc)
                raise ChainError(f"{fn_name} would revert: {reason}", reason) from None
            raise
        params["gas"] = hex(gas + gas // 5 + 10_000)
        return params

    def fees(self) -> dict[str, int]:
        """The fee fields of a transaction now: EIP-1559's ``maxPriorityFeePerGas`` (the node's
        suggestion) and ``maxFeePerGas`` (twice the latest base fee plus that: it survives six
        full blocks of base-fee rises), or a legacy ``gasPrice`` on a chain without a base fee."""
        base = self.block("latest").get("baseFeePerGas")
        if base is None:
            return {"gasPrice": _int(self.rpc.request("eth_gasPrice", []))}
        tip = _int(self.rpc.request("eth_maxPriorityFeePerGas", []))
        return {"maxPriorityFeePerGas": tip, "maxFeePerGas": 2 * _int(base) + tip}

    def send(
        self,
        account: Signer,
        fn_name: str,
        *args: Any,
        value: int = 0,
        receipt_timeout: float = 120,
    ) -> Sent:
        """Sign and send ``fn_name(*args)`` from ``account``, wait for it, decode its events.

        As :meth:`gridmarket.chain.EscrowClient.send`: a revert is a :class:`ChainError` with
        the decoded custom error, before anything is sent; a 'nonce too low' answer reads the
        nonce again and re-signs once; 'already known' waits for the pooled twin; at most
        ``receipt_timeout`` seconds for mining (then :class:`ReceiptTimeoutError`).
        """
        params = self.prepare(account, fn_name, *args, value=value)
        fees = self.fees()
        tx_hash = b""
        for attempt in range(2):
            with self._lock:
                nonce = self._nonces.get(account.address)
                if nonce is None:
                    pending = self.rpc.request(
                        "eth_getTransactionCount", [account.address, "pending"]
                    )
                    nonce = _int(pending)
                self._nonces[account.address] = nonce + 1
            signed = sign_transaction(
                account,
                {
                    "chainId": self.deployment.chain_id,
                    "nonce": nonce,
                    "gas": _int(params["gas"]),
                    "to": self.address,
                    "value": value,
                    "data": params["data"],
                    **fees,
                },
            )
            try:
                raw = "0x" + signed.raw_transaction.hex()
                tx_hash = _hex_bytes(self.rpc.request("eth_sendRawTransaction", [raw]))
            except RpcError as exc:
                message = exc.message.lower()
                if is_already_known(message):  # this very transaction is already in the pool
                    tx_hash = signed.hash
                    break
                with self._lock:  # the nonce was not used: forget the cache
                    self._nonces.pop(account.address, None)
                if is_nonce_too_low(message) and attempt == 0:
                    continue  # another sender used the key: read the nonce again, re-sign
                raise
            except Exception:
                with self._lock:  # the nonce was not used: forget the cache
                    self._nonces.pop(account.address, None)
                raise
            break
        receipt = self.wait_for_receipt(tx_hash, receipt_timeout)
        return self.sent_from_receipt(fn_name, params, receipt)

    def forget_nonce(self, address: str) -> None:
        """Read ``address``'s nonce from the node again at its next :meth:`send`."""
        with self._lock:
            self._nonces.pop(to_checksum_address(address), None)

    def wait_for_receipt(
        self, tx_hash: bytes, timeout: float, poll_s: float = 0.1
    ) -> dict[str, Any]:
        """The receipt of ``tx_hash`` once mined; :class:`ReceiptTimeoutError` after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        name = "0x" + tx_hash.hex()
        while True:
            receipt = self.rpc.request("eth_getTransactionReceipt", [name])
            if isinstance(receipt, dict) and receipt.get("blockNumber") is not None:
                return receipt
            if time.monotonic() >= deadline:
                raise ReceiptTimeoutError(f"transaction {name} not mined after {timeout:g} s")
            time.sleep(poll_s)

    def sent_from_receipt(
        self, fn_name: str, params: Mapping[str, Any], receipt: Mapping[str, Any]
    ) -> Sent:
        """A mined transaction's :class:`Sent`, or :class:`ChainError` if it reverted (the
        revert decoded by replaying the call on the state of its block)."""
        tx_hash = "0x" + _hex_bytes(receipt["transactionHash"]).hex()
        block = _int(receipt["blockNumber"])
        if _int(receipt["status"]) != 1:
            try:
                reason = self.replay_revert(params, block)
            except RpcError as exc:
                if not is_state_unavailable(exc.message):
                    raise  # an error of the read itself: the caller's retry reads again
                raise ChainError(
                    f"{fn_name} reverted in tx {tx_hash} (why is unknown: the node keeps no "
                    f"state at block {block} to replay it on: {exc.message})"
                ) from None
            raise ChainError(
                f"{fn_name} reverted in tx {tx_hash}" + (f": {reason}" if reason else ""), reason
            )
        logs = receipt.get("logs")
        return Sent(
            tx_hash=tx_hash,
            gas_used=_int(receipt["gasUsed"]),
            block=block,
            events=self.decode_logs(logs if isinstance(logs, list) else []),
        )

    def replay_revert(self, params: Mapping[str, Any], block: int) -> str | None:
        """The decoded revert of ``params`` run on the state after ``block``; None if it passes."""
        call = {k: v for k, v in params.items() if k != "gas"}
        try:
            self.rpc.request("eth_call", [call, hex(block)])
        except RpcError as exc:
            if _is_revert(exc):
                return self.decode_error(exc)
            raise
        return None

    # ------------------------------------------------------------------ job calls
    def call_job(
        self, account: Signer, fn_name: str, state: JobState, *extra: Any, value: int = 0
    ) -> tuple[JobState, Sent]:
        """Call a job transition (``submitResult``, ``finalize``...); fold its events."""
        sent = self.send(account, fn_name, state.job_id, state.job.as_tuple(), *extra, value=value)
        return fold_events(state, sent.events), sent

    def resolve(
        self, account: Signer, group_id: bytes, seats: Sequence[JobState]
    ) -> tuple[list[JobState], Sent]:
        """Resolve a replicated job's seats (given in seat order); fold the seats' events."""
        sent = self.send(account, "resolve", group_id, [s.job.as_tuple() for s in seats])
        return [fold_events(state, sent.events) for state in seats], sent

    def stake_token(self, provider: Signer, token: str, amount: int) -> Sent:
        """Add ``amount`` of ``token`` to the provider's stake in it (the EIP-2612 permit and
        ``stakeToken`` in one ``multicall``; no permit when the allowance is there)."""
        token = to_checksum_address(token)
        stake = self.encode("stakeToken", token, amount)
        return self.send(provider, "multicall", [*self._permit(provider, token, amount), stake])

    def _permit(self, owner: Signer, token: str, amount: int) -> list[bytes]:
        """``[permitToken(...)]`` for ``amount`` of ``token``, or nothing when the allowance is
        already there (as :meth:`gridmarket.chain.EscrowClient._permit`)."""
        allowance = int(
            self.call_at(
                token, "allowance(address,address)", [owner.address, self.address], ["uint256"]
            )
        )
        if allowance >= amount:
            return []
        deadline = self.timestamp() + 3600
        domain = bytes(self.call_at(token, "DOMAIN_SEPARATOR()", [], ["bytes32"]))
        nonce = int(self.call_at(token, "nonces(address)", [owner.address], ["uint256"]))
        struct = keccak(
            abicodec.encode(
                ["bytes32", "address", "address", "uint256", "uint256", "uint256"],
                [PERMIT_TYPEHASH, owner.address, self.address, amount, nonce, deadline],
            )
        )
        rsv = sign_digest(owner.key, keccak(b"\x19\x01" + domain + struct))
        return [self.encode("permitToken", token, amount, deadline, rsv[64], rsv[:32], rsv[32:64])]


def _int(value: object) -> int:
    """A JSON-RPC quantity (``0x`` hex) or an int."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value[:2] in ("0x", "0X"):
        return int(value, 16)
    raise BadAnswerError(f"not a quantity: {str(value)[:100]!r}")


def _hex_bytes(value: object) -> bytes:
    """JSON-RPC data (``0x`` hex) as bytes."""
    if isinstance(value, str) and value[:2] in ("0x", "0X"):
        try:
            return bytes.fromhex(value[2:])
        except ValueError:
            pass
    raise BadAnswerError(f"not 0x hex data: {str(value)[:100]!r}")


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _fmt(value: Any) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return str(value)
