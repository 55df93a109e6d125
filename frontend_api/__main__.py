"""``python -m frontend_api --port 8800``: serve the front end with uvicorn.

Settings come from the environment (``GRIDMARKET_FRONTEND_*``, see
:class:`frontend_api.settings.Settings`).
"""

from __future__ import annotations

import argparse
import logging

import uvicorn

from frontend_api.app import create_app
from frontend_api.settings import Settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m frontend_api", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8800)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    app = create_app(Settings())
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=3,  # live job streams would otherwise hold a stop
    )


if __name__ == "__main__":
    main()
