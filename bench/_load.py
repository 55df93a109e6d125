"""The one load generator of the claims and heartbeats benches, for our scheduler and the peers.

Each client is one node with one keep-alive HTTP/1.1 connection (:class:`_stack.RawHttp`) that
asks for work back to back until the jobs are drained. The same loop drives our scheduler's
``POST next-job`` long poll and the Sarva peer's ``GET /jobs/next``; only the request and the
way a job id is read from the answer differ.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from _stack import NodeAuth, RawHttp


@dataclass
class Client:
    """One node: where it asks, how, and how many jobs it may hold at once."""

    host: str
    port: int
    method: str
    path: str
    headers: dict[str, str]
    slots: int
    accept: Callable[[RawHttp, bytes], Awaitable[bool]] | None = None
    """What the node does with an offer before it counts as claimed (our scheduler: sign the
    acceptance of the job's terms and post it on the same connection); None: nothing."""
    finish: Callable[[RawHttp, bytes], Awaitable[bool]] | None = None
    """What the node does with a claimed job before it asks again (our scheduler: report the
    run ended, with its signed result); True frees the slot. None: the node keeps the job."""
    auth: NodeAuth | None = None
    """Our scheduler's nodes: the token sent instead of ``headers``, renewed on a 401."""


@dataclass
class Drained:
    claims: int = 0
    unique: int = 0
    elapsed: float = 0.0
    lat: list[float] = field(default_factory=list)
    empty: int = 0
    """polls answered "no job" while jobs were still waiting: retried"""
    empty_by_client: list[int] = field(default_factory=list)
    """the empty polls of each client, in the order of ``clients``"""
    refused: int = 0
    """polls answered with an error status, or dropped by the server (then retried)"""
    dupes: int = 0
    """jobs that reached two or more clients"""
    got: list[str] = field(default_factory=list)
    by_client: list[list[str]] = field(default_factory=list)
    """the jobs each client received, in the order of ``clients``"""
    stalled: bool = False
    stopped: bool = False
    """the run reached its time limit (``max_s``) before every job was handed out"""
    finished: int = 0
    """claimed jobs the node reported done (the server took the result: the slot is free)"""
    unfinished: int = 0
    """results the server refused (the node keeps that job, its slot stays taken)"""


async def drain(
    clients: list[Client],
    n_jobs: int,
    job_id: Callable[[bytes], str],
    *,
    empty_means_done: bool = False,
    stall_s: float = 15.0,
    progress_s: float = 0.0,
    progress_note: Callable[[], Awaitable[str]] | None = None,
    max_s: float = 0.0,
) -> Drained:
    """Every client polls until it holds ``slots`` jobs or ``n_jobs`` distinct jobs were
    handed out in all (or, with ``empty_means_done``, until the server says it has none), or
    nothing new came for ``stall_s`` seconds (reported as ``stalled``). A client with a
    ``finish`` reports each job done before it asks again, so its slots are used again. With
    ``progress_s``, a line of progress (jobs, rate, doubles so far) every ``progress_s``, and
    under it what ``progress_note`` says (the claims bench: the jobs still queued, by kind).
    With ``max_s``, the run stops after that many seconds (reported as ``stopped``)."""
    out = Drained()
    seen: set[str] = set()
    done = asyncio.Event()
    last_new = [time.perf_counter()]
    out.by_client = [[] for _ in clients]
    out.empty_by_client = [0 for _ in clients]

    async def one(k: int, c: Client) -> None:
        conn = RawHttp(c.host, c.port)
        taken = 0
        try:
            while not done.is_set() and taken < c.slots:
                t0 = time.perf_counter()
                try:
                    if c.auth is not None:
                        status, _, body = await c.auth.request(conn, c.method, c.path)
                    else:
                        status, _, body = await conn.request(c.method, c.path, c.headers)
                except (ConnectionError, asyncio.IncompleteReadError):
                    conn.close()  # the server dropped the request: count it, reconnect
                    status, body = 599, b""
                if status == 200 and c.accept is not None and not await c.accept(conn, body):
                    out.refused += 1  # the offer was gone by the time it was accepted
                    continue
                if status == 200:
                    out.lat.append(time.perf_counter() - t0)
                    jid = job_id(body)
                    out.got.append(jid)
                    out.by_client[k].append(jid)
                    if jid not in seen:  # before the finish: len(got) - len(seen) stays exact
                        seen.add(jid)
                        last_new[0] = time.perf_counter()
                    if c.finish is None:
                        taken += 1
                    elif await c.finish(conn, body):
                        out.finished += 1
                    else:
                        out.unfinished += 1
                        taken += 1
                    if len(seen) >= n_jobs:
                        done.set()
                elif status == 204:
                    if empty_means_done:
                        done.set()
                    elif len(seen) < n_jobs:
                        out.empty += 1
                        out.empty_by_client[k] += 1
                else:
                    out.refused += 1
                    await asyncio.sleep(0.05)
        finally:
            conn.close()

    async def watchdog() -> None:
        shown = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.5)
            now = time.perf_counter()
            if progress_s and now - shown >= progress_s:
                shown = now
                took = now - t0
                print(
                    f"    {time.strftime('%H:%M:%S')} {len(seen)}/{n_jobs} jobs in {took:.0f} s "
                    f"({len(seen) / took:.0f}/s), {len(out.got) - len(seen)} received twice, "
                    f"{out.finished} finished, {out.empty} empty polls, {out.refused} refused",
                    flush=True,
                )
                if progress_note is not None:
                    print(f"      {await progress_note()}", flush=True)
            if time.perf_counter() - last_new[0] > stall_s:
                out.stalled = True
                done.set()
            if max_s and now - t0 >= max_s:
                out.stopped = True
                done.set()

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(one(k, c)) for k, c in enumerate(clients)]
    dog = asyncio.create_task(watchdog())
    waiter = asyncio.create_task(done.wait())
    finished = asyncio.ensure_future(asyncio.gather(*tasks, return_exceptions=True))
    first: list[asyncio.Future[Any]] = [waiter, finished]
    await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
    out.elapsed = (last_new[0] if out.stalled else time.perf_counter()) - t0
    done.set()
    for t in (*tasks, dog, waiter):
        t.cancel()
    results = await finished
    await asyncio.gather(dog, waiter, return_exceptions=True)
    for r in results:
        if isinstance(r, Exception) and not isinstance(r, asyncio.CancelledError):
            raise r
    out.claims = len(out.got)
    out.unique = len(seen)
    out.dupes = sum(1 for c in Counter(out.got).values() if c > 1)
    return out
