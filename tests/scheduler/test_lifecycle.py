"""The job lifecycle table (scheduler/lifecycle.py): every row, every refused pair, the doc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gridmarket.escrow import JOB_EVENTS
from gridmarket.wire import RunReason
from scheduler import lifecycle
from scheduler.lifecycle import CHAIN_EVENTS, FOLD_ONLY, OPEN, TABLE, Event, Fault, State

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"
ROWS = {(t.source, t.event): t.target for t in TABLE}
FINAL = [s for s in State if s not in OPEN]


@pytest.mark.parametrize("row", TABLE, ids=lambda t: f"{t.source}+{t.event.value}")
def test_every_row_moves_its_source_to_its_target(row: lifecycle.Transition) -> None:
    assert lifecycle.target(row.source, row.event) is row.target
    assert lifecycle.step(row.source, row.event) is row.target
    if row.source is not None:
        assert lifecycle.step(row.source.value, row.event) is row.target  # as read from the db
        assert row.source in lifecycle.sources(row.event)


def test_every_pair_not_in_the_table_is_refused() -> None:
    refused = 0
    for state in [None, *State]:
        for event in Event:
            if (state, event) in ROWS:
                continue
            refused += 1
            assert lifecycle.target(state, event) is None
            with pytest.raises(lifecycle.RefusedError, match=re.escape(repr(event.value))):
                lifecycle.step(state, event)
    assert refused == (len(State) + 1) * len(Event) - len(TABLE)


def test_the_table_has_one_row_per_pair_and_uses_every_state_and_event() -> None:
    assert len(ROWS) == len(TABLE)
    assert {t.event for t in TABLE} == set(Event)
    assert {t.target for t in TABLE} | {t.source for t in TABLE if t.source} == set(State)
    assert all(t.why for t in TABLE)


def test_a_job_is_born_pending_spec_and_only_chain_events_move_a_final_state() -> None:
    assert lifecycle.sources(Event.CREATED) == ()
    assert lifecycle.step(None, Event.CREATED) is State.PENDING_SPEC
    assert [e for e in Event if lifecycle.target(None, e)] == [Event.CREATED]
    for state in FINAL:
        moves = {e for e in Event if lifecycle.target(state, e) is not None}
        assert moves <= {Event.RELEASED_ON_CHAIN, Event.REFUNDED_ON_CHAIN}, state
    for state in (State.RELEASED, State.REFUNDED):  # money moved: nothing moves them again
        assert not [e for e in Event if lifecycle.target(state, e) is not None]


def test_every_open_state_can_be_given_up_and_refunded() -> None:
    assert set(lifecycle.sources(Event.GIVEN_UP)) == set(OPEN)
    assert set(OPEN) <= set(lifecycle.sources(Event.REFUNDED_ON_CHAIN))


def test_the_escrow_events_are_all_accounted_for() -> None:
    assert set(CHAIN_EVENTS) | FOLD_ONLY == set(JOB_EVENTS)
    assert not set(CHAIN_EVENTS) & FOLD_ONLY
    assert all(e.value == "chain:" + name for name, e in CHAIN_EVENTS.items())


@pytest.mark.parametrize(
    ("failures", "max_attempts", "late", "then", "ends"),
    [
        (0, 3, False, None, State.QUEUED),
        (2, 3, False, None, State.QUEUED),
        (3, 3, False, Event.ATTEMPTS_USED_UP, State.FAILED),
        (3, 3, True, Event.ATTEMPTS_USED_UP, State.FAILED),  # used-up wins over late
        (1, 3, True, Event.DEADLINE_PASSED, State.EXPIRED),
    ],
)
def test_a_job_going_back_to_the_queue_meets_its_attempts_then_its_deadline(
    failures: int, max_attempts: int, late: bool, then: Event | None, ends: State
) -> None:
    got = lifecycle.on_requeue(failures=failures, max_attempts=max_attempts, deadline_passed=late)
    assert got is then
    assert (State.QUEUED if got is None else lifecycle.step(State.QUEUED, got)) is ends


@pytest.mark.parametrize(
    ("error", "event"),
    [
        ("JobEscrowDeadlinePassed(5, 4)", Event.ASSIGN_REFUSED_FOR_GOOD),
        ("JobStatus(RELEASED)", Event.ASSIGN_REFUSED_FOR_GOOD),
        ("JobEscrowProviderNotEligible(0xab)", Event.ASSIGN_REFUSED),
    ],
)
def test_an_assign_refused_for_the_job_itself_is_for_good(error: str, event: Event) -> None:
    assert lifecycle.assign_refusal(error) is event
    assert lifecycle.step(State.LEASED, event) in (State.QUEUED, State.FAILED)


def test_the_doc_draws_the_same_table() -> None:
    text = DOC.read_text()
    begin, end = "<!-- lifecycle table: begin -->\n", "<!-- lifecycle table: end -->"
    assert begin in text and end in text, f"{DOC} lacks the lifecycle table markers"
    drawn = text.split(begin, 1)[1].split(end, 1)[0]
    assert drawn == lifecycle.markdown_table(), (
        "docs/scheduler.md's job table is out of date: paste `python -m scheduler.lifecycle`"
    )
    for state in State:
        assert f"`{state.value}`" in drawn


# --------------------------------------------------------------------------- whose fault


@pytest.mark.parametrize(
    ("reason", "message", "fault"),
    [
        (RunReason.EXIT_CODE, "exited with code 3", Fault.JOB),
        (RunReason.OUT_OF_MEMORY, "killed at the memory limit of 67108864 bytes", Fault.JOB),
        (RunReason.OUTPUT_TOO_LARGE, "output is over the 1024-byte cap", Fault.JOB),
        (RunReason.OUTPUT_INVALID, "/output/link is a symlink", Fault.JOB),
        (RunReason.TRAPPED, "trapped: unreachable", Fault.JOB),
        (RunReason.DATASET_ERROR, "dataset bafk... does not hash to its CID", Fault.JOB),
        (RunReason.WORKLOAD_ERROR, "image 'busybox:9' is not on this node", Fault.JOB),
        (RunReason.WORKLOAD_ERROR, "WASM module: bafk... is not a valid WASM module", Fault.JOB),
        (RunReason.WORKLOAD_ERROR, "this node does not run wasm jobs", Fault.NODE),
        (
            RunReason.WORKLOAD_ERROR,
            "the job asks for 1 GPU(s) and the engine cannot provide them (no driver)",
            Fault.NODE,
        ),
        (RunReason.TIMEOUT, "killed at the time limit of 60 s", Fault.NODE_IF_IT_FITS),
        (RunReason.TIMEOUT, "ran out of fuel (1000 units)", Fault.JOB),
        (RunReason.AGENT_ERROR, "the IPFS daemon is down (dataset)", Fault.NODE),
        (RunReason.CANCELLED, "cancelled by the agent", Fault.NODE),
        (RunReason.SUCCEEDED, "", Fault.NODE),
    ],
)
def test_each_run_reason_is_the_job_s_or_the_node_s_fault(
    reason: RunReason, message: str, fault: Fault
) -> None:
    assert lifecycle.fault_of(reason, message) is fault
    event = lifecycle.run_failed(reason, message)
    assert event is (Event.JOB_FAILED if fault is Fault.JOB else Event.RUN_FAILED)
    # the job's fault ends the job; the node's sends it to another node
    assert lifecycle.step(State.LEASED, event) is (
        State.FAILED if fault is Fault.JOB else State.QUEUED
    )


def test_every_run_reason_has_a_fault_and_a_why() -> None:
    assert set(lifecycle.FAULTS) == set(RunReason)
    assert all(why for _, why in lifecycle.FAULTS.values())


def test_a_spec_fetch_backs_off_then_gives_up() -> None:
    delays = [lifecycle.spec_retry_in(n, age_s=10) for n in range(1, 9)]
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    old = lifecycle.SPEC_GIVE_UP_S
    assert [lifecycle.spec_retry_in(n, age_s=old) for n in (1, 2, 3)] == [1, 2, None]


@pytest.mark.parametrize("doc", [DOC, DOC.parent / "matching.md"], ids=lambda p: p.name)
def test_the_docs_draw_the_same_faults_table(doc: Path) -> None:
    text = doc.read_text()
    begin, end = "<!-- faults table: begin -->\n", "<!-- faults table: end -->"
    assert begin in text and end in text, f"{doc} lacks the faults table markers"
    drawn = text.split(begin, 1)[1].split(end, 1)[0]
    assert drawn == lifecycle.faults_table(), (
        f"{doc.name}'s faults table is out of date: paste `python -m scheduler.lifecycle faults`"
    )
