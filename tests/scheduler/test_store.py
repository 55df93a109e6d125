"""The scheduler's store on SQLite and PostgreSQL: migrations, registration nonces, the job
state machine, leases, and exactly-once claims under concurrency (two replicas, 64 pollers)."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from gridmarket.chain import Event
from gridmarket.holds import hold_for
from gridmarket.wire import JobSpec, NodeCapacityIn, ResultReport, RunReason
from scheduler import lifecycle
from scheduler.dispatch import refused_wallets, requirements
from scheduler.lifecycle import Event as Event_
from scheduler.lifecycle import State
from scheduler.store import Claim, ConflictError, ReplayError, ShortOfCollateralError, Store
from scheduler.store.db import MIGRATIONS
from scheduler.store.tables import jobs, metadata

SUBMITTER = "0x90F79bf6EB2c4f870365E785982E1f101E93b906"
WALLETS = [f"0x{i:040x}" for i in range(1, 200)]
SPEC = JobSpec.model_validate(
    {"executor": "docker", "image": "busybox:1", "command": ["true"], "max_attempts": 2}
)
CAP = NodeCapacityIn(
    cpu_cores=8, ram_mib=16384, disk_mib=100_000, region="us", executors=["docker"]
)


OPERATOR = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
MEDIATOR = "0xBcd4042DE499D14e55001CcbB24a551F3b954096"
SIG = "0x" + "22" * 65  # the store keeps an acceptance; the API checks its signer


SPEC_CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


def created(
    n: int,
    *,
    block: int = 10,
    deadline: int | None = None,
    flags: int = 0,
    spec_cid: str = SPEC_CID,
) -> Event:
    """A ``JobCreated`` of job ``n``. A test storing a spec of its own passes that spec's real
    CID: parsed specs are cached process-wide by CID (``scheduler.store.rows.SPEC_CACHE``)."""
    return Event(
        name="JobCreated",
        args={
            "jobId": n.to_bytes(32, "big"),
            "submitter": SUBMITTER,
            "bounty": 10**17,
            "deadline": deadline or int(time.time()) + 3600,
            "feeBps": 250,
            "operator": OPERATOR,
            "mediator": MEDIATOR,
            "collateral": 10**17,
            "flags": flags,
            "salt": b"\x01" * 32,
            "specCid": spec_cid,
        },
        block=block,
        tx_hash="0x" + "ab" * 32,
        log_index=n % 1000,
    )


def jid(n: int) -> str:
    return "0x" + n.to_bytes(32, "big").hex()


def queue_jobs(store: Store, count: int, start: int = 1) -> list[str]:
    store.apply_chain_events([created(i) for i in range(start, start + count)], through_block=10)
    for i in range(start, start + count):
        assert store.set_spec(jid(i), SPEC) == "queued"
    return [jid(i) for i in range(start, start + count)]


def node(store: Store, wallet: str = WALLETS[0], *, slots: int = 1, nonce: int = 1) -> str:
    cap = CAP.model_copy(update={"slots": slots})
    return store.register_node(
        wallet=wallet, name="gpu0", capacity=cap, tier="cpu", agent_version="t", nonce=nonce
    ).node_id


def take(store: Store, node_id: str, lease_ttl: float = 30.0, *, accept: bool = True) -> list[str]:
    """One round offering the oldest queued job to ``node_id``, which accepts it (unless not
    ``accept``)."""
    won = store.dispatch(
        lambda rows: [Claim(rows[0].job_id, node_id)] if rows else [], limit=8, lease_ttl=lease_ttl
    )
    if accept:
        for c in won:
            store.accept(c.job.job_id, node_id, c.job.attempt, SIG)
    return [c.job.job_id for c in won]


def offer(store: Store, job_id: str, node_id: str, *, accept: bool = True) -> int:
    """Offer ``job_id`` to ``node_id`` (and accept it); the attempt."""
    won = store.dispatch(lambda rows: [Claim(job_id, node_id)], limit=8, lease_ttl=30.0)
    assert [c.job.job_id for c in won] == [job_id]
    if accept:
        store.accept(job_id, node_id, won[0].job.attempt, SIG)
    return won[0].job.attempt


def ok_report(attempt: int) -> ResultReport:
    return ResultReport(
        attempt=attempt,
        reason=RunReason.SUCCEEDED,
        duration_s=1.0,
        output_cid="bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
        signature="0x" + "11" * 65,
    )


def test_migrations_match_the_tables_and_rerun_cleanly(store: Store) -> None:
    store.migrate()  # a second run is a no-op
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


def test_registration_nonce_must_grow(store: Store) -> None:
    first = node(store, nonce=5)
    with pytest.raises(ReplayError, match="not above 5"):
        node(store, nonce=5)
    with pytest.raises(ReplayError):
        node(store, nonce=4)
    assert node(store, nonce=6) == first  # same wallet + name: same node


def test_chain_events_are_idempotent_and_move_the_cursor(store: Store) -> None:
    assert store.chain_cursor() is None
    assert store.apply_chain_events([created(1), created(2)], through_block=12) == 2
    assert store.apply_chain_events([created(1), created(2)], through_block=12) == 0
    assert store.chain_cursor() == 12
    assert [j.state for j in store.jobs()] == ["pending_spec", "pending_spec"]
    assert store.set_spec(jid(1), None, "spec is not JSON") == "invalid"
    assert store.job(jid(1)).reason == "spec is not JSON"


def test_dispatch_leases_once_and_respects_slots(store: Store) -> None:
    queue_jobs(store, 3)
    n = node(store, slots=2)
    assert take(store, n) == [jid(1)]
    assert take(store, n) == [jid(2)]
    assert take(store, n) == []  # both slots used
    job = store.job(jid(1))
    assert (job.state, job.node_id, job.attempt) == ("leased", n, 1)
    assert [i.kind for i in store.outbox_pending()] == ["assign", "assign"]
    assert store.outbox_pending()[0].payload == {
        "provider": WALLETS[0],
        "attempt": 1,
        "node_id": n,
        "acceptance": SIG,
        "hold_for": hold_for(job.spec.limits.timeout_s),  # what the offer carried
    }
    assert store.node(n).running == 2


def test_an_offer_goes_on_chain_only_once_accepted(store: Store) -> None:
    queue_jobs(store, 1)
    a, b = node(store, WALLETS[0]), node(store, WALLETS[1])
    assert take(store, a, accept=False) == [jid(1)]
    job = store.job(jid(1))
    assert (job.state, job.acceptance, job.attempt) == ("leased", None, 1)
    assert store.outbox_pending() == []  # nothing on-chain for an offer
    with pytest.raises(ConflictError, match="never accepted"):  # no result before accepting
        store.record_result(jid(1), a, ok_report(attempt=1))
    with pytest.raises(ConflictError, match="stale"):
        store.accept(jid(1), a, 2, SIG)
    with pytest.raises(ConflictError, match="not offered to node"):
        store.accept(jid(1), b, 1, SIG)
    # heartbeats do not renew an offer
    before = job.lease_expires
    store.heartbeat(a, [jid(1)], lease_ttl=300)
    assert store.job(jid(1)).lease_expires == before
    assert store.accept(jid(1), a, 1, SIG) == "leased"
    assert store.accept(jid(1), a, 1, SIG) == "leased"  # the same acceptance again: a no-op
    with pytest.raises(ConflictError, match="already accepted"):
        store.accept(jid(1), a, 1, "0x" + "33" * 65)
    assert [i.kind for i in store.outbox_pending()] == ["assign"]
    assert store.job(jid(1)).acceptance == SIG
    store.heartbeat(a, [jid(1)], lease_ttl=300)
    assert (store.job(jid(1)).lease_expires or 0) > (before or 0)


def test_an_offer_not_accepted_in_time_is_lost_like_a_lease(store: Store) -> None:
    queue_jobs(store, 1)
    a, b = node(store, WALLETS[0]), node(store, WALLETS[1])
    assert take(store, a, lease_ttl=-1, accept=False) == [jid(1)]
    assert store.expire_leases() == [jid(1)]
    job = store.job(jid(1))
    assert job.state == "queued" and job.excluded_wallets == (WALLETS[0].lower(),)
    assert store.node(a).reputation.bad > 0 and store.node(a).running == 0
    assert store.outbox_pending() == []  # never accepted: nothing to take back on-chain
    # the chain never moved: the next offer is the same attempt, for another wallet
    assert take(store, b, accept=False) == [jid(1)]
    assert store.job(jid(1)).attempt == 1


def test_an_offer_short_of_collateral_ends_without_a_fault(store: Store) -> None:
    queue_jobs(store, 1)
    a = node(store)
    take(store, a, accept=False)
    why = "free collateral 0 < 10**17"
    assert store.offer_refused(jid(1), a, 2, why) == "leased"  # another attempt: not this one
    assert store.offer_refused(jid(1), a, 1, why) == "queued"
    job = store.job(jid(1))
    assert job.excluded_wallets == (WALLETS[0].lower(),) and why in job.reason
    n = store.node(a)
    assert (n.running, n.reputation.bad, n.jobs_failed) == (0, 0, 0)
    assert store.attempts_of(jid(1))[0]["outcome"] == "not_taken"
    assert store.outbox_pending() == []


def test_accepting_refuses_a_signature_over_other_terms(store: Store) -> None:
    """The API may check a signature against the offer it remembers: the store compares the
    terms signed with the row's, under its lock, and keeps the offer open when they differ."""
    queue_jobs(store, 1)
    a = node(store)
    take(store, a, accept=False)
    job = store.job(jid(1))
    for field, value in [("bounty", job.chain.job.bounty + 1), ("collateral", 1), ("flags", 4)]:
        other = replace(job.chain.job, **{field: value})
        with pytest.raises(ConflictError, match="terms signed are not the job's"):
            store.accept(jid(1), a, 1, SIG, signed=other)
    assert store.job(jid(1)).acceptance is None and store.outbox_pending() == []
    same = replace(job.chain.job, mediator="0x" + job.chain.job.mediator[2:].upper())
    assert store.accept(jid(1), a, 1, SIG, signed=same) == "leased"


