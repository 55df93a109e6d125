"""The scheduler's moving parts behind the API: chain watcher, transaction outbox, job-spec
fetcher, result verifier, and the sweeper for heartbeats, leases and deadlines.

Every replica runs the API, the dispatcher and the sweeper. Exactly one replica, the *leader*,
runs the chain watcher, the outbox (the operator key's only sender, so nonces never collide)
and the spec fetcher: the *chain* duty. Exactly one runs the verifier: the *verify* duty. Each
duty has its own lock, and ``Settings.duties`` says which a replica may take: by default both,
so the first replica up holds both; a busy grid gives each its own process (and GIL).

    replica.py       Replica: one replica's store, chain client, IPFS and workers; start/stop
    leader.py        LeaderLock: a duty's PostgreSQL advisory lock (SQLite: the one replica leads)
    loops.py         run_loop (period, wake-ups, backoff) and each loop's pass: sweep, Watch,
                     OutboxLoop, SpecFetcher, Verifier
    outbox_rules.py  OutboxRules: what each outbox kind sends, what a refusal undoes
"""

from .leader import DUTY_LOCK_KEYS, LEADER_LOCK_KEY, VERIFIER_LOCK_KEY, LeaderLock
from .replica import Replica

__all__ = ["DUTY_LOCK_KEYS", "LEADER_LOCK_KEY", "VERIFIER_LOCK_KEY", "LeaderLock", "Replica"]
