"""The product's web3 client of the chain: deployments, transactions, events.

Used by the scheduler (watcher + transaction sender), the agent's commands (``register
--stake``, ``earnings``, ``withdraw``, ``unstake``), the CLIs, the demo and the benchmarks. The
agent's daemon does its on-chain duties with :mod:`gridmarket.lightchain` instead (no web3:
docs/agent.md, "Footprint"), whose ``decode_event`` this module's log decoding shares.
Transactions are signed locally (eth-account) and sent raw, with a per-account nonce cache, so no
node-side unlocked accounts are needed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any, cast

import requests
import requests.adapters
import requests.utils
from eth_abi.abi import decode as abi_decode
from eth_abi.abi import encode as abi_encode
from eth_account.datastructures import SignedTransaction
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils.abi import event_abi_to_log_topic, function_abi_to_4byte_selector
from eth_utils.address import to_checksum_address
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import ContractCustomError, ContractLogicError, Web3RPCError
from web3.types import LogReceipt, TxParams, TxReceipt

from gridmarket.deployment import ChainError as ChainError  # re-exported
from gridmarket.deployment import Deployment as Deployment  # re-exported
from gridmarket.escrow import (
    FLAG_ON_VERIFY,
    JOB_EVENTS,
    ZERO_ADDRESS,
    JobState,
    Terms,
    apply_event,
    assign_target,
    fold_events,
    min_collateral,
    rule_args,
)
from gridmarket.lightchain import Event as Event  # re-exported
from gridmarket.lightchain import Sent as Sent  # re-exported
from gridmarket.lightchain import UndecodableLogError as UndecodableLogError  # re-exported
from gridmarket.lightchain import decode_event, is_state_unavailable
from gridmarket.lightchain import is_already_known as is_already_known  # re-exported
from gridmarket.lightchain import is_nonce_too_low as is_nonce_too_low  # re-exported
from gridmarket.token import TokenClient

log = logging.getLogger(__name__)


_DROPPED_MIDDLEWARE = ("validation", "ens_name_to_address")
"""web3 middleware :meth:`EscrowClient.connect` removes (see there)."""


def rpc_session(rpc_url: str, pool: int = 32) -> requests.Session:
    """The HTTP session of a JSON-RPC client, shared by every thread (web3 otherwise makes one
    per thread). The environment's proxy for ``rpc_url`` (``HTTP(S)_PROXY``, ``NO_PROXY``)
    and a ``~/.netrc`` login for its host are read here, once: a default session read both
    again on every request, and that was 5% of a busy scheduler's CPU (issue 12's claims
    profile). ``pool``: connections kept for the threads that call at once."""
    session = requests.Session()
    session.trust_env = False
    session.proxies.update(requests.utils.get_environ_proxies(rpc_url))
    auth = requests.utils.get_netrc_auth(rpc_url)
    if auth is not None:
        session.auth = auth
    adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=pool)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class EscrowClient:
    """Typed access to a deployed JobEscrow."""

    def __init__(self, w3: Web3, deployment: Deployment) -> None:
        self.w3 = w3
        self.deployment = deployment
        self.address = deployment.escrow
        self.contract = w3.eth.contract(
            address=cast(ChecksumAddress, deployment.escrow), abi=deployment.abi
        )
        self._events = {
            event_abi_to_log_topic(e): e  # type: ignore[arg-type]
            for e in deployment.abi
            if e["type"] == "event"
        }
        self._errors = {
            function_abi_to_4byte_selector(e): e  # type: ignore[arg-type]
            for e in deployment.abi
            if e["type"] == "error"
        }
        # web3's contract-function objects re-validate the whole ABI on every call (~1 ms
        # each); calls are encoded here from precomputed selectors and types instead.
        self._fns: dict[str, tuple[bytes, list[str], list[str]]] = {
            f["name"]: (
                function_abi_to_4byte_selector(f),  # type: ignore[arg-type]
                [abi_type(i) for i in f["inputs"]],
                [abi_type(o) for o in f["outputs"]],
            )
            for f in deployment.abi
            if f["type"] == "function"
        }
        self._nonces: dict[str, int] = {}
        self._lock = threading.Lock()
        self._min_collateral_bps: int | None = None
        self.undecodable_logs = 0
        """Logs of the escrow that could not be decoded at all and were skipped (each logged)."""

    @classmethod
    def connect(cls, rpc_url: str, deployment: Deployment, timeout: float = 30) -> EscrowClient:
        w3 = Web3(
            Web3.HTTPProvider(
                rpc_url, request_kwargs={"timeout": timeout}, session=rpc_session(rpc_url)
            )
        )
        # web3's default "validation" middleware asks the node for eth_chainId before every
        # eth_call and eth_estimateGas (a second round trip each: 10% of a busy scheduler's
        # samples), and "ens_name_to_address" walks every request's params for ENS names.
        # This client checks the chain id once, here, signs with the deployment's chain id, and
        # only ever passes hex addresses: both are dropped.
        for name in _DROPPED_MIDDLEWARE:
            if name in w3.middleware_onion:
                w3.middleware_onion.remove(name)
        chain_id = w3.eth.chain_id
        if chain_id != deployment.chain_id:
            raise ChainError(
                f"{rpc_url} is chain {chain_id} but the deployment is for chain "
                f"{deployment.chain_id}"
            )
        return cls(w3, deployment)

    # ------------------------------------------------------------------ transactions
    def send(
        self,
        account: LocalAccount,
        fn_name: str,
        *args: Any,
        value: int = 0,
        receipt_timeout: float = 120,
    ) -> Sent:
        """Sign and send ``fn_name(*args)`` from ``account``, wait for it, decode its events.

        Reverts are reported as :class:`ChainError` with the decoded custom error, before any
        transaction is sent (the gas estimate runs the call first). If the node says the cached
        nonce is stale ('nonce too low': another process used the key), the nonce is read again
        and the transaction re-signed once; if it says the identical transaction is already in
        its pool, that one is waited for. Waits at most ``receipt_timeout`` seconds for mining.
        The scheduler's operator key uses :class:`scheduler.chain.TxSender` instead, which adds
        retries, lookups by hash after lost responses, and serialized nonces.
        """
        params = self.prepare(account, fn_name, *args, value=value)
        gas_price = self.w3.eth.gas_price
        for attempt in range(2):
            with self._lock:
                nonce = self._nonces.get(account.address)
                if nonce is None:
                    nonce = self.w3.eth.get_transaction_count(account.address, "pending")
                self._nonces[account.address] = nonce + 1
            signed = self.sign(account, params, nonce=nonce, gas_price=gas_price)
            try:
                tx_hash = HexBytes(self.w3.eth.send_raw_transaction(signed.raw_transaction))
            except Web3RPCError as exc:
                message = rpc_error_message(exc)
                if is_already_known(message):  # this very transaction is already in the pool
                    tx_hash = HexBytes(signed.hash)
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
        receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=receipt_timeout)
        return self.sent_from_receipt(fn_name, params, receipt)

    def forget_nonce(self, address: str) -> None:
        """Read ``address``'s nonce from the node again at its next :meth:`send` (after a reorg
        that may have dropped its transactions, the cached one can be ahead of the chain)."""
        with self._lock:
            self._nonces.pop(to_checksum_address(address), None)

    def prepare(self, account: LocalAccount, fn_name: str, *args: Any, value: int = 0) -> TxParams:
        """The transaction for ``fn_name(*args)`` from ``account``, gas estimated with a margin.

        Nonce, gas price and chain id are left for :meth:`sign`. Raises :class:`ChainError` with
        the decoded custom error when the call would revert (the estimate runs it); transport
        errors (connection refused, timeouts, HTTP 5xx) propagate unchanged for callers to retry.
        """
        params: TxParams = {
            "from": account.address,
            "to": cast(ChecksumAddress, self.address),
            "value": cast(Any, value),
            "data": self.encode(fn_name, *args),
        }
        try:
            gas = self.w3.eth.estimate_gas(params)
        except (ContractCustomError, ContractLogicError) as exc:
            reason = self.decode_error(exc)
            raise ChainError(f"{fn_name} would revert: {reason}", reason) from None
        params["gas"] = gas + gas // 5 + 10_000
        return params

    def sign(
        self, account: LocalAccount, params: TxParams, *, nonce: int, gas_price: int
    ) -> SignedTransaction:
        """Sign ``params`` (from :meth:`prepare`) with ``nonce`` for this deployment's chain."""
        tx: dict[str, Any] = {
            **params,
            "gasPrice": gas_price,
            "nonce": nonce,
            "chainId": self.deployment.chain_id,
        }
        del tx["from"]
        return account.sign_transaction(cast(Any, tx))

    def sent_from_receipt(self, fn_name: str, params: TxParams, receipt: TxReceipt) -> Sent:
        """A mined transaction's :class:`Sent`, or :class:`ChainError` if it reverted.

        A revert in a mined transaction (the state changed between the estimate and the block)
        is decoded by replaying the call on the state of the block that included it.
        """
        tx_hash = "0x" + bytes(HexBytes(receipt["transactionHash"])).hex()
        if receipt["status"] != 1:
            block = int(receipt["blockNumber"])
            try:
                reason = self.replay_revert(params, block)
            except Web3RPCError as exc:
                if not is_state_unavailable(str(exc)):
                    raise
                raise ChainError(
                    f"{fn_name} reverted in tx {tx_hash} (why is unknown: the node keeps no "
                    f"state at block {block} to replay it on: {exc})"
                ) from None
            raise ChainError(
                f"{fn_name} reverted in tx {tx_hash}" + (f": {reason}" if reason else ""), reason
            )
        return Sent(
            tx_hash=tx_hash,
            gas_used=int(receipt["gasUsed"]),
            block=int(receipt["blockNumber"]),
            events=self.decode_logs(receipt["logs"]),
        )

    def replay_revert(self, params: TxParams, block: int) -> str | None:
        """The decoded revert of ``params`` run on the state after ``block``; None if it passes."""
        call: TxParams = {k: v for k, v in params.items() if k != "gas"}  # type: ignore[assignment]
        try:
            self.w3.eth.call(call, block_identifier=block)
        except (ContractCustomError, ContractLogicError) as exc:
            return self.decode_error(exc)
        return None

    def encode(self, fn_name: str, *args: Any) -> bytes:
        """Calldata for ``fn_name(*args)``."""
        try:
            selector, types, _ = self._fns[fn_name]
        except KeyError:
            raise ChainError(f"JobEscrow has no function {fn_name!r}") from None
        return selector + abi_encode(types, list(args))

    def call(self, fn_name: str, *args: Any) -> Any:
        """Run a view function; one value is returned bare, several as a tuple."""
        raw = self.w3.eth.call(
            {"to": cast(ChecksumAddress, self.address), "data": self.encode(fn_name, *args)}
        )
        return self.decode_output(fn_name, raw)

    def decode_output(self, fn_name: str, raw: bytes) -> Any:
        _, _, outputs = self._fns[fn_name]
        values = abi_decode(outputs, bytes(raw))
        return values[0] if len(values) == 1 else values

    def decode_error(self, exc: Exception) -> str:
        """``Name(arg=value, ...)`` for a custom-error revert, else the node's message."""
        data = getattr(exc, "data", None)
        if isinstance(data, str) and data.startswith("0x") and len(data) >= 10:
            raw = bytes.fromhex(data[2:])
            abi = self._errors.get(raw[:4])
            if abi is not None:
                types = [i["type"] for i in abi["inputs"]]
                values = abi_decode(types, raw[4:])
                parts = [
                    f"{i['name']}={_fmt(v)}" for i, v in zip(abi["inputs"], values, strict=True)
                ]
                return f"{abi['name']}({', '.join(parts)})"
        return str(exc)

    # ------------------------------------------------------------------ job calls
    def create_job(
        self,
        submitter: LocalAccount,
        salt: bytes,
        spec_cid: str,
        deadline: int,
        bounty: int,
        terms: Terms | None = None,
    ) -> tuple[JobState, Sent]:
        """Fund a job; ``terms`` default to the deployment's (:meth:`default_terms`). A job in a
        token (``terms.token``) is funded in one transaction with the submitter's permit
        (:meth:`fund_in_token`); ``bounty`` is then in the token's units."""
        t = terms or self.default_terms(bounty, submitter.address)
        if t.token != ZERO_ADDRESS:
            sent = self.fund_in_token(submitter, salt, spec_cid, deadline, t.funding(bounty), t, 0)
        else:
            sent = self.send(
                submitter,
                "createJob",
                salt,
                spec_cid,
                deadline,
                self.expected_operator(t),
                t.mediator,
                t.collateral,
                t.flags,
                0,
                value=t.funding(bounty),
            )
        (created,) = [e for e in sent.events if e.name == "JobCreated"]
        return apply_event(None, created.name, created.args), sent

    def create_replicated(
        self,
        submitter: LocalAccount,
        salt: bytes,
        spec_cid: str,
        deadline: int,
        bounty: int,
        replicas: int,
        terms: Terms | None = None,
    ) -> tuple[bytes, list[JobState], Sent]:
        """Fund a replicated job of ``replicas`` seats sharing ``bounty`` (divisible by it);
        ``terms.collateral`` is each seat's. Returns the group id and the seats in order."""
        t = terms or self.default_terms(bounty // replicas, submitter.address)
        if t.token != ZERO_ADDRESS:
            sent = self.fund_in_token(submitter, salt, spec_cid, deadline, bounty, t, replicas)
        else:
            sent = self.send(
                submitter,
                "createJob",
                salt,
                spec_cid,
                deadline,
                self.expected_operator(t),
                t.mediator,
                t.collateral,
                t.flags,
                replicas,
                value=bounty,
            )
        (group,) = [e for e in sent.events if e.name == "ReplicasCreated"]
        seats = [apply_event(None, e.name, e.args) for e in sent.events if e.name == "JobCreated"]
        return bytes(group.args["groupId"]), seats, sent

    def fund_in_token(
        self,
        submitter: LocalAccount,
        salt: bytes,
        spec_cid: str,
        deadline: int,
        amount: int,
        terms: Terms,
        replicas: int,
        *,
        permit: bool = True,
    ) -> Sent:
        """``createJobWith`` in ``terms.token``: with ``permit``, one ``multicall`` of the
        submitter's EIP-2612 permit and the funding (one transaction, no approval first);
        without, an allowance must already be there."""
        create = self.encode(
            "createJobWith",
            terms.token,
            amount,
            salt,
            spec_cid,
            deadline,
            self.expected_operator(terms),
            terms.mediator,
            terms.collateral,
            terms.flags,
            replicas,
        )
        signed = self._permit(submitter, terms.token, amount) if permit else []
        return self.send(submitter, "multicall", [*signed, create])

    def expected_operator(self, terms: Terms) -> str:
        """The ``expectedOperator`` to fund with: the terms' operator, or (zero there) the one
        in office now; the contract refuses the funding if another is in office when it is
        mined."""
        if terms.operator != ZERO_ADDRESS:
            return terms.operator
        return to_checksum_address(self.call("operator"))

    def assign(
        self,
        operator: LocalAccount,
        state: JobState,
        provider: str,
        hold_for: int,
        acceptance: bytes,
    ) -> tuple[JobState, Sent]:
        """``assign`` a job (or a seat: :func:`gridmarket.escrow.assign_target`) to ``provider``
        with its acceptance signed over ``hold_for``; fold its events."""
        target, seat = assign_target(state)
        sent = self.send(
            operator, "assign", target, seat, state.job.as_tuple(), provider, hold_for, acceptance
        )
        return fold_events(state, sent.events), sent

    def rule(
        self,
        mediator: LocalAccount,
        state: JobState,
        upheld: bool,
        seats: Sequence[JobState] = (),
    ) -> tuple[JobState, Sent]:
        """The mediator's ruling on a job's pending result (a seat's needs all ``seats`` of its
        group, in order: :func:`gridmarket.escrow.rule_args`); fold its events."""
        target, jobs, i = rule_args(state, seats)
        sent = self.send(mediator, "rule", target, jobs, i, upheld)
        return fold_events(state, sent.events), sent

    def _permit(self, owner: LocalAccount, token: str, amount: int) -> list[bytes]:
        """``[permitToken(...)]`` for ``amount`` of ``token``, or nothing when the allowance is
        already there."""
        client = TokenClient(self.w3, token)
        if client.allowance(owner.address, self.address) >= amount:
            return []
        deadline = int(self.w3.eth.get_block("latest")["timestamp"]) + 3600
        v, r, s = client.sign_permit(owner, self.address, amount, deadline)
        return [self.encode("permitToken", client.address, amount, deadline, v, r, s)]

    def stake_token(self, provider: LocalAccount, token: str, amount: int) -> Sent:
        """Add ``amount`` of ``token`` to the provider's stake in it (permit and stake in one
        transaction)."""
        stake = self.encode("stakeToken", to_checksum_address(token), amount)
        return self.send(provider, "multicall", [*self._permit(provider, token, amount), stake])

    def resolve(
        self, account: LocalAccount, group_id: bytes, seats: Sequence[JobState]
    ) -> tuple[list[JobState], Sent]:
        """Resolve a replicated job's seats (given in seat order); fold the seats' events."""
        sent = self.send(account, "resolve", group_id, [s.job.as_tuple() for s in seats])
        return [fold_events(state, sent.events) for state in seats], sent

    def call_job(
        self, account: LocalAccount, fn_name: str, state: JobState, *extra: Any, value: int = 0
    ) -> tuple[JobState, Sent]:
        """Call a job transition (``assign``, ``settle``, ``dispute``...); fold its events."""
        sent = self.send(account, fn_name, state.job_id, state.job.as_tuple(), *extra, value=value)
        return fold_events(state, sent.events), sent

    def default_terms(
        self, bounty: int, submitter: str, on_verify: bool = False, token: str = ZERO_ADDRESS
    ) -> Terms:
        """The terms a job gets unless its submitter says otherwise: the mediator listed at
        deployment (the submitter itself when none was), the least collateral the contract
        allows for ``bounty`` (in the job's token), and after-window payment unless
        ``on_verify``."""
        mediator = self.deployment.params.get("mediator") or submitter
        return Terms(
            mediator=to_checksum_address(mediator),
            collateral=self.min_collateral(bounty),
            flags=FLAG_ON_VERIFY if on_verify else 0,
            token=to_checksum_address(token),
        )

    # ------------------------------------------------------------------ reads
    def min_collateral(self, bounty: int) -> int:
        """The least collateral the escrow accepts for a job with this bounty (``minCollateral``
        computed from the deployment's immutable ``minCollateralBps``, read once)."""
        bps = self._min_collateral_bps
        if bps is None:
            bps = self._min_collateral_bps = int(self.call("minCollateralBps"))
        return min_collateral(bounty, bps)

    def balance_of(self, account: str, token: str = ZERO_ADDRESS) -> int:
        """Withdrawable balance of ``account`` in ``token`` (zero: ETH)."""
        if token == ZERO_ADDRESS:
            return int(self.call("balanceOf", account))
        return int(self.call("balanceOfToken", account, to_checksum_address(token)))

    def free_collateral_of(self, provider: str, token: str = ZERO_ADDRESS) -> int:
        """``freeCollateralIn(provider, token)`` as one raw ``eth_call``: the scheduler asks it
        on every acceptance, and web3's contract machinery costs four times the CPU of the call
        itself (2.8 ms against 0.7 ms here). Raises :class:`ChainError` when the node refuses
        it."""
        data = self._free_collateral_data(provider, token)
        try:
            answer = self.w3.provider.make_request(
                "eth_call",  # type: ignore[arg-type]
                [{"to": self.address, "data": data}, "latest"],
            )
        except Exception as exc:
            raise ChainError(f"freeCollateralOf({provider}): {exc}", "Unavailable") from exc
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, str) or not result.startswith("0x") or len(result) != 66:
            raise ChainError(f"freeCollateralOf({provider}): {answer}", "BadAnswer")
        return int(result, 16)

    def free_collateral_at(self, provider: str, token: str = ZERO_ADDRESS) -> tuple[int, int]:
        """``(freeCollateralIn(provider, token), block)``: the value as of one block, named, so
        that a caller can tell which later assigns it does not count yet (the scheduler's
        acceptance check: an assign mined after ``block`` is not in it). Two raw calls,
        ``eth_blockNumber`` then ``eth_call`` at that block."""
        try:
            head = self.w3.provider.make_request("eth_blockNumber", [])  # type: ignore[arg-type]
            block = int(str(head["result"]), 16)
            answer = self.w3.provider.make_request(
                "eth_call",  # type: ignore[arg-type]
                [
                    {"to": self.address, "data": self._free_collateral_data(provider, token)},
                    hex(block),
                ],
            )
        except Exception as exc:
            raise ChainError(f"freeCollateralOf({provider}): {exc}", "Unavailable") from exc
        result = answer.get("result") if isinstance(answer, dict) else None
        if not isinstance(result, str) or not result.startswith("0x") or len(result) != 66:
            raise ChainError(f"freeCollateralOf({provider}): {answer}", "BadAnswer")
        return int(result, 16), block

    @staticmethod
    def _free_collateral_data(provider: str, token: str = ZERO_ADDRESS) -> str:
        return (
            "0x"
            + (
                _FREE_COLLATERAL_IN
                + bytes(12)
                + bytes.fromhex(provider[2:])
                + bytes(12)
                + bytes.fromhex(token[2:])
            ).hex()
        )

    def decode_logs(self, logs: Iterable[LogReceipt]) -> list[Event]:
        """The escrow's events among ``logs``, each log decoded on its own.

        Event data is hostile: the contract accepts any bytes as a ``string``. A string argument
        that does not decode to a usable value becomes an :class:`~gridmarket.escrow.InvalidText`
        and is named in :attr:`Event.problems`; a log that does not decode at all is skipped,
        logged and counted in :attr:`undecodable_logs`. Neither stops the other logs.
        """
        out: list[Event] = []
        for entry in logs:
            try:
                event = self.decode_log(entry)
            except Exception as exc:
                with self._lock:
                    self.undecodable_logs += 1
                log.error(
                    "skipping an escrow log that does not decode (tx %s, log %s): %s",
                    _hex_or(entry, "transactionHash"),
                    entry.get("logIndex"),
                    _short(repr(exc)),
                )
                continue
            if event is not None:
                out.append(event)
        return out

    def decode_log(self, entry: LogReceipt) -> Event | None:
        """One log as an escrow :class:`Event`; None if it is another contract's or an unknown
        topic's. Raises :class:`UndecodableLogError` when it does not decode as its event."""
        if to_checksum_address(entry["address"]) != self.address or not entry["topics"]:
            return None
        abi = self._events.get(bytes(entry["topics"][0]))
        if abi is None:
            return None
        args, problems = decode_event(
            abi, [bytes(t) for t in entry["topics"][1:]], bytes(HexBytes(entry["data"])), abi_decode
        )
        return Event(
            name=str(abi["name"]),
            args=args,
            block=int(entry["blockNumber"]),
            tx_hash="0x" + bytes(HexBytes(entry["transactionHash"])).hex(),
            log_index=int(entry["logIndex"]),
            problems=problems,
        )

    def events(
        self, from_block: int, to_block: int | str = "latest", topics: Sequence[Any] | None = None
    ) -> list[Event]:
        """Every escrow event in the block range, in chain order."""
        flt: dict[str, Any] = {
            "address": self.address,
            "fromBlock": from_block,
            "toBlock": to_block,
        }
        if topics is not None:
            flt["topics"] = list(topics)
        return self.decode_logs(self.w3.eth.get_logs(cast(Any, flt)))

    def job_state(self, job_id: bytes) -> JobState:
        """Rebuild one job's state from its events (jobId is the first indexed topic)."""
        state: JobState | None = None
        for event in self.events(self.deployment.block, "latest", [None, "0x" + job_id.hex()]):
            if event.name in JOB_EVENTS:
                state = apply_event(state, event.name, event.args)
        if state is None:
            raise ChainError(f"no job 0x{job_id.hex()} on this escrow")
        return state


def rpc_error_message(exc: Web3RPCError) -> str:
    """The JSON-RPC error message of ``exc``, lower-cased (nodes word these differently)."""
    rpc = getattr(exc, "rpc_response", None)
    if isinstance(rpc, dict) and isinstance(rpc.get("error"), dict):
        return str(rpc["error"].get("message", "")).lower()
    return str(exc).lower()


def abi_type(param: dict[str, Any]) -> str:
    """The canonical ABI type of a parameter, tuples spelled out: ``(address,uint96,...)``."""
    kind = str(param["type"])
    if kind.startswith("tuple"):
        inner = ",".join(abi_type(c) for c in param["components"])
        return f"({inner}){kind[len('tuple') :]}"
    return kind


def _hex_or(entry: Any, key: str) -> str:
    try:
        return "0x" + bytes(HexBytes(entry[key])).hex()
    except Exception:
        return "?"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _fmt(value: Any) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return str(value)


_FREE_COLLATERAL_IN = bytes(Web3.keccak(text="freeCollateralIn(address,address)")[:4])
"""The selector of ``freeCollateralIn(address,address)`` (EscrowClient.free_collateral_of)."""