def test_accepting_counts_collateral_promised_to_assigns_not_yet_mined(store: Store) -> None:
    """freeCollateralOf does not yet count jobs whose assign is still in the outbox: a node
    accepting faster than the chain mines cannot promise the same stake twice."""
    queue_jobs(store, 3)
    a = node(store, slots=3)
    offers = take(store, a, accept=False) + take(store, a, accept=False)
    offers += take(store, a, accept=False)
    assert offers == [jid(1), jid(2), jid(3)]
    free = 2 * 10**17 + 10**16  # on-chain: room for two jobs' collateral (10**17 each)
    assert store.accept(jid(1), a, 1, SIG, free) == "leased"
    assert store.accept(jid(2), a, 1, SIG, free) == "leased"
    with pytest.raises(ShortOfCollateralError, match="200000000000000000 of it promised"):
        store.accept(jid(3), a, 1, SIG, free)
    assert store.job(jid(3)).acceptance is None
    assert [i.job_id for i in store.outbox_pending()] == [jid(1), jid(2)]
    # once an assign is folded (mined), the chain's own figure counts it: no double count
    store.apply_sent(
        jid(1),
        [
            chain_event(
                "JobAssigned",
                1,
                11,
                provider=WALLETS[0],
                previousProvider="0x" + "0" * 40,
                attempt=1,
                since=int(time.time()),
                holdUntil=0,
            )
        ],
    )
    # the race: free collateral read at block 10, job 1's assign mined (block 11) and folded
    # before this acceptance's transaction: counted nowhere but here
    with pytest.raises(ShortOfCollateralError, match="200000000000000000 of it promised"):
        store.accept(jid(3), a, 1, SIG, 2 * 10**17 + 10**16, as_of_block=10)
    # (the chain now says 1.1e17 free: job 1's collateral is locked there, job 2's promised)
    with pytest.raises(ShortOfCollateralError, match="100000000000000000 of it promised"):
        store.accept(jid(3), a, 1, SIG, 10**17 + 10**16)
    # read at the assign's own block: the chain's figure has it, only job 2 is promised
    with pytest.raises(ShortOfCollateralError, match="100000000000000000 of it promised"):
        store.accept(jid(3), a, 1, SIG, 10**17 + 10**16, as_of_block=11)
    assert store.accept(jid(3), a, 1, SIG, 2 * 10**17 + 10**16) == "leased"  # staked more


