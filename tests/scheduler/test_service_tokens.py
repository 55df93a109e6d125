"""A job paid in an ERC-20 token (escrow v4), end to end through the scheduler on real services:
anvil (a fresh escrow listing the devnet's TestUSD), the js-ipfs daemon, uvicorn on loopback,
SQLite and PostgreSQL. It is offered only to a node with a tUSD floor, on terms naming the
token (the acceptance the escrow checks in ``assign``), refused to a wallet short of tUSD
collateral, paid in tUSD, shown in tUSD; quotes come in tUSD from the nodes' floors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account.signers.local import LocalAccount

from gridmarket.chain import EscrowClient
from gridmarket.deploy import list_token
from gridmarket.escrow import ZERO_ADDRESS, Status
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec

from ..conftest import Devnet
from .harness import (
    CPU_CAP,
    Provider,
    Server,
    accept,
    fresh_escrow,
    register_on_chain,
    scheduler,
)
from .test_service import chain_status, output, wait_chain

SPEC = JobSpec.model_validate(
    {"executor": "docker", "image": "busybox:1", "command": ["true"], "max_attempts": 3}
)
BOUNTY = 3_600_000  # 3.6 tUSD (6 decimals) for the spec's 600 s: 21.6 tUSD per hour
FLOOR = 5_000_000  # 5 tUSD per hour
TUSD_STAKE = 10 * 10**6


@pytest.fixture
def ipfs(ipfs_daemon: Any) -> Iterator[IpfsStore]:
    store = IpfsStore(ipfs_daemon.api_addr)
    yield store
    store.close()


@pytest.fixture
def grid(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any, db_url: str
) -> Iterator[tuple[Server, EscrowClient, str]]:
    """A scheduler on a fresh escrow that lists TestUSD; the token's address."""
    deployment, _ = fresh_escrow(devnet)
    deployment = list_token(devnet.w3, devnet.owner, deployment, devnet.token)
    client = EscrowClient(devnet.w3, deployment)
    for p in devnet.providers[:3]:
        register_on_chain(client, p)
    with scheduler(
        tmp_path,
        deployment,
        devnet,
        ipfs_daemon.api_addr,
        database_url=db_url,
        quote_floors_ttl_s=0,  # quotes read the floors afresh (default: every 10 s)
    ) as server:
        yield server, client, devnet.token


def fund_in_tusd(client: EscrowClient, ipfs: IpfsStore, submitter: LocalAccount, token: str) -> str:
    """Fund SPEC in tUSD on the default terms (a permit and createJobWith in one transaction)."""
    spec_cid = ipfs.add_bytes(SPEC.to_bytes())
    now = max(int(time.time()), int(client.w3.eth.get_block("latest")["timestamp"]))
    terms = client.default_terms(BOUNTY, submitter.address, on_verify=True, token=token)
    salt = time.time_ns().to_bytes(32, "big")
    state, _ = client.create_job(submitter, salt, spec_cid, now + 3600, BOUNTY, terms)
    assert state.job.token == token
    return "0x" + state.job_id.hex()


def taker(account: LocalAccount, server: Server, token: str, name: str) -> Provider:
    cap = CPU_CAP.model_copy(update={"price_floors": {token: FLOOR}})
    node = Provider(account, server, name=name, capacity=cap)
    assert node.register().status_code == 200
    return node


