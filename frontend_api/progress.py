"""A checkpointing job's progress for people: the scheduler's checkpoints answer checked and
bounded (:func:`normalize`), the progress bar and metrics as text (the CLI's ``gridmarket
progress`` and ``status``, the job page), the newest checkpoint and what a new attempt resumes
from, and one small SVG line chart per metric (the job page, drawn on the server).

The answer is ``GET /v1/jobs/{job_id}/checkpoints`` (:data:`gridmarket.checkpoints.
JOB_CHECKPOINTS`, docs/scheduler.md). Its progress and points come from the job, through a
node: hostile. :func:`normalize` keeps only what has the documented shape (bounded numbers,
metric names as :mod:`gridmarket.checkpoints` allows them, at most :data:`MAX_POINTS` points,
CIDs and ids of bounded length) and drops the rest, so nothing below re-checks. The charts are
written by hand like :mod:`frontend_api.svg`'s (numbers and ``escape()``d labels only, no chart
library); the same CSS classes draw them.
"""

from __future__ import annotations

import math
import re
import time
from typing import TYPE_CHECKING, Any

from markupsafe import Markup, escape

from gridmarket.checkpoints import MAX_METRICS, MAX_STEP

from .format import ago, size

if TYPE_CHECKING:
    from .scheduler import SchedulerClient

__all__ = [
    "MAX_CHARTS",
    "MAX_POINTS",
    "attach",
    "bar",
    "chart",
    "charts",
    "checkpoint_line",
    "fraction",
    "has_policy",
    "latest_progress",
    "metrics_text",
    "normalize",
    "normalize_progress",
    "number",
    "page_view",
    "point_line",
    "resume_line",
    "summary",
]

MAX_POINTS = 2000
"""Points kept from one answer (the newest; the scheduler keeps 500 per job)."""
CHART_POINTS = 240
"""Points one chart draws at most (evenly thinned, the first and the newest always kept)."""
MAX_CHARTS = 4
"""Metric charts on the job page (the metrics the newest points carry, by name)."""
BAR_WIDTH = 30

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$")
_CID = re.compile(r"^[A-Za-z0-9]{8,128}$")
_WALLET = re.compile(r"^0x[0-9a-fA-F]{40}$")
_NODE = re.compile(r"^[A-Za-z0-9_.:-]{1,80}$")


# --------------------------------------------------------------------------- checking


def _int(value: Any, low: int = 0, high: int = MAX_STEP) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and low <= value <= high:
        return value
    return None


def _float(value: Any, low: float = -math.inf, high: float = math.inf) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) > 10**300:
        return None
    number = float(value)
    if math.isfinite(number) and low <= number <= high:
        return number
    return None


