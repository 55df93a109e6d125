"""Shared request dependencies: the replica's parts, and node authentication."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from scheduler.auth import TokenError, verify
from scheduler.dispatch import Dispatcher
from scheduler.service import Grid
from scheduler.store import NodeRow, NotFoundError, Store


def grid(request: Request) -> Grid:
    g: Grid = request.app.state.grid
    return g


def store(request: Request) -> Store:
    s: Store = request.app.state.grid.store
    return s


def dispatcher(request: Request) -> Dispatcher:
    d: Dispatcher = request.app.state.dispatcher
    return d


def authenticated_node_id(request: Request, node_id: str) -> str:
    """``node_id``, once a valid ``Authorization: Bearer`` token issued to it is shown (a hash,
    no database read: heartbeats stay cheap)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing Authorization: Bearer <node token> (register to get one)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    g: Grid = request.app.state.grid
    try:
        owner = verify(g.settings.token_secret.get_secret_value().encode(), token)
    except TokenError as exc:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, str(exc), headers={"WWW-Authenticate": "Bearer"}
        ) from None
    if owner != node_id:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token is for node {owner}")
    return node_id


def authenticated_node(request: Request, node_id: str) -> NodeRow:
    """The node row of an authenticated request (see :func:`authenticated_node_id`)."""
    authenticated_node_id(request, node_id)
    g: Grid = request.app.state.grid
    try:
        return g.store.node(node_id)
    except NotFoundError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no node {node_id}") from None


GridDep = Annotated[Grid, Depends(grid)]
StoreDep = Annotated[Store, Depends(store)]
DispatcherDep = Annotated[Dispatcher, Depends(dispatcher)]
NodeDep = Annotated[NodeRow, Depends(authenticated_node)]
NodeIdDep = Annotated[str, Depends(authenticated_node_id)]
