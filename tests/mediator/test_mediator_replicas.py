"""The mediator's tie-break of a replicated job (docs/mediator.md "The tie-break of a replicated
job") on a real anvil and the real js-ipfs daemon, under JobEscrow version 5's rules for a
ruling on a seat: only while the seats' results hold no strict majority, once every seat has
delivered or the deadline has passed, and before ``deadline + mediationWindow``. The mediator
waits for exactly that: it funds no re-run while a seat may still break the tie, none when a
majority agrees (``resolve`` settles it), and tries no ruling once the window has closed."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account.signers.local import LocalAccount

from devstack.ipfs import IpfsDaemon
from gridmarket.chain import ChainError, Deployment, EscrowClient
from gridmarket.escrow import JobState, Status, rule_args
from gridmarket.ipfs import IpfsStore
from mediator import Mediator
from mediator.rulings import seat_ruling_blocked
from mediator.tasks import Kind

from ..conftest import Devnet
from ..scheduler.harness import advance, fresh_escrow, register_on_chain
from .test_mediator import (
    BOUNTY,
    CONFIG,
    WASM_SPEC,
    assign,
    chain_now,
    mediator,
    ruled_events,
    take_rerun,
    to_base58btc,
    until,
)

K = 3
DURATION = 3600
MEDIATION_WINDOW = 7200
MARGIN = int(CONFIG.window_margin_s)


@pytest.fixture
def escrow(devnet: Devnet) -> tuple[Deployment, EscrowClient]:
    deployment, client = fresh_escrow(
        devnet, challenge_window=3600, reassign_delay=60, mediation_window=MEDIATION_WINDOW
    )
    for provider in devnet.providers[:4]:
        register_on_chain(client, provider)
    return deployment, client


@pytest.fixture
def store(ipfs_daemon: IpfsDaemon) -> Iterator[IpfsStore]:
    with IpfsStore(ipfs_daemon.api_addr) as s:
        yield s


def seats_of(
    devnet: Devnet, client: EscrowClient, store: IpfsStore
) -> tuple[bytes, list[JobState]]:
    """A replicated WASM job of K seats naming the listed mediator, due in DURATION s."""
    spec_cid = store.add_bytes(WASM_SPEC.to_bytes())
    group, seats, _ = client.create_replicated(
        devnet.submitter,
        os.urandom(32),
        spec_cid,
        chain_now(client) + DURATION,
        K * BOUNTY,
        K,
    )
    assert all(s.job.mediator == devnet.mediator.address for s in seats)
    return group, seats


def deliver(
    devnet: Devnet, client: EscrowClient, seat: JobState, provider: LocalAccount, output: str
) -> JobState:
    state = assign(devnet, client, seat, provider)
    state, _ = client.call_job(provider, "submitResult", state, output)
    return state


def now_seats(client: EscrowClient, seats: list[JobState]) -> list[JobState]:
    return [client.job_state(s.job_id) for s in seats]


def statuses(client: EscrowClient, seats: list[JobState]) -> list[Status]:
    return [Status(int(client.call("statusOf", s.job_id))) for s in seats]


def tie_task(med: Mediator, seats: list[JobState]) -> tuple[bool, str] | None:
    """The replicated job's ``tie`` task (keyed by seat 0, attempt 0): (done, note)."""
    with sqlite3.connect(med.state.path) as db:
        row = db.execute(
            "SELECT done, note FROM tasks WHERE job_id = ? AND attempt = 0 AND kind = ?",
            (seats[0].job_id.hex(), str(Kind.TIE)),
        ).fetchone()
    return None if row is None else (bool(row[0]), str(row[1]))


def tie_task_note(med: Mediator, seats: list[JobState]) -> tuple[bool, str]:
    found = tie_task(med, seats)
    assert found is not None, "no tie task"
    return found


def contract_takes(client: EscrowClient, devnet: Devnet, seats: list[JobState], i: int) -> bool:
    """Whether ``rule`` on seat i would go through now (an eth_call from the mediator)."""
    target, jobs, index = rule_args(seats[i], seats)
    try:
        client.w3.eth.call(
            {
                "from": devnet.mediator.address,
                "to": client.address,
                "data": client.encode("rule", target, jobs, index, True),
            }
        )
    except Exception:
        return False
    return True


