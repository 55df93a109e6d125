"""The grids of the end-to-end tests: :func:`devstack.grid.run_grid` with short
liveness timings, so that a dead agent or a silent scheduler is noticed in seconds.

A grid is anvil + escrow, a js-ipfs daemon, dockerd, a scheduler process and three agent
processes with their own wallets, all real. They run under pytest's temporary directory and are
stopped when the tests using them are done. If a part cannot start, the tests FAIL with its log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack._process import ServiceError
from devstack.grid import LocalGrid, run_grid
from devstack.postgres import fresh_database

from .support import FAST, FAST_ESCROW


def _grid(work: Path, agents: int = 3, **overrides: str) -> Iterator[LocalGrid]:
    try:
        cm = run_grid(
            work,
            agents=agents,
            with_frontend=False,
            scheduler_overrides={**FAST, **overrides},
            escrow_overrides=FAST_ESCROW,
        )
        grid = cm.__enter__()
    except ServiceError as exc:
        pytest.fail(f"the grid did not start: {exc}", pytrace=False)
    try:
        if grid.dockerd is None:  # the Docker jobs could never run: say why, do not time out
            pytest.fail(f"the grid has no Docker engine: {grid.docker_note}", pytrace=False)
        yield grid
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="class")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGrid]:
    """One SQLite grid shared by a class of tests that leave it whole (agents restarted...)."""
    yield from _grid(tmp_path_factory.mktemp("grid"))


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database (the machine's server, trust auth), dropped afterwards."""
    try:
        with fresh_database("gm_e2e") as url:
            yield url
    except ServiceError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def pg_grid(tmp_path_factory: pytest.TempPathFactory, pg_database: str) -> Iterator[LocalGrid]:
    """A grid whose scheduler runs on PostgreSQL, with no agents yet: the test adds replicas
    (``start_replica``) and agents (``start_agent``) where it wants them."""
    yield from _grid(tmp_path_factory.mktemp("pg-grid"), agents=0, database_url=pg_database)
