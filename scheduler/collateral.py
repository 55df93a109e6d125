"""Each provider wallet's free collateral as the chain said at a named block, kept a moment.

Every acceptance checks that the wallet has the job's collateral free on-chain
(``freeCollateralIn(wallet, token)``, :meth:`scheduler.store.JobStore.accept`). Reading it
costs two JSON-RPC round trips (the head, then the call at that head); at hundreds of claims a
second spread over a few dozen wallets, most of those reads return what the previous one did.
:class:`CollateralView` keeps the last ``(free, block)`` of each wallet and token for
``max_age_s`` seconds. It is safe to reuse because of how the store uses it:

* The value is named by its block. The store takes off the collateral of the wallet's accepted
  jobs whose ``assign`` was not mined as of that block, so assigns (the only thing our own
  grid does to a wallet's free collateral between reads) are counted however old the value.
* A value that has grown since (a ``Staked``, a job released) only understates: the store may
  refuse an acceptance that fits. The route then reads the chain again (``fresh=True``) and
  asks once more, so no acceptance is refused on a remembered value.
* A value that has shrunk since (``UnstakeRequested``, ``ProviderSlashed``) would overstate.
  The leader's chain watcher forgets the wallet when it folds such an event
  (:meth:`observe`); a replica that does not lead relies on ``max_age_s``. Either way the
  chain is the guard: an ``assign`` that no longer fits is refused on-chain and ends that
  lease (the job goes to another node), as it would after a read that raced the unstake.

``max_age_s = 0`` reads the chain for every acceptance.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["SHRINKS", "CollateralView"]

SHRINKS = frozenset({"UnstakeRequested", "ProviderSlashed", "Staked", "Unstaked"})
"""Escrow events naming a ``provider`` after which its remembered free collateral is dropped:
the two that shrink it, and the stake changes (so a node that staked more is believed at
once)."""

_MAX_WALLETS = 100_000
"""Entries kept at most; past it the view starts again empty (a bound, not an expected size)."""


class CollateralView:
    """``(free, block)`` per (wallet, token), from ``read`` (the chain), reused for
    ``max_age_s`` seconds unless forgotten. Thread-safe; reads happen outside its lock."""

    def __init__(
        self,
        read: Callable[[str, str], tuple[int, int]],
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._values: dict[tuple[str, str], tuple[float, int, int]] = {}
        self._generation: dict[str, int] = {}
        self.reads = 0
        """Chain reads made (for the bench and the tests)."""
        self.hits = 0
        """Answers given from memory."""

    def peek(self, wallet: str, token: str) -> tuple[int, int] | None:
        """``(free, block)`` if remembered and young enough, else None; never reads."""
        key = (wallet.lower(), token.lower())
        with self._lock:
            hit = self._values.get(key) if self.max_age_s > 0 else None
            if hit is None or self._clock() - hit[0] >= self.max_age_s:
                return None
            self.hits += 1
            return hit[1], hit[2]

    def get(self, wallet: str, token: str, *, fresh: bool = False) -> tuple[int, int, bool]:
        """``(free, block, remembered)``: the wallet's free collateral in ``token`` at
        ``block``; ``remembered`` when it came from memory rather than a read just now.
        ``fresh`` always reads. Raises what ``read`` raises (nothing is remembered then)."""
        key = (wallet.lower(), token.lower())
        now = self._clock()
        with self._lock:
            hit = None if fresh or self.max_age_s <= 0 else self._values.get(key)
            if hit is not None and now - hit[0] < self.max_age_s:
                self.hits += 1
                return hit[1], hit[2], True
            generation = self._generation.get(key[0], 0)
        free, block = self._read(wallet, token)
        with self._lock:
            self.reads += 1
            # a wallet forgotten while the read was in flight may have read the old state:
            # answer it (it is no older than a read made a moment earlier) but do not keep it
            if self._generation.get(key[0], 0) == generation:
                if len(self._values) >= _MAX_WALLETS:
                    self._values.clear()
                old = self._values.get(key)
                if old is None or old[2] <= block:  # never replace a newer block's value
                    self._values[key] = (now, free, block)
        return free, block, False

    def forget(self, wallet: str) -> None:
        """Drop what is remembered of ``wallet`` (every token)."""
        w = wallet.lower()
        with self._lock:
            self._generation[w] = self._generation.get(w, 0) + 1
            if len(self._generation) > _MAX_WALLETS:
                self._generation = {w: self._generation[w]}
            for key in [k for k in self._values if k[0] == w]:
                del self._values[key]

    def observe(self, events: Iterable[Any]) -> None:
        """Forget the providers named by the folded ``events`` that change a stake
        (:data:`SHRINKS`). Events are decoded chain logs (``.name``, ``.args``); one without
        a usable ``provider`` is skipped."""
        for ev in events:
            if getattr(ev, "name", None) not in SHRINKS:
                continue
            args = getattr(ev, "args", None)
            provider = args.get("provider") if isinstance(args, dict) else None
            if isinstance(provider, str):
                self.forget(provider)
