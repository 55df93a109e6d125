"""The mediator's tasks as plain data: the kinds of work it owes a job, what opens each, and the
table of what handling one may lead to (another task, the same one again later, or the end).

Pure: no I/O. The state file (:mod:`mediator.state`, table ``tasks``) keeps one row per (job,
attempt, :class:`Kind`); the service (:mod:`mediator.service`) runs each due row through the
handler :data:`HANDLERS` names for its kind. docs/mediator.md draws the same table
(:func:`markdown_table`, checked by tests/mediator/test_tasks.py).

A new kind of work is a member of :class:`Kind`, its handler an entry of :data:`HANDLERS`, and
what opens and ends it rows of :data:`TABLE`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["HANDLERS", "TABLE", "Kind", "Move", "Step", "markdown_table", "reachable", "targets"]


class Kind(StrEnum):
    """What the mediator owes a job (``tasks.kind``)."""

    CHECK = "check"
    """Check a submitted result within its challenge window (rule only if it fails; on a spot
    job, draw whether the attempt is checked)."""
    DISPUTE = "dispute"
    """Rule on a disputed result: not upheld if it fails its check; if it passes and the job is
    deterministic, re-run it elsewhere and compare (a tie-break when the re-run differs)."""
    REVEAL = "reveal"
    """Reveal a settled spot job's seed to the scheduler (``POST API.SPOT``), keyed by the job
    with attempt 0; retried while the scheduler is down or has not seen the settlement."""
    TIE = "tie"
    """Break the tie of a replicated job whose seats' results have no majority (re-run it
    elsewhere; rule the seats that agree with the re-run upheld, the others wrong). Keyed by seat
    0 with attempt 0."""


class Step(StrEnum):
    """What opens a task, or what handling one concludes. ``chain:`` steps are the escrow's
    events as the mediator folds them."""

    RESULT_SUBMITTED = "chain:ResultSubmitted"
    RESULT_DISPUTED = "chain:ResultDisputed"
    SPOT_SETTLED = "chain: a spot job settled"
    """Any event that leaves a ``FLAG_SPOT`` job in a terminal status (released, refunded)."""
    SPOT_DRAWN = "spot attempt drawn"
    """The seed draws the attempt: the mediator disputes it itself (its ``ResultDisputed``)."""
    SEAT_INTACT = "replicated seat intact"
    """An intact result of a replicated job's seat: the seats' tie, if any, is the mediator's."""
    AGAIN = "due again"
    """Unreachable, unsure, a re-run still running, an error: the same task, later."""
    RULING_LOST = "ruling reorged out"
    """A sent ruling no longer on the chain while the job is still open: decided again."""
    RULED = "ruled"
    """``rule`` sent (upheld or not), or refused by the escrow: never sent twice."""
    NO_RULING = "no ruling"
    """Intact and undisputed, the window about to close, or nothing proves the provider wrong."""
    MOOT = "moot"
    """The job moved on (another attempt or status), is unknown, or was ruled already."""
    REVEALED = "revealed"
    """The scheduler took the seed (or cannot ever take it)."""


@dataclass(frozen=True)
class Move:
    """``source`` (``None``: opened by a chain event) becomes ``target`` (``None``: the task is
    done) on ``step``."""

    source: Kind | None
    step: Step
    target: Kind | None


K = Kind
S = Step

TABLE: tuple[Move, ...] = (
    Move(None, S.RESULT_SUBMITTED, K.CHECK),
    Move(None, S.RESULT_DISPUTED, K.DISPUTE),
    Move(None, S.SPOT_SETTLED, K.REVEAL),
    Move(K.CHECK, S.SPOT_DRAWN, K.DISPUTE),
    Move(K.CHECK, S.SEAT_INTACT, K.TIE),
    Move(K.CHECK, S.AGAIN, K.CHECK),
    Move(K.DISPUTE, S.AGAIN, K.DISPUTE),
    Move(K.REVEAL, S.AGAIN, K.REVEAL),
    Move(K.TIE, S.AGAIN, K.TIE),
    Move(K.CHECK, S.RULING_LOST, K.CHECK),
    Move(K.DISPUTE, S.RULING_LOST, K.DISPUTE),
    Move(K.CHECK, S.RULED, None),
    Move(K.DISPUTE, S.RULED, None),
    Move(K.TIE, S.RULED, None),
    Move(K.CHECK, S.NO_RULING, None),
    Move(K.DISPUTE, S.NO_RULING, None),
    Move(K.TIE, S.NO_RULING, None),
    Move(K.CHECK, S.MOOT, None),
    Move(K.DISPUTE, S.MOOT, None),
    Move(K.REVEAL, S.MOOT, None),
    Move(K.TIE, S.MOOT, None),
    Move(K.REVEAL, S.REVEALED, None),
)
"""Every move a task may make. The service opens tasks only on the ``None``-source rows' steps
(:meth:`mediator.service.Mediator._fold`) and the moves out of a kind happen in its handler."""

HANDLERS: dict[Kind, str] = {
    K.CHECK: "_result",
    K.DISPUTE: "_result",
    K.REVEAL: "_reveal",
    K.TIE: "_tie",
}
"""The :class:`mediator.service.Mediator` method that handles a due task of each kind, called
with the task and the job's folded state."""


def targets(source: Kind | None, step: Step) -> set[Kind | None]:
    """What ``source`` may become on ``step`` (empty: that step does not apply to it)."""
    return {m.target for m in TABLE if m.source == source and m.step == step}


def reachable() -> set[Kind]:
    """The kinds a chain event leads to, directly or through other tasks."""
    found: set[Kind] = set()
    frontier: list[Kind | None] = [None]
    while frontier:
        source = frontier.pop()
        for m in TABLE:
            if m.source == source and m.target is not None and m.target not in found:
                found.add(m.target)
                frontier.append(m.target)
    return found


def markdown_table() -> str:
    """The table for docs/mediator.md: one line per (step, target), its sources joined."""
    groups: dict[tuple[Step, Kind | None], list[str]] = {}
    for m in TABLE:
        groups.setdefault((m.step, m.target), []).append(
            "(chain event)" if m.source is None else f"`{m.source}`"
        )
    lines = ["| task | on | becomes |", "| --- | --- | --- |"]
    for (step, to), froms in groups.items():
        becomes = "done" if to is None else f"`{to}`"
        lines.append(f"| {', '.join(froms)} | {step.value} | {becomes} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m mediator.tasks: the table for docs/mediator.md
    sys.stdout.write(markdown_table())