def test_heartbeat_renews_and_cancels(store: Store) -> None:
    queue_jobs(store, 2)
    n = node(store)
    (job_id,) = take(store, n)
    before = store.job(job_id).lease_expires
    assert before is not None
    leases, cancel = store.heartbeat(n, [job_id, jid(2)], lease_ttl=300)
    assert leases[job_id] > before
    assert cancel == [jid(2)]  # not this node's job


def test_expired_lease_requeues_elsewhere(store: Store) -> None:
    queue_jobs(store, 1)
    a, b = node(store, WALLETS[0]), node(store, WALLETS[1])
    assert take(store, a, lease_ttl=-1) == [jid(1)]
    assert store.expire_leases() == [jid(1)]
    job = store.job(jid(1))
    assert job.state == "queued" and job.excluded == (a,) and job.acceptance is None
    assert store.node(a).running == 0 and store.node(a).reputation.bad > 0
    # the accepted lease may be on-chain: the outbox takes it back from that provider
    assert [(i.kind, i.payload) for i in store.outbox_pending()][1:] == [
        ("unassign", {"provider": WALLETS[0], "attempt": 1})
    ]
    assert take(store, b) == [jid(1)]
    assert store.job(jid(1)).attempt == 1  # the chain's next attempt (no receipt folded here)


def test_offline_node_loses_its_jobs(store: Store) -> None:
    queue_jobs(store, 1)
    a = node(store)
    take(store, a)
    time.sleep(0.05)
    assert store.mark_offline(timeout=0.01) == [a]
    assert store.node(a).status == "offline"
    assert store.job(jid(1)).state == "queued"


