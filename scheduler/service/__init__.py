"""The scheduler's moving parts behind the API: chain watcher, transaction outbox, job-spec
fetcher, result verifier, and the sweeper for heartbeats, leases and deadlines.

Every replica runs the API, the dispatcher and the sweeper. Exactly one replica, the *leader*,
runs the chain watcher, the outbox (the operator key's only sender, so nonces never collide),
the spec fetcher and the verifier.

    replica.py       Replica: one replica's store, chain client, IPFS and workers; start/stop
    leader.py        LeaderLock: PostgreSQL advisory lock (SQLite: the one replica leads)
    loops.py         run_loop (period, wake-ups, backoff) and each loop's pass: sweep, Watch,
                     OutboxLoop, SpecFetcher, Verifier
    outbox_rules.py  OutboxRules: what each outbox kind sends, what a refusal undoes
"""

from .leader import LEADER_LOCK_KEY, LeaderLock
from .replica import Replica

__all__ = ["LEADER_LOCK_KEY", "LeaderLock", "Replica"]
