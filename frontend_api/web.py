"""The Jinja2 environment shared by the pages and the live job stream, and error answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, pass_environment

from . import format as fmt
from . import svg
from .currency import ETH_CURRENCY, Currencies

HERE = Path(__file__).resolve().parent

templates = Jinja2Templates(directory=str(HERE / "templates"))
env = templates.env
env.filters.update(
    eth=fmt.eth,
    short=fmt.short,
    when=fmt.when,
    ago=fmt.ago,
    mib=fmt.mib,
    size=fmt.size,
    duration=fmt.duration,
    state_label=fmt.state_label,
)
env.globals.update(node_state=svg.node_state, status_colors=svg.STATUS_COLORS)


@pass_environment
def money(environment: Environment, units: Any, token: Any = None) -> str:
    """``{{ amount | money(token) }}``: smallest units of ``token`` (a job's token address, or
    a currency's JSON) with its symbol: ``5 tUSD``, ``0.01 ETH`` (no token: ETH). The
    currencies are the app's (:func:`use_currencies`)."""
    if isinstance(token, dict):
        token = token.get("address")
    if token is None:
        return ETH_CURRENCY.fmt(units)
    found = environment.globals.get("currencies")
    currencies = found if isinstance(found, Currencies) else Currencies({})
    try:
        currency = currencies.of(token)
    except ValueError:
        return f"{units} (unknown token)"
    return currency.fmt(units)


def use_currencies(currencies: Currencies) -> None:
    """The currencies the pages show amounts in (one deployment per process)."""
    env.globals["currencies"] = currencies


env.filters["money"] = money


def _spot_p(bps: Any) -> str:
    from .forms import spot_p

    return spot_p(int(bps))


env.filters["spot_p"] = _spot_p

STATE_CLASSES = {
    "funded": "info",
    "pending_spec": "info",
    "queued": "info",
    "assigned": "work",
    "leased": "work",
    "verifying": "work",
    "settling": "work",
    "submitted": "work",
    "disputed": "warn",
    "released": "ok",
    "refunded": "warn",
    "expired": "warn",
    "failed": "bad",
    "invalid": "bad",
    # seats of a replicated job, against the verdict
    "agrees": "ok",
    "disagrees": "bad",
    "slashed": "bad",
    "unknown": "info",
    # nodes, attempts, registry
    "busy": "work",
    "online": "ok",
    "offline": "info",
    "excluded": "bad",
    "running": "work",
    "success": "ok",
    "failure": "bad",
    "timeout": "warn",
    "rejected": "bad",
    "handed_back": "info",
    "eligible": "ok",
    "not eligible": "warn",
}
env.filters["state_class"] = lambda state: STATE_CLASSES.get(str(state), "info")


def error_body(detail: str, field: str | None = None) -> dict[str, Any]:
    """The JSON of every 4xx/5xx answer: ``detail`` is a sentence, ``field`` the input at fault."""
    body: dict[str, Any] = {"detail": detail}
    if field:
        body["field"] = field
    return body


def wants_html(request: Request) -> bool:
    """A browser navigating (not the API, not fetch()): errors come back as a page."""
    if request.url.path.startswith("/api/"):
        return False
    return "text/html" in request.headers.get("accept", "")
