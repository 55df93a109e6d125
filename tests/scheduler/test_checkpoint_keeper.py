"""Checkpoints in the scheduler's store (SQLite and PostgreSQL) and its keeper on real js-ipfs
daemons: reports only from the attempt's node (and for a minute after it ended), reposts
no-ops, rows bounded per job without losing the kept one; the keeper copying a checkpoint
added on the provider's IPFS node to its own (pinned there, the same CID), giving up one over
``max_bytes`` at once and one that exists nowhere within a bounded time, unpinning superseded
and settled checkpoints (retention)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from devstack.ipfs import IpfsSwarm
from gridmarket.checkpoints import CheckpointReport, Progress
from gridmarket.cid import bytes_cid
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import JobSpec
from scheduler.service.checkpoints import CheckpointKeeper, CheckpointSettings
from scheduler.settings import Settings
from scheduler.store import ConflictError, Store
from scheduler.store.logs import LATE_S, NotAssigneeError
from scheduler.store.tables import job_checkpoints, jobs
from tests.scheduler.test_store import WALLETS, created, jid, node, take

SPEC = JobSpec.model_validate(
    {
        "executor": "docker",
        "image": "busybox:1",
        "command": ["true"],
        "max_attempts": 3,
        "checkpoint": {"interval_s": 60, "max_bytes": 64 * 1024},
    }
)
SIG = "0x" + "11" * 65


def checkpoint_job(store: Store, n: int = 1, spec: JobSpec = SPEC) -> str:
    """Job ``n`` with a checkpointing spec, queued (the spec's real CID: specs are cached)."""
    spec_cid = bytes_cid(spec.to_bytes())
    store.apply_chain_events([created(n, spec_cid=spec_cid)], through_block=10)
    assert store.set_spec(jid(n), spec) == "queued"
    return jid(n)


def report(seq: int, cid: str, *, attempt: int = 1, step: int | None = None) -> CheckpointReport:
    progress = Progress(step=step, total=1000, metrics={"loss": 1.0 / (step + 1)}) if step else None
    return CheckpointReport(
        attempt=attempt,
        seq=seq,
        cid=cid,
        size=100,
        files=1,
        progress=progress,
        taken_at=time.time(),
        signature=SIG,
    )


def fake_cid(n: int) -> str:
    return bytes_cid(f"checkpoint {n}".encode())


def test_reports_are_the_assignee_s_idempotent_bounded_and_resumed_from(store: Store) -> None:
    job_id = checkpoint_job(store)
    a, b = (node(store, w) for w in WALLETS[:2])
    assert take(store, a) == [job_id]
    with pytest.raises(NotAssigneeError):
        store.add_checkpoint(job_id, b, WALLETS[1], report(1, fake_cid(1)), keep_rows=3)
    with pytest.raises(NotAssigneeError):  # no such attempt
        store.add_checkpoint(job_id, a, WALLETS[0], report(1, fake_cid(1), attempt=2), keep_rows=3)
    assert store.add_checkpoint(job_id, a, WALLETS[0], report(1, fake_cid(1), step=10), keep_rows=3)
    assert not store.add_checkpoint(job_id, a, WALLETS[0], report(1, fake_cid(9)), keep_rows=3)
    # the keeper takes only the newest pending report of a job; older ones are superseded
    assert store.add_checkpoint(job_id, a, WALLETS[0], report(2, fake_cid(2), step=20), keep_rows=3)
    (todo,) = store.checkpoints_to_keep(8)
    assert (todo["seq"], todo["cid"]) == (2, fake_cid(2))
    store.checkpoint_kept(todo["id"])
    assert store.checkpoints_to_keep(8) == []
    seen = store.checkpoints_of(job_id, 500)
    assert seen["resume"]["seq"] == 2 and seen["resume"]["kept"] is True
    assert [p["step"] for p in seen["points"]] == [10, 20]
    # bounded: three rows at most, the oldest go but never the pinned one (seq 2)
    for seq in range(3, 7):
        store.add_checkpoint(job_id, a, WALLETS[0], report(seq, fake_cid(seq)), keep_rows=3)
    seen = store.checkpoints_of(job_id, 500)
    assert seen["latest"]["seq"] == 6 and seen["latest"]["kept"] is False
    assert seen["resume"]["seq"] == 2 and seen["resume"]["cid"] == fake_cid(2)
    assert [p["step"] for p in seen["points"]] == [20]  # only reports that carried progress
    progress = store.latest_progress(job_id)
    assert progress is not None and progress.step == 20 and progress.fraction == 0.02
    # the next attempt resumes from the kept one, and says so in its attempt row
    ref = store.resume_for(job_id, 1, a)
    assert ref is not None and (ref.cid, ref.attempt, ref.seq) == (fake_cid(2), 1, 2)
    assert ref.wallet == WALLETS[0] and ref.progress is not None and ref.progress.step == 20
    assert store.attempts_of(job_id)[0]["resume_cid"] == fake_cid(2)
    # once seq 6 is kept, seq 2 is the keeper's to unpin (and only it); after that, all of a
    # job settled before the cutoff
    (todo,) = store.checkpoints_to_keep(8)
    store.checkpoint_kept(todo["id"])
    assert [cid for _, cid in store.checkpoints_to_release(time.time() - 60)] == [fake_cid(2)]
    two = _row(store, job_id, 2)["id"]
    assert not store.cid_pinned_by_others(fake_cid(2), [two])
    store.checkpoints_unpinned([two])
    assert store.checkpoints_to_release(time.time() - 60) == []
    with store.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.job_id == job_id).values(state="failed"))
    assert [cid for _, cid in store.checkpoints_to_release(time.time() + 1)] == [fake_cid(6)]


