"""``python -m frontend_api --port 8800``: serve the front end with uvicorn.

Settings come from the environment (``GRIDMARKET_FRONTEND_*``, see
:class:`frontend_api.settings.Settings`).
"""

from __future__ import annotations

from frontend_api.app import conn_limits, create_app
from frontend_api.settings import Settings
from gridmarket.conn_guard import guarded_protocol
from gridmarket.serving import serve


def main(argv: list[str] | None = None) -> None:
    settings = Settings()
    serve(
        "python -m frontend_api",
        __doc__,
        8800,
        lambda: create_app(settings),
        argv,
        timeout_graceful_shutdown=3,  # live job streams would otherwise hold a stop
        http=guarded_protocol(conn_limits(settings)),  # slow clients: gridmarket/conn_guard.py
    )


if __name__ == "__main__":
    main()
