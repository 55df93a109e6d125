"""Token jobs (escrow v4) in the scheduler's store, on SQLite and PostgreSQL: the job's token is
stored and folded from ``JobCreated``, the dispatcher's view and the offer's terms carry it,
collateral promised to accepted jobs is counted per token, and migration 0005 adds it (the zero
address for the jobs stored before) and goes back down."""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from gridmarket.chain import Event
from gridmarket.escrow import ZERO_ADDRESS
from scheduler.dispatch import requirements, terms_of
from scheduler.store import ShortOfCollateralError, Store
from scheduler.store.db import MIGRATIONS
from scheduler.store.tables import jobs

from .test_store import MEDIATOR, OPERATOR, SIG, SPEC, SUBMITTER, WALLETS, chain_event, jid, node
from .test_store import take as take_oldest

TUSD = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
COLLATERAL = 10**17


def created(n: int, token: str | None, *, block: int = 10) -> Event:
    """``JobCreated`` as escrow v4 emits it (``token`` None: an event without the field, as
    a v3 escrow's; the fold reads it as ETH)."""
    args: dict[str, Any] = {
        "jobId": n.to_bytes(32, "big"),
        "submitter": SUBMITTER,
        "bounty": 3_600_000,  # 3.6 tUSD (6 decimals) or 3.6e6 wei for an hour
        "deadline": int(time.time()) + 3600,
        "feeBps": 250,
        "operator": OPERATOR,
        "mediator": MEDIATOR,
        "collateral": COLLATERAL,
        "flags": 0,
        "salt": n.to_bytes(32, "big"),
        "specCid": "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
    }
    if token is not None:
        args["token"] = token
    return Event(name="JobCreated", args=args, block=block, tx_hash="0x" + "ab" * 32, log_index=n)


def queue(store: Store, *tokens: str | None) -> None:
    events = [created(i + 1, t) for i, t in enumerate(tokens)]
    store.apply_chain_events(events, through_block=10)
    for i in range(len(tokens)):
        assert store.set_spec(jid(i + 1), SPEC) == "queued"


def test_a_token_job_is_stored_folded_and_offered_with_its_token(store: Store) -> None:
    queue(store, TUSD.lower(), ZERO_ADDRESS, None)
    job = store.job(jid(1))
    assert job.chain.job.token == TUSD  # checksummed by the fold
    assert requirements(job).token == TUSD
    terms = terms_of(job)
    assert terms.token == TUSD and terms.as_job().token == TUSD
    assert terms.bounty_wei == 3_600_000 and terms.collateral_wei == COLLATERAL
    # an ETH job (explicit zero address, or an event without the field) stays ETH
    for n in (2, 3):
        eth = store.job(jid(n))
        assert eth.chain.job.token == ZERO_ADDRESS and requirements(eth).token is None
        assert terms_of(eth).token == ZERO_ADDRESS
    # later events fold into the struct and keep the token
    a = node(store)
    take_oldest(store, a)
    store.apply_chain_events(
        [
            chain_event(
                "JobAssigned",
                1,
                11,
                provider=WALLETS[0],
                previousProvider=ZERO_ADDRESS,
                attempt=1,
                since=int(time.time()),
                holdUntil=0,
            )
        ],
        through_block=11,
    )
    job = store.job(jid(1))
    assert job.chain.job.attempt == 1 and job.chain.job.provider.lower() == WALLETS[0]
    assert job.chain.job.token == TUSD and terms_of(job).token == TUSD
    # and a store opened anew reads the same from the database
    again = Store(store.url)
    assert again.job(jid(1)).chain.job.token == TUSD
    again.close()


def test_collateral_promised_to_accepted_jobs_is_counted_per_token(store: Store) -> None:
    """A stake in ETH never covers a tUSD job, nor a tUSD stake an ETH job: the collateral
    promised to accepted jobs not yet assigned is taken off the free collateral of their own
    token only."""
    queue(store, ZERO_ADDRESS, TUSD, TUSD, ZERO_ADDRESS)
    a = node(store, slots=4)
    offers: list[str] = []
    for _ in range(4):
        offers += take_oldest(store, a, accept=False)
    assert offers == [jid(1), jid(2), jid(3), jid(4)]
    # free collateral as the chain says it, in each job's own token: room for one job each
    assert store.accept(jid(1), a, 1, SIG, COLLATERAL) == "leased"  # ETH
    assert store.accept(jid(2), a, 1, SIG, COLLATERAL) == "leased"  # tUSD: ETH pending not in it
    with pytest.raises(ShortOfCollateralError) as refused:
        store.accept(jid(3), a, 1, SIG, COLLATERAL)  # tUSD: job 2 holds the tUSD
    assert f"units of token {TUSD}" in str(refused.value)
    assert f"{COLLATERAL} of it promised" in str(refused.value)
    assert "stakeToken" in str(refused.value)
    with pytest.raises(ShortOfCollateralError, match="wei of free collateral"):
        store.accept(jid(4), a, 1, SIG, COLLATERAL)  # ETH: job 1 holds the ETH
    assert store.accept(jid(3), a, 1, SIG, 2 * COLLATERAL) == "leased"  # staked more tUSD


def _alembic() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def test_migration_0005_adds_the_token_as_eth_for_stored_jobs_and_goes_down(db_url: str) -> None:
    store = Store(db_url)
    cfg = _alembic()
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004")
        assert "token" not in {c["name"] for c in sa.inspect(conn).get_columns("jobs")}
    row: dict[str, Any] = {  # a job as the 0004 schema wrote it
        "job_id": jid(1),
        "submitter": SUBMITTER,
        "bounty_wei": "1",
        "deadline": 2**40,
        "fee_bps": 0,
        "salt": "0x" + "00" * 32,
        "spec_cid": "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
        "state": "pending_spec",
        "reason": "",
        "created_block": 1,
        "created_at": 1.0,
        "updated_at": 1.0,
        "chain_status": 1,
        "chain_job": {
            "submitter": SUBMITTER,
            "bounty": "1",
            "provider": ZERO_ADDRESS,
            "deadline": 2**40,
            "since": 0,
            "fee_bps": 0,
            "attempt": 0,
            "result_digest": "0x" + "00" * 32,
            "operator": OPERATOR,
            "mediator": MEDIATOR,
            "collateral": "0",
            "disputed_at": 0,
            "flags": 0,
            "output_cid": None,
        },
        "chain_pos": 0,
        "attempt": 0,
        "excluded": [],
        "failures": 0,
    }
    old = sa.table("jobs", *(sa.column(c.name, c.type) for c in jobs.c if c.name in row))
    with store.engine.begin() as conn:
        conn.execute(sa.insert(old), [row])
    store.migrate()
    assert store.job(jid(1)).chain.job.token == ZERO_ADDRESS  # stored before: ETH
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
        assert "token" not in {c["name"] for c in sa.inspect(conn).get_columns("jobs")}
        assert conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar() == 1  # kept
    store.migrate()  # and up again
    assert store.job(jid(1)).chain.job.token == ZERO_ADDRESS
    store.close()