def test_a_tusd_job_goes_to_a_tusd_taker_is_assigned_on_its_terms_and_paid_in_tusd(
    grid: tuple[Server, EscrowClient, str], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    server, client, token = grid
    eth_only = Provider(devnet.providers[0], server, name="eth-only")
    assert eth_only.register().status_code == 200
    job_id = fund_in_tusd(client, ipfs, devnet.submitters[0], token)
    server.wait_job(job_id, {"queued"})
    # the ETH-only node is never offered it, and the job says why it waits
    assert eth_only.next_job(wait_s=1.5).status_code == 204
    reason = server.job(job_id)["reason"]
    assert "no node takes tUSD" in reason, reason
    # a node with a tUSD floor (and a tUSD stake for the collateral) gets it
    provider = devnet.providers[1]
    client.stake_token(provider, token, TUSD_STAKE)
    node = taker(provider, server, token, "tusd")
    seen = server.get(API.NODE.format(node_id=node.node_id)).json()
    assert seen["capacity"]["price_floors"] == {token: FLOOR}  # kept with the node's row
    r = node.next_job(wait_s=20)
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["job_id"] == job_id
    chain = client.job_state(bytes.fromhex(job_id[2:])).job
    assert a["terms"]["token"] == token == chain.token
    assert a["terms"]["bounty_wei"] == BOUNTY and a["terms"]["collateral_wei"] == chain.collateral
    # the acceptance signed over the terms (token last) is what the escrow checks in assign
    accept(server, node, a)
    wait_chain(client, job_id, Status.ASSIGNED)
    assert client.free_collateral_of(provider.address, token) == TUSD_STAKE - chain.collateral
    before = client.balance_of(provider.address, token)
    eth_before = client.balance_of(provider.address)
    assert node.succeed(a, output(ipfs, tmp_path, "paid in tUSD")).status_code == 202
    view = server.wait_job(job_id, {"released"}, timeout=30)  # on-verify: settled at once
    state = client.job_state(bytes.fromhex(job_id[2:]))
    assert state.status is Status.RELEASED
    assert client.balance_of(provider.address, token) - before == state.job.payout
    assert client.balance_of(provider.address) == eth_before  # nothing in ETH
    assert client.free_collateral_of(provider.address, token) == TUSD_STAKE  # unlocked
    # the API shows the job in its token
    assert (view["token"], view["token_symbol"], view["token_decimals"]) == (token, "tUSD", 6)
    assert view["bounty_wei"] == str(BOUNTY) and view["bounty"] == "3.6 tUSD"
    assert view["collateral_display"] == f"{chain.collateral / 10**6:g} tUSD"
    listed = server.get(API.JOBS).json()["jobs"]
    assert [j["token_symbol"] for j in listed if j["job_id"] == job_id] == ["tUSD"]


def test_an_offer_to_a_wallet_short_of_tusd_collateral_is_withdrawn(
    grid: tuple[Server, EscrowClient, str], devnet: Devnet, ipfs: IpfsStore
) -> None:
    """The wallet's ETH stake (0.1 ETH, far above the job's 3.6 tUSD of collateral in number)
    does not cover a tUSD job: its free collateral in tUSD is read, and it has none."""
    server, client, token = grid
    node = taker(devnet.providers[2], server, token, "no-tusd-stake")
    job_id = fund_in_tusd(client, ipfs, devnet.submitters[0], token)
    a = node.next_job(wait_s=20).json()
    assert a["job_id"] == job_id
    r = node.accept(a)
    assert r.status_code == 200, r.text
    ack = r.json()
    assert ack["accepted"] is False and "free collateral" in ack["message"], ack
    assert f"units of token {token}" in ack["message"]
    job = server.job(job_id)
    assert job["state"] == "queued" and "free collateral" in job["reason"]
    assert chain_status(client, job_id) is Status.FUNDED


def test_quotes_in_tusd_come_from_the_base_rate_and_the_nodes_floors(
    grid: tuple[Server, EscrowClient, str], devnet: Devnet
) -> None:
    server, _, token = grid
    body = {"gpu_count": 0, "duration_s": 7200}
    # no node takes tUSD yet: the base rate (settings base_rates, 300,000 units an hour)
    q = server.http.post(API.QUOTE, json={**body, "token": token.lower()})
    assert q.status_code == 200, q.text
    answer = q.json()
    assert (answer["token"], answer["token_symbol"], answer["token_decimals"]) == (
        token,
        "tUSD",
        6,
    )
    (cpu,) = answer["quotes"]
    assert cpu["base_rate_wei_per_hour"] == "300000" and cpu["nodes_taking_token"] == 0
    assert int(cpu["rate_wei_per_hour"]) == int(cpu["market_rate_wei_per_hour"]) < FLOOR
    # a node taking tUSD at 5 tUSD an hour: the quote rises to its floor
    taker(devnet.providers[0], server, token, "tusd-quote")
    (cpu,) = server.http.post(API.QUOTE, json={**body, "token": token}).json()["quotes"]
    assert cpu["nodes_taking_token"] == 1 and cpu["floor_applied"] is True
    assert cpu["rate_wei_per_hour"] == str(FLOOR) and cpu["total_wei"] == str(2 * FLOOR)
    assert cpu["total"] == "10 tUSD"
    # ETH as before; an unlisted token is refused, naming the listed ones
    eth = server.http.post(API.QUOTE, json=body).json()
    assert (eth["token"], eth["token_symbol"]) == (ZERO_ADDRESS, "ETH")
    assert "nodes_taking_token" not in eth["quotes"][0]
    r = server.http.post(API.QUOTE, json={**body, "token": "0x" + "11" * 20})
    assert r.status_code == 422 and "not listed" in r.text and "tUSD" in r.text
