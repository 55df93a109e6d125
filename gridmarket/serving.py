"""``python -m scheduler`` and ``python -m frontend_api``: one way to serve an app with uvicorn
(``--host``, ``--port``, ``--log-level``; settings from the environment)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any


def serve(
    prog: str,
    description: str | None,
    default_port: int,
    make_app: Callable[[], Any],
    argv: list[str] | None = None,
    **uvicorn_options: Any,
) -> None:
    """Parse ``argv``, set up logging at ``--log-level``, build the app with ``make_app`` (after
    logging, so its start-up is logged) and serve it until stopped."""
    import uvicorn

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    app = make_app()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        **uvicorn_options,
    )
