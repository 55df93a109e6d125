"""The node fast path: a node's hot requests answered in plain ASGI, before FastAPI's router.

Heartbeats (every node, every few seconds), ``next-job`` long polls and offer acceptances are
most of a replica's requests, and FastAPI's routing, dependency solving and body handling cost
more than the work itself (issue 12: 40% of the replica's samples under heartbeats, a third
under claims, were the HTTP stack). This middleware sits inside the request guard
(``gridmarket/http_guard.py``: body size, strict JSON and the rest still apply first) and
before FastAPI's router. It serves

* ``POST /v1/nodes/{node_id}/heartbeat`` when ``nodes.beat_from_memory`` can answer it (the
  node is online and every job it lists is known leased to it);
* ``POST /v1/nodes/{node_id}/next-job[?wait_s=S]`` (``nodes.poll``, the route's own work);
* ``POST /v1/nodes/{node_id}/jobs/{job_id}/accept`` (``nodes.accept_offer``, likewise);
* ``POST /v1/nodes/{node_id}/jobs/{job_id}/result`` (``nodes.record_run``, likewise: the end
  of every run, so one per job);

each only when all of these hold:

* that exact path and method; for a heartbeat, an acceptance or a result, a ``Content-Type`` of
  ``application/json``; for a poll, no query parameter but one ``wait_s`` within the route's
  bounds (0 to 120);
* the bearer token is valid and issued to that node (``deps.token_problem``, the routes' check);
* the node's row is in the node-row cache (``nodecache.py``);
* the body parses as JSON and validates as the route's model (``HeartbeatRequest``,
  ``AcceptRequest``, ``ResultReport``), validated from the parsed JSON as FastAPI does.

Anything else (a cache miss, a bad token, a body the model refuses, a node back from offline
for a heartbeat) goes to the FastAPI route with the body replayed, before any effect, so those
errors, status codes and messages are the route's. Once the work has started, an
``HTTPException`` it raises is answered here as FastAPI's handler answers it
(``{"detail": ...}``, its status and headers), and the store's ``NotFoundError`` and
``ConflictError`` as the app's handlers do (404, 409). The routes stay the documented
operations in OpenAPI. Requests answered here count ``heartbeats_fast_path``,
``polls_fast_path``, ``acceptances_fast_path`` and ``results_fast_path`` (``/metrics``).
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import parse_qsl

from fastapi import HTTPException

from gridmarket.http_guard import ASGIApp, Message, Receive, Scope, Send
from gridmarket.wire import AcceptRequest, HeartbeatRequest, ResultReport
from scheduler.store import ConflictError, NotFoundError

from .deps import token_problem
from .nodes import accept_offer, beat_from_memory, poll, record_run

PREFIX = "/v1/nodes/"
_JSON = [(b"content-type", b"application/json")]
_WAIT_S_DEFAULT = 20.0  # the route's default and bounds (nodes.next_job's Query)
_WAIT_S_MAX = 120.0


class NodeFastPath:
    """The ASGI middleware (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        parts = path[len(PREFIX) :].split("/") if path.startswith(PREFIX) else []
        if len(parts) == 2 and parts[0] and parts[1] == "heartbeat":
            kind = "heartbeat"
        elif len(parts) == 2 and parts[0] and parts[1] == "next-job":
            kind = "poll"
        elif (
            len(parts) == 4
            and parts[0]
            and parts[1] == "jobs"
            and parts[2]
            and parts[3] in ("accept", "result")
        ):
            kind = parts[3]
        else:
            await self.app(scope, receive, send)
            return
        authorization = content_type = None
        for name, value in scope["headers"]:
            if name == b"authorization" and authorization is None:
                authorization = value
            elif name == b"content-type" and content_type is None:
                content_type = value
        if authorization is None or (
            kind != "poll"
            and (
                content_type is None
                or content_type.split(b";", 1)[0].strip().lower() != b"application/json"
            )
        ):
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        node_id = parts[0]
        node = _node(state, node_id, authorization)
        body, rest = await _body(receive)
        if node is None or rest is not None:
            await self.app(scope, _replay(body, rest, receive), send)
            return
        if kind == "heartbeat":
            answer = _heartbeat(state, node, body)
            if answer is None:
                await self.app(scope, _replay(body, rest, receive), send)
                return
            await _send(send, 200, answer)
            return
        if kind == "poll":
            wait_s = _wait_s(scope.get("query_string", b""))
            if wait_s is None:
                await self.app(scope, _replay(body, rest, receive), send)
                return
            state.grid.count("polls_fast_path")
            await _answer(send, _polled(state, node, wait_s))
            return
        model = AcceptRequest if kind == "accept" else ResultReport
        try:  # as FastAPI: the parsed JSON validated in Python mode
            parsed: Any = model.model_validate(json.loads(body))
        except Exception:  # every bad body is the route's to answer
            await self.app(scope, _replay(body, rest, receive), send)
            return
        if kind == "accept":
            state.grid.count("acceptances_fast_path")
            await _answer(send, _accepted(state, parts[2], parsed, node))
        else:
            state.grid.count("results_fast_path")
            await _answer(send, _reported(state, parts[2], parsed, node))


def _node(state: Any, node_id: str, authorization: bytes) -> Any:
    """The node's cached row when the token is its own, else None (the route answers)."""
    if token_problem(state.grid, authorization.decode("latin-1"), node_id) is not None:
        return None
    return state.node_cache.get(node_id)


def _heartbeat(state: Any, node: Any, body: bytes) -> bytes | None:
    """The heartbeat's answer if it can be given here, else None (the route answers)."""
    try:  # as FastAPI: the parsed JSON validated in Python mode
        beat = HeartbeatRequest.model_validate(json.loads(body))
    except Exception:  # every bad body is the route's to answer
        return None
    answer = beat_from_memory(state, node, beat)
    if answer is not None:
        state.grid.count("heartbeats_fast_path")
    return answer


def _wait_s(query: bytes) -> float | None:
    """``wait_s`` of a poll's query string (the route's default when absent), or None when
    the route must answer (another parameter, a repeated one, a value it would refuse)."""
    if not query:
        return _WAIT_S_DEFAULT
    try:
        pairs = parse_qsl(query.decode("ascii"), keep_blank_values=True, strict_parsing=True)
        if len(pairs) != 1 or pairs[0][0] != "wait_s":
            return None
        wait_s = float(pairs[0][1])
    except ValueError:
        return None
    return wait_s if math.isfinite(wait_s) and 0 <= wait_s <= _WAIT_S_MAX else None


async def _polled(state: Any, node: Any, wait_s: float) -> tuple[int, bytes, list[Any]]:
    got = await poll(state, node, wait_s)
    if isinstance(got, float):
        return 204, b"", [(b"retry-after", f"{got:.2f}".encode())]
    return 200, got, _JSON


async def _accepted(
    state: Any, job_id: str, body: AcceptRequest, node: Any
) -> tuple[int, bytes, list[Any]]:
    ack = await accept_offer(job_id, body, node, state.grid, state.dispatcher)
    return 200, ack.__pydantic_serializer__.to_json(ack), _JSON


async def _reported(
    state: Any, job_id: str, body: ResultReport, node: Any
) -> tuple[int, bytes, list[Any]]:
    ack = await record_run(job_id, body, node, state.grid, state.grid.store)
    return 202, ack.__pydantic_serializer__.to_json(ack), _JSON


async def _answer(send: Send, work: Any) -> None:
    """Run the route's ``work`` (a coroutine giving status, body, headers) and send what it
    gives, or its error as FastAPI and the app's handlers would."""
    try:
        code, body, headers = await work
    except HTTPException as exc:
        extra = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in (exc.headers or {}).items()
        ]
        code, body, headers = exc.status_code, _detail(exc.detail), [*_JSON, *extra]
    except NotFoundError as exc:
        code, body, headers = 404, _detail(str(exc)), _JSON
    except ConflictError as exc:
        code, body, headers = 409, _detail(str(exc)), _JSON
    await _send(send, code, body, headers)


def _detail(detail: Any) -> bytes:
    """An error's body as Starlette's ``JSONResponse`` renders ``{"detail": detail}``."""
    return json.dumps(
        {"detail": detail}, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


async def _send(send: Send, code: int, body: bytes, headers: list[Any] = _JSON) -> None:
    head = headers if code == 204 else [(b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": code, "headers": head})
    await send({"type": "http.response.body", "body": b"" if code == 204 else body})


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
