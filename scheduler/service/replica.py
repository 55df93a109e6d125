"""One scheduler replica: the store, the chain client, IPFS, and the background workers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from gridmarket.chain import Deployment, EscrowClient
from gridmarket.holds import margin_of
from gridmarket.ipfs import IpfsStore
from gridmarket.registry_policy import RegistryPolicy
from gridmarket.token import Token, by_address, tokens_of
from gridmarket.wire import checksum
from scheduler.chain import FeePolicy
from scheduler.collateral import CollateralView
from scheduler.settings import Duty, Settings
from scheduler.store import Store

from .checkpoints import CheckpointKeeper
from .leader import DUTY_LOCK_KEYS, LeaderLock
from .loops import OutboxLoop, SpecFetcher, Verifier, Wakes, Watch, run_loop, sweep
from .outbox_rules import OutboxRules

__all__ = ["Replica", "Worker"]

log = logging.getLogger(__name__)


@dataclass
class Worker:
    name: str
    fn: Callable[[threading.Event], None]
    thread: threading.Thread | None = None


class Replica:
    """Owns the store, the chain client and the background workers of one replica."""

    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self.store = store or Store(settings.database_url)
        self.deployment = Deployment.load(Path(settings.deployment_file))
        self._tokens = tokens_of(self.deployment.tokens)
        self.chain = EscrowClient.connect(settings.rpc_url, self.deployment)
        key = settings.operator_key
        self.operator: LocalAccount | None = (
            Account.from_key(key.get_secret_value()) if key is not None else None
        )
        self.operator_address = checksum(str(self.chain.call("operator")))
        if self.operator is not None and self.operator.address != self.operator_address:
            raise ValueError(
                f"operator_key is for {self.operator.address}, but the escrow's operator is "
                f"{self.operator_address}"
            )
        self.fee_bps = int(self.chain.call("feeBps"))
        self.hold_margin_s = margin_of(self.deployment.params)
        """What a hold adds to a run's timeout (gridmarket/holds.py), as the agents read it."""
        self.ipfs = IpfsStore(
            settings.ipfs_api,
            timeout=settings.ipfs_timeout_s,
            resolve_timeout=settings.verify_timeout_s,
        )
        self.is_leader = False
        """Whether this replica holds the chain duty (watcher, outbox, spec fetcher)."""
        self.duties_held: set[str] = set()
        """The leader duties this replica holds now (``chain``, ``verify``)."""
        self._stop = threading.Event()
        self._workers: list[Worker] = []
        self.duties = tuple(dict.fromkeys(settings.duties))
        if not self.store.postgres and set(self.duties) != set(DUTY_LOCK_KEYS):
            raise ValueError(
                f"duties {list(self.duties)}: on SQLite the one replica takes every duty "
                "(chain and verify); split them only on PostgreSQL"
            )
        self._locks = {d: LeaderLock(self.store, DUTY_LOCK_KEYS[d]) for d in self.duties}
        self._verifier: Verifier | None = None
        self._keeper: CheckpointKeeper | None = None
        self._wakes = Wakes()
        self.counters: dict[str, int] = {}
        self.specs = SpecFetcher(
            self.store,
            self.ipfs,
            wake=lambda: self.wake("specs"),
            registries=RegistryPolicy.of(settings.image_registries, "image_registries"),
        )
        self.collateral = CollateralView(self.chain.free_collateral_at, settings.collateral_cache_s)
        """Providers' free collateral for the acceptance check, reused a moment
        (scheduler/collateral.py says why that is safe)."""

    @property
    def chain_id(self) -> int:
        return self.deployment.chain_id

    @property
    def escrow(self) -> str:
        return self.deployment.escrow

    @property
    def tokens(self) -> dict[str, Token]:
        """The currencies jobs may be paid in, by symbol: ETH and the deployment's listed
        tokens (``Deployment.tokens``)."""
        return self._tokens

    def token(self, address: str) -> Token:
        """The listed token at ``address`` (ETH for the zero address); an unlisted one is
        named by its address."""
        return by_address(self.tokens, address)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def wake(self, name: str) -> None:
        """Run the leader loop ``name`` (specs, outbox, verifier) now instead of at its next
        period; a no-op on a replica that does not lead. Safe from any thread."""
        self._wakes.wake(name)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.store.migrate()
        cursor = self.store.chain_cursor()
        head = int(self.chain.w3.eth.block_number)
        if cursor is not None and cursor > head:
            raise RuntimeError(
                f"the database at {self.settings.database_url} has read the chain up to block "
                f"{cursor}, but {self.settings.rpc_url} is at block {head}: it belongs to "
                "another chain (a restarted devnet?). Use a fresh database."
            )
        self._workers = [
            Worker("sweeper", lambda stop: sweep(self.store, self.settings, stop)),
            *(Worker(f"lead-{d}", partial(self._lead, d)) for d in self.duties),
        ]
        for w in self._workers:
            w.thread = threading.Thread(target=self._guard, args=(w,), name=w.name, daemon=True)
            w.thread.start()

    def stop(self) -> None:
        self._stop.set()
        for w in self._workers:
            if w.thread is not None:
                w.thread.join(timeout=10)
        for lock in self._locks.values():
            lock.close()
        if self._verifier is not None:
            self._verifier.close()
        if self._keeper is not None:
            self._keeper.close()
        self.specs.close()
        self.ipfs.close()
        self.store.close()

    def _guard(self, worker: Worker) -> None:
        while not self._stop.is_set():
            try:
                worker.fn(self._stop)
                return
            except Exception:
                log.exception("worker %s crashed; restarting in 1 s", worker.name)
                self._stop.wait(1.0)

    def _lead(self, duty: Duty, stop: threading.Event) -> None:
        """Wait for ``duty``'s lock, then run its loops until stopped."""
        lock = self._locks[duty]
        while not stop.is_set():
            if not lock.try_lead():
                stop.wait(2.0)
                continue
            self.duties_held.add(duty)
            if duty == "chain":
                self.is_leader = True
            log.info(
                "replica %s holds the %s duty: %s",
                self.settings.replica_id,
                duty,
                "chain watcher, outbox, specs" if duty == "chain" else "verifier",
            )
            self._run_loops(self._chain_loops() if duty == "chain" else self._verify_loops(), stop)
            return

    def _chain_loops(self) -> list[tuple[str, Callable[[], int], float]]:
        watch = Watch(
            self.store,
            self.chain,
            self.deployment,
            self.settings,
            self._created,
            self.collateral.observe,
        )
        rules = OutboxRules(self.store, self.count)
        s = self.settings
        fees = FeePolicy(
            max_fee_per_gas=s.max_fee_per_gas_wei,
            priority_fee=s.priority_fee_wei,
            base_fee_multiplier=s.base_fee_multiplier,
            replace_after_s=s.tx_replace_after_s,
        )
        outbox = OutboxLoop(
            self.store,
            self.chain,
            self.operator,
            rules,
            fees=fees,
            receipt_timeout_s=s.tx_receipt_timeout_s,
            batch_calls=s.outbox_batch_calls,
            batch_gas=s.outbox_batch_gas,
        )
        return [
            ("watcher", watch.once, self.settings.chain_poll_s),
            ("outbox", outbox.once, 0.25),
            ("specs", self.specs.once, 0.5),
        ]

    def _verify_loops(self) -> list[tuple[str, Callable[[], int], float]]:
        self._verifier = Verifier(
            self.store,
            self.ipfs,
            self.settings,
            self.count,
            # the outbox may run in another process: then its next period sends the settle
            lambda: self.wake("outbox"),
            wake=lambda: self.wake("verifier"),
        )
        # the checkpoint keeper (service/checkpoints.py) uses the same IPFS node
        self._keeper = CheckpointKeeper(
            self.store, self.ipfs, self.settings, self.count, wake=lambda: self.wake("keeper")
        )
        return [("verifier", self._verifier.once, 0.5), ("keeper", self._keeper.once, 1.0)]

    def _run_loops(
        self, loops: list[tuple[str, Callable[[], int], float]], stop: threading.Event
    ) -> None:
        threads = [
            threading.Thread(
                target=run_loop, args=(name, fn, period, stop, self._wakes), name=name, daemon=True
            )
            for name, fn, period in loops
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _created(self, n: int) -> None:
        self.count("jobs_seen", n)
        self.wake("specs")