# --------------------------------------------------------------------------- the keeper


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpfsSwarm]:
    """``node``: the provider's IPFS daemon; ``sched``: the scheduler's (connected)."""
    swarm = IpfsSwarm(tmp_path_factory.mktemp("ckpt-swarm"), ["node", "sched"]).start()
    try:
        yield swarm
    finally:
        swarm.stop()


def _checkpoint_dir(root: Path, step: int, extra: bytes = b"") -> Path:
    d = root / f"ckpt-{step}-{time.time_ns()}"
    (d / "state").mkdir(parents=True)
    (d / "state" / "model.bin").write_bytes(os.urandom(20_000) + extra)
    (d / "progress.json").write_text(f'{{"step": {step}, "total": 100}}')
    return d


def _wait_idle(keeper: CheckpointKeeper, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    keeper.once()
    while not keeper.idle():
        assert time.monotonic() < deadline, "the keeper did not finish in time"
        time.sleep(0.05)


def _row(store: Store, job_id: str, seq: int) -> dict[str, Any]:
    t = job_checkpoints
    with store.engine.connect() as conn:
        row = conn.execute(select(t).where(t.c.job_id == job_id, t.c.seq == seq)).one()
    return dict(row._mapping)


def test_the_keeper_copies_checkpoints_to_its_own_node_and_unpins_what_it_no_longer_needs(
    pair: IpfsSwarm, tmp_path: Path
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'sched.db'}")
    store.migrate()
    provider = IpfsStore(pair["node"].api_addr)
    sched = IpfsStore(pair["sched"].api_addr, timeout=10, resolve_timeout=2)
    keeper = CheckpointKeeper(
        store,
        sched,
        Settings(work_dir=tmp_path / "work"),
        options=CheckpointSettings(checkpoint_retention_s=3600, checkpoint_keep_timeout_s=3),
    )
    keeper.backoff_s = 0.2
    try:
        job_id = checkpoint_job(store)
        a = node(store, WALLETS[0])
        assert take(store, a) == [job_id]

        def post(seq: int, cid: str) -> None:
            assert store.add_checkpoint(job_id, a, WALLETS[0], report(seq, cid), keep_rows=500)

        first = provider.add_dir(_checkpoint_dir(tmp_path, 10))
        assert not sched.pinned(first)
        post(1, first)
        _wait_idle(keeper)
        assert _row(store, job_id, 1)["kept_at"] is not None
        assert sched.pinned(first)  # copied over bitswap and pinned on the scheduler's node
        ref = store.resume_for(job_id, 1, a)
        assert ref is not None and ref.cid == first

        # a newer one is kept and the older one unpinned
        second = provider.add_dir(_checkpoint_dir(tmp_path, 20))
        post(2, second)
        _wait_idle(keeper)
        assert sched.pinned(second) and not sched.pinned(first)
        assert _row(store, job_id, 1)["unpinned_at"] is not None

        # over max_bytes (64 KiB) whatever the report said: given up at once, nothing pinned
        big = provider.add_dir(_checkpoint_dir(tmp_path, 30, extra=os.urandom(80_000)))
        post(3, big)
        started = time.monotonic()
        _wait_idle(keeper)
        row = _row(store, job_id, 3)
        assert row["kept_at"] is None and "larger than the 65536-byte cap" in row["keep_error"]
        assert not sched.pinned(big) and time.monotonic() - started < 10
        ref = store.resume_for(job_id, 1, a)
        assert ref is not None and ref.cid == second  # the newest KEPT one

        # one that exists nowhere: tried a few times, each bounded, then given up
        missing = bytes_cid(os.urandom(64))
        post(4, missing)
        started = time.monotonic()
        deadline = started + 60
        while _row(store, job_id, 4)["keep_error"] is None:
            assert time.monotonic() < deadline, "never given up"
            _wait_idle(keeper)
            time.sleep(0.1)
        assert "gave up after 4 tries" in _row(store, job_id, 4)["keep_error"]
        assert time.monotonic() - started < 4 * (3 + 2) + 10
        assert sched.pinned(second)  # the failures cost the kept checkpoint nothing

        # retention: a settled job's checkpoints stay pinned until the retention has passed
        with store.engine.begin() as conn:  # the job settled half an hour ago
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id)
                .values(state="released", updated_at=time.time() - 1800)
            )
        assert keeper.release() == 0 and sched.pinned(second)  # 1 h retention: not yet
        keeper.options = CheckpointSettings(checkpoint_retention_s=60)
        assert keeper.release() == 1
        assert not sched.pinned(second)
        assert store.checkpoints_of(job_id, 500)["resume"] is None
        assert store.resume_for(job_id, 2, a) is None
    finally:
        keeper.close()
        provider.close()
        sched.close()
        store.close()


def test_a_lost_attempt_s_last_checkpoint_is_taken_for_a_minute_only(store: Store) -> None:
    """The agent takes a last copy when a run is stopped (``final``): accepted within LATE_S of
    the attempt's end, refused (409, ConflictError) after."""
    job_id = checkpoint_job(store)
    a = node(store, WALLETS[0])
    assert take(store, a, lease_ttl=-1) == [job_id]
    assert store.expire_leases() == [job_id]  # the attempt ended: its lease was lost
    last = report(1, fake_cid(1), step=5).model_copy(update={"final": True})
    assert store.add_checkpoint(job_id, a, WALLETS[0], last, keep_rows=500)
    assert store.checkpoints_of(job_id, 500)["latest"]["final"] is True
    store.clock = lambda: time.time() + LATE_S + 5
    with pytest.raises(ConflictError, match="ended"):
        store.add_checkpoint(job_id, a, WALLETS[0], report(2, fake_cid(2)), keep_rows=500)