def _metrics(raw: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    if not isinstance(raw, dict):
        return out
    for name in sorted(k for k in raw if isinstance(k, str) and _NAME.match(k)):
        value = _float(raw[name])
        if value is not None:
            out[name] = value
        if len(out) == MAX_METRICS:
            break
    return out


def normalize_progress(raw: Any) -> dict[str, Any] | None:
    """``{"step", "total", "metrics"}`` of a job's progress (the job view's ``progress``, a
    checkpoint's), bounded; None when it has no usable step."""
    if not isinstance(raw, dict):
        return None
    step = _int(raw.get("step"))
    if step is None:
        return None
    total = _int(raw.get("total"), 1)
    if total is not None and total < step:
        total = None
    return {"step": step, "total": total, "metrics": _metrics(raw.get("metrics"))}


def _checkpoint(raw: Any) -> dict[str, Any] | None:
    """A ``latest``/``resume`` entry with the documented fields, or None when it has no usable
    attempt, seq or CID."""
    if not isinstance(raw, dict):
        return None
    attempt, seq = _int(raw.get("attempt"), 1, 2**16), _int(raw.get("seq"), 1, 2**31)
    cid = raw.get("cid")
    if attempt is None or seq is None or not isinstance(cid, str) or not _CID.match(cid):
        return None
    node, wallet = raw.get("node_id"), raw.get("wallet")
    return {
        "attempt": attempt,
        "seq": seq,
        "cid": cid,
        "size": _int(raw.get("size"), 0, 2**62),
        "files": _int(raw.get("files"), 0, 10**9),
        "node_id": node if isinstance(node, str) and _NODE.match(node) else None,
        "wallet": wallet if isinstance(wallet, str) and _WALLET.match(wallet) else None,
        "taken_at": _float(raw.get("taken_at"), 0, 2**40),
        "final": raw.get("final") is True,
        "kept": raw.get("kept") is True,
        "progress": normalize_progress(raw.get("progress")),
    }


def _policy(raw: Any) -> dict[str, int] | None:
    if not isinstance(raw, dict):
        return None
    interval, max_bytes = _int(raw.get("interval_s"), 1), _int(raw.get("max_bytes"))
    if interval is None or max_bytes is None:
        return None
    return {"interval_s": interval, "max_bytes": max_bytes}


def _point(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    progress = normalize_progress(raw)
    attempt, seq = _int(raw.get("attempt"), 1, 2**16), _int(raw.get("seq"), 1, 2**31)
    if progress is None or attempt is None or seq is None:
        return None
    return {
        "attempt": attempt,
        "seq": seq,
        **progress,
        "taken_at": _float(raw.get("taken_at"), 0, 2**40),
        "final": raw.get("final") is True,
    }


def normalize(doc: Any) -> dict[str, Any] | None:
    """The scheduler's checkpoints answer with the documented shape only (None when it is not
    a JSON object): ``policy``, ``latest``, ``resume`` (each None when absent or malformed),
    ``points`` (the newest :data:`MAX_POINTS` well-formed ones, oldest first), ``keep_points``."""
    if not isinstance(doc, dict):
        return None
    raw_points = doc.get("points")
    points: list[dict[str, Any]] = []
    if isinstance(raw_points, list):
        for raw in raw_points[-MAX_POINTS:]:
            point = _point(raw)
            if point is not None:
                points.append(point)
    job_id = doc.get("job_id")
    return {
        "job_id": job_id if isinstance(job_id, str) and len(job_id) <= 66 else None,
        "policy": _policy(doc.get("policy")),
        "latest": _checkpoint(doc.get("latest")),
        "resume": _checkpoint(doc.get("resume")),
        "points": points,
        "keep_points": _int(doc.get("keep_points"), 0, 10**6),
    }


# --------------------------------------------------------------------------- text


def number(value: float) -> str:
    """A metric for people: 4 significant digits (``0.3100``, ``12.35``, ``1.235e+06``)."""
    if not math.isfinite(value):
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e6 or magnitude < 1e-3:
        return f"{value:.3e}"
    if magnitude >= 1000:
        return f"{value:.0f}"
    decimals = max(0, 3 - math.floor(math.log10(magnitude)))
    return f"{value:.{decimals}f}"


def fraction(progress: dict[str, Any] | None) -> float | None:
    """``step / total`` in [0, 1]; None without a total."""
    if not progress or not progress.get("total"):
        return None
    value: float = progress["step"] / progress["total"]
    return min(1.0, max(0.0, value))


def bar(progress: dict[str, Any] | None, width: int = BAR_WIDTH) -> str:
    """``[#########---------------------]  300/1000  30.0%``, or ``step 300 (no total
    given)`` for a job that did not say how many steps it takes."""
    if not progress:
        return "no progress reported yet"
    frac = fraction(progress)
    if frac is None:
        return f"step {progress['step']} (no total given)"
    filled = int(frac * width)
    return (
        f"[{'#' * filled}{'-' * (width - filled)}]  {progress['step']}/{progress['total']}  "
        f"{frac * 100:.1f}%"
    )


def metrics_text(metrics: dict[str, float] | None, limit: int = MAX_METRICS) -> str:
    """``loss 0.3100  acc 0.9120`` (by name), ``-`` for none."""
    if not metrics:
        return "-"
    return "  ".join(f"{name} {number(v)}" for name, v in list(metrics.items())[:limit])


def _where(cp: dict[str, Any]) -> str:
    return f"attempt {cp['attempt']}, checkpoint {cp['seq']}"


def checkpoint_line(cp: dict[str, Any] | None, now: float | None = None) -> str:
    """``attempt 2, checkpoint 7: 120.6 KiB, 3 files, 2 min ago, kept``."""
    if cp is None:
        return "none yet"
    parts = [size(cp["size"]) if cp.get("size") is not None else "size unknown"]
    if cp.get("files") is not None:
        parts.append(f"{cp['files']} file{'s' if cp['files'] != 1 else ''}")
    if cp.get("taken_at"):
        parts.append(ago(cp["taken_at"], now))
    if cp.get("final"):
        parts.append("taken as the run stopped")
    parts.append("kept" if cp.get("kept") else "not yet kept")
    return f"{_where(cp)}: {', '.join(parts)}"


def resume_line(doc: dict[str, Any]) -> str:
    """What the next attempt starts from: the newest checkpoint the scheduler kept."""
    cp = doc.get("resume")
    if cp is None:
        return "from the start (no checkpoint kept yet)"
    step = (cp.get("progress") or {}).get("step")
    at = f" (step {step})" if step is not None else ""
    return f"from {_where(cp)}{at}"


def latest_progress(doc: dict[str, Any] | None, view: dict[str, Any] | None) -> Any:
    """The newest progress: the checkpoints answer's newest point or report, else the job
    view's ``progress`` (the scheduler's job detail)."""
    if doc:
        if doc["points"]:
            return doc["points"][-1]
        if doc["latest"] and doc["latest"]["progress"]:
            return doc["latest"]["progress"]
    sched = (view or {}).get("scheduler") or view or {}
    return normalize_progress(sched.get("progress"))


def summary(progress: dict[str, Any] | None, metrics: int = 3) -> str:
    """One line: ``300/1000 (30.0%)  loss 0.3100`` (``gridmarket status``, the live line)."""
    if not progress:
        return "no progress reported yet"
    frac = fraction(progress)
    head = (
        f"{progress['step']}/{progress['total']} ({frac * 100:.1f}%)"
        if frac is not None
        else f"step {progress['step']}"
    )
    rest = metrics_text(progress.get("metrics"), metrics)
    return head if rest == "-" else f"{head}  {rest}"


def point_line(point: dict[str, Any]) -> str:
    """``12:03:05  attempt 2  step 300/1000  30.0%  loss 0.3100``: one point, for a pipe."""
    ts = point.get("taken_at")
    stamp = time.strftime("%H:%M:%S", time.gmtime(ts)) if ts else "--:--:--"
    frac = fraction(point)
    step = (
        f"step {point['step']}/{point['total']}" if point.get("total") else f"step {point['step']}"
    )
    pct = f"  {frac * 100:.1f}%" if frac is not None else ""
    rest = metrics_text(point.get("metrics"), 4)
    return f"{stamp}  attempt {point['attempt']}  {step}{pct}" + (
        "" if rest == "-" else f"  {rest}"
    )


# --------------------------------------------------------------------------- charts


def _thin(values: list[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    if len(values) <= limit:
        return values
    stride = (len(values) - 1) / (limit - 1)
    return [values[round(i * stride)] for i in range(limit)]


def chart(
    name: str, values: list[tuple[float, float]], *, width: int = 360, height: int = 150
) -> Markup:
    """One metric over the steps: a line through ``(step, value)`` (in the order given: a
    resumed run may step back), the range on the left, the first and last step below."""
    values = _thin(
        [(x, y) for x, y in values if math.isfinite(x) and math.isfinite(y)], CHART_POINTS
    )
    label = escape(name[:32])
    if not values:
        return Markup(  # noqa: S704 - numbers and escape()d labels only
            f'<svg class="chart metric-chart" viewBox="0 0 {width} 40" role="img" '
            f'aria-label="{label}: no points"><text x="8" y="24" class="muted">'
            f"{label}: no points yet.</text></svg>"
        )
    left, right, top, bottom = 64, 12, 22, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    xs, ys = [x for x, _ in values], [y for _, y in values]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y1 / 2 - y0 / 2 <= 1e-12 * max(1.0, abs(y1)):  # flat: a band around the value
        y0, y1 = y0 - max(1.0, abs(y0) / 2), y1 + max(1.0, abs(y1) / 2)
    span_x, span_y = (x1 - x0) or 1.0, y1 / 2 - y0 / 2  # halves: 1e308 - -1e308 overflows

    def px(x: float) -> float:
        return left + plot_w * (x - x0) / span_x

    def py(y: float) -> float:
        return top + plot_h * (1 - (y / 2 - y0 / 2) / span_y)

    path = "".join(
        f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for i, (x, y) in enumerate(values)
    )
    last_x, last_y = values[-1]
    parts = [
        f'<svg class="chart metric-chart" viewBox="0 0 {width} {height}" role="img" '
        f'data-metric="{label}" data-points="{len(values)}" aria-label="{label} over the steps">',
        f'<text x="{left}" y="14" class="axis head">{label}</text>',
        f'<text x="{width - right}" y="14" text-anchor="end" class="axis">'
        f"last {escape(number(last_y))} at step {int(last_x)}</text>",
    ]
    for value in (y1, y0):
        y = py(value)
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="axis">'
            f"{escape(number(value))}</text>"
        )
    parts.append(f'<path d="{path}" class="line" fill="none"/>')
    if len(values) == 1:
        parts.append(f'<circle cx="{px(last_x):.1f}" cy="{py(last_y):.1f}" r="3" class="dot"/>')
    parts.append(
        f'<text x="{left}" y="{height - 6}" class="axis">step {int(x0)}</text>'
        f'<text x="{left + plot_w}" y="{height - 6}" text-anchor="end" class="axis">'
        f"step {int(x1)}</text></svg>"
    )
    return Markup("".join(parts))  # noqa: S704 - numbers and escape()d labels only


def charts(points: list[dict[str, Any]], limit: int = MAX_CHARTS) -> list[tuple[str, Markup]]:
    """``(metric, chart)`` for the metrics of the newest point that has any (at most
    ``limit``, by name), each over every point that carries it."""
    names: list[str] = []
    for point in reversed(points):
        if point.get("metrics"):
            names = sorted(point["metrics"])[:limit]
            break
    return [
        (
            name,
            chart(name, [(p["step"], p["metrics"][name]) for p in points if name in p["metrics"]]),
        )
        for name in names
    ]


# --------------------------------------------------------------------------- the job page


def has_policy(view: dict[str, Any]) -> bool:
    """Whether the job's spec (as the scheduler read it) asks for checkpoints."""
    spec = (view.get("scheduler") or {}).get("spec")
    return isinstance(spec, dict) and isinstance(spec.get("checkpoint"), dict)


async def attach(scheduler: SchedulerClient, view: dict[str, Any]) -> None:
    """Add ``checkpoints`` (:func:`normalize`, points thinned to what the charts draw) to a job
    view whose spec asks for checkpoints; nothing for any other job. A scheduler that cannot
    be asked leaves ``checkpoints`` None (the page shows the job view's own progress)."""
    if not has_policy(view):
        return
    from .scheduler import SchedulerError

    try:
        doc = normalize(await scheduler.checkpoints(str(view["job_id"])))
    except (SchedulerError, ValueError):  # unreachable, an error, or not JSON
        doc = None
    if doc is not None:
        doc["points"] = _thin_points(doc["points"])
    view["checkpoints"] = doc


def _thin_points(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names: set[str] = set()
    for point in reversed(points):
        if point["metrics"]:
            names = set(sorted(point["metrics"])[:MAX_CHARTS])
            break
    slim = [{**p, "metrics": {k: v for k, v in p["metrics"].items() if k in names}} for p in points]
    if len(slim) <= CHART_POINTS:
        return slim
    stride = (len(slim) - 1) / (CHART_POINTS - 1)
    return [slim[round(i * stride)] for i in range(CHART_POINTS)]


def page_view(view: dict[str, Any]) -> dict[str, Any] | None:
    """What the job page's progress card shows, None for a job without a checkpoint policy:
    ``progress`` (step, total, metrics), ``percent`` (None without a total), ``summary``,
    ``charts``, ``latest``/``resume`` lines, ``policy``."""
    if not has_policy(view):
        return None
    doc = view.get("checkpoints")
    progress = latest_progress(doc, view)
    frac = fraction(progress)
    return {
        "progress": progress,
        "percent": None if frac is None else round(frac * 100, 1),
        "summary": summary(progress, MAX_METRICS),
        "metrics": metrics_text((progress or {}).get("metrics")),
        "charts": charts(doc["points"]) if doc else [],
        "latest": checkpoint_line(doc["latest"]) if doc and doc["latest"] else None,
        "resume": resume_line(doc) if doc else None,
        "policy": (doc or {}).get("policy") or _policy(view["scheduler"]["spec"]["checkpoint"]),
        "error": None if doc is not None else "the scheduler's checkpoints could not be read",
    }