def test_a_verdict_on_another_attempt_or_output_changes_nothing(store: Store) -> None:
    """The verifier's checks run concurrently and take time: a verdict names the attempt and
    the output it checked, and one that no longer matches the job is dropped."""
    queue_jobs(store, 1)
    a = node(store)
    take(store, a)
    report = ok_report(attempt=1)
    assert store.record_result(jid(1), a, report) == "verifying"
    assert store.verified(jid(1), False, "stale", attempt=2) == "verifying"
    other = "bafkreie7q3iidccmpvszul7kudcvvuavuo7u6gzlbobczuk5nqk3b4akba"
    assert store.verified(jid(1), False, "stale", attempt=1, output_cid=other) == "verifying"
    assert store.node(a).running == 1
    ok = store.verified(jid(1), True, "ok", attempt=1, output_cid=report.output_cid)
    assert ok == "settling"


def test_results_success_failure_and_attempts(store: Store) -> None:
    queue_jobs(store, 2)
    a, b, c = (node(store, w) for w in WALLETS[:3])
    take(store, a)
    with pytest.raises(ConflictError, match="stale"):
        store.record_result(jid(1), a, ok_report(attempt=9))
    with pytest.raises(ConflictError, match="not leased to node"):
        store.record_result(jid(1), b, ok_report(attempt=1))
    assert store.record_result(jid(1), a, ok_report(attempt=1)) == "verifying"
    assert store.node(a).running == 1  # verifying: the node's slot is still held
    assert store.verified(jid(1), True, "ok") == "settling"
    assert store.outbox_pending()[-1].kind == "relay"  # not on-verify: relay, then finalize
    assert store.node(a).running == 0  # the node's work is done
    # job 2 fails twice on the nodes' side (max_attempts=2): failed, the chain assignment undone
    failed = ResultReport(
        attempt=1, reason=RunReason.AGENT_ERROR, message="IPFS down", duration_s=1
    )
    take(store, b)
    assert store.record_result(jid(2), b, failed) == "queued"
    take(store, c)
    assert store.record_result(jid(2), c, failed) == "failed"
    assert store.outbox_pending()[-1].kind == "unassign"
    assert store.node(c).running == 0
    assert store.node(b).reputation.bad > 0 and store.node(b).jobs_failed == 1


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        (RunReason.EXIT_CODE, "exited with code 3"),
        (RunReason.OUT_OF_MEMORY, "killed at the memory limit of 1048576 bytes"),
        (RunReason.OUTPUT_TOO_LARGE, "the output is over its 10-byte cap"),
        (RunReason.TRAPPED, "trapped: unreachable"),
        (RunReason.DATASET_ERROR, "dataset bafk... does not hash to its CID"),
        (RunReason.WORKLOAD_ERROR, "image 'busybox:9' is not in the registry"),
    ],
)
def test_a_run_failed_by_the_job_itself_fails_it_at_once_and_spares_the_node(
    store: Store, reason: RunReason, message: str
) -> None:
    queue_jobs(store, 1)
    a = node(store)
    take(store, a)
    report = ResultReport(attempt=1, reason=reason, message=message, duration_s=1)
    assert store.record_result(jid(1), a, report) == "failed"
    job = store.job(jid(1))
    # a reason the submitter can read, the run's report kept, no other node tries it
    assert reason.value in job.reason and message in job.reason and "cancel" in job.reason
    assert job.result is not None and job.result.reason is reason
    assert job.failures == 0 and job.excluded == () and job.node_id is None
    # the node keeps its reputation and its slot
    n = store.node(a)
    assert (n.reputation.bad, n.reputation.streak, n.jobs_failed, n.running) == (0, 0, 0, 0)
    # the refund path: the outbox unassigns on-chain, so the submitter can cancel at once
    assert [i.kind for i in store.outbox_pending()] == ["assign", "unassign"]
    with pytest.raises(ConflictError):  # nothing left leased to the node
        store.hand_back(jid(1), a)


def test_a_requeue_for_a_node_fault_excludes_the_node_s_whole_wallet(store: Store) -> None:
    queue_jobs(store, 2)
    w1 = [node(store, WALLETS[0], nonce=1)]
    w1 += [
        store.register_node(
            wallet=WALLETS[0],
            name=f"gpu{i}",
            capacity=CAP,
            tier="cpu",
            agent_version="t",
            nonce=10 + i,
        ).node_id
        for i in range(1, 4)
    ]
    other = node(store, WALLETS[1])
    take(store, w1[0])
    lost = ResultReport(attempt=1, reason=RunReason.AGENT_ERROR, duration_s=1)
    assert store.record_result(jid(1), w1[0], lost) == "queued"
    job = store.job(jid(1))
    assert job.excluded_wallets == (WALLETS[0].lower(),)
    nodes_of = {WALLETS[0].lower(): w1, WALLETS[1].lower(): [other]}
    req = requirements(job, lambda w: nodes_of.get(w, []))
    assert req.excluded_node_ids == frozenset(w1)  # every node of the wallet, not the other
    # a refused assign excludes the wallet too (the escrow refuses it for every node of it)
    take(store, w1[1])
    attempt = store.job(jid(2)).attempt
    assert store.assign_failed(jid(2), attempt, "JobEscrowProviderNotEligible(0x1)") == "queued"
    assert store.job(jid(2)).excluded_wallets == (WALLETS[0].lower(),)
    # a hand-back excludes nobody
    queue_jobs(store, 1, start=3)
    offer(store, jid(3), other)
    assert store.hand_back(jid(3), other) == "queued"
    assert store.job(jid(3)).excluded_wallets == ()


