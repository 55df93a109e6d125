"""``gridmarket progress JOB [-f]``: a checkpointing job's progress: a bar with step/total and
percent, the newest metrics, the newest checkpoint (attempt, seq, size, age, kept by the
scheduler or not yet) and what a new attempt would resume from. It reads the front end's
``/api/jobs/{job_id}`` and ``/api/jobs/{job_id}/checkpoints`` (the scheduler's answer, checked
by :func:`frontend_api.progress.normalize`).

With ``--follow`` it polls until no run of the job can report more: on a terminal one line
redrawn in place, in a pipe (a file, ``tee``) one line per new progress point, so both read
well. A job without a checkpoint policy says so and exits 0.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from . import progress as fmt
from .format import size
from .submitter_client import CliError, Frontend
from .submitter_logs import RUNNING

__all__ = ["live_line", "show_progress"]


def _fetch(fe: Frontend, jid: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    view = fe.get(f"/api/jobs/{jid}")
    try:
        doc = fmt.normalize(fe.get(f"/api/jobs/{jid}/checkpoints"))
    except CliError as exc:
        if str(exc) != "Not Found":  # a front end from before checkpoints: the view's progress
            raise
        doc = None
    return view, doc


def _running(view: dict[str, Any]) -> bool:
    sched = view.get("scheduler")
    if not sched:  # not seen by the scheduler yet: it may still run
        return not view.get("final")
    return sched.get("state") in RUNNING and not view.get("final")


def _has_policy(view: dict[str, Any], doc: dict[str, Any] | None) -> bool:
    return bool(doc and doc.get("policy")) or fmt.has_policy(view)


def report(view: dict[str, Any], doc: dict[str, Any] | None, jid: str) -> list[str]:
    """The lines ``gridmarket progress`` prints (no follow)."""
    state = view.get("state") or "unknown"
    rows: list[tuple[str, str]] = [("job", jid), ("state", str(state).replace("_", " "))]
    if not _has_policy(view, doc):
        rows.append(
            (
                "progress",
                "this job has no checkpoint policy, so it reports no progress "
                "(a job file's `checkpoint:` asks for it: docs/submitter.md)",
            )
        )
        return _table(rows)
    progress = fmt.latest_progress(doc, view)
    rows.append(("progress", fmt.bar(progress)))
    rows.append(("metrics", fmt.metrics_text((progress or {}).get("metrics"))))
    policy = (doc or {}).get("policy")
    if policy:
        rows.append(
            (
                "policy",
                f"a checkpoint every {policy['interval_s']} s, at most {size(policy['max_bytes'])}",
            )
        )
    if doc is None:
        rows.append(("checkpoint", "the scheduler's checkpoints could not be read"))
    else:
        rows.append(("checkpoint", fmt.checkpoint_line(doc["latest"])))
        rows.append(("resume", fmt.resume_line(doc)))
        if doc["points"]:
            n = len(doc["points"])
            rows.append(("points", f"{n} progress point{'s' if n != 1 else ''} so far"))
    return _table(rows)


def _table(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"{key:<{width}}  {value}" for key, value in rows]


def live_line(view: dict[str, Any], doc: dict[str, Any] | None) -> str:
    """The one line a terminal redraws: bar, metrics, newest checkpoint."""
    progress = fmt.latest_progress(doc, view)
    parts = [fmt.bar(progress, 20)]
    metrics = fmt.metrics_text((progress or {}).get("metrics"), 3)
    if metrics != "-":
        parts.append(metrics)
    latest = (doc or {}).get("latest")
    if latest:
        kept = "kept" if latest["kept"] else "not kept yet"
        parts.append(f"checkpoint {latest['attempt']}.{latest['seq']} {kept}")
    return "  ".join(parts)


def show_progress(
    fe: Frontend,
    jid: str,
    *,
    follow: bool = False,
    timeout: float = 24 * 3600,
    poll_s: float = 2.0,
    echo: Callable[[str], None] = print,
    tty: bool | None = None,
    write: Callable[[str], None] | None = None,
) -> None:
    """Print the job's progress; with ``follow``, keep printing it until no run of the job
    can report more (:class:`CliError` after ``timeout`` seconds). ``tty`` (default: whether
    stdout is a terminal) picks the redrawn line over one line per point."""
    view, doc = _fetch(fe, jid)
    for line in report(view, doc, jid):
        echo(line)
    if not follow or not _has_policy(view, doc) or not _running(view):
        return
    if tty is None:
        tty = sys.stdout.isatty()
    out = write or _write
    seen = _newest(doc)
    drawn = ""
    deadline = time.monotonic() + timeout
    while _running(view):
        if time.monotonic() > deadline:
            if drawn:
                out("\n")
            raise CliError(f"job {jid} still runs after {timeout:.0f} s")
        time.sleep(poll_s)
        view, doc = _fetch(fe, jid)
        if tty:
            line = live_line(view, doc)
            if line != drawn:
                out(f"\r{line}\x1b[K")
                drawn = line
            continue
        for point in (doc or {}).get("points") or []:
            if (point["attempt"], point["seq"]) > seen:
                echo(fmt.point_line(point))
        seen = max(seen, _newest(doc))
    if drawn:
        out("\n")
    echo(f"job {jid} is {str(view.get('state') or 'unknown').replace('_', ' ')}: {_end(view, doc)}")


def _newest(doc: dict[str, Any] | None) -> tuple[int, int]:
    points = (doc or {}).get("points") or []
    return max(((p["attempt"], p["seq"]) for p in points), default=(0, 0))


def _end(view: dict[str, Any], doc: dict[str, Any] | None) -> str:
    return fmt.summary(fmt.latest_progress(doc, view))


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
