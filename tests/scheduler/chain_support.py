"""Shared pieces of the scheduler's chain tests: jobs and providers on a real anvil, a private
anvil that can be stopped and restarted with its state file, a tiny sqlite store for the
watcher, and a JSON-RPC proxy that injects network faults.

The proxy is not a mock: every request it lets through is answered by the real anvil. It exists
because some failures cannot be produced on demand with a real node, e.g. a transaction that
reached the node but whose response was lost.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from devstack.anvil import Anvil, DevRoles, dev_accounts
from gridmarket.chain import Deployment, EscrowClient, Event
from gridmarket.deploy import EscrowParams, deploy_escrow
from gridmarket.eip712 import sign_acceptance
from gridmarket.escrow import JobState


def make_w3(url: str, timeout: float = 5) -> Web3:
    """A Web3 without web3.py's own transport retries, so the code under test sees every
    failure (and the proxy's counts are exact)."""
    return Web3(
        Web3.HTTPProvider(
            url, request_kwargs={"timeout": timeout}, exception_retry_configuration=None
        )
    )


def chain_now(w3: Web3) -> int:
    return int(w3.eth.get_block("latest")["timestamp"])


def ensure_provider(client: EscrowClient, provider: LocalAccount, stake: int) -> None:
    """Register and stake ``provider`` unless it already is eligible, and top its free
    collateral up to ``stake`` (jobs other tests left assigned to it keep theirs locked)."""
    if not client.call("isEligible", provider.address):
        client.send(provider, "registerProvider", "bafkreiprovidermeta", value=stake)
    free = int(client.call("freeCollateralOf", provider.address))
    if free < stake:
        client.send(provider, "stake", value=stake - free)


HOLD = 0
"""The ``holdFor`` the chain tests' acceptances sign when they assign through the sender
directly: none, so the operator may take a job back ``reassignDelay`` after the assignment
(the scheduler's own offers carry :func:`gridmarket.holds.hold_for` of the spec's timeout)."""


def acceptance(via: Any, state: JobState, provider: LocalAccount, hold_for: int = HOLD) -> bytes:
    """``provider``'s EIP-712 acceptance of the next assignment of ``state`` (what the agent
    signs from the offer's terms) with ``hold_for``; ``via``: the escrow's client, or a sender
    holding one."""
    client: EscrowClient = getattr(via, "client", via)
    return sign_acceptance(
        provider,
        client.deployment.chain_id,
        client.address,
        state.job_id,
        state.job.attempt + 1,
        state.job,
        hold_for,
    )


def create_job(
    client: EscrowClient,
    submitter: LocalAccount,
    bounty: int = 10**16,
    ttl: int = 86_400,
    *,
    on_verify: bool = False,
) -> JobState:
    """Fund a job on the deployment's default terms (``on_verify``: the operator may pay it at
    once on its own check, ``settle``)."""
    terms = client.default_terms(bounty, submitter.address, on_verify=on_verify)
    state, _ = client.create_job(
        submitter, os.urandom(32), "bafkreijobspec", chain_now(client.w3) + ttl, bounty, terms
    )
    return state


def rpc(w3: Web3, method: str, *params: Any) -> Any:
    """A raw JSON-RPC call (anvil's evm_* / anvil_* methods)."""
    response = w3.provider.make_request(method, list(params))  # type: ignore[arg-type]
    assert "error" not in response, response
    return response["result"]


# --------------------------------------------------------------------------- private chain


@dataclass
class OwnChain(DevRoles):
    """A private anvil with a state file (restartable on the same port) and the escrow."""

    anvil: Anvil
    deployment: Deployment
    params: EscrowParams
    accounts: list[LocalAccount]

    @property
    def url(self) -> str:
        return self.anvil.url

    def client(self, url: str | None = None, timeout: float = 5) -> EscrowClient:
        return EscrowClient(make_w3(url or self.url, timeout), self.deployment)

    def stop(self) -> None:
        self.anvil.stop()

    def start(self) -> None:
        self.anvil.start()  # same port, same state file


@contextmanager
def own_chain_at(tmp_path: Path) -> Iterator[OwnChain]:
    """A private anvil (state file and log under ``tmp_path``) with the escrow deployed."""
    anvil = Anvil(state_file=tmp_path / "state.json", log_file=tmp_path / "anvil.log")
    anvil.start()
    try:
        accounts = [Account.from_key(k) for k in dev_accounts(11)]
        params = EscrowParams(
            operator=accounts[1].address,
            treasury=accounts[2].address,
            mediator=accounts[10].address,
        )
        deployment = deploy_escrow(make_w3(anvil.url), accounts[0], params)
        yield OwnChain(anvil, deployment, params, accounts)
    finally:
        anvil.stop()


# --------------------------------------------------------------------------- watcher store


class SqliteStore:
    """The smallest store a watcher needs: events upserted by (tx_hash, log_index) and the cursor,
    written in one sqlite transaction. ``deliveries`` records every event the sink was handed,
    duplicates included, so tests can tell redelivery from storage."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.deliveries: list[tuple[str, int]] = []
        self.calls: list[tuple[int, int]] = []  # (events, through_block) per sink call
        # Commit the events, then raise before writing the cursor, this many times: what a
        # sink that is not atomic (or a crash between its two writes) leaves behind.
        self.crash_before_cursor = 0
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS events (tx_hash TEXT, log_index INTEGER, block INTEGER,"
                " name TEXT, args TEXT, PRIMARY KEY (tx_hash, log_index))"
            )
            db.execute("CREATE TABLE IF NOT EXISTS cursor (id INTEGER PRIMARY KEY, block INTEGER)")

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path)

    def load(self) -> int | None:
        with self._db() as db:
            row = db.execute("SELECT block FROM cursor WHERE id = 1").fetchone()
        return None if row is None else int(row[0])

    def sink(self, events: list[Event], through_block: int) -> None:
        self.calls.append((len(events), through_block))
        db = self._db()
        try:
            for e in events:
                self.deliveries.append((e.tx_hash, e.log_index))
                db.execute(
                    "INSERT INTO events VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (tx_hash, log_index) DO NOTHING",
                    (e.tx_hash, e.log_index, e.block, e.name, json.dumps(e.args, default=_hex)),
                )
            if self.crash_before_cursor:
                self.crash_before_cursor -= 1
                db.commit()
                raise RuntimeError("simulated crash before the cursor was committed")
            db.execute(
                "INSERT INTO cursor VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET block = ?",
                (through_block, through_block),
            )
            db.commit()
        finally:
            db.close()  # without commit: rolled back

    def stored(self) -> list[tuple[str, int, int, str]]:
        with self._db() as db:
            rows = db.execute(
                "SELECT tx_hash, log_index, block, name FROM events ORDER BY block, log_index"
            ).fetchall()
        return [(str(a), int(b), int(c), str(d)) for a, b, c, d in rows]


def _hex(value: Any) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    raise TypeError(f"not JSON: {value!r}")


# --------------------------------------------------------------------------- fault proxy


@dataclass
class _Rule:
    methods: frozenset[str] | None  # None: any method
    times: int
    forward: bool  # forward to anvil first (the node acts), then fail the reply
    status: int


@dataclass
class FaultProxy:
    """An HTTP JSON-RPC proxy in front of a real node that can fail chosen requests."""

    upstream: str
    counts: Counter[str] = field(default_factory=Counter)
    _rules: list[_Rule] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail(self, times: int, *methods: str, status: int = 503, forward: bool = False) -> None:
        """Answer the next ``times`` matching requests with HTTP ``status``; with ``forward``,
        after the node has handled them (the reply is lost, the effect is not)."""
        with self._lock:
            self._rules.append(_Rule(frozenset(methods) or None, times, forward, status))

    def start(self) -> FaultProxy:
        proxy = self
        session = requests.Session()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                payload = json.loads(body)
                methods = [
                    str(p.get("method"))
                    for p in (payload if isinstance(payload, list) else [payload])
                ]
                rule = proxy._take_rule(methods)
                if rule is not None and not rule.forward:
                    self._reply(rule.status, b"injected fault")
                    return
                try:
                    upstream = session.post(
                        proxy.upstream,
                        data=body,
                        headers={"Content-Type": "application/json"},
                        timeout=10,
                    )
                except requests.RequestException:
                    self._reply(502, b"upstream unreachable")
                    return
                if rule is not None:
                    self._reply(rule.status, b"injected fault after forwarding")
                    return
                self._reply(upstream.status_code, upstream.content)

            def _reply(self, status: int, content: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def _take_rule(self, methods: list[str]) -> _Rule | None:
        with self._lock:
            self.counts.update(methods)
            for rule in self._rules:
                if rule.times > 0 and (rule.methods is None or rule.methods & set(methods)):
                    rule.times -= 1
                    return rule
        return None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def wait_until(predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
