"""The store's live-log table (``job_logs``) on SQLite and PostgreSQL: only the attempt's node
may add, a repost of a ``seq`` is a no-op, and a job keeps only its newest batches."""

from __future__ import annotations

import pytest

from scheduler.store import Store
from scheduler.store.logs import NotAssigneeError
from tests.scheduler.test_store import WALLETS, jid, node, queue_jobs, take


def chunk(text: str) -> dict[str, object]:
    return {"stream": "stdout", "ts": 1.0, "text": text}


def test_assignee_only_idempotent_and_bounded(store: Store) -> None:
    queue_jobs(store, 1)
    a, b = (node(store, w) for w in WALLETS[:2])
    assert take(store, a) == [jid(1)]
    keep = {"keep_chars": 250, "keep_batches": 3}
    with pytest.raises(NotAssigneeError):
        store.add_logs(jid(1), b, 1, 0, [chunk("forged\n")], **keep)
    with pytest.raises(NotAssigneeError):  # no such attempt
        store.add_logs(jid(1), a, 2, 0, [chunk("x\n")], **keep)
    assert store.add_logs(jid(1), a, 1, 0, [chunk("a" * 100)], **keep) is True
    assert store.add_logs(jid(1), a, 1, 0, [chunk("again")], **keep) is False  # repost
    assert [r["chunks"][0]["text"] for r in store.logs_of(jid(1))] == ["a" * 100]
    for seq, letter in enumerate("bcd", start=1):
        assert store.add_logs(jid(1), a, 1, seq, [chunk(letter * 100)], **keep)
    rows = store.logs_of(jid(1))  # 400 characters over 250: the oldest two went
    assert [r["seq"] for r in rows] == [2, 3]
    assert all(r["node_id"] == a and r["attempt"] == 1 for r in rows)
    assert store.logs_of(jid(1), after=rows[0]["id"]) == rows[1:]
    for seq in range(4, 9):  # small batches: the batch count bounds them
        store.add_logs(jid(1), a, 1, seq, [chunk("z")], **keep)
    assert [r["seq"] for r in store.logs_of(jid(1))] == [6, 7, 8]
