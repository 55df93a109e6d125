"""GridMarket scheduler: node registry, matching, leases, chain watcher and outbox, verification.

Run it with ``python -m scheduler`` (uvicorn), or build the app with ``scheduler.app.create_app``.
"""

__version__ = "0.1.0"
