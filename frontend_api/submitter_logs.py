"""``gridmarket logs JOB [-f]``: a job's attempts and its live log lines, each with its time
(UTC), attempt, node and stream; a replicated job's lines per seat. With ``--follow`` it polls
the front end (``/api/jobs/{job_id}/logs?after=<id>``) until no run of the job (of any seat)
can write more, then exits. A job whose scheduler kept no live log shows the last run's
stdout/stderr tails, as before live logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .format import short
from .submitter_client import CliError, Frontend

__all__ = ["RUNNING", "format_line", "show_logs"]

RUNNING = frozenset({"pending_spec", "queued", "leased", "verifying"})
"""Scheduler states in which a run may still write lines (as :mod:`frontend_api.joblogs`)."""


def format_line(line: dict[str, Any], seat: int | None = None) -> str:
    """``00:12:03.250  [seat 1  ]attempt 2  n-abc  stderr  text`` (no newline)."""
    ts = float(line.get("ts") or 0.0)
    stamp = time.strftime("%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}"
    where = f"seat {seat}  " if seat is not None else ""
    text = str(line.get("text", "")).rstrip("\n")
    return (
        f"{stamp}  {where}attempt {line.get('attempt')}  {line.get('node_id')}  "
        f"{line.get('stream', 'stdout'):<6}  {text}"
    )


def _seats(view: dict[str, Any], jid: str) -> list[tuple[int | None, str]]:
    group = view.get("group") or {}
    seats: list[tuple[int | None, str]] = [
        (int(s["seat"]), str(s["job_id"])) for s in group.get("seats") or []
    ]
    return seats or [(None, jid)]


def _attempts(view: dict[str, Any], echo: Callable[[str], None], seat: int | None) -> None:
    sched = view.get("scheduler") or {}
    where = f"seat {seat}: " if seat is not None else ""
    attempts = sched.get("attempts") or []
    if not attempts:
        echo(f"{where}no attempt yet")
    for a in attempts:
        echo(
            f"{where}attempt {a['attempt']} on {a['node_id']} ({short(a['wallet'])}): "
            f"{a.get('outcome') or 'running'} {a.get('detail') or ''}".rstrip()
        )


def _running(view: dict[str, Any]) -> bool:
    sched = view.get("scheduler")
    if not sched:  # not seen by the scheduler yet: it may still run
        return not view.get("final")
    return sched.get("state") in RUNNING


def show_logs(
    fe: Frontend,
    jid: str,
    *,
    follow: bool = False,
    timeout: float = 24 * 3600,
    poll_s: float = 1.0,
    echo: Callable[[str], None] = print,
) -> None:
    """Print the job's attempts and log lines; with ``follow``, keep printing new lines until
    no seat can run again (:class:`CliError` after ``timeout`` seconds)."""
    view = fe.get(f"/api/jobs/{jid}")
    seats = _seats(view, jid)
    views = {sid: (view if sid == jid else fe.get(f"/api/jobs/{sid}")) for _, sid in seats}
    for seat, sid in seats:
        _attempts(views[sid], echo, seat)
    cursors = {sid: 0 for _, sid in seats}
    printed = 0
    deadline = time.monotonic() + timeout
    while True:
        running = False
        for seat, sid in seats:
            if follow:  # the state first: lines written before it changed are then all in
                views[sid] = fe.get(f"/api/jobs/{sid}")
                running = running or _running(views[sid])
            while True:
                page = fe.get(f"/api/jobs/{sid}/logs", params={"after": cursors[sid]})
                for line in page.get("lines") or []:
                    echo(format_line(line, seat))
                    printed += 1
                cursors[sid] = int(page.get("next") or cursors[sid])
                if not page.get("more"):
                    break
        if not follow or not running:
            break
        if time.monotonic() > deadline:
            raise CliError(f"job {jid} still runs after {timeout:.0f} s")
        time.sleep(poll_s)
    if printed:
        return
    for seat, sid in seats:  # no live log kept: the last run's tails
        result = (views[sid].get("scheduler") or {}).get("result") or {}
        where = f" (seat {seat})" if seat is not None else ""
        for name in ("stdout_tail", "stderr_tail"):
            if result.get(name):
                echo(f"--- {name.removesuffix('_tail')}{where}")
                echo(result[name].rstrip("\n"))
