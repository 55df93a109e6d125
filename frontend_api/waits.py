"""Requests that wait (IPFS reads of CIDs nobody may have, transaction receipts)
must not hold the threads that every page needs.

:class:`Waits` runs such blocking calls on a pool of their own (``wait_threads``), and allows
each client address at most ``per_client`` waiting requests at once (429 past it, with
``Retry-After``): one client cannot fill the pool, and the default pool that renders pages and
reads the chain index stays free. Waiting on a receipt happens on the event loop
(``asyncio.sleep``), holding no thread at all. Live job streams have their own cap
(:mod:`frontend_api.live`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeVar

from fastapi import HTTPException, Request

T = TypeVar("T")


def client_of(request: Request) -> str:
    """The address a request came from (what the per-client caps count)."""
    return request.client.host if request.client else "unknown"


class Waits:
    """A thread pool for blocking waits and a cap on waiting requests per client."""

    def __init__(self, threads: int, per_client: int) -> None:
        self.per_client = per_client
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="frontend-wait")
        self._active: dict[str, int] = {}

    def acquire(self, client: str) -> None:
        """Count one more waiting request for ``client``, or refuse it with 429. Called on the
        event loop only (no lock needed)."""
        n = self._active.get(client, 0)
        if n >= self.per_client:
            raise HTTPException(
                429,
                f"{client} already has {n} requests waiting (IPFS reads, transaction "
                f"receipts); at most {self.per_client} at once",
                headers={"Retry-After": "2"},
            )
        self._active[client] = n + 1

    def release(self, client: str) -> None:
        n = self._active.get(client, 0) - 1
        if n > 0:
            self._active[client] = n
        else:
            self._active.pop(client, None)

    def waiting(self, client: str) -> int:
        return self._active.get(client, 0)

    @asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[None]:
        self.acquire(client)
        try:
            yield
        finally:
            self.release(client)

    async def run(self, client: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the wait pool, counted against ``client``."""
        async with self.slot(client):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
