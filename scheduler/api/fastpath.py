"""The heartbeat fast path: ``POST /v1/nodes/{node_id}/heartbeat`` answered in plain ASGI.

Heartbeats are most of a replica's requests (every node, every few seconds, thousands a
second in all), and FastAPI's routing, dependency solving and body handling cost more than the
heartbeat itself (issue 12: 40% of the replica's samples were the HTTP stack). This middleware
sits inside the request guard (``gridmarket/http_guard.py``: body size, strict JSON and the
rest still apply first) and before FastAPI's router. It answers a heartbeat itself only when
all of these hold, with the same code the route runs:

* ``POST``, that exact path, a ``Content-Type`` of ``application/json``;
* the bearer token is valid and issued to that node (``deps.token_problem``, the route's check);
* the node's row is in the node-row cache (``nodecache.py``);
* the body parses as JSON and validates as ``HeartbeatRequest`` (the route's model, validated
  from the parsed JSON as FastAPI does);
* ``nodes.beat_from_memory`` can answer it (the node is online and every job it lists is known
  leased to it): the route's own answer, effects and JSON.

Anything else (an error of any kind, a node back from offline, a job this replica must read, a
cache miss) goes to the FastAPI route with the body replayed, so every error, status code and
message is the route's. The route stays the documented operation in OpenAPI. Each heartbeat
answered here counts ``heartbeats_fast_path`` (``/metrics``).
"""

from __future__ import annotations

import json
from typing import Any

from gridmarket.http_guard import ASGIApp, Message, Receive, Scope, Send
from gridmarket.wire import HeartbeatRequest

from .deps import token_problem
from .nodes import beat_from_memory

PREFIX = "/v1/nodes/"
SUFFIX = "/heartbeat"
_HEADERS = [(b"content-type", b"application/json")]


class HeartbeatFastPath:
    """The ASGI middleware (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        node_id = path[len(PREFIX) : -len(SUFFIX)]
        if (
            not path.startswith(PREFIX)
            or not path.endswith(SUFFIX)
            or not node_id
            or "/" in node_id
        ):
            await self.app(scope, receive, send)
            return
        authorization = content_type = None
        for name, value in scope["headers"]:
            if name == b"authorization" and authorization is None:
                authorization = value
            elif name == b"content-type" and content_type is None:
                content_type = value
        if (
            authorization is None
            or content_type is None
            or content_type.split(b";", 1)[0].strip().lower() != b"application/json"
        ):
            await self.app(scope, receive, send)
            return
        body, rest = await _body(receive)
        answer = None if rest is not None else _answer(scope, node_id, authorization, body)
        if answer is None:
            await self.app(scope, _replay(body, rest, receive), send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode()), *_HEADERS],
            }
        )
        await send({"type": "http.response.body", "body": answer})


def _answer(scope: Scope, node_id: str, authorization: bytes, body: bytes) -> bytes | None:
    """The heartbeat's answer if it can be given here, else None (the route answers)."""
    state = scope["app"].state
    if token_problem(state.grid, authorization.decode("latin-1"), node_id) is not None:
        return None
    node = state.node_cache.get(node_id)
    if node is None:
        return None
    try:  # as FastAPI: the parsed JSON validated in Python mode
        beat = HeartbeatRequest.model_validate(json.loads(body))
    except Exception:  # every bad body is the route's to answer
        return None
    answer = beat_from_memory(state, node, beat)
    if answer is not None:
        state.grid.count("heartbeats_fast_path")
    return answer


async def _body(receive: Receive) -> tuple[bytes, Message | None]:
    """The request's body, and the message that ended it early (a disconnect) or None. The
    request guard in front has bounded it (and, for JSON, read it whole already)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, rest: Message | None, receive: Receive) -> Receive:
    """``receive`` for the app: the body read here, then (or the message that cut it short,
    then) whatever ``receive`` says."""
    pending: list[Any] = [{"type": "http.request", "body": body, "more_body": False}]
    if rest is not None:
        pending = [{"type": "http.request", "body": body, "more_body": True}, rest]

    async def replay() -> Message:
        if pending:
            message: Message = pending.pop(0)
            return message
        return await receive()

    return replay