def test_the_wallet_the_escrow_holds_a_job_for_is_never_offered_it(store: Store) -> None:
    queue_jobs(store, 1)
    job = store.job(jid(1))
    assert refused_wallets(job) == frozenset()
    provider = "0x00000000000000000000000000000000000000Ab"
    assigned = replace(job, chain=replace(job.chain, job=replace(job.chain.job, provider=provider)))
    assert refused_wallets(assigned) == {provider.lower()}
    req = requirements(assigned, lambda w: ["n-a", "n-b"] if w == provider.lower() else [])
    assert req.excluded_node_ids == {"n-a", "n-b"}


def test_spec_fetches_in_backoff_are_skipped_and_new_jobs_go_first(db_url: str) -> None:
    now = [1000.0]
    store = Store(db_url, clock=lambda: now[0])
    store.migrate()
    store.apply_chain_events([created(i) for i in range(1, 5)], through_block=10)
    assert [j.job_id for j in store.pending_specs()] == [jid(i) for i in range(1, 5)]
    assert [j.job_id for j in store.pending_specs(skip=[jid(1)], limit=2)] == [jid(2), jid(3)]
    # 1 and 2 fail: in backoff until 1002 and 1001; 3 and 4 were never tried
    assert store.spec_retry(jid(1), 1002.0, "waiting for the job spec (try 1 failed)")
    assert store.spec_retry(jid(2), 1001.0, "waiting for the job spec (try 1 failed)")
    assert [j.job_id for j in store.pending_specs()] == [jid(3), jid(4)]
    now[0] = 1001.5  # 2 is due again: after the jobs never tried, before 1 (not due)
    assert [j.job_id for j in store.pending_specs()] == [jid(3), jid(4), jid(2)]
    now[0] = 1003.0  # both due: the oldest due first
    assert [j.job_id for j in store.pending_specs()][2:] == [jid(2), jid(1)]
    job = store.job(jid(1))
    assert (job.spec_tries, job.spec_retry_at, job.state) == (1, 1002.0, "pending_spec")
    assert "try 1 failed" in job.reason
    # a store opened later (a new leader) sees the same backoff
    again = Store(db_url, clock=lambda: 1001.5)
    assert [j.job_id for j in again.pending_specs()] == [jid(3), jid(4), jid(2)]
    again.close()
    assert store.set_spec(jid(1), None, "gave up") == "invalid"
    assert not store.spec_retry(jid(1), 2000.0, "too late")  # no longer pending
    store.close()