def test_a_tie_waits_for_every_seat_then_the_rerun_rules_them_within_the_window(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    """Three seats, three intact different outputs: while seat 2 still runs the mediator funds
    nothing (the escrow would refuse a ruling: seats pending); once it delivers, the mediator
    re-runs the job on a fourth provider, due at ``deadline + mediationWindow`` less its margin,
    and rules the seat that agrees upheld and one that differs wrong. That seat is offered
    again, so the last one waits for the deadline and is ruled wrong then."""
    deployment, client = escrow
    a, b, c, d = devnet.providers[:4]
    _, seats = seats_of(devnet, client, store)
    deadline = seats[0].job.deadline
    right = store.add_bytes(b"mean=42.5\n" + os.urandom(4))
    outputs = [right, store.add_bytes(b"mean=41.0\n"), store.add_bytes(b"mean=40.0\n")]
    seats[0] = deliver(devnet, client, seats[0], a, outputs[0])
    seats[1] = deliver(devnet, client, seats[1], b, outputs[1])
    seats[2] = assign(devnet, client, seats[2], c)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db", rerun_poll_s=0.2) as med:
        for _ in range(5):
            med.poll_once()
        done, note = tie_task_note(med, seats)
        assert (done, note) == (False, "seats still running")
        assert med.state.reruns() == []
        blocked = seat_ruling_blocked(seats, 0, chain_now(client), MEDIATION_WINDOW)
        assert blocked is not None and blocked[0] == "pending"
        assert not contract_takes(client, devnet, seats, 0)  # the escrow agrees

        seats[2], _ = client.call_job(c, "submitResult", seats[2], outputs[2])
        assert seat_ruling_blocked(seats, 0, chain_now(client), MEDIATION_WINDOW) is None
        assert contract_takes(client, devnet, seats, 0)
        until(med, lambda: bool(med.state.reruns()), what="the tie-break re-run")
        (rerun,) = med.state.reruns()
        assert rerun.job_id == seats[0].job_id and rerun.status == "funded"
        assert rerun.deadline == deadline + MEDIATION_WINDOW - MARGIN
        take_rerun(devnet, client, rerun.rerun_id, d, to_base58btc(right))
        until(
            med,
            lambda: statuses(client, seats)[:2] == [Status.RELEASED, Status.FUNDED],
            what="the rulings on seats 0 and 1",
        )
        assert statuses(client, seats) == [Status.RELEASED, Status.FUNDED, Status.SUBMITTED]
        for _ in range(5):
            med.poll_once()
        done, note = tie_task_note(med, seats)
        assert not done and "the rest wait" in note, note
        assert ruled_events(client, seats[2]) == []  # seat 1 runs again: no ruling on seat 2 yet
        assert Status(int(client.call("statusOf", rerun.rerun_id))) is Status.RELEASED

        advance(client.w3, deadline - chain_now(client) + 1)  # the deadline has passed
        until(med, lambda: statuses(client, seats)[2] is Status.FUNDED, what="the ruling on seat 2")
        assert statuses(client, seats) == [Status.RELEASED, Status.FUNDED, Status.FUNDED]
        done, note = tie_task_note(med, seats)
        assert done and note.startswith("ruled 1 seats"), note
    upheld = [bool(e.args["upheld"]) for s in seats for e in ruled_events(client, s)]
    assert upheld == [True, False, False]
    slashed = [
        e.args["provider"]
        for e in client.events(deployment.block, "latest")
        if e.name == "ProviderSlashed"
    ]
    assert slashed == [b.address, c.address]


def test_no_tie_break_when_a_majority_agrees(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    """Two seats of three agree: the escrow takes no ruling on any seat (``JobEscrowMajority``)
    and the mediator funds no re-run; ``resolve`` pays the majority and slashes the third."""
    deployment, client = escrow
    a, b, c = devnet.providers[:3]
    group, seats = seats_of(devnet, client, store)
    same = store.add_bytes(b"mean=42.5\n" + os.urandom(4))
    other = store.add_bytes(b"mean=41.0\n" + os.urandom(4))
    seats[0] = deliver(devnet, client, seats[0], a, same)
    seats[1] = deliver(devnet, client, seats[1], b, other)
    seats[2] = deliver(devnet, client, seats[2], c, same)
    blocked = seat_ruling_blocked(seats, 1, chain_now(client), MEDIATION_WINDOW)
    assert blocked is not None and blocked[0] == "majority"
    assert not contract_takes(client, devnet, seats, 1)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m2.db", rerun_poll_s=0.2) as med:
        until(med, lambda: (tie_task(med, seats) or (False, ""))[0], what="the tie task's end")
        done, note = tie_task_note(med, seats)
        assert done and note.startswith("a majority agrees"), note
        assert med.state.reruns() == []
        assert all(ruled_events(client, s) == [] for s in seats)
    settled, _ = client.resolve(devnet.submitter, group, now_seats(client, seats))
    assert [s.status for s in settled] == [Status.RELEASED, Status.REFUNDED, Status.RELEASED]


def test_no_ruling_is_tried_once_the_seats_mediation_window_has_closed(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    """Two seats deliver different outputs, the third is never taken: past the deadline the
    escrow would take a ruling (until ``deadline + mediationWindow``), not after. A mediator
    that looks only once that window has closed funds no re-run and sends nothing."""
    deployment, client = escrow
    a, b = devnet.providers[:2]
    _, seats = seats_of(devnet, client, store)
    deadline = seats[0].job.deadline
    seats[0] = deliver(devnet, client, seats[0], a, store.add_bytes(b"x=1\n" + os.urandom(4)))
    seats[1] = deliver(devnet, client, seats[1], b, store.add_bytes(b"x=2\n" + os.urandom(4)))
    advance(client.w3, deadline - chain_now(client) + 1)
    assert seat_ruling_blocked(seats, 0, chain_now(client), MEDIATION_WINDOW) is None
    assert contract_takes(client, devnet, seats, 0)  # past the deadline, within the window
    advance(client.w3, MEDIATION_WINDOW)
    blocked = seat_ruling_blocked(seats, 0, chain_now(client), MEDIATION_WINDOW)
    assert blocked is not None and blocked[0] == "closed"
    assert not contract_takes(client, devnet, seats, 0)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db", rerun_poll_s=0.2) as med:
        until(
            med,
            lambda: len(med.decisions) >= 2 and not med.state.pending_tasks(),
            what="both checks",
        )
        assert med.state.reruns() == []
        assert [d.verdict for d in med.decisions] == ["no ruling", "no ruling"], med.decisions
        assert med.counters["rulings_refused"] == 0
    assert all(ruled_events(client, s) == [] for s in seats)
    with pytest.raises(ChainError):
        client.rule(devnet.mediator, seats[0], True, seats)
