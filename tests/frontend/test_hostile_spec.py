"""Hostile job specs against the whole grid (issue 32, item 3; tests/frontend/conftest.py): jobs
funded on the test anvil whose spec, on the real test IPFS node, is nested 20,000 deep, over the
size cap, not JSON, not UTF-8, JSON of the wrong shape, or of the right shape with wrong types
in every field the views read. The scheduler marks each ``invalid``; every view of the front end
(the job page, its JSON, its spot views, its stream, the lists, the explorer) answers 200 (or
the documented 4xx) at once, showing the job invalid and why (``frontend_api/specdoc.py``)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import Any

import httpx

from gridmarket import spot
from gridmarket.cid import bytes_cid
from gridmarket.escrow import FLAG_SPOT
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import MAX_SPEC_BYTES
from tests.frontend.conftest import FrontendStack

BOUNTY = 10**16
MODULE = bytes_cid(b"a module no hostile spec ever runs")
HTML = {"accept": "text/html"}
QUICK_S = 10.0
"""A view of a hostile job answers within this (no stall)."""


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


HOSTILE: dict[str, bytes] = {
    "deep": _deep(20_000),
    "deep-in-a-field": (
        b'{"name":"deep","executor":"wasm","module_cid":"'
        + MODULE.encode()
        + b'","command":'
        + _deep(20_000)
        + b"}"
    ),
    "deep-objects": b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    "huge": json.dumps(
        {"name": "x" * (MAX_SPEC_BYTES + 1024), "executor": "wasm", "module_cid": MODULE}
    ).encode(),
    "not-json": b'{"name": "half a spec", "executor": ',
    "not-utf8": b'{"name":"\xff\xfe","executor":"wasm"}',
    "array": b'[{"name":"in a list","executor":"wasm"}]',
    "string": b'"a spec"',
    "null": b"null",
    "wrong-types": json.dumps(
        {
            "name": 5,
            "executor": ["wasm"],
            "image": {"a": 1},
            "module_cid": 7,
            "command": 5,
            "env": [1, 2],
            "dataset_cid": [],
            "resources": "lots",
            "limits": {"timeout_s": "forever", "output_max_bytes": []},
            "max_attempts": "many",
            "deterministic": "maybe",
            "exclude_providers": 3,
            "spot": "yes",
        }
    ).encode(),
    "wrong-inner-types": json.dumps(
        {
            "name": "inner",
            "executor": "wasm",
            "module_cid": MODULE,
            "command": [1, {"a": 2}],
            "resources": {"cpu_cores": "x", "ram_mib": [], "disk_mib": {}, "gpu_count": "2"},
            "limits": {"output_max_bytes": "big", "timeout_s": None},
            "spot": {"p_bps": "all", "commit": 5, "sealed": []},
        }
    ).encode(),
}
PLAIN = ("deep", "wrong-types")
"""Also funded as plain jobs (no FLAG_SPOT): their views read the spec without a spot section."""


def fund_raw(stack: FrontendStack, raw: bytes, flags: int) -> tuple[str, str]:
    """``raw`` put on the test IPFS node and funded (with ``flags``) by the browser's wallet:
    (job id, the funding transaction)."""
    with IpfsStore(stack.ipfs_api) as store:
        cid = store.add_bytes(raw)
    submitter = stack.devnet.submitters[1]
    escrow = stack.client()
    terms = escrow.default_terms(BOUNTY, submitter.address)
    if flags & FLAG_SPOT:  # the least collateral a spot job of p = 1 bps could ask
        terms = replace(terms, flags=flags, collateral=max(terms.collateral, BOUNTY + 1))
    head = int(escrow.w3.eth.get_block("latest")["timestamp"])
    state, sent = escrow.create_job(
        submitter, os.urandom(32), cid, max(head, int(time.time())) + 3600, BOUNTY, terms
    )
    return "0x" + state.job_id.hex(), sent.tx_hash


def timed(stack: FrontendStack, method: str, path: str, **kwargs: Any) -> httpx.Response:
    started = time.monotonic()
    response = httpx.request(method, stack.frontend_url + path, timeout=30, **kwargs)
    took = time.monotonic() - started
    assert took < QUICK_S, f"{method} {path} took {took:.1f} s"
    return response


def stream_events(stack: FrontendStack, job_id: str) -> list[tuple[str, str]]:
    """The job's SSE stream read until ``end`` (a final job's stream ends at once)."""
    events: list[tuple[str, str]] = []
    name = ""
    started = time.monotonic()
    url = f"{stack.frontend_url}/api/jobs/{job_id}/stream"
    with httpx.stream("GET", url, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, line.removeprefix("data: ")))
                if name == "end":
                    break
            assert time.monotonic() - started < QUICK_S, f"stream of {job_id}: {events}"
    return events


def test_every_view_of_a_job_with_a_hostile_spec_answers_and_shows_it_invalid(
    stack: FrontendStack,
) -> None:
    jobs: dict[str, tuple[str, str, bool]] = {}  # label -> (job id, tx hash, spot)
    for label, raw in HOSTILE.items():
        job_id, tx = fund_raw(stack, raw, FLAG_SPOT)
        jobs[label] = (job_id, tx, True)
    for label in PLAIN:
        job_id, tx = fund_raw(stack, HOSTILE[label], 0)
        jobs[f"{label} (plain)"] = (job_id, tx, False)

    for label, (job_id, tx, is_spot) in jobs.items():
        view = stack.wait_job(job_id, {"invalid"}, timeout=60)
        where = f"{label}: {job_id}"
        assert view["chain_status"] == "funded", where
        assert "spec" in view["scheduler"]["reason"], (where, view["scheduler"])
        # the job's JSON: the front end's own reading of the spec, and why it is invalid
        r = timed(stack, "GET", f"/api/jobs/{job_id}")
        assert r.status_code == 200, (where, r.text[:500])
        body = r.json()
        assert body["state"] == "invalid", where
        assert str(body["spec_problem"]).startswith("the spec "), (where, body["spec_problem"])
        # the job's page
        page = timed(stack, "GET", f"/jobs/{job_id}", headers=HTML)
        assert page.status_code == 200, (where, page.text[:2000])
        assert 'data-state="invalid"' in page.text, where
        assert 'id="spec-invalid"' in page.text and 'id="job-reason"' in page.text, where
        assert "<h2>Job spec</h2>" not in page.text, where  # no field of it is shown
        # its spot views: the section says why there is no commitment; a reveal is refused
        r = timed(stack, "GET", f"/api/jobs/{job_id}/spot")
        if is_spot:
            assert r.status_code == 200, (where, r.text[:500])
            problem = r.json()["problem"]
            assert problem.startswith("the spec ") and "commitment cannot be shown" in problem
            assert 'id="spot-problem"' in page.text, where
        else:
            assert r.status_code == 404, (where, r.text[:500])
        seed = {"seed": "0x" + spot.new_seed().hex()}
        r = timed(stack, "POST", f"/api/jobs/{job_id}/spot", json=seed)
        assert r.status_code == 400 and "job_id" in r.text, (where, r.text[:500])
        # its live stream: the same view, then the end (an invalid job is final)
        events = stream_events(stack, job_id)
        assert [name for name, _ in events] == ["job", "end"], (where, events)
        pushed = json.loads(events[0][1])
        assert pushed["view"]["state"] == "invalid", where
        assert 'id="spec-invalid"' in pushed["html"], where
        # the transaction that funded it
        for path, headers in ((f"/tx/{tx}", HTML), (f"/api/tx/{tx}", {})):
            r = timed(stack, "GET", path, headers=headers)
            assert r.status_code == 200, (where, path, r.text[:500])

    # the lists and the explorer, with every hostile job in them
    submitter = stack.devnet.submitters[1].address
    listed = {j["job_id"] for j in timed(stack, "GET", "/api/jobs?limit=1000").json()["jobs"]}
    assert {job_id for job_id, _, _ in jobs.values()} <= listed
    for path in (
        "/",
        "/jobs",
        f"/jobs?submitter={submitter}",
        "/payouts",
        f"/address/{submitter}",
        "/providers",
    ):
        r = timed(stack, "GET", path, headers=HTML)
        assert r.status_code == 200, (path, r.text[:500])
    for path in (
        "/api/info",
        "/api/jobs",
        f"/api/jobs?submitter={submitter}",
        "/api/payouts",
        "/api/verdicts",
        f"/api/address/{submitter}",
        "/api/fleet",
    ):
        r = timed(stack, "GET", path)
        assert r.status_code == 200, (path, r.text[:500])