def test_migration_0002_upgrades_existing_jobs(db_url: str) -> None:
    store = Store(db_url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
        cols = {c["name"] for c in sa.inspect(conn).get_columns("jobs")}
    assert not cols & {"spec_tries", "spec_retry_at", "excluded_wallets"}
    row: dict[str, Any] = {  # a job as the 0001 schema wrote it
        "job_id": jid(1),
        "submitter": SUBMITTER,
        "bounty_wei": "1",
        "deadline": 2**40,
        "fee_bps": 0,
        "salt": "0x" + "00" * 32,
        "spec_cid": "bafk",
        "state": "pending_spec",
        "reason": "",
        "created_block": 1,
        "created_at": 1.0,
        "updated_at": 1.0,
        "chain_status": 1,
        "chain_job": {},
        "chain_pos": 0,
        "attempt": 0,
        "excluded": [],
        "failures": 0,
    }
    old = sa.table("jobs", *(sa.column(c.name, c.type) for c in jobs.c if c.name in row))
    with store.engine.begin() as conn:
        conn.execute(sa.insert(old), [row])
    store.migrate()
    with store.engine.connect() as conn:
        got = conn.execute(
            sa.select(jobs.c.spec_tries, jobs.c.spec_retry_at, jobs.c.excluded_wallets)
        ).one()
    assert tuple(got) == (0, None, None)
    store.close()


def test_migration_0003_upgrades_existing_jobs_and_outbox_rows(db_url: str) -> None:
    store = Store(db_url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
        assert "acceptance" not in {c["name"] for c in sa.inspect(conn).get_columns("jobs")}
        conn.execute(
            sa.text(
                "INSERT INTO outbox (job_id, kind, payload, status, tries, error, created_at, "
                "updated_at) VALUES ('0xa', 'assign', '{}', 'pending', 0, '', 1.0, 1.0)"
            )
        )
    store.migrate()
    (item,) = store.outbox_pending(now=0.0)  # an old row waits for no time
    assert (item.kind, item.not_before) == ("assign", None)
    with store.engine.connect() as conn:
        cols = {c["name"] for c in sa.inspect(conn).get_columns("jobs")}
    assert "acceptance" in cols
    store.close()


def test_hand_back_requeues_without_penalty(store: Store) -> None:
    queue_jobs(store, 1)
    a = node(store)
    take(store, a)
    assert store.hand_back(jid(1), a) == "queued"
    job = store.job(jid(1))
    assert job.excluded == () and store.node(a).reputation.bad == 0
    assert job.excluded_wallets == ()
    # the escrow would refuse the same provider: the assignment is undone on-chain
    assert [i.kind for i in store.outbox_pending()] == ["assign", "unassign"]
    # declining an offer (never accepted) is a hand-back with nothing to undo on-chain
    take(store, a, accept=False)
    assert store.hand_back(jid(1), a) == "queued"
    assert [i.kind for i in store.outbox_pending()] == ["assign", "unassign"]
    assert store.attempts_of(jid(1))[-1]["outcome"] == "declined"
    job = store.job(jid(1))
    assert job.excluded == (a,) and job.excluded_wallets == ()  # that node only, no fault
    assert store.node(a).reputation.bad == 0
    # an offer that never reached its node (its poll ended first) excludes nobody
    queue_jobs(store, 1, start=2)
    b = node(store, WALLETS[1])
    offer(store, jid(2), b, accept=False)
    assert store.hand_back(jid(2), b, delivered=False) == "queued"
    assert store.job(jid(2)).excluded == ()


def refunded(n: int, block: int) -> Event:
    return Event(
        name="JobRefunded",
        args={"jobId": n.to_bytes(32, "big"), "submitter": SUBMITTER, "amount": 10**17},
        block=block,
        tx_hash="0x" + "cd" * 32,
        log_index=0,
    )


def test_every_state_the_store_writes_is_a_row_of_the_lifecycle_table(store: Store) -> None:
    """Walk jobs through the store's transitions; each state change must be one the table
    allows, either directly or through the queue's follow-ups (attempts used up, deadline)."""
    steps: set[tuple[str, str]] = set()

    def do(job_id: str, fn: Any) -> None:
        before = store.job(job_id).state
        fn()
        after = store.job(job_id).state
        if after != before:
            steps.add((before, after))

    def lease(job_id: str, node_id: str) -> None:
        assert [j for j in store.jobs(state="queued") if j.job_id == job_id]
        offer(store, job_id, node_id)

    one, two, three, four, five = queue_jobs(store, 5)
    a, b, c = (node(store, w) for w in WALLETS[:3])
    do(one, lambda: lease(one, a))  # paid
    do(one, lambda: store.record_result(one, a, ok_report(attempt=1)))
    do(one, lambda: store.verified(one, True, "ok"))
    do(one, lambda: store.settled(one))
    do(two, lambda: lease(two, b))  # failed the check, handed back, refused for good
    do(two, lambda: store.record_result(two, b, ok_report(attempt=1)))
    do(two, lambda: store.verified(two, False, "bad"))
    do(two, lambda: lease(two, c))
    do(two, lambda: store.hand_back(two, c))
    do(two, lambda: lease(two, c))
    attempt = store.job(two).attempt
    do(two, lambda: store.assign_failed(two, attempt, "JobEscrowDeadlinePassed(1, 2)"))
    do(three, lambda: store.fail_job(three, "settle refused on-chain"))  # given up
    do(four, lambda: store.apply_chain_events([refunded(4, block=11)], through_block=11))
    do(five, lambda: lease(five, a))  # failed by its own fault
    own = ResultReport(attempt=1, reason=RunReason.TRAPPED, message="trapped", duration_s=1)
    do(five, lambda: store.record_result(five, a, own))
    assert [store.job(j).state for j in (one, two, three, four, five)] == [
        "released",
        "failed",
        "failed",
        "refunded",
        "failed",
    ]
    queued = State.QUEUED
    follow_ups = (Event_.ATTEMPTS_USED_UP, Event_.DEADLINE_PASSED)
    via_queue = {lifecycle.target(queued, e) for e in follow_ups}
    for before, after in steps:
        direct = {lifecycle.target(before, e) for e in lifecycle.Event}
        assert after in direct or (queued in direct and after in via_queue), (before, after)
    assert len(steps) == 9, steps


def test_a_move_the_table_refuses_changes_nothing(store: Store) -> None:
    queue_jobs(store, 1)
    a = node(store)
    take(store, a)
    assert store.settled(jid(1)) == "leased"  # not settling: nothing to pay
    assert store.verified(jid(1), True, "ok") == "leased"
    job = store.job(jid(1))
    assert (job.state, job.node_id) == ("leased", a)
    assert store.node(a).running == 1 and store.node(a).jobs_done == 0
    with pytest.raises(ConflictError, match="not leased"):
        store.hand_back(jid(1), node(store, WALLETS[1]))


def test_concurrent_claims_across_two_replicas_are_exactly_once(db_url: str) -> None:
    """64 pollers on two store instances (two replicas) race for 400 jobs."""
    replicas = [Store(db_url), Store(db_url)]
    replicas[0].migrate()
    jobs = queue_jobs(replicas[0], 400)
    nodes = [node(replicas[0], WALLETS[i], slots=64) for i in range(64)]
    taken: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(64)

    def poller(i: int) -> None:
        store = replicas[i % 2]
        start.wait()
        while True:
            got = take(store, nodes[i])
            if not got:
                if not store.jobs(state="queued", limit=1):
                    return
                continue
            with lock:
                taken.extend(got)

    threads = [threading.Thread(target=poller, args=(i,)) for i in range(64)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    elapsed = time.perf_counter() - t0
    counts = Counter(taken)
    assert [j for j, n in counts.items() if n > 1] == []  # no job on two nodes
    assert sorted(counts) == sorted(jobs)  # every job claimed
    leased = {j.job_id: j.node_id for j in replicas[1].jobs(limit=1000)}
    assert all(leased[j] is not None for j in jobs)
    assert sum(replicas[0].node(n).running for n in nodes) == 400
    if os.environ.get("GRIDMARKET_VERBOSE"):
        print(f"{db_url.split(':')[0]}: 400 claims in {elapsed:.2f}s")
    for r in replicas:
        r.close()


def test_windowed_round_reaches_past_jobs_nobody_fits(store: Store) -> None:
    """A round reads a few jobs at a time, but goes on while nodes wait: a job deep in the
    queue still reaches a node when the jobs ahead of it fit nobody."""
    ids = queue_jobs(store, 10)
    n = node(store)
    seen: list[int] = []

    def only_the_last(rows: list[Any]) -> list[Claim]:
        seen.append(len(rows))
        return [Claim(r.job_id, n) for r in rows if r.job_id == ids[-1]]

    won = store.dispatch(only_the_last, limit=100, window=3, wants_more=lambda: True, lease_ttl=30)
    assert [c.job.job_id for c in won] == [ids[-1]]
    assert seen == [3, 3, 3, 1]
    # and a round with nobody left waiting stops after its first window
    seen.clear()
    store.dispatch(only_the_last, limit=100, window=3, wants_more=lambda: False, lease_ttl=30)
    assert seen == [3]


def test_a_timeout_costs_the_node_only_once_another_node_is_paid_for_the_job(
    store: Store,
) -> None:
    queue_jobs(store, 2)
    slow, fast = node(store, WALLETS[0]), node(store, WALLETS[1])
    why = "killed at the time limit of 600 s"
    timeout = ResultReport(attempt=1, reason=RunReason.TIMEOUT, message=why, duration_s=1)
    # job 1: times out on `slow`, requeued; nothing counted yet
    offer(store, jid(1), slow)
    assert store.record_result(jid(1), slow, timeout) == "queued"
    assert store.attempts_of(jid(1))[0]["outcome"] == "timed_out"
    assert (store.node(slow).reputation.bad, store.node(slow).jobs_failed) == (0, 0)
    # `fast` does it in time and is paid: the job fitted, so `slow` is at fault
    offer(store, jid(1), fast)
    assert store.record_result(jid(1), fast, ok_report(attempt=1)) == "verifying"
    assert store.verified(jid(1), True, "ok") == "settling"
    assert store.settled(jid(1)) == "released"
    assert (store.node(slow).reputation.bad, store.node(slow).jobs_failed) == (1.0, 1)
    assert store.node(fast).jobs_done == 1
    # job 2 times out everywhere (max_attempts=2): failed, and nobody is counted
    offer(store, jid(2), slow)
    assert store.record_result(jid(2), slow, timeout) == "queued"
    offer(store, jid(2), fast)
    assert store.record_result(jid(2), fast, timeout) == "failed"
    assert store.node(slow).jobs_failed == 1 and store.node(fast).jobs_failed == 0


def chain_event(name: str, n: int, block: int, **args: Any) -> Event:
    return Event(
        name=name,
        args={"jobId": n.to_bytes(32, "big"), **args},
        block=block,
        tx_hash="0x" + f"{block:02x}" * 32,
        log_index=0,
    )


def test_a_dispute_waits_for_the_mediator_and_a_ruling_against_requeues_elsewhere(
    store: Store,
) -> None:
    queue_jobs(store, 1)
    a, b = node(store, WALLETS[0]), node(store, WALLETS[1])
    take(store, a)
    cid = ok_report(1).output_cid
    now = int(time.time())
    store.apply_chain_events(
        [
            chain_event(
                "JobAssigned",
                1,
                11,
                provider=WALLETS[0],
                previousProvider=OPERATOR[:2] + "0" * 40,
                attempt=1,
                since=now,
                holdUntil=0,
            ),
            chain_event(
                "ResultSubmitted",
                1,
                12,
                provider=WALLETS[0],
                attempt=1,
                submittedAt=now,
                outputCid=cid,
            ),
        ],
        through_block=12,
    )
    assert store.job(jid(1)).state == "verifying"  # posted on-chain by the provider itself
    assert store.verified(jid(1), True, "ok") == "settling"
    assert [i.kind for i in store.outbox_pending()] == ["assign", "finalize"]
    assert store.node(a).running == 0
    store.apply_chain_events(
        [chain_event("ResultDisputed", 1, 13, provider=WALLETS[0], disputedAt=now, deposit=1)],
        through_block=13,
    )
    job = store.job(jid(1))
    assert job.state == "disputed" and "mediator" in job.reason
    store.apply_chain_events(
        [
            chain_event(
                "Ruled", 1, 14, mediator=MEDIATOR, provider=WALLETS[0], attempt=1, upheld=False
            ),
            chain_event(
                "ProviderSlashed",
                1,
                15,
                provider=WALLETS[0],
                amount=10**17,
                submitter=SUBMITTER,
                toMediator=1,
            ),
        ],
        through_block=15,
    )
    job = store.job(jid(1))
    assert (job.state, job.node_id, job.chain.status.name) == ("queued", None, "FUNDED")
    assert job.excluded_wallets == (WALLETS[0].lower(),) and "slashed" in job.reason
    assert job.failures == 1
    n = store.node(a)
    assert n.reputation.bad > 0 and n.jobs_failed == 1 and n.running == 0
    assert store.attempts_of(jid(1))[0]["outcome"] == "ruled_against"
    assert "chain:ProviderSlashed" in [r["event"] for r in store.audit_of(jid(1))]
    # the finalize waiting for the window is moot: it holds back no later step
    assert [i.kind for i in store.outbox_pending()] == ["assign"]
    # the chain is Funded again at attempt 1: the next offer is attempt 2, to another wallet
    assert take(store, b) == [jid(1)]
    assert store.job(jid(1)).attempt == 2


def test_a_result_that_fails_the_check_is_not_relayed_and_the_job_is_taken_back(
    store: Store,
) -> None:
    queue_jobs(store, 1)
    a = node(store, WALLETS[0])
    take(store, a)
    assert store.record_result(jid(1), a, ok_report(attempt=1)) == "verifying"
    assert store.verified(jid(1), False, "output is not on IPFS") == "queued"
    job = store.job(jid(1))
    assert job.excluded_wallets == (WALLETS[0].lower(),) and job.failures == 1
    assert "not relayed" in job.reason
    kinds = [(i.kind, i.payload) for i in store.outbox_pending()]
    assert kinds[1:] == [("unassign", {"provider": WALLETS[0], "attempt": 1})]  # no relay
    n = store.node(a)
    assert n.reputation.bad > 0 and n.running == 0
    assert store.attempts_of(jid(1))[0]["outcome"] == "rejected"


def test_an_on_verify_job_is_settled_at_once(store: Store) -> None:
    store.apply_chain_events([created(1, flags=1)], through_block=10)
    assert store.set_spec(jid(1), SPEC) == "queued"
    a = node(store)
    take(store, a)
    store.record_result(jid(1), a, ok_report(attempt=1))
    assert store.verified(jid(1), True, "ok") == "settling"
    (_, settle) = store.outbox_pending()
    assert settle.kind == "settle" and settle.payload["signature"] == "0x" + "11" * 65


def test_outbox_rows_wait_for_their_chain_time_and_hold_their_job_back(store: Store) -> None:
    store.outbox_add("0xa", "finalize", {}, not_before=1000.0)
    store.outbox_add("0xa", "unassign", {})
    store.outbox_add("0xb", "unassign", {})
    assert store.outbox_waiting()
    assert [(i.job_id, i.kind) for i in store.outbox_pending(now=999)] == [("0xb", "unassign")]
    assert [(i.job_id, i.kind) for i in store.outbox_pending(now=1000)] == [
        ("0xa", "finalize"),
        ("0xa", "unassign"),
        ("0xb", "unassign"),
    ]
    first = store.outbox_pending(now=1000)[0]
    store.outbox_defer(first.id, 2000.0, "too early")
    assert [i.job_id for i in store.outbox_pending(now=1500)] == ["0xb"]
    assert len(store.outbox_pending()) == 3  # without a time: everything pending
