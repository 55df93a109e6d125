"""Shared request dependencies: the replica's parts, and node authentication."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from scheduler.auth import TokenError, verify
from scheduler.dispatch import Dispatcher
from scheduler.service import Replica
from scheduler.store import NodeRow, NotFoundError, Store

from .nodecache import NodeCache


async def grid(request: Request) -> Replica:
    g: Replica = request.app.state.grid
    return g


async def store(request: Request) -> Store:
    s: Store = request.app.state.grid.store
    return s


async def dispatcher(request: Request) -> Dispatcher:
    d: Dispatcher = request.app.state.dispatcher
    return d


def token_problem(grid: Replica, authorization: str, node_id: str) -> HTTPException | None:
    """Why ``authorization`` (the header's value) does not authenticate ``node_id``: a
    ``Bearer`` token issued to it (a hash, no database read); None when it does. The one check
    of the node routes and of the node fast path (``scheduler/api/fastpath.py``)."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing Authorization: Bearer <node token> (register to get one)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        owner = verify(grid.settings.token_secret.get_secret_value().encode(), token)
    except TokenError as exc:
        return HTTPException(
            status.HTTP_401_UNAUTHORIZED, str(exc), headers={"WWW-Authenticate": "Bearer"}
        )
    if owner != node_id:
        return HTTPException(status.HTTP_403_FORBIDDEN, f"this token is for node {owner}")
    return None


async def authenticated_node_id(request: Request, node_id: str) -> str:
    """``node_id``, once a valid ``Authorization: Bearer`` token issued to it is shown
    (:func:`token_problem`). The dependencies here are ``async`` so FastAPI runs them on the
    event loop, not through its thread pool."""
    g: Replica = request.app.state.grid
    problem = token_problem(g, request.headers.get("authorization", ""), node_id)
    if problem is not None:
        raise problem
    return node_id


async def authenticated_node(request: Request, node_id: str) -> NodeRow:
    """The node row of an authenticated request (see :func:`authenticated_node_id`), from the
    replica's node-row cache (``scheduler/api/nodecache.py``: a row is at most 2 s old, and
    refreshed behind after 1 s), else read now."""
    await authenticated_node_id(request, node_id)
    cache: NodeCache = request.app.state.node_cache
    node = cache.get(node_id)
    if node is not None:
        return node
    try:
        return await cache.load(node_id)
    except NotFoundError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no node {node_id}") from None


GridDep = Annotated[Replica, Depends(grid)]
StoreDep = Annotated[Store, Depends(store)]
DispatcherDep = Annotated[Dispatcher, Depends(dispatcher)]
NodeDep = Annotated[NodeRow, Depends(authenticated_node)]
NodeIdDep = Annotated[str, Depends(authenticated_node_id)]
