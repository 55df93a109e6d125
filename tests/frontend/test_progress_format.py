"""A checkpointing job's progress as people see it (frontend_api/progress.py): the scheduler's
checkpoints answer (``JOB_CHECKPOINTS``, the documented JSON) checked and bounded whatever a
job or a node put in it (NaN, huge and negative numbers, booleans, long or odd metric names,
thousands of points), the bar, metrics and checkpoint lines of ``gridmarket progress``, the SVG
charts and the job page's progress card (the live fragment the SSE feed pushes, rendered by
the pages' Jinja environment)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from frontend_api import live, progress
from frontend_api.web import env

JOB = "0x" + "ab" * 32
CID = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"


def documented(n_points: int = 7) -> dict[str, Any]:
    """The answer as docs/scheduler.md documents it."""
    latest = {
        "attempt": 2,
        "seq": 7,
        "cid": CID,
        "size": 123456,
        "files": 3,
        "node_id": "n-abc123",
        "wallet": "0x" + "11" * 20,
        "taken_at": 1764400000.5,
        "final": False,
        "kept": True,
        "progress": {"step": 700, "total": 1000, "metrics": {"loss": 0.21}},
    }
    return {
        "job_id": JOB,
        "policy": {"interval_s": 300, "max_bytes": 1073741824},
        "latest": latest,
        "resume": {**latest, "seq": 6, "progress": {"step": 600, "total": 1000, "metrics": {}}},
        "points": [
            {
                "attempt": 1 if i < 4 else 2,
                "seq": i,
                "step": 100 * i,
                "total": 1000,
                "metrics": {"loss": 1 / i, "acc": i / 10},
                "taken_at": 1764399000.0 + i,
                "final": False,
            }
            for i in range(1, n_points + 1)
        ],
        "keep_points": 500,
    }


def test_the_documented_answer_reads_as_documented() -> None:
    doc = progress.normalize(documented())
    assert doc is not None
    assert doc["policy"] == {"interval_s": 300, "max_bytes": 1073741824}
    assert doc["latest"]["kept"] is True and doc["latest"]["progress"]["step"] == 700
    assert [p["step"] for p in doc["points"]] == [100 * i for i in range(1, 8)]
    newest = progress.latest_progress(doc, None)
    assert progress.bar(newest) == f"[{'#' * 21}{'-' * 9}]  700/1000  70.0%"
    assert progress.metrics_text(newest["metrics"]) == "acc 0.7000  loss 0.1429"
    line = progress.checkpoint_line(doc["latest"], now=1764400000.5 + 125)
    assert line == "attempt 2, checkpoint 7: 120.6 KiB, 3 files, 2 min ago, kept"
    assert progress.resume_line(doc) == "from attempt 2, checkpoint 6 (step 600)"
    assert progress.summary(newest) == "700/1000 (70.0%)  acc 0.7000  loss 0.1429"
    assert progress.point_line(doc["points"][0]).endswith(
        "attempt 1  step 100/1000  10.0%  acc 0.1000  loss 1.000"
    )


def test_nothing_yet_no_total_and_unkept() -> None:
    empty = progress.normalize(
        {"job_id": JOB, "policy": None, "latest": None, "resume": None, "points": []}
    )
    assert empty is not None
    assert progress.latest_progress(empty, None) is None
    assert progress.bar(None) == "no progress reported yet"
    assert progress.checkpoint_line(None) == "none yet"
    assert progress.resume_line(empty) == "from the start (no checkpoint kept yet)"
    assert progress.bar({"step": 42, "total": None, "metrics": {}}) == "step 42 (no total given)"
    assert progress.summary({"step": 42, "total": None, "metrics": {}}) == "step 42"
    unkept = {**documented()["latest"], "kept": False, "final": True, "files": 1, "size": 0}
    cp = progress.normalize({"latest": unkept})["latest"]  # type: ignore[index]
    line = progress.checkpoint_line(cp, now=cp["taken_at"] + 5)
    assert line.endswith("0 B, 1 file, 5 s ago, taken as the run stopped, not yet kept"), line
    # the job view's own progress (the scheduler's detail) when no answer came
    view = {"scheduler": {"progress": {"step": 3, "total": 4, "metrics": {}, "fraction": 0.75}}}
    assert progress.latest_progress(None, view) == {"step": 3, "total": 4, "metrics": {}}


def test_hostile_answers_are_bounded_and_dropped_not_trusted() -> None:
    assert progress.normalize([1, 2]) is None and progress.normalize("x") is None
    hostile_metrics = {
        "loss": math.nan,
        "acc": math.inf,
        "a_neg": -1e308,
        "big": 10**400,
        "a_ok": -2.5,
        "flag": True,
        "text": "1.0",
        "x" * 33: 1.0,
        "<script>alert(1)</script>": 1.0,
        "1starts_with_digit": 1.0,
        **{f"m{i:02d}": float(i) for i in range(40)},
    }
    doc = progress.normalize(
        {
            "job_id": "0x" + "f" * 5000,
            "policy": {"interval_s": -1, "max_bytes": 10},
            "latest": {"attempt": 0, "seq": 1, "cid": CID},
            "resume": {"attempt": 1, "seq": 1, "cid": "<img src=x>", "size": 1},
            "points": [
                {"attempt": 1, "seq": 1, "step": -5, "total": 10},
                {"attempt": 1, "seq": 2, "step": 2**60, "total": 10},
                {"attempt": 1, "seq": 3, "step": True, "total": 10},
                {"attempt": 1, "seq": 4, "step": 7.5, "total": 10},
                {"attempt": 1, "seq": 5, "step": 20, "total": 10, "metrics": hostile_metrics},
                {"attempt": "1", "seq": 6, "step": 1},
                "not a point",
                {"attempt": 1, "seq": 7, "step": 8.0, "total": 0, "taken_at": math.nan},
            ],
            "keep_points": 10**12,
        }
    )
    assert doc is not None
    assert doc["job_id"] is None and doc["keep_points"] is None
    assert doc["policy"] is None and doc["latest"] is None and doc["resume"] is None
    assert [(p["seq"], p["step"], p["total"]) for p in doc["points"]] == [
        (5, 20, None),
        (7, 8, None),
    ]
    metrics = doc["points"][0]["metrics"]
    assert "loss" not in metrics and "acc" not in metrics and "big" not in metrics
    assert metrics["a_ok"] == -2.5 and metrics["a_neg"] == -1e308
    assert "flag" not in metrics and "text" not in metrics and len(metrics) == 16
    assert all(re.match(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$", name) for name in metrics)
    assert doc["points"][1]["taken_at"] is None
    json.dumps(doc, allow_nan=False)  # what the front end answers is strict JSON
    assert progress.number(-1e308) == "-1.000e+308" and progress.number(0) == "0"
    assert progress.number(1234567.0) == "1.235e+06" and progress.number(0.0001234) == "1.234e-04"
    assert progress.number(12.3456) == "12.35" and progress.number(math.nan) == "-"


def test_thousands_of_points_are_capped_and_charts_thinned() -> None:
    answer = documented(5000)
    doc = progress.normalize(answer)
    assert doc is not None and len(doc["points"]) == progress.MAX_POINTS
    assert doc["points"][-1]["seq"] == 5000  # the newest are kept
    charts = progress.charts(doc["points"])
    assert [name for name, _ in charts] == ["acc", "loss"]
    for _, svg in charts:
        assert 'data-points="240"' in svg and svg.count("L") == 239
        assert "step 3001" in svg and "step 5000" in svg  # the first and the newest
    many = {f"metric{i}": float(i) for i in range(16)}
    points = [{"attempt": 1, "seq": 1, "step": 1, "total": None, "metrics": many}]
    assert len(progress.charts(points)) == progress.MAX_CHARTS


def test_a_chart_escapes_its_name_and_survives_flat_or_single_values() -> None:
    svg = progress.chart('<b onload="x">&', [(1, 5.0), (2, 5.0), (3, 5.0)])
    assert "<b " not in svg and "&lt;b onload=&#34;x&#34;&gt;&amp;" in svg
    one = progress.chart("loss", [(10, 0.5)])
    assert "<circle" in one and "nan" not in one.lower()
    none = progress.chart("loss", [(math.nan, 1.0)])
    assert "no points yet" in none
    huge = progress.chart("loss", [(0, -1e308), (2**53, 1e308)])
    assert "inf" not in huge.lower() and "nan" not in huge.lower()


def _view(checkpoints: dict[str, Any] | None, *, policy: bool = True) -> dict[str, Any]:
    spec = {"checkpoint": {"interval_s": 300, "max_bytes": 1073741824}} if policy else {}
    view: dict[str, Any] = {
        "job_id": JOB,
        "state": "leased",
        "chain": None,
        "chain_status": None,
        "scheduler": {"state": "leased", "spec": spec, "attempts": [], "progress": None},
        "scheduler_error": None,
        "actions": {},
        "group": None,
        "spot": None,
        "transactions": [],
        "final": False,
    }
    if checkpoints is not None:
        view["checkpoints"] = checkpoints
    return view


def _card(html: str) -> str:
    start = html.find('id="job-progress"')
    return html[start : html.find('<div class="grid2">', start)] if start >= 0 else ""


def test_the_job_page_card_shows_bar_charts_and_checkpoint() -> None:
    assert live.PING and env.globals["job_progress"] is progress.page_view  # live.py registers it
    template = env.get_template("_job_live.html")
    doc = progress.normalize(documented(300))
    assert doc is not None
    doc["points"][-1]["metrics"]["<script>x"] = 1.0  # a name normalize would have dropped
    html = template.render(view=_view(doc), b=None)
    card = _card(html)
    assert card, html[:2000]
    assert '<progress id="job-progress-bar" max="1000" value="30000">' not in card
    # 300 points of 100 steps each: the newest is step 30000 of a total of 1000 -> dropped total
    assert "step 30000" in card and "the job gives no total" in card
    assert "<script>x" not in html and "&lt;script&gt;x" in card
    assert card.count("<svg") == 3  # acc, loss and the hostile name, escaped

    doc = progress.normalize(documented())
    html = template.render(view=_view(doc), b=None)
    card = _card(html)
    assert '<progress id="job-progress-bar" max="1000" value="700">70.0%</progress>' in card
    assert "<b>700 / 1000</b> steps" in card and 'data-percent="70.0"' in card
    assert card.count('class="chart metric-chart"') == 2
    assert "attempt 2, checkpoint 7: 120.6 KiB, 3 files" in card and "kept" in card
    assert "resumes from attempt 2, checkpoint 6 (step 600)" in card
    assert "a checkpoint every 5 min, at most 1.0 GiB" in card

    # no answer from the scheduler: the view's own progress, and why the rest is missing
    view = _view(None)
    view["checkpoints"] = None
    view["scheduler"]["progress"] = {"step": 5, "total": 10, "metrics": {}, "fraction": 0.5}
    card = _card(template.render(view=view, b=None))
    assert 'value="5"' in card and "could not be read" in card

    # a job without a checkpoint policy shows nothing new
    html = template.render(view=_view(None, policy=False), b=None)
    assert 'id="job-progress"' not in html
