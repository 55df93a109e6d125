"""Hostile HTTP against the front end of the real stack (tests/frontend/conftest.py): bodies
over their cap and JSON that Python would accept but the app must not (NaN, Infinity, lone
surrogates) are refused with 413 and 400; requests that wait on IPFS do not hold the threads
pages need, and one client's waiting requests are capped."""

from __future__ import annotations

import os
import threading
import time

import httpx

from gridmarket.cid import bytes_cid
from tests.frontend.conftest import FrontendStack

JSON = {"content-type": "application/json"}


def test_oversized_bodies_and_bad_json_are_refused(stack: FrontendStack) -> None:
    big = b"[" + b"1," * (2 * 1024**2) + b"1]"
    r = stack.post("/api/quote", content=big, headers=JSON)
    assert r.status_code == 413
    assert "over the 1048576-byte limit for /api/quote" in r.json()["detail"]
    for body, problem in (
        (b'{"spec": {"resources": {"cpu_cores": NaN}}}', "NaN is not a JSON number"),
        (b'{"bounty_wei": Infinity}', "Infinity is not a JSON number"),
        (b'{"from": "\\udfff"}', "lone UTF-16 surrogate"),
    ):
        for path in ("/api/quote", "/api/jobs/prepare"):
            r = stack.post(path, content=body, headers=JSON)
            assert r.status_code == 400 and problem in r.json()["detail"], (path, r.text)


def test_waiting_requests_do_not_hold_the_page_threads(stack: FrontendStack) -> None:
    """More IPFS reads of CIDs nobody has than the default thread pool holds (6 on 2 cores):
    pages still answer fast, and a client past its cap of waiting requests gets 429."""
    per_client = 8
    missing = [bytes_cid(os.urandom(32)) for _ in range(per_client + 1)]
    codes: list[int] = []

    def read(cid: str) -> None:
        codes.append(httpx.get(f"{stack.frontend_url}/ipfs/{cid}", timeout=90).status_code)

    threads = [threading.Thread(target=read, args=(cid,)) for cid in missing[:per_client]]
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)  # all of them are waiting on IPFS now
        over = stack.get(f"/ipfs/{missing[-1]}")
        assert over.status_code == 429, over.text
        assert "at most 8 at once" in over.json()["detail"]
        assert over.headers["retry-after"] == "2"
        times = []
        for path in ("/jobs", "/api/info", "/payouts", "/api/jobs", "/"):
            t0 = time.perf_counter()
            r = stack.get(path, headers={"accept": "text/html"})
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200, (path, r.text[:300])
        assert max(times) < 2.0, times
        assert not codes  # the reads are still waiting
    finally:
        for t in threads:
            t.join(timeout=90)
    assert len(codes) == per_client and set(codes) <= {502, 504}, codes
