"""``python -m scheduler``: serve the scheduler with uvicorn (settings from the environment)."""

from __future__ import annotations

from gridmarket.serving import serve
from scheduler.app import create_app
from scheduler.settings import Settings


def main(argv: list[str] | None = None) -> None:
    serve(
        "python -m scheduler", __doc__, 8700, lambda: create_app(Settings(), freeze_heap=True), argv
    )


if __name__ == "__main__":
    main()
