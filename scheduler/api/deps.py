"""Shared request dependencies: the replica's parts, and node authentication."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from scheduler.auth import TokenError, verify
from scheduler.dispatch import Dispatcher
from scheduler.service import Replica
from scheduler.store import NodeRow, NotFoundError, Store


async def grid(request: Request) -> Replica:
    g: Replica = request.app.state.grid
    return g


async def store(request: Request) -> Store:
    s: Store = request.app.state.grid.store
    return s


async def dispatcher(request: Request) -> Dispatcher:
    d: Dispatcher = request.app.state.dispatcher
    return d


async def authenticated_node_id(request: Request, node_id: str) -> str:
    """``node_id``, once a valid ``Authorization: Bearer`` token issued to it is shown (a hash,
    no database read: heartbeats stay cheap). The dependencies here are ``async`` so FastAPI
    runs them on the event loop, not through its thread pool."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing Authorization: Bearer <node token> (register to get one)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    g: Replica = request.app.state.grid
    try:
        owner = verify(g.settings.token_secret.get_secret_value().encode(), token)
    except TokenError as exc:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, str(exc), headers={"WWW-Authenticate": "Bearer"}
        ) from None
    if owner != node_id:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token is for node {owner}")
    return node_id


_NODE_CACHE_S = 1.0


async def authenticated_node(request: Request, node_id: str) -> NodeRow:
    """The node row of an authenticated request (see :func:`authenticated_node_id`).

    Rows are cached for a second: a node polling again and again costs one read a second, and
    a status change (offline, suspended) is seen within that second.
    """
    await authenticated_node_id(request, node_id)
    now = time.monotonic()
    _nodes: dict[str, tuple[float, NodeRow]] = request.app.state.node_cache
    hit = _nodes.get(node_id)
    if hit is not None and now - hit[0] < _NODE_CACHE_S:
        return hit[1]
    g: Replica = request.app.state.grid
    try:
        node = await asyncio.to_thread(g.store.node, node_id)
    except NotFoundError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no node {node_id}") from None
    if len(_nodes) > 100_000:
        _nodes.clear()
    _nodes[node_id] = (now, node)
    return node


GridDep = Annotated[Replica, Depends(grid)]
StoreDep = Annotated[Store, Depends(store)]
DispatcherDep = Annotated[Dispatcher, Depends(dispatcher)]
NodeDep = Annotated[NodeRow, Depends(authenticated_node)]
NodeIdDep = Annotated[str, Depends(authenticated_node_id)]
