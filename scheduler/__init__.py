"""GridMarket scheduler: node registry, matching, leases, chain watcher and outbox, verification.

Run it with ``python -m scheduler`` (uvicorn), or build the app with ``scheduler.app.create_app``.

What lives where::

    app.py          the FastAPI app factory: starts a Replica, the dispatcher, the heartbeats
    api/            HTTP routers, one module per resource; deps.py holds the dependencies
    lifecycle.py    a job's states, events and transition table (pure; the store applies it)
    store/          persistence per concept (jobs, nodes, outbox, audit, reputation, chain,
                    claims, leases) behind one Store facade
    service/        one replica's background work: leader lock, loops (watcher, outbox, specs,
                    verifier, sweeper), the outbox's per-kind rules; the Replica class
    dispatch.py     long-polling nodes matched to queued jobs in rounds
    heartbeats.py   heartbeats answered from a read and written behind in batches
    matching/       hard gates, best-fit ranking, reputation, quotes (pure)
    chain/          transaction sender and event watcher (no database)
    verify.py       an output checked against its CID before payment
    auth.py         node tokens
    settings.py     the one Settings (env prefix GRIDMARKET_SCHEDULER_)
    migrations/     Alembic revisions of store/tables.py
"""

__version__ = "0.1.0"
