"""The mediator's task table (mediator/tasks.py) read as data: every kind reachable from a chain
event and able to end, a handler for each, and docs/mediator.md drawing the same table."""

from __future__ import annotations

from pathlib import Path

from mediator import Mediator
from mediator.tasks import HANDLERS, TABLE, Kind, Step, markdown_table, reachable, targets

DOC = Path(__file__).resolve().parents[2] / "docs" / "mediator.md"


def test_every_kind_is_reachable_from_a_chain_event() -> None:
    assert reachable() == set(Kind)
    assert all(m.step.value.startswith("chain:") for m in TABLE if m.source is None)


def test_every_kind_can_end() -> None:
    for kind in Kind:
        assert any(m.source is kind and m.target is None for m in TABLE), kind


def test_a_ruling_ends_its_task_and_a_lost_one_reopens_it() -> None:
    for kind in (Kind.CHECK, Kind.DISPUTE, Kind.TIE):
        assert targets(kind, Step.RULED) == {None}
    for kind in (Kind.CHECK, Kind.DISPUTE):
        assert targets(kind, Step.RULING_LOST) == {kind}
    assert targets(Kind.REVEAL, Step.RULED) == set()  # a reveal never rules
    assert targets(Kind.CHECK, Step.SPOT_DRAWN) == {Kind.DISPUTE}


def test_no_move_is_listed_twice() -> None:
    assert len(set(TABLE)) == len(TABLE)


def test_each_kind_has_a_handler_on_the_mediator() -> None:
    assert set(HANDLERS) == set(Kind)
    for kind, name in HANDLERS.items():
        assert callable(getattr(Mediator, name, None)), f"{kind}: Mediator.{name} is missing"


def test_the_doc_draws_the_same_table() -> None:
    text = DOC.read_text()
    begin, end = "<!-- tasks table: begin -->\n", "<!-- tasks table: end -->"
    assert begin in text and end in text, f"{DOC} lacks the tasks table markers"
    drawn = text.split(begin, 1)[1].split(end, 1)[0]
    assert drawn == markdown_table(), (
        "docs/mediator.md's task table is out of date: paste `python -m mediator.tasks`"
    )
    for kind in Kind:
        assert f"`{kind.value}`" in drawn
